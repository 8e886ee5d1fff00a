"""`probectl doctor`'s judgement (probectl/doctor.py) on facts as a node gives them, without a node: the
kubelet's flags and config file, the shim's answers. The real kubelet's side is in tests/e2e/test_real_kubelet.py."""

from __future__ import annotations

from probectl.doctor import FAIL, OK, Facts, evaluate, flag_values, node_labels, read_kubelet_config, render

SHIM = "unix:///run/probe-shim/probe-shim.sock"
KUBEADM_ARGV = ["/usr/bin/kubelet", "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=/var/lib/kubelet/config.yaml",
                "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
                "--node-labels=topology.kubernetes.io/zone=a",
                "--container-runtime-endpoint=unix:///run/probe-shim/probe-shim.sock",
                "--node-labels=probe-shim.io/bridge=v1alpha1"]


def healthy(**changes) -> Facts:
    facts = Facts(shim_endpoint=SHIM, kubelet_pid=42, kubelet_argv=list(KUBEADM_ARGV), shim_version="0.1.0",
                  runtime_endpoint="unix:///run/containerd/containerd.sock", runtime_version="containerd v1.6.20",
                  sandboxes=12)
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def statuses(facts: Facts) -> list[tuple[str, str]]:
    return [(f.status, f.check) for f in evaluate(facts)]


def test_flags_are_read_as_the_kubelet_reads_them():
    assert flag_values(KUBEADM_ARGV, "container-runtime-endpoint")[-1] == SHIM  # the last one wins
    assert flag_values(["kubelet", "--config", "/c.yaml"], "config") == ["/c.yaml"]
    assert node_labels(KUBEADM_ARGV) == {"topology.kubernetes.io/zone": "a", "probe-shim.io/bridge": "v1alpha1"}


def test_a_node_that_goes_through_the_shim_is_all_ok():
    findings = evaluate(healthy())
    assert [f.status for f in findings] == [OK] * 5 and all(not f.fix for f in findings)
    assert "kubelet (pid 42) uses unix:///run/probe-shim/probe-shim.sock (--container-runtime-endpoint)" in \
        render(findings)


def test_the_config_file_says_when_no_flag_does(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      f"containerRuntimeEndpoint: {SHIM}\n")
    argv = ["kubelet", f"--config={config}", "--node-labels=probe-shim.io/bridge=v1alpha1"]
    parsed, error = read_kubelet_config(argv)
    facts = healthy(kubelet_argv=argv, kubelet_config=parsed, kubelet_config_error=error)
    (first, *_) = evaluate(facts)
    assert first.status == OK and "containerRuntimeEndpoint in its --config file" in first.detail


def test_a_kubelet_straight_to_containerd_fails_with_the_drop_in_as_the_fix():
    argv = ["kubelet", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock"]
    (first, *_) = evaluate(healthy(kubelet_argv=argv))
    assert first.status == FAIL and "not unix:///run/probe-shim/probe-shim.sock" in first.detail
    assert "systemd/kubelet-probe-shim.conf" in first.fix and "systemctl restart kubelet" in first.fix


def test_a_missing_node_label_fails_and_the_fix_names_kubectl_label():
    findings = {f.check: f for f in evaluate(healthy(kubelet_argv=KUBEADM_ARGV[:-1]))}
    label = findings["the node is labelled probe-shim.io/bridge=v1alpha1"]
    assert label.status == FAIL and "kubectl label node NODE probe-shim.io/bridge=v1alpha1" in label.fix


def test_a_shim_that_does_not_answer_fails_and_the_shims_other_checks_are_not_made():
    assert statuses(healthy(shim_version="", shim_error="cannot reach the probe shim")) == [
        (OK, "the kubelet's CRI endpoint is the shim"), (FAIL, "the shim answers"),
        (OK, "the node is labelled probe-shim.io/bridge=v1alpha1")]


def test_a_runtime_the_shim_cannot_reach_and_unhealthy_workers_fail():
    facts = healthy(runtime_version="", runtime_error="UNAVAILABLE: connection refused",
                    unhealthy_workers=["4f1c2d3e4f5a6: backoff: exited with code 3"])
    found = {f.check: f for f in evaluate(facts)}
    assert found["the shim reaches the container runtime"].status == FAIL
    assert "systemctl status containerd" in found["the shim reaches the container runtime"].fix
    assert found["the shim's workers are healthy"].status == FAIL
    assert "backoff: exited with code 3" in found["the shim's workers are healthy"].detail


def test_no_kubelet_on_this_machine():
    (first, *rest) = evaluate(healthy(kubelet_pid=None, kubelet_argv=[]))
    assert first.status == FAIL and "--kubelet-pid" in first.fix
    assert all("node is labelled" not in f.check for f in rest)
