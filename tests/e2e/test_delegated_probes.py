"""The kubelet delegates its probes to the shim (kubelet/: the patch series, feature gate CRIProbeDelegation).

The kubelet is 1.37.2 with the series applied (hack/build-kubelet-delegating.sh, built by `make go-binaries`),
standalone, its CRI endpoint the shim in front of the suite's containerd, the gate on. Every pod is an UNCONVERTED
static pod (no webhook, no `probectl convert`): the kubelet hands its httpGet, tcpSocket and grpc probes to the
shim's ProbeService (RunProbe per container, one WatchProbeStatus stream) and sets readiness, liveness and startup
from what the shim reports. What is asserted is what the kubelet says (readiness and restarts on its read-only
port, its prober_probe_total, the events in its log) and what the shim shows (a registered row per probe, labelled
as the kubelet's, its attempts made inside the pod's netns).

What each test proves:
- HTTP on the pod IP, HTTP on the pod's own 127.0.0.1, TCP and gRPC readiness make pods Ready, and so does a pod
  the node cannot reach at all (its netns drops what comes from the node, as a NetworkPolicy would): none of which
  the kubelet's own probing can do for the last two;
- an endpoint made to fail turns the pod NOT ready within its thresholds and back, with the kubelet's event;
- a startup probe holds liveness back; a failing liveness probe makes the kubelet restart the container, and the
  probe follows the new container;
- the unpatched kubelet shows the same startup, readiness and liveness timeline for the same pod, within one
  period; the same build with the gate off probes as upstream does (the pod's 127.0.0.1 probe fails on the node);
- faults (shim kill -9, 5 s without a shim, a containerd restart) flip nothing and restart nothing;
- a removed pod's probes are stopped in the shim;
- postStart and preStop httpGet hooks on the pod's own 127.0.0.1 run in the pod (ExecProbe as a lifecycle hook),
  with the kubelet's hook User-Agent, preStop within the grace period.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import KUBELET_VERSION
from tests.support import kubelet_env
from tests.support.containerd_env import ContainerdEnv
from tests.support.kubelet_env import KubeletProcess
from tests.support.kubelet_node import (
    GRPC_PORT, HTTP_PORT, PERIOD_S, Node, fault_pods, free_node_port, http_get, httpd, probe, probe_count as count,
    kill_and_stop_the_shim, restart_containerd, running_node, static_pod,
)
from tests.support.kubelet_views import ReadinessRecorder, log_records

pytestmark = pytest.mark.e2e

GATE = {"CRIProbeDelegation": True}
DELEGATED = {"io.kubernetes.probe.delegated-by": "kubelet"}
GAP_S = 5


@pytest.fixture(scope="module")
def node(containerd: ContainerdEnv):
    reason = kubelet_env.delegation_unavailable_reason(containerd.runtime)
    if reason is not None:
        pytest.skip(reason)
    with running_node(containerd, "delegated-", binary=kubelet_env.delegating_kubelet_binary(),
                      feature_gates=GATE) as node:
        yield node


@pytest.fixture
def k(node):
    """The node, its pods removed after the test (each test starts with none)."""
    yield node
    node.remove_pods()


def delegated_probes(k: Node) -> list[service_pb.Probe]:
    """The shim's rows of the probes the kubelet registered."""
    return list(k.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(
        filter=service_pb.ProbeFilter(label_selector=DELEGATED)), timeout=10).probes)


def delegated_rows(k: Node) -> dict[tuple[str, str], service_pb.Probe]:
    """Those rows by (pod name, probe type)."""
    return {(p.labels["io.kubernetes.pod.name"], spec_pb.ProbeType.Name(p.type)): p for p in delegated_probes(k)}


def events(k: Node, pod: str, reason: str) -> list[str]:
    """The messages of the events the kubelet recorded for the pod with this reason (its log: `Event occurred`)."""
    return [r.values["message"] for r in log_records(k.kubelet.log_text(), "Event occurred")
            if r.values.get("object") == f"default/{pod}" and r.values.get("reason") == reason]


def running_container(k: Node, pod: str, container: str) -> str:
    """The id of the pod's running container, as containerd lists it (the kubelet's labels name both)."""
    answer = k.containerd.cri.call("ListContainers", cri_pb.ListContainersRequest(filter=cri_pb.ContainerFilter(
        state=cri_pb.ContainerStateValue(state=cri_pb.CONTAINER_RUNNING),
        label_selector={"io.kubernetes.pod.name": pod, "io.kubernetes.container.name": container})))
    (found,) = answer.containers
    return found.id


def node_reaches(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


def shut_out_the_node(netns: str, gateway: str) -> None:
    """What a NetworkPolicy denying the node does: the pod's netns drops every packet from the node's bridge."""
    subprocess.run(["nsenter", f"--net={netns}", "iptables", "-I", "INPUT", "-s", gateway, "-j", "DROP"],
                   check=True, capture_output=True, timeout=30)


def gateway_of(k: Node) -> str:
    """The node's address on the pods' bridge (the CNI's gateway, the subnet's first host)."""
    return str(next(ipaddress.ip_network(k.containerd.session.subnet).hosts()))


# --- readiness from the runtime --------------------------------------------------------------------------------------

def test_delegated_probes_make_unconverted_pods_ready_even_where_the_node_cannot_probe(k, in_pod):
    image = k.containerd.images.http
    admin = 8081  # the pods' admin port, on their own 127.0.0.1 only
    pods = {
        "pod-ip": k.apply(static_pod("pod-ip", k.www("pod-ip"), [
            httpd("web", image, readinessProbe=probe(http_get()))]), convert=False),
        "loopback": k.apply(static_pod("loopback", k.www("loopback"), [
            httpd("web", image, listen=f"127.0.0.1:{admin}",
                  readinessProbe=probe(http_get(admin, host="127.0.0.1")))]), convert=False),
        "tcp": k.apply(static_pod("tcp", k.www("tcp"), [
            httpd("web", image, readinessProbe=probe({"tcpSocket": {"port": HTTP_PORT}}))]), convert=False),
        "grpc": k.apply(static_pod("grpc", k.www("grpc"), [
            {"name": "app", "image": image, "imagePullPolicy": "Never",
             "command": ["/bin/busybox", "sleep", "2147483647"],
             "readinessProbe": probe({"grpc": {"port": GRPC_PORT}})}]), convert=False),
    }
    # The node cannot reach this one at all: its netns drops the node's packets before its server starts.
    unreachable = k.apply(static_pod("unreachable", k.www("unreachable"), [
        {"name": "web", "image": image, "imagePullPolicy": "Never",
         "command": ["/bin/sh", "-c", f"until [ -e /www/go ]; do sleep 0.2; done; "
                                      f"exec /bin/busybox httpd -f -p {HTTP_PORT} -h /www"],
         "volumeMounts": [{"name": "www", "mountPath": "/www"}],
         "readinessProbe": probe(http_get())}]), convert=False)
    netns = k.netns_of(unreachable)
    shut_out_the_node(netns, gateway_of(k))
    (k.www("unreachable") / "go").write_text("")
    in_pod(SimpleNamespace(netns_path=k.netns_of(pods["grpc"])),
           [sys.executable, "tests/support/servers/grpc_health_server.py", "--host", "0.0.0.0", "--port", str(GRPC_PORT),
            "--status", "SERVING"])

    ready = k.wait_ready(*pods.values(), unreachable)
    assert all(p.restarts == 0 for p in ready.values())
    assert not node_reaches(ready[unreachable].pod_ip, HTTP_PORT)  # the kubelet's own probe could not have
    rows = delegated_rows(k)
    containers = {"grpc": "app"}
    counts = k.kubelet.probe_counts()
    for key, pod in {**pods, "unreachable": unreachable}.items():
        row = rows[(pod, "READINESS")]
        assert row.status.state == spec_pb.STATE_SUCCESS and not row.HasField("bridged"), key
        assert row.container_name == containers.get(key, "web") and row.labels["io.kubernetes.pod.namespace"] == \
            "default"
        # prober_probe_total counts the runtime's attempts (brought up to its totals at each update).
        assert count(counts, pod, containers.get(key, "web"), "Readiness", "successful") >= 1, (key, counts)
    assert rows[(pods["loopback"], "READINESS")].status.last_attempt.address == f"127.0.0.1:{admin}"
    assert rows[(pods["pod-ip"], "READINESS")].status.last_attempt.address == \
        f"{ready[pods['pod-ip']].pod_ip}:{HTTP_PORT}"
    assert rows[(unreachable, "READINESS")].status.last_attempt.address == \
        f"{ready[unreachable].pod_ip}:{HTTP_PORT}"
    assert "Probe delegation: the container runtime serves the ProbeService" in k.kubelet.log_text()


def test_an_endpoint_made_to_fail_turns_the_pod_not_ready_within_its_thresholds_and_back(k):
    failure_threshold = 2
    www = k.www("flaky")
    name = k.apply(static_pod("flaky", www, [httpd("web", k.containerd.images.http, readinessProbe=probe(
        http_get(), failureThreshold=failure_threshold))]), convert=False)
    k.wait_ready(name)

    with ReadinessRecorder(k.kubelet, [name]) as recorder:
        (www / "healthz").unlink()  # 404 from now on
        failed_at = time.monotonic()
        k.kubelet.wait_for("the pod NOT ready", lambda pods: not pods[name].ready, timeout_s=30)
        # failureThreshold failures at the period, the first up to a period after the file went; slack for the
        # status to reach the read-only port on a loaded machine.
        assert time.monotonic() - failed_at <= (failure_threshold + 1) * PERIOD_S + 2.0

        (www / "healthz").write_text("ok\n")
        back_at = time.monotonic()
        k.wait_ready(name)
        assert time.monotonic() - back_at <= 2 * PERIOD_S + 2.0
    assert k.kubelet.pods()[name].restarts == 0
    assert recorder.logged_changes() == [(name, "not ready"), (name, "ready")]
    # The kubelet's event, with the runtime's output of the failed attempt.
    assert "Readiness probe failed: HTTP probe failed with statuscode: 404" in events(k, name, "Unhealthy")
    assert delegated_rows(k)[(name, "READINESS")].status.totals.failure >= failure_threshold


def test_a_startup_probe_holds_liveness_back_then_failing_liveness_restarts_the_container(k):
    www = k.www("alive")
    name = k.apply(static_pod("alive", www, [httpd(
        "web", k.containerd.images.http,
        startupProbe=probe(http_get(path="/started"), failureThreshold=600),
        livenessProbe=probe(http_get(path="/alive"), failureThreshold=1))]), convert=False)

    counts = k.kubelet.wait_for_counts("3 failed startup probes",
                                       lambda c: count(c, name, "web", "Startup", "failed") >= 3)
    assert not any(key[0] == name and key[2] == "Liveness" for key in counts), counts
    assert (name, "LIVENESS") not in delegated_rows(k)  # not registered before the container has started
    (container,) = k.kubelet.pods()[name].containers.values()
    assert (container.started, container.restart_count) == (False, 0)

    (www / "started").write_text("ok\n")  # startup succeeds; liveness starts and fails: the kubelet restarts it
    k.kubelet.wait_for("a restart", lambda pods: pods[name].restarts >= 1)

    (www / "alive").write_text("ok\n")
    k.kubelet.wait_for_counts("a successful liveness probe",
                              lambda c: count(c, name, "web", "Liveness", "successful") >= 1)
    restarts = k.kubelet.pods()[name].restarts
    k.kubelet.wait_for_counts("3 more successful liveness probes",
                              lambda c: count(c, name, "web", "Liveness", "successful") >= 4)
    pods = k.kubelet.pods()
    assert pods[name].restarts == restarts  # alive: no more restarts
    # The shim probes the container that runs now (the kubelet registered the new one and stopped the old).
    rows = [p for p in delegated_probes(k) if p.labels["io.kubernetes.pod.name"] == name
            and p.type == spec_pb.LIVENESS]
    assert len(rows) == 1 and rows[0].status.state == spec_pb.STATE_SUCCESS
    assert rows[0].container_id == running_container(k, name, "web")


# --- the same timelines as the kubelet's own probing -------------------------------------------------------------------

# A container that becomes started after 2 s, ready 2 s later, and dead (its liveness endpoint gone) 3 s after that,
# on its own clock: the same timeline wherever it runs, whoever probes it.
TIMELINE_SCRIPT = ("/bin/busybox mkdir -p /srv; echo ok > /srv/healthz; "
                   "(sleep 2; echo ok > /srv/started; sleep 2; echo ok > /srv/ready; sleep 3; /bin/busybox rm "
                   "/srv/healthz) & "
                   f"exec /bin/busybox httpd -f -p {HTTP_PORT} -h /srv")


def timeline_pod(image: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "timeline", "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "web", "image": image, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", TIMELINE_SCRIPT],
                "startupProbe": probe(http_get(path="/started"), failureThreshold=30),
                "readinessProbe": probe(http_get(path="/ready")),
                "livenessProbe": probe(http_get(), failureThreshold=2)}]}}


def timeline(k: Node, name: str) -> dict[str, float]:
    """When the kubelet showed the pod's container started, the pod Ready and the container restarted, in seconds
    after it first showed the container running (its read-only port, sampled every 100 ms)."""
    with ReadinessRecorder(k.kubelet, [name]) as recorder:
        # Until the recorder's own samples show the restart (the kubelet's port may show it between two samples).
        deadline = time.monotonic() + 60
        while not any(name in pods and pods[name].restarts >= 1 for _, pods in list(recorder.samples)):
            assert time.monotonic() < deadline, f"no restart of {name} within 60 s:\n{k.kubelet.log_tail(40)}"
            time.sleep(kubelet_env.POLL_S)  # the samples have no event to wait on
    seen: dict[str, float] = {}
    for at, pods in recorder.samples:
        pod = pods.get(name)
        container = pod.containers.get("web") if pod else None
        if container is None:
            continue
        for what, now in (("running", container.running), ("started", container.started), ("ready", pod.ready),
                          ("restarted", pod.restarts >= 1)):
            if now:
                seen.setdefault(what, at)
    assert set(seen) == {"running", "started", "ready", "restarted"}, seen
    return {what: round(at - seen["running"], 1) for what, at in seen.items() if what != "running"}


def registered_types(watch, pod: str) -> set[str]:
    """The types of the pod's probes the watch saw registered (read until all three, or its timeout)."""
    seen: set[str] = set()
    for event in watch:
        if event.type in (service_pb.SNAPSHOT, service_pb.UPDATED) and \
                event.probe.labels["io.kubernetes.pod.name"] == pod:
            seen.add(spec_pb.ProbeType.Name(event.probe.type))
        if len(seen) == 3:
            watch.cancel()
            break
    return seen


def swap_kubelet(k: Node, workdir: str, **options) -> None:
    k.remove_pods()
    k.kubelet.stop()
    k.kubelet = KubeletProcess(k.workdir / workdir, f"unix://{k.shim.socket_path}", **options).start()


def test_the_unpatched_kubelet_shows_the_same_timeline_within_one_period(k):
    image = k.containerd.images.http
    watch = k.shim.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
        filter=service_pb.ProbeFilter(label_selector=DELEGATED)), timeout=120)
    name = k.apply(timeline_pod(image), convert=False)
    delegated = timeline(k, name)
    assert registered_types(watch, name) == {"STARTUP", "READINESS", "LIVENESS"}  # the shim probed them
    binary = k.kubelet.binary
    try:
        swap_kubelet(k, "kubelet-unpatched")  # kubelet_env's 1.37.2, as released
        native = timeline(k, k.apply(timeline_pod(image), convert=False))
        assert delegated_probes(k) == []  # the kubelet probed it itself
    finally:
        swap_kubelet(k, "kubelet", binary=binary, feature_gates=GATE)  # a restart of the delegating kubelet
    for what in ("started", "ready", "restarted"):
        assert abs(delegated[what] - native[what]) <= PERIOD_S + 0.5, (what, delegated, native)


def test_with_the_gate_off_the_same_build_probes_as_upstream_does(k):
    binary = k.kubelet.binary
    admin = free_node_port()  # nothing listens there on the node's own loopback
    try:
        swap_kubelet(k, "kubelet-gate-off", binary=binary)
        pod_ip = k.apply(static_pod("off-pod-ip", k.www("off-pod-ip"), [
            httpd("web", k.containerd.images.http, readinessProbe=probe(http_get()))]), convert=False)
        loopback = k.apply(static_pod("off-loopback", k.www("off-loopback"), [
            httpd("web", k.containerd.images.http, listen=f"127.0.0.1:{admin}",
                  readinessProbe=probe(http_get(admin, host="127.0.0.1")))]), convert=False)
        k.wait_ready(pod_ip)
        # The kubelet probes the node's 127.0.0.1 for the other one: it fails there, as upstream's does.
        k.kubelet.wait_for_counts("3 failed loopback probes",
                                  lambda c: count(c, loopback, "web", "Readiness", "failed") >= 3)
        assert not k.kubelet.pods()[loopback].ready
        assert delegated_probes(k) == [] and "Probe delegation" not in k.kubelet.log_text()
    finally:
        swap_kubelet(k, "kubelet", binary=binary, feature_gates=GATE)


# --- faults -------------------------------------------------------------------------------------------------------------

def test_faults_under_a_delegating_kubelet_flip_nothing(k):
    names = fault_pods(k, convert=False)
    k.wait_ready(*names)

    with ReadinessRecorder(k.kubelet, names) as recorder:
        kill_and_stop_the_shim(k, names, GAP_S)  # the kubelet's watch ends; its registrations stay
        restart_containerd(k, names)

    assert recorder.samples and not recorder.errors
    assert recorder.not_ready_samples() == {}
    assert recorder.logged_changes() == []
    assert recorder.restarts() == {n: 0 for n in names}
    # One registration per probe still (none lost, none doubled), all the kubelet's.
    rows = delegated_rows(k)
    assert sorted(rows) == sorted([(n, "READINESS") for n in names] + [(names[0], "LIVENESS")])
    assert "the kubelet runs its probes itself" not in k.kubelet.log_text()


def test_a_removed_pods_probes_are_stopped_in_the_shim(k):
    name = k.apply(static_pod("gone", k.www("gone"), [httpd("web", k.containerd.images.http,
                                                            readinessProbe=probe(http_get()))]), convert=False)
    k.wait_ready(name)
    assert (name, "READINESS") in delegated_rows(k)
    k.remove_pods()
    # The kubelet stops its probe workers (StopProbe) when it has removed the pod, a moment after the sandbox went.
    deadline = time.monotonic() + 30
    while delegated_probes(k):
        assert time.monotonic() < deadline, delegated_probes(k)
        time.sleep(kubelet_env.POLL_S)  # no event of the kubelet's to wait on


# --- lifecycle hooks ---------------------------------------------------------------------------------------------------

def test_http_hooks_on_the_pods_own_loopback_run_in_the_pod(k):
    """postStart and preStop httpGet hooks to 127.0.0.1: the runtime runs them in the pod (ExecProbe), where the
    kubelet's own would reach the node's loopback."""
    www = k.www("hooked")
    grace_s = 10
    image = k.containerd.images.http
    recorder_port = HTTP_PORT + 1
    loopback = {"host": "127.0.0.1"}
    pod = static_pod("hooked", www, [httpd(
        "app", image, listen=f"127.0.0.1:{HTTP_PORT}",
        lifecycle={"postStart": http_get(recorder_port, "/cgi-bin/record?hook=postStart", **loopback),
                   "preStop": http_get(HTTP_PORT, "/cgi-bin/record?hook=preStop", **loopback)})],
        grace_s=grace_s,
        # A sidecar: the kubelet starts `app` (and so its postStart hook) once the sidecar's startup probe passed.
        initContainers=[httpd("recorder", image, listen=f"127.0.0.1:{recorder_port}", restartPolicy="Always",
                              startupProbe=probe({"tcpSocket": {"port": recorder_port, **loopback}}))])
    name = k.apply(pod, convert=False)
    k.wait_ready(name)
    log = www / "hooks.log"
    (post_start,) = log.read_text().splitlines()
    assert post_start.split()[:2] == ["hook=postStart", f"kube-lifecycle/{KUBELET_VERSION}"]
    assert k.kubelet.pods()[name].restarts == 0  # the hook succeeded: no kill
    # The sidecar's startup probe of its 127.0.0.1 passed in the runtime (which the kubelet stopped once it had).
    assert count(k.kubelet.probe_counts(), name, "recorder", "Startup", "successful") >= 1
    assert (name, "STARTUP") not in delegated_rows(k)

    k.kubelet.remove_manifest("hooked")
    removed_at = time.time()
    deadline = time.monotonic() + grace_s + 30
    while len(log.read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, k.kubelet.log_tail()
        time.sleep(kubelet_env.POLL_S)  # a file has no event to wait on
    pre_stop = log.read_text().splitlines()[1].split()
    assert pre_stop[:2] == ["hook=preStop", f"kube-lifecycle/{KUBELET_VERSION}"]
    assert int(pre_stop[2]) <= removed_at + grace_s  # before the kubelet's grace period ran out
    assert "HTTP lifecycle hook" not in k.kubelet.log_text()  # no hook failed
