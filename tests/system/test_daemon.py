"""The daemon end to end: a real `probe-shim serve --runtime-endpoint none`, real netns, real servers.

Every wait is on something the daemon sends (a watch event, a status answer), bounded by
a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import os
import signal
import socket

import grpc
import psutil
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, run, status, tcp_spec, wait_for
from tests.support.netns_env import PodNetns, listen

pytestmark = pytest.mark.netns


def worker_processes(daemon_pid):
    return [p for p in psutil.Process(daemon_pid).children(recursive=True)]


# --- serving --------------------------------------------------------------------------

def test_health_reflection_and_version(daemon):
    reflection = reflection_pb2_grpc.ServerReflectionStub(daemon.channel)
    answer = next(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in answer.list_services_response.service}
    assert {"runtime.probe.v1alpha1.ProbeService", "grpc.health.v1.Health"} <= names
    version = daemon.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=5)
    assert version.api_version == "v1alpha1" and version.runtime_endpoint == "none" and len(version.instance_id) == 32
    assert oct(os.stat(daemon.socket_path).st_mode & 0o777) == "0o660"


def test_register_probe_status_and_replace(daemon, pod_netns):
    server = listen(pod_netns)
    probe_id = run(daemon, pod_netns, tcp_spec(server.port))
    ready = wait_for(daemon, lambda p: p.status.state == spec_pb.STATE_SUCCESS, probe_id)
    assert ready.status.worker.state == service_pb.WORKER_RUNNING and ready.status.worker.pid > 0
    assert ready.status.worker.netns_inode == os.stat(pod_netns.path).st_ino
    assert ready.status.last_attempt.result == spec_pb.RESULT_SUCCESS and len(ready.status.last_trace_id) == 32
    assert ready.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"
    # Same sandbox, container and type: same id, new spec.
    again = run(daemon, pod_netns, tcp_spec(server.port, period_ms=200))
    assert again == probe_id
    (probe,) = status(daemon, pod_sandbox_id=pod_netns.name).probes
    assert probe.spec.period_ms == 200 and probe.status.totals.success >= 1


def test_invalid_specs_and_unknown_sandbox(daemon, pod_netns):
    bad = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(port=spec_pb.PortRef(number=0)), success_threshold=3)
    with pytest.raises(grpc.RpcError) as err:
        run(daemon, pod_netns, bad, probe_type=spec_pb.LIVENESS)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.http_get.port: Invalid value: 0" in err.value.details()
    assert "spec.success_threshold: Invalid value: 3: must be 1" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        daemon.stub.RunProbe(service_pb.RunProbeRequest(pod_sandbox_id="cps-no-such-netns", container_name="a",
                                                        type=spec_pb.READINESS, spec=tcp_spec(80)), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_host_field_is_refused_by_default(daemon, pod_netns):
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80), host="169.254.169.254"))
    with pytest.raises(grpc.RpcError) as err:
        run(daemon, pod_netns, spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.tcp_socket.host: Forbidden" in err.value.details() and "SSRF" in err.value.details()



def node_refuses(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on the node's own loopback at this port: what the kubelet's probe would reach."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        return probe.connect_ex((host, port)) != 0


def test_the_pods_own_loopback_is_probed_without_allow_host(daemon, pod_netns):
    server = listen(pod_netns, host="127.0.0.1")
    assert node_refuses(server.port)  # the node's 127.0.0.1 is not where this answer comes from
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=server.port),
                                                                host="127.0.0.1"), period_ms=100)
    probe_id = run(daemon, pod_netns, spec)  # no --allow-host-field
    probed = wait_for(daemon, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS, probe_id)
    assert probed.status.last_attempt.address == f"127.0.0.1:{server.port}"
    assert probed.spec.tcp_socket.host == "127.0.0.1"  # kept as registered
    daemon.stop()
    assert "probe uses the host field" not in daemon.logs()


def test_localhost_reaches_an_ipv6_only_pods_loopback(tmp_path):
    ns = PodNetns.create(ipv4=False)
    d = DaemonProcess(tmp_path)
    try:
        d.start()
        server = ns.spawn_python("http_server.py", "--host", "::1", "--port", "0")  # bound to ::1 only
        spec = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/echo", port=spec_pb.PortRef(number=server.port),
                                                                host="localhost"))
        answer = d.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=ns.name, spec=spec), timeout=10)
        # 127.0.0.1 first (the kubelet's resolver order) is refused, then ::1 answers, as Go's dialer races them.
        assert answer.attempt.result == spec_pb.RESULT_SUCCESS, answer.attempt.output
        assert answer.attempt.address == f"[::1]:{server.port}"
        assert f"Host: localhost:{server.port}\r\n" in answer.attempt.output  # the URL the kubelet would build
    finally:
        d.stop()
        ns.destroy()


def test_stop_is_idempotent_and_removes_the_worker(daemon, pod_netns):
    server = listen(pod_netns)
    probe_id = run(daemon, pod_netns, tcp_spec(server.port))
    wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)
    stopped = daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=probe_id), timeout=5)
    assert list(stopped.stopped_probe_ids) == [probe_id]
    again = daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=probe_id), timeout=5)
    assert list(again.stopped_probe_ids) == []
    assert status(daemon).probes == []
    sandboxes = daemon.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(), timeout=5).sandboxes
    mine = [s for s in sandboxes if s.id == pod_netns.name]
    assert mine and mine[0].probes == 0 and mine[0].worker.state == service_pb.WORKER_NONE


def test_exec_probe_runs_once_and_traces(daemon, pod_netns):
    server = listen(pod_netns, host="127.0.0.1")
    request = service_pb.ExecProbeRequest(pod_sandbox_id=pod_netns.name, spec=tcp_spec(server.port, target=spec_pb.LOOPBACK))
    parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = daemon.stub.ExecProbe(request, timeout=10,
                                   metadata=[("traceparent", f"00-{parent_trace}-00f067aa0ba902b7-01")])
    assert answer.attempt.result == spec_pb.RESULT_SUCCESS
    assert answer.attempt.address == f"127.0.0.1:{server.port}"
    assert answer.trace_id == parent_trace and len(answer.span_id) == 16


def test_exec_probe_as_a_lifecycle_hook_succeeds_on_any_answer(daemon, pod_netns):
    server = pod_netns.spawn_python("http_server.py", "--host", "0.0.0.0", "--port", "0")

    def run_hook(path: str, lifecycle_hook: bool) -> spec_pb.Attempt:
        spec = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=server.port)))
        return daemon.stub.ExecProbe(service_pb.ExecProbeRequest(
            pod_sandbox_id=pod_netns.name, spec=spec, lifecycle_hook=lifecycle_hook), timeout=10).attempt

    # pkg/kubelet/lifecycle runHTTPHandler: only a failed request fails a hook; a probe fails on a 404.
    hook = run_hook("/status/404", lifecycle_hook=True)
    assert (hook.result, hook.http_status_code, hook.output) == (spec_pb.RESULT_SUCCESS, 404, "")  # body discarded
    assert run_hook("/status/404", lifecycle_hook=False).result == spec_pb.RESULT_FAILURE
    server.stop()
    refused = run_hook("/echo", lifecycle_hook=True)
    assert refused.result == spec_pb.RESULT_FAILURE and "connection refused" in refused.output


def test_run_probe_traceparent_parents_the_attempt_spans(daemon, pod_netns):
    server = listen(pod_netns)
    parent_trace = "0af7651916cd43dd8448eb211c80319c"
    req = service_pb.RunProbeRequest(pod_sandbox_id=pod_netns.name, container_name="app",
                                     type=spec_pb.READINESS, spec=tcp_spec(server.port))
    probe_id = daemon.stub.RunProbe(req, timeout=10,
                                    metadata=[("traceparent", f"00-{parent_trace}-b7ad6b7169203331-01")]).probe_id
    traced = wait_for(daemon, lambda p: p.status.last_trace_id != "", probe_id)
    assert traced.status.last_trace_id == parent_trace


def test_host_field_allowed_by_config_is_used_and_logged(tmp_path, pod_netns):
    d = DaemonProcess(tmp_path, ["--allow-host-field"]).start()
    try:
        server = listen(pod_netns, host=pod_netns.ipv4)
        # Any address but the pod's loopback is behind the gate, the pod's own IP written out included.
        spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=server.port),
                                                                    host=pod_netns.ipv4), period_ms=100)
        probe_id = run(d, pod_netns, spec)
        probed = wait_for(d, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS, probe_id)
        assert probed.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"  # connected from the pod's netns
    finally:
        d.stop()
    assert "probe uses the host field (allowed by config)" in d.logs()


# --- watch ------------------------------------------------------------------------------

def test_watch_snapshot_then_changes_and_resume(daemon, pod_netns):
    server = listen(pod_netns)
    first = run(daemon, pod_netns, tcp_spec(server.port), container="a")
    wait_for(daemon, lambda p: p.status.state == spec_pb.STATE_SUCCESS, first)

    stream = daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(), timeout=15)
    events = iter(stream)
    snapshot = next(events)
    assert snapshot.type == service_pb.SNAPSHOT and snapshot.probe.probe_id == first
    complete = next(events)
    assert complete.type == service_pb.SNAPSHOT_COMPLETE
    instance, last_revision = complete.instance_id, complete.revision
    stream.cancel()

    second = run(daemon, pod_netns, tcp_spec(server.port), container="b")
    daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=first), timeout=5)
    resumed = daemon.stub.WatchProbeStatus(
        service_pb.WatchProbeStatusRequest(instance_id=instance, since_revision=last_revision), timeout=15)
    seen = []
    for event in resumed:
        assert event.type in (service_pb.UPDATED, service_pb.REMOVED), "a resumed watch sends no snapshot"
        assert event.revision > last_revision
        seen.append((event.type, event.probe.probe_id))
        if (service_pb.REMOVED, first) in seen:
            break
    resumed.cancel()
    assert (service_pb.UPDATED, second) in seen

    other = daemon.stub.WatchProbeStatus(
        service_pb.WatchProbeStatusRequest(instance_id="another-daemon", since_revision=last_revision), timeout=15)
    assert next(iter(other)).type == service_pb.SNAPSHOT
    other.cancel()


# --- failures ---------------------------------------------------------------------------

def test_worker_killed_is_restarted_and_probing_resumes(daemon, pod_netns):
    server = listen(pod_netns)
    probe_id = run(daemon, pod_netns, tcp_spec(server.port))
    running = wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING and p.status.last_attempt.result, probe_id)
    os.kill(running.status.worker.pid, signal.SIGKILL)
    restarted = wait_for(daemon, lambda p: p.status.worker.restarts == 1 and p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)
    assert restarted.status.worker.pid != running.status.worker.pid
    assert "signal 9" in restarted.status.worker.last_error or "exited" in restarted.status.worker.last_error
    total = restarted.status.totals.success
    wait_for(daemon, lambda p: p.status.totals.success > total, probe_id)


def test_daemon_restart_restores_every_acknowledged_probe(tmp_path, pod_netns):
    server = listen(pod_netns)
    d = DaemonProcess(tmp_path).start()
    try:
        probe_id = run(d, pod_netns, tcp_spec(server.port))
        old_instance = status(d).instance_id
        d.crash()
        d2 = DaemonProcess(tmp_path).start()
        try:
            restored = status(d2)
            # The same board, going on: watchers resume across the restart (test_handover.py).
            assert restored.instance_id == old_instance
            assert [p.probe_id for p in restored.probes] == [probe_id]
            wait_for(d2, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS, probe_id)
        finally:
            d2.stop()
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_removed_sandbox_drops_its_probes(tmp_path, pod_netns):
    d = DaemonProcess(tmp_path, ["--reconcile-interval", "0.2"]).start()
    try:
        server = listen(pod_netns)
        probe_id = run(d, pod_netns, tcp_spec(server.port))
        wait_for(d, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)
        server.stop()
        os.system(f"ip netns del {pod_netns.name}")
        stream = d.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(), timeout=15)
        for event in stream:
            if event.type == service_pb.REMOVED and event.probe.probe_id == probe_id:
                break
        stream.cancel()
        assert status(d).probes == []
    finally:
        d.stop()


@pytest.mark.parametrize("extra_args, sig", [([], signal.SIGINT), (["--handover-timeout-s", "0"], signal.SIGTERM)])
def test_a_stop_without_handover_stops_everything(tmp_path, pod_netns, extra_args, sig):
    """SIGINT (Ctrl-C), or SIGTERM with no handover: nothing is left running (SIGTERM with a handover leaves the
    workers to the next daemon: test_handover.py)."""
    d = DaemonProcess(tmp_path, extra_args).start()
    server = listen(pod_netns)
    probe_id = run(d, pod_netns, tcp_spec(server.port))
    wait_for(d, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)
    children = worker_processes(d.proc.pid)
    assert children, "the zygote and the worker are the daemon's descendants"
    assert d.stop(sig) == 0
    assert not os.path.exists(d.socket_path)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []


# --- worker groups ----------------------------------------------------------------------------

def test_embedded_namespaces_read_from_netns_names_never_share_a_worker(tmp_path):
    made = [PodNetns.create(with_addresses=False, tenancy=t) for t in ("team-a", "team-a", "team-b")]
    daemon = DaemonProcess(tmp_path, ["--embedded-namespace-separator", "."]).start()
    try:
        probes = {}
        for ns in made:
            server = listen(ns, host="127.0.0.1")
            probes[ns.name] = run(daemon, ns, tcp_spec(server.port, target=spec_pb.LOOPBACK))
        for probe_id in probes.values():
            wait_for(daemon, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS, probe_id)
        workers = {p.pod_sandbox_id: p.status.worker for p in status(daemon).probes}
        a1, a2, b1 = (workers[ns.name] for ns in made)
        assert (a1.group, a2.group, b1.group) == ("team-a#1", "team-a#1", "team-b#1")
        assert a1.pid == a2.pid != b1.pid
        listed = {s.id: s.worker.group_sandboxes
                  for s in daemon.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(), timeout=5).sandboxes}
        assert [listed[ns.name] for ns in made] == [2, 2, 1]
    finally:
        daemon.stop()
        for ns in made:
            ns.destroy()
