"""The kubelet bridge against a real containerd: ExecSync exactly as today's kubelet sends it, through the shim.

The kubelet is not installable here; `Kubelet.exec_sync` (tests/support/cri_client.py) sends what its exec prober and
exec hook runner send (cri-client remote_runtime.go: container id, the command, the timeout in whole seconds;
the call's deadline is 2 minutes plus the timeout, none for a hook), and tests/support/kubelet_exec_model.py reads the
answer as the kubelet's prober (pkg/probe/exec) and hook runner (pkg/kubelet/lifecycle) read it. Expected outputs
are the kubelet's own network probers' texts (pkg/probe/http, tcp, grpc).

What each test proves:
- HTTP success against a server bound to the pod's 127.0.0.1, which the node cannot reach;
- HTTP 500, TCP refused, gRPC SERVING and NOT_SERVING read as the kubelet's own probers would print them;
- a named port resolves from the container's ports as the kubelet hands them to the runtime;
- a probe that outlives its timeout answers with the kubelet's own HTTP timeout text, in time;
- bad arguments answer exit code 2 with the field named; an unknown container gets containerd's own NOT_FOUND;
- the same marker ExecSync sent straight to containerd ends in an error status: the kubelet discards the result
  (fail closed); an ordinary exec through the shim is answered byte for byte as containerd answers it;
- a marker preStop hook performs the GET with the kubelet's hook semantics (any status is a success), and one
  that cannot connect fails the hook with the Go error;
- each bridged attempt is on the status board (a row per handler, ATTEMPT events) and in the metrics with the pod's
  labels.
"""

from __future__ import annotations

import signal
import socket
import sys
import urllib.request

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from probe_api.bridge_command import MARKER, command_for
from tests.support.containerd_session import HTTP_PORT
from tests.support.cri_client import CriClient, Kubelet
from tests.support.daemon_env import DaemonProcess
from tests.support.kubelet_exec_model import hook_error, probe_verdict
from tests.support.netns_env import REPO_ROOT
from tests.support.shim_calls import cannot_connect, probectl

pytestmark = pytest.mark.e2e

PROBE_TIMEOUT_S = 1       # timeoutSeconds of the probes below (the kubelet's default)
CLOSED_PORT = 9999        # nothing listens there in any pod of these tests
HTTP_SERVER = [sys.executable, str(REPO_ROOT / "tests/support/servers/http_server.py"), "--host", "0.0.0.0", "--port", "0"]
GRPC_SERVER = [sys.executable, str(REPO_ROOT / "tests/support/servers/grpc_health_server.py"), "--host", "0.0.0.0",
               "--port", "0", "--status", "SERVING", "--status", "db=NOT_SERVING"]


@pytest.fixture
def pod(containerd, kubelet):
    """A pod whose `http` container serves /healthz on the pod's 127.0.0.1 only, with a named port."""
    pod = kubelet.run_pod("bridged")
    kubelet.start_container(pod, "http", containerd.images.http,
                            ports=[{"name": "web", "containerPort": HTTP_PORT, "protocol": "TCP"}])
    return pod


def probe(kubelet: Kubelet, container_id: str, cmd: list[str], timeout_s: int = PROBE_TIMEOUT_S):
    """The kubelet's exec prober: the answer, and what the kubelet makes of it."""
    try:
        answer = kubelet.exec_sync(container_id, cmd, timeout_s)
    except grpc.RpcError as error:
        return error, probe_verdict(cmd, timeout_s, error)
    return answer, probe_verdict(cmd, timeout_s, answer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readiness(handler: dict, *extra: str) -> list[str]:
    return command_for("readiness", handler) + list(extra)


def test_http_success_in_the_pod_on_what_the_node_cannot_reach(containerd, kubelet, pod):
    answer, verdict = probe(kubelet, pod.containers["http"],
                            readiness({"httpGet": {"path": "/healthz", "port": HTTP_PORT}}, "--target", "loopback"))
    assert (answer.exit_code, verdict.result) == (0, "success")
    assert answer.stdout.decode() == f"ok {containerd.images.token}\n"  # the body, from this session's workload
    assert cannot_connect(pod.ip, HTTP_PORT), "the node reached the pod's loopback-only server"


def test_network_results_read_as_the_kubelets_own_probers(containerd, kubelet, pod, in_pod):
    http_port = in_pod(pod, HTTP_SERVER)
    grpc_port = in_pod(pod, GRPC_SERVER)
    container = pod.containers["http"]
    cases = [
        ({"httpGet": {"path": "/status/500", "port": http_port}}, "failure",
         "HTTP probe failed with statuscode: 500"),
        ({"httpGet": {"path": "/ok", "port": http_port}}, "success", "ok"),
        ({"tcpSocket": {"port": CLOSED_PORT}}, "failure", f"dial tcp {pod.ip}:{CLOSED_PORT}: connect: connection refused"),
        ({"grpc": {"port": grpc_port}}, "success", "service healthy"),
        ({"grpc": {"port": grpc_port, "service": "db"}}, "failure", 'service unhealthy (responded with "NOT_SERVING")'),
    ]
    for handler, result, output in cases:
        answer, verdict = probe(kubelet, container, readiness(handler))
        assert (verdict.result, verdict.output) == (result, output), handler
        assert answer.exit_code == (0 if result == "success" else 1)


def test_a_named_port_resolves_from_the_containers_ports(containerd, kubelet, pod):
    answer, verdict = probe(kubelet, pod.containers["http"],
                            readiness({"httpGet": {"path": "/healthz", "port": "web"}}, "--target", "loopback"))
    assert verdict.result == "success", answer
    answer, verdict = probe(kubelet, pod.containers["http"], readiness({"tcpSocket": {"port": "nope"}}))
    assert answer.exit_code == 2
    assert answer.stderr.decode() == ('cri-probe-shim: bad arguments: tcpSocket.port: unknown named port "nope"')


def test_a_probe_that_outlives_its_timeout_reads_as_the_kubelets_timeout(containerd, kubelet, pod, in_pod):
    port = in_pod(pod, HTTP_SERVER)
    answer, verdict = probe(kubelet, pod.containers["http"], readiness({"httpGet": {"path": "/hang", "port": port}}))
    assert answer.exit_code == 1 and verdict.result == "failure"
    assert verdict.output == (f'Get "http://{pod.ip}:{port}/hang": context deadline exceeded '
                              "(Client.Timeout exceeded while awaiting headers)")


def test_bad_arguments_and_unknown_containers(containerd, kubelet, pod):
    answer, verdict = probe(kubelet, pod.containers["http"], readiness({"httpGet": {"path": "/", "port": 0}}))
    assert answer.exit_code == 2 and verdict.result == "failure"
    assert answer.stderr.decode() == ("cri-probe-shim: bad arguments: httpGet.port: Invalid value: 0: "
                                      "must be between 1 and 65535, inclusive")
    answer, _ = probe(kubelet, pod.containers["http"], [MARKER, "readiness", "--tcp", "10.0.0.1:80"])
    assert answer.exit_code == 2 and "tcpSocket.host: Forbidden: the host field makes the runtime" in answer.stderr.decode()

    cmd = readiness({"tcpSocket": {"port": CLOSED_PORT}})
    error, verdict = probe(kubelet, "0" * 64, cmd)
    direct, _ = probe(Kubelet(containerd.cri, containerd), "0" * 64, cmd)
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND
    assert (error.code(), error.details()) == (direct.code(), direct.details()), "not the runtime's own answer"
    assert verdict.discarded


def test_without_the_shim_a_marker_exec_fails_closed(containerd, kubelet, pod):
    """Sent straight to containerd (a node where the shim is not on the CRI path): the runtime cannot start the
    marker inside the container, ExecSync ends in an error status, and the kubelet discards the result."""
    direct = Kubelet(containerd.cri, containerd)
    cmd = readiness({"tcpSocket": {"port": CLOSED_PORT}})
    error, verdict = probe(direct, pod.containers["http"], cmd)
    assert isinstance(error, grpc.RpcError), f"containerd ran the marker: {error}"
    assert verdict.discarded
    assert hook_error(cmd, error) is not None  # as a hook, it fails: no silent success either


def test_an_ordinary_exec_is_forwarded_byte_for_byte(containerd, kubelet, pod):
    direct = Kubelet(containerd.cri, containerd)
    for cmd in (["/bin/busybox", "echo", "hello", MARKER], ["/bin/busybox", "sh", "-c", "echo oops >&2; exit 3"]):
        assert (kubelet.exec_sync_raw(pod.containers["http"], cmd, 5)
                == direct.exec_sync_raw(pod.containers["http"], cmd, 5))


def test_a_marker_prestop_hook_runs_with_hook_semantics(containerd, kubelet, pod, in_pod):
    port = in_pod(pod, HTTP_SERVER)
    container = pod.containers["http"]
    # The kubelet's preStop: ExecSync with no timeout, then StopContainer (kuberuntime_container.go).
    cmd = command_for("preStop", {"httpGet": {"path": "/status/500", "port": port}})
    answer = kubelet.exec_sync(container, cmd, 0)
    assert hook_error(cmd, answer) is None, "a hook ignores the HTTP status, as the kubelet's does"
    cmd = command_for("preStop", {"httpGet": {"path": "/stop", "port": CLOSED_PORT}})
    answer = kubelet.exec_sync(container, cmd, 0)
    assert hook_error(cmd, answer) == (
        f"command '{' '.join(cmd)}' exited with 1: "
        f'Get "http://{pod.ip}:{CLOSED_PORT}/stop": dial tcp {pod.ip}:{CLOSED_PORT}: connect: connection refused')
    kubelet.stop_container(container)


def test_bridged_attempts_are_visible_like_any_probe(containerd, make_shim):
    metrics_port = free_port()
    shim = make_shim(extra_args=("--metrics-listen", f"127.0.0.1:{metrics_port}"))
    kubelet = Kubelet(shim.cri, containerd)
    pod = kubelet.run_pod("bridged")
    container = kubelet.start_container(pod, "http", containerd.images.http)
    cmd = readiness({"tcpSocket": {"port": CLOSED_PORT}})
    watch = shim.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(every_attempt=True), timeout=30)
    assert next(watch).type == service_pb.SNAPSHOT_COMPLETE
    for _ in range(2):
        assert kubelet.exec_sync(container, cmd, PROBE_TIMEOUT_S).exit_code == 1
    assert kubelet.exec_sync(container, [MARKER, "readyness", "--tcp", "80"], PROBE_TIMEOUT_S).exit_code == 2
    events = [next(watch) for _ in range(3)]
    watch.cancel()
    assert [e.type for e in events] == [service_pb.UPDATED, service_pb.ATTEMPT, service_pb.ATTEMPT]
    row = events[-1].probe
    assert (row.bridged.role, row.container_id, row.container_name, row.pod_sandbox_id) == (
        "readiness", container, "http", pod.id)
    assert row.labels["io.kubernetes.pod.name"] == "bridged" and row.status.totals.failure == 2
    assert row.status.last_attempt.output == f"dial tcp {pod.ip}:{CLOSED_PORT}: connect: connection refused"
    assert [p.name for p in row.status.last_attempt.phases] == ["connect"]

    listed = probectl(shim, "ps", "--pod", pod.id)
    assert listed.returncode == 0, listed.stderr
    assert "bridged" in listed.stdout and f"tcp-socket :{CLOSED_PORT}" in listed.stdout, listed.stdout

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as page:
        text = page.read().decode()
    uid = pod.config.metadata.uid
    assert (f'prober_probe_total{{container="http",namespace="e2e",pod="bridged",pod_uid="{uid}",'
            f'probe_type="Readiness",result="failed"}} 2.0') in text
    assert 'probe_shim_bridged_execs_total{answer="1",role="readiness"} 2.0' in text
    assert 'probe_shim_bridged_execs_total{answer="2",role="invalid"} 1.0' in text  # a typo is no new series


def test_containers_created_behind_the_shim_or_before_a_restart_are_bridged(containerd, make_shim):
    """Nothing the shim remembers is needed: the runtime knows every container."""
    first = make_shim()
    through_first = Kubelet(first.cri, containerd)
    pod = through_first.run_pod("bridged")
    before = through_first.start_container(pod, "http", containerd.images.http)
    first.stop()
    behind = Kubelet(containerd.cri, containerd).start_container(pod, "late", containerd.images.tcp)
    second = Kubelet(make_shim().cri, containerd)
    cmd = readiness({"httpGet": {"path": "/healthz", "port": HTTP_PORT}}, "--target", "loopback")
    for container in (before, behind):
        answer = second.exec_sync(container, cmd, PROBE_TIMEOUT_S)
        assert answer.exit_code == 0 and answer.stdout.decode() == f"ok {containerd.images.token}\n"


def test_the_pods_worker_stays_up_between_calls_and_goes_with_the_pod(containerd, shim, kubelet, pod):
    container = pod.containers["http"]
    cmd = readiness({"tcpSocket": {"port": CLOSED_PORT}})

    def row() -> service_pb.Probe | None:
        probes = shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(
            filter=service_pb.ProbeFilter(pod_sandbox_id=pod.id)), timeout=10).probes
        return probes[0] if probes else None

    kubelet.exec_sync(container, cmd, PROBE_TIMEOUT_S)
    first = row().status.worker
    assert first.state == service_pb.WORKER_RUNNING and first.pid
    kubelet.exec_sync(container, cmd, PROBE_TIMEOUT_S)
    assert row().status.worker.pid == first.pid, "a worker per call: the bridge must keep the pod's worker"

    kubelet.stop_pod(pod)  # the proxy stops the worker before containerd tears the pod down
    # The reconcile pass (every 0.5 s here) may already have dropped the rows of the not-ready sandbox.
    after = row()
    assert after is None or after.status.worker.state == service_pb.WORKER_NONE
    answer = kubelet.exec_sync(container, cmd, PROBE_TIMEOUT_S)
    assert answer.exit_code == 3 and answer.stderr.decode().startswith("cri-probe-shim: cannot probe: ")
    kubelet.remove_pod(pod)
    assert row() is None, "the pod's bridged rows go with it"


def test_a_shim_restart_keeps_the_bridged_rows_and_the_pods_worker(containerd, make_shim, pod):
    """`systemctl restart probe-shim` (SIGTERM, then the same ExecStart): the kubelet's next ExecSync is answered by
    the pod's same worker, adopted by the new shim, and the row the old shim showed is there before it."""
    first = make_shim()
    container = pod.containers["http"]
    cmd = readiness({"httpGet": {"path": "/healthz", "port": HTTP_PORT}}, "--target", "loopback")
    assert Kubelet(first.cri, containerd).exec_sync(container, cmd, PROBE_TIMEOUT_S).exit_code == 0
    (before,) = first.stub.ProbeStatus(service_pb.ProbeStatusRequest(
        filter=service_pb.ProbeFilter(pod_sandbox_id=pod.id)), timeout=10).probes
    assert first.stop(signal.SIGTERM) == 0
    second = DaemonProcess(first.workdir, first.extra_args).start()
    try:
        second.cri = CriClient(second.channel)
        (restored,) = second.stub.ProbeStatus(service_pb.ProbeStatusRequest(
            filter=service_pb.ProbeFilter(pod_sandbox_id=pod.id)), timeout=10).probes
        assert restored.probe_id == before.probe_id and restored.bridged.role == "readiness"
        assert restored.status.last_attempt == before.status.last_attempt and restored.status.totals == before.status.totals
        answer = Kubelet(second.cri, containerd).exec_sync(container, cmd, PROBE_TIMEOUT_S)
        assert answer.exit_code == 0 and answer.stdout.decode() == f"ok {containerd.images.token}\n"
        (after,) = second.stub.ProbeStatus(service_pb.ProbeStatusRequest(
            filter=service_pb.ProbeFilter(pod_sandbox_id=pod.id)), timeout=10).probes
        assert after.status.worker.pid == before.status.worker.pid, "the pod's worker was not adopted"
        assert after.status.totals.success == before.status.totals.success + 1
    finally:
        assert second.stop() == 0
