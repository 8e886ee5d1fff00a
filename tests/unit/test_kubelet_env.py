"""The pure parts of the real-kubelet fixture (tests/support/kubelet_env.py), without a kubelet: its configuration and
how the tests read what it says (/pods, /metrics/probes, its log)."""

from __future__ import annotations

from pathlib import Path

from tests.support.kubelet_env import KubeletPorts, free_ports, kubelet_config, pod_views, probe_counts, readiness_changes
from tests.support.kubelet_views import log_records

# Shapes of the kubelet's own answers (core/v1 PodList from /pods; its /metrics/probes text; klog lines).
POD_LIST = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [{
    "metadata": {"name": "web-node1", "namespace": "default", "uid": "77da"},
    "spec": {},
    "status": {
        "phase": "Running", "podIP": "10.244.77.5",
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "False"}],
        "initContainerStatuses": [{"name": "recorder", "ready": True, "started": True, "restartCount": 1,
                                   "state": {"running": {"startedAt": "2026-11-26T11:45:51Z"}}}],
        "containerStatuses": [{"name": "web", "ready": False, "started": False, "restartCount": 2,
                               "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
    }}, {
    "metadata": {"name": "new-node1", "namespace": "default", "uid": "88eb"},
    "spec": {}, "status": {"phase": "Pending"}}]}

METRICS = """\
# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.
# TYPE prober_probe_total counter
prober_probe_total{container="web",namespace="default",pod="web-node1",pod_uid="77da",probe_type="Readiness",result="successful"} 12
prober_probe_total{container="web",namespace="default",pod="web-node1",pod_uid="77da",probe_type="Readiness",result="failed"} 3
prober_probe_total{container="web",namespace="default",pod="web-node1",pod_uid="66c9",probe_type="Readiness",result="failed"} 1
prober_probe_duration_seconds_count{container="web",namespace="default",pod="web-node1",probe_type="Readiness"} 15
"""

LOG = """\
I1126 11:45:51.171188    2304 kubelet.go:2481] "SyncLoop (probe)" probe="readiness" status="not ready" pod="default/web-node1"
I1126 11:45:51.180125    2304 kubelet_node_status.go:610] "Recording event message for node" node="node1"
I1126 11:45:51.194247    2304 kubelet.go:2481] "SyncLoop (probe)" probe="readiness" status="ready" pod="default/web-node1"
I1126 11:45:52.001000    2304 kubelet.go:2481] "SyncLoop (probe)" probe="liveness" status="unhealthy" pod="default/web-node1"
"""


def test_pods_are_read_as_the_kubelet_reports_them():
    pods = pod_views(POD_LIST)
    web = pods["web-node1"]
    assert (web.ready, web.pod_ip, web.uid) == (False, "10.244.77.5", "77da")
    assert web.containers["web"].restart_count == 2 and not web.containers["web"].running
    assert web.init_containers["recorder"].running and web.init_containers["recorder"].started
    assert web.restarts == 3  # a sidecar's restarts count too
    assert pods["new-node1"].containers == {} and not pods["new-node1"].ready
    assert pod_views({"kind": "PodList", "items": None}) == {}


def test_probe_counts_sum_over_pod_uids_by_pod_container_type_and_result():
    counts = probe_counts(METRICS)
    assert counts == {("web-node1", "web", "Readiness", "successful"): 12.0,
                      ("web-node1", "web", "Readiness", "failed"): 4.0}


def test_readiness_changes_are_read_from_the_kubelets_log():
    assert readiness_changes(LOG) == [("web-node1", "not ready"), ("web-node1", "ready")]


def test_the_config_is_standalone_and_binds_nothing_beyond_loopback(tmp_path: Path):
    ports = KubeletPorts(read_only=20265, https=20260, healthz=20258)
    config = kubelet_config(tmp_path, "unix:///run/shim.sock", ports)
    assert config["staticPodPath"] == str(tmp_path / "manifests")
    assert config["containerRuntimeEndpoint"] == config["imageServiceEndpoint"] == "unix:///run/shim.sock"
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert (config["readOnlyPort"], config["port"], config["healthzPort"]) == (20265, 20260, 20258)
    assert config["imageGCHighThresholdPercent"] == 100  # the locally imported images must stay
    assert config["authentication"]["anonymous"]["enabled"] and config["authorization"]["mode"] == "AlwaysAllow"


def test_a_registered_kubelet_authenticates_its_clients_as_a_clusters_does(tmp_path: Path):
    ports = KubeletPorts(read_only=20265, https=20260, healthz=20258)
    config = kubelet_config(tmp_path, "unix:///run/shim.sock", ports, client_ca=tmp_path / "ca.crt")
    assert config["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                        "x509": {"clientCAFile": str(tmp_path / "ca.crt")}}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["address"] == "127.0.0.1"


def test_free_ports_are_distinct():
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= p < 65536 for p in ports)


# Lines of kubelet 1.37.2's log through the shim (tests/e2e/test_real_kubelet_answers.py), shortened; and a value
# holding a newline, which klog writes as an indented block (klog/v2 internal/serialize writeStringValue).
RECORDS_LOG = r"""I1127 17:50:12.269458   20843 event.go:395] "Event occurred" object="default/fail-http-node1" fieldPath="spec.containers{web}" kind="Pod" apiVersion="v1" type="Warning" reason="Unhealthy" message="Readiness probe failed: HTTP probe failed with statuscode: 404"
I1127 17:50:29.727640   20843 prober.go:107] "Probe errored" probeType="Readiness" pod="default/short-node1" podUID="fb9c38ed" containerName="web" probeResult="unknown" err="rpc error: code = Unknown desc = unexpected EOF"
I1127 17:50:35.816460   20843 handlers.go:84] "Exec lifecycle hook for Container in Pod failed" execCommand=["cri-probe-shim","postStart","{\"httpGet\":{\"path\":\"/start\",\"port\":9999}}"] containerName="web" pod="default/hook-fail-node1" message="Get \"http://10.244.78.7:9999/start\": dial tcp 10.244.78.7:9999: connect: connection refused"
E1127 17:50:37.920262   20843 kuberuntime_manager.go:1854] "Unhandled Error" err="a: message: \"Get \\\"http://x/\\\"\" \t\u00e9\x01" logger="UnhandledError"
I1127 17:50:40.000001   20843 prober.go:117] "Probe failed" probeType="Liveness" pod="default/multi-node1" probeResult="failure" output=<
	first line
	second line
 > containerName="web"
"""


def test_log_records_are_read_with_their_values_unquoted():
    (event,) = log_records(RECORDS_LOG, "Event occurred")
    assert event.values == {"object": "default/fail-http-node1", "fieldPath": "spec.containers{web}", "kind": "Pod",
                            "apiVersion": "v1", "type": "Warning", "reason": "Unhealthy",
                            "message": "Readiness probe failed: HTTP probe failed with statuscode: 404"}
    (errored,) = log_records(RECORDS_LOG, "Probe errored")
    assert errored.values["err"] == "rpc error: code = Unknown desc = unexpected EOF"
    (hook,) = log_records(RECORDS_LOG, "Exec lifecycle hook for Container in Pod failed")
    assert hook.values["execCommand"] == r'["cri-probe-shim","postStart","{\"httpGet\":{\"path\":\"/start\",\"port\":9999}}"]'
    assert hook.values["message"].startswith('Get "http://10.244.78.7:9999/start": dial tcp')


def test_log_records_undo_strconv_quote_and_klogs_blocks():
    (unhandled,) = log_records(RECORDS_LOG, "Unhandled Error")
    assert unhandled.values == {"err": 'a: message: "Get \\"http://x/\\"" \t\u00e9\x01', "logger": "UnhandledError"}
    (failed,) = log_records(RECORDS_LOG, "Probe failed")
    assert failed.values["output"] == "first line\nsecond line"
    assert failed.values["containerName"] == "web"
    assert log_records(RECORDS_LOG, "SyncLoop (probe)") == []
