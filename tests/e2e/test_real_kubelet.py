"""The promise, proven with a real kubelet: kubelet -> shim -> real containerd, static pods converted by probectl.

A real kubelet (tests/support/kubelet_env.py: KUBELET_BIN, else `make k8s`'s, 1.37.2) runs standalone with the shim's socket
as its CRI endpoint, in front of the suite's private containerd. Every pod is a static pod written by the test
and converted with the real `probectl convert`; what is asserted is what the kubelet itself says: readiness and
restart counts on its read-only port, its own `prober_probe_total`, its log. Workloads are busybox httpd serving a
directory of the test's (a hostPath), so a test makes an endpoint fail or recover by removing or writing a file,
and hooks are recorded by a CGI script there; gRPC health servers run from the host inside the pod's netns.

What each test proves:
- converted HTTP (pod IP and the pod's own 127.0.0.1), TCP and gRPC readiness probes make pods Ready, counted in
  the kubelet's prober_probe_total and seen by the shim as bridged rows; the same loopback pod unconverted stays
  NOT ready (the kubelet probes the node's 127.0.0.1: the problem this project solves);
- an endpoint made to fail turns the pod NOT ready within failureThreshold x period, and back;
- a startup probe holds liveness back; then a failing liveness probe makes the kubelet restart the container;
- converted postStart and preStop httpGet hooks reach the pod (postStart after a sidecar's startup probe, preStop
  on removal, inside the grace period), with the kubelet's hook User-Agent;
- faults under the running kubelet (shim kill -9, shim SIGTERM and no shim for GAP_S, a worker kill -9, a containerd
  restart) cost no readiness flip and no container restart;
- crictl through the shim shows what it shows straight from containerd;
- a hand-converted hostNetwork pod is never probed (its probes aim at the node's 127.0.0.1): it stays not ready, is
  never restarted, and the kubelet's log says why.

The node and the manifest builders: tests/support/kubelet_node.py.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import jsonpatch
import pytest

from cri_proto import probe_service_pb2 as service_pb
from probe_api.bridge_command import command_for
from probe_api.defaults import KUBELET_VERSION
from probe_api.rollout import CONVERT_LABEL, NODE_LABEL, NODE_LABEL_VALUE
from tests.support import kubelet_env
from tests.support.containerd_env import ContainerdEnv
from tests.support.kubelet_env import crictl_binary
from tests.support.kubelet_node import (
    GRPC_PORT, HTTP_PORT, PERIOD_S, fault_pods, free_node_port, http_get, httpd, node_refuses, probe,
    kill_and_stop_the_shim, probe_count as count, restart_containerd, running_node, static_pod,
    wait_probes_answered,
)
from tests.support.kubelet_views import ReadinessRecorder, log_records
from tests.support.netns_env import REPO_ROOT
from tests.support.webhook_env import Webhook, admit, review

pytestmark = pytest.mark.e2e

GAP_S = 5                # no shim at all for this long in the SIGTERM fault


@pytest.fixture(scope="module")
def node(containerd: ContainerdEnv):
    reason = kubelet_env.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if not containerd.runtime.supports_kubelet(kubelet_env.kubelet_minor()):
        pytest.skip(f"kubelet {kubelet_env.KUBELET_VERSION} does not support containerd {containerd.runtime.version}"
                    " (1.35 is the last Kubernetes release that supports containerd 1.x; `make test-matrix` runs "
                    "kubelet 1.35 on it)")
    # Labelled as the kubelet drop-in labels a shim node: converted pods require it (their node affinity).
    with running_node(containerd, "node-", node_labels={NODE_LABEL: NODE_LABEL_VALUE}) as node:
        yield node


@pytest.fixture
def k(node):
    """The node, its pods removed after the test (each test starts with none)."""
    yield node
    node.remove_pods()


# --- readiness through the bridge ----------------------------------------------------------------------------------

def test_converted_probes_make_pods_ready_and_the_unconverted_loopback_probe_does_not(k, in_pod):
    image = k.containerd.images.http
    admin = free_node_port()  # the pods' admin port, on their own 127.0.0.1
    pods = {
        "pod-ip": k.apply(static_pod("pod-ip", k.www("pod-ip"), [
            httpd("web", image, readinessProbe=probe(http_get()))])),
        "loopback": k.apply(static_pod("loopback", k.www("loopback"), [
            httpd("web", image, listen=f"127.0.0.1:{admin}",
                  readinessProbe=probe(http_get(admin, host="127.0.0.1")))])),
        "localhost": k.apply(static_pod("localhost", k.www("localhost"), [
            httpd("web", image, listen=f"127.0.0.1:{admin}",
                  readinessProbe=probe(http_get(admin, host="localhost")))])),
        "tcp": k.apply(static_pod("tcp", k.www("tcp"), [
            httpd("web", image, readinessProbe=probe({"tcpSocket": {"port": HTTP_PORT}}))])),
        "grpc": k.apply(static_pod("grpc", k.www("grpc"), [
            {"name": "app", "image": image, "imagePullPolicy": "Never",
             "command": ["/bin/busybox", "sleep", "2147483647"],
             "readinessProbe": probe({"grpc": {"port": GRPC_PORT}})}])),
    }
    # The same loopback pod as the kubelet runs it without the shim: it probes the NODE's 127.0.0.1.
    native = k.apply(static_pod("native-loopback", k.www("native-loopback"), [
        httpd("web", image, listen=f"127.0.0.1:{admin}", readinessProbe=probe(http_get(admin, host="127.0.0.1")))]),
        convert=False)
    in_pod(SimpleNamespace(netns_path=k.netns_of(pods["grpc"])),
           [sys.executable, "tests/support/servers/grpc_health_server.py", "--host", "0.0.0.0", "--port", str(GRPC_PORT),
            "--status", "SERVING"])

    ready = k.wait_ready(*pods.values())
    assert all(p.restarts == 0 for p in ready.values())
    containers = {"grpc": "app"}
    counts = k.kubelet.wait_for_counts(
        "the native loopback probe failing 3 times",
        lambda c: count(c, native, "web", "Readiness", "failed") >= 3)
    assert not k.kubelet.pods()[native].ready and node_refuses(admin)
    for key, pod in pods.items():
        # The kubelet's own prober counted each bridged probe (a first one may fail: a server starts after its
        # container, and the gRPC one after the sandbox, started by the test).
        assert count(counts, pod, containers.get(key, "web"), "Readiness", "successful") >= 1, (key, counts)
    # ... and the shim answered them: a bridged row per pod, its attempts in the pod's netns, as many as the
    # kubelet counted (read one after the other: a probe may fall between the two reads).
    rows = {p.labels["io.kubernetes.pod.name"]: p for p in
            k.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes}
    assert set(pods.values()) <= set(rows) and native not in rows
    after = k.kubelet.probe_counts()
    for key, pod in pods.items():
        assert rows[pod].bridged.role == "readiness"
        assert count(counts, pod, containers.get(key, "web"), "Readiness", "successful") <= rows[pod].status.totals.success \
            <= count(after, pod, containers.get(key, "web"), "Readiness", "successful") + 1, key
    assert rows[pods["loopback"]].status.last_attempt.address == f"127.0.0.1:{admin}"
    assert rows[pods["localhost"]].status.last_attempt.address == f"127.0.0.1:{admin}"
    assert rows[pods["pod-ip"]].status.last_attempt.address == f"{ready[pods['pod-ip']].pod_ip}:{HTTP_PORT}"


def test_an_endpoint_made_to_fail_turns_the_pod_not_ready_within_its_thresholds_and_back(k):
    failure_threshold = 2
    www = k.www("flaky")
    name = k.apply(static_pod("flaky", www, [httpd("web", k.containerd.images.http, readinessProbe=probe(
        http_get(), failureThreshold=failure_threshold))]))
    k.wait_ready(name)
    before = k.kubelet.probe_counts()

    with ReadinessRecorder(k.kubelet, [name]) as recorder:
        (www / "healthz").unlink()  # 404 from now on
        failed_at = time.monotonic()
        k.kubelet.wait_for("the pod NOT ready", lambda pods: not pods[name].ready, timeout_s=30)
        took = time.monotonic() - failed_at
        failures = count(k.kubelet.probe_counts(), name, "web", "Readiness", "failed") - \
            count(before, name, "web", "Readiness", "failed")
        # failureThreshold consecutive failures at the period, the first up to a period after the file went.
        assert failures >= failure_threshold
        # Slack for the kubelet's status to reach its read-only port on a loaded machine.
        assert took <= (failure_threshold + 1) * PERIOD_S + 2.0, took

        (www / "healthz").write_text("ok\n")
        back_at = time.monotonic()
        k.wait_ready(name)
        assert time.monotonic() - back_at <= 2 * PERIOD_S + 2.0
    assert k.kubelet.pods()[name].restarts == 0
    # What the fault test counts as a flip, seen here both ways: in the samples and in the kubelet's log.
    assert recorder.not_ready_samples()[name] >= 1
    assert recorder.logged_changes() == [(name, "not ready"), (name, "ready")]


def test_a_startup_probe_holds_liveness_back_then_failing_liveness_restarts_the_container(k):
    www = k.www("alive")
    name = k.apply(static_pod("alive", www, [httpd(
        "web", k.containerd.images.http,
        startupProbe=probe(http_get(path="/started"), failureThreshold=600),
        livenessProbe=probe(http_get(path="/alive"), failureThreshold=1))]))

    # Neither file yet: the startup probe fails on and on, and the kubelet runs no liveness probe meanwhile.
    counts = k.kubelet.wait_for_counts("3 failed startup probes",
                                       lambda c: count(c, name, "web", "Startup", "failed") >= 3)
    assert not any(key[0] == name and key[2] == "Liveness" for key in counts), counts
    (container,) = k.kubelet.pods()[name].containers.values()
    assert (container.started, container.restart_count) == (False, 0)

    (www / "started").write_text("ok\n")  # startup succeeds; liveness starts and fails: the kubelet restarts it
    k.kubelet.wait_for("a restart", lambda pods: pods[name].restarts >= 1)
    assert count(k.kubelet.probe_counts(), name, "web", "Liveness", "failed") >= 1

    (www / "alive").write_text("ok\n")
    counts = k.kubelet.wait_for_counts("a successful liveness probe",
                                       lambda c: count(c, name, "web", "Liveness", "successful") >= 1)
    restarts = k.kubelet.pods()[name].restarts
    k.kubelet.wait_for_counts("3 more successful liveness probes",
                              lambda c: count(c, name, "web", "Liveness", "successful") >= 4)
    assert k.kubelet.pods()[name].restarts == restarts  # alive: no more restarts


def test_a_hand_converted_host_network_pod_stays_not_ready_is_never_restarted_and_the_log_says_why(k, node_loopback):
    # `probectl convert` and the webhook leave hostNetwork pods alone; by hand, their markers reach the shim, which
    # refuses them (FAILED_PRECONDITION): the kubelet throws each result away ("Probe errored").
    target = {"httpGet": {"path": "/", "port": node_loopback.port, "host": "127.0.0.1"}}
    name = k.apply(static_pod("hostnet", k.www("hostnet"), [{
        "name": "app", "image": k.containerd.images.pause, "imagePullPolicy": "Never",
        "readinessProbe": probe({"exec": {"command": command_for("readiness", target)}}),
        "livenessProbe": probe({"exec": {"command": command_for("liveness", target)}}),  # failureThreshold 3
    }], hostNetwork=True), convert=False)
    refused = "uses the node's network namespace (hostNetwork)"

    def errored() -> list[str]:
        """The prober's "Probe errored" records for the pod (one a probe a period; the text is also in cri-client's
        log line for each of the period's three ExecSyncs, and in the event)."""
        return [r.values["err"] for r in log_records(k.kubelet.log_text(), "Probe errored")
                if r.values.get("pod") == f"default/{name}"]

    deadline = time.monotonic() + 60
    while len(errored()) < 10 and time.monotonic() < deadline:
        time.sleep(kubelet_env.POLL_S)
    errors = errored()
    assert len(errors) >= 10, k.kubelet.log_tail(40)  # both probes, 5 periods or more: past liveness' threshold
    assert all(e.startswith("rpc error: code = FailedPrecondition desc = cri-probe-shim: ") and refused in e
               for e in errors), errors
    pod = k.kubelet.pods()[name]
    assert not pod.ready and pod.restarts == 0
    assert node_loopback.connections == []


# --- the admission webhook -----------------------------------------------------------------------------------------

def test_a_pod_the_webhook_mutated_is_ready_through_the_bridge_and_an_opted_out_one_is_the_kubelets(k, tmp_path):
    """The pod as the API server would store it after `probe-shim webhook` answered its AdmissionReview, run as a
    static pod (no API server here): Ready through the bridge on a node labelled as a shim node; the same pod
    opted out is left as it is, and the kubelet probes the node's 127.0.0.1 for it, as without the shim."""
    webhook = Webhook(tmp_path)
    try:
        admin = free_node_port()
        image = k.containerd.images.http

        def pod(name: str, **labels) -> dict:
            out = static_pod(name, k.www(name), [httpd("web", image, listen=f"127.0.0.1:{admin}",
                                                       readinessProbe=probe(http_get(admin, host="127.0.0.1")))])
            out["metadata"]["labels"] = labels
            return out

        admitted = pod("admitted", app="web")
        answer = admit(webhook, review(admitted, namespace="default"))["response"]
        assert answer["allowed"] and answer["patchType"] == "JSONPatch" and "warnings" not in answer
        mutated = jsonpatch.apply_patch(copy.deepcopy(admitted), json.loads(base64.b64decode(answer["patch"])))
        opted_out = pod("opted-out", **{CONVERT_LABEL: "disabled"})
        left = admit(webhook, review(opted_out, namespace="default"))["response"]
        assert "patch" not in left and left["allowed"]
    finally:
        assert webhook.stop() == 0
    names = k.apply(mutated, convert=False), k.apply(opted_out, convert=False)
    k.wait_ready(names[0])
    counts = k.kubelet.wait_for_counts("the opted-out pod's probe failing 3 times",
                                       lambda c: count(c, names[1], "web", "Readiness", "failed") >= 3)
    assert count(counts, names[0], "web", "Readiness", "successful") >= 1
    assert not k.kubelet.pods()[names[1]].ready
    bridged = {p.labels["io.kubernetes.pod.name"] for p in
               k.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes}
    assert names[0] in bridged and names[1] not in bridged


# --- hooks ------------------------------------------------------------------------------------------------------------

def test_converted_post_start_and_pre_stop_hooks_reach_the_pod(k):
    www = k.www("hooked")
    grace_s = 10
    image = k.containerd.images.http
    recorder_port = HTTP_PORT + 1
    pod = static_pod("hooked", www, [httpd(
        "app", image,
        lifecycle={"postStart": http_get(recorder_port, "/cgi-bin/record?hook=postStart"),
                   "preStop": http_get(HTTP_PORT, "/cgi-bin/record?hook=preStop")})],
        grace_s=grace_s,
        # A sidecar: the kubelet starts `app` (and so its postStart hook) once the sidecar's startup probe passed.
        initContainers=[httpd("recorder", image, listen=str(recorder_port), restartPolicy="Always",
                              startupProbe=probe({"tcpSocket": {"port": recorder_port}}))])
    name = k.apply(pod)
    k.wait_ready(name)
    log = www / "hooks.log"
    (post_start,) = log.read_text().splitlines()
    # The kubelet's hook User-Agent, of the kubelet version the engine follows.
    assert post_start.split()[:2] == ["hook=postStart", f"kube-lifecycle/{KUBELET_VERSION}"]
    assert k.kubelet.pods()[name].restarts == 0  # the hook succeeded: no kill

    k.kubelet.remove_manifest("hooked")
    removed_at = time.time()
    deadline = time.monotonic() + grace_s + 30
    while len(log.read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, k.kubelet.log_tail()
        time.sleep(kubelet_env.POLL_S)
    pre_stop = log.read_text().splitlines()[1].split()
    assert pre_stop[:2] == ["hook=preStop", f"kube-lifecycle/{KUBELET_VERSION}"]
    assert int(pre_stop[2]) <= removed_at + grace_s  # before the kubelet's grace period ran out


# --- faults under a running kubelet -----------------------------------------------------------------------------------

def test_faults_under_a_running_kubelet_flip_nothing(k):
    names = fault_pods(k, convert=True)
    k.wait_ready(*names)

    with ReadinessRecorder(k.kubelet, names) as recorder:
        kill_and_stop_the_shim(k, names, GAP_S)  # the kubelet's ExecSyncs fail meanwhile

        workers = {s.worker.pid for s in k.shim.stub.ListProbeSandboxes(
            service_pb.ListProbeSandboxesRequest(), timeout=10).sandboxes if s.worker.pid}
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        wait_probes_answered(k, names, "a kill -9 of the workers")

        restart_containerd(k, names)

    assert recorder.samples and not recorder.errors
    assert recorder.not_ready_samples() == {}
    assert recorder.logged_changes() == []
    assert recorder.restarts() == {n: 0 for n in names}
    assert all(k.kubelet.pods()[n].ready for n in names)


# --- probectl doctor -------------------------------------------------------------------------------------------------

def doctor(endpoint: str, kubelet_pid: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probectl.cli", "-r", endpoint, "doctor", "--kubelet-pid",
                           str(kubelet_pid)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_doctor_says_the_kubelet_goes_through_the_shim_and_what_to_fix_when_not(k):
    healthy = doctor(f"unix://{k.shim.socket_path}", k.kubelet.proc.pid)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    lines = healthy.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["ok"] * 5, healthy.stdout
    assert f"uses unix://{k.shim.socket_path} (containerRuntimeEndpoint in its --config file)" in lines[0]
    assert "containerd" in lines[2]
    # Asked about containerd's socket instead: the kubelet does not use it, and no shim answers there.
    wrong = doctor(k.containerd.endpoint, k.kubelet.proc.pid)
    assert wrong.returncode == 1
    failed = [line for line in wrong.stdout.splitlines() if line.startswith("FAIL")]
    assert failed[0].startswith("FAIL  the kubelet's CRI endpoint is the shim:")
    assert failed[1].startswith("FAIL  the shim answers:")
    assert wrong.stdout.count("      fix: ") == 2


# --- crictl -------------------------------------------------------------------------------------------------------

def crictl(endpoint: str, *args: str) -> object:
    done = subprocess.run([str(crictl_binary()), "-r", endpoint, "--timeout", "20s", *args],
                          env=dict(os.environ, CRI_CONFIG_FILE="/dev/null"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"crictl {' '.join(args)}: {done.stderr}"
    return json.loads(done.stdout)


def test_crictl_through_the_shim_shows_what_containerd_shows(k):
    if not os.access(crictl_binary(), os.X_OK):
        pytest.skip(f"needs crictl: none at {crictl_binary()}; set CRICTL_BIN")
    name = k.apply(static_pod("listed", k.www("listed"), [httpd("web", k.containerd.images.http,
                                                                readinessProbe=probe(http_get()))]))
    k.wait_ready(name)
    shim, direct = f"unix://{k.shim.socket_path}", k.containerd.endpoint
    for args in (("pods", "-o", "json"), ("ps", "-a", "-o", "json"), ("images", "-o", "json")):
        assert crictl(shim, *args) == crictl(direct, *args), args
    (sandbox,) = crictl(shim, "pods", "--name", name, "-o", "json")["items"]
    assert crictl(shim, "inspectp", "-o", "json", sandbox["id"]) == crictl(direct, "inspectp", "-o", "json",
                                                                           sandbox["id"])
    (container,) = crictl(shim, "ps", "--pod", sandbox["id"], "-o", "json")["containers"]
    assert container["metadata"]["name"] == "web" and container["state"] == "CONTAINER_RUNNING"
