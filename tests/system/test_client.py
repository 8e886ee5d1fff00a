"""ProbeShimClient against a real `probe-shim serve` (embedded mode, or in front of the fake runtime), real netns
and real servers.

Every wait is on something the daemon sends; watches are bounded by a watchdog that closes the client (the
iteration then ends and the test fails on its assertion) instead of sleeping.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probectl import NotFoundError, ProbeShimClient, RuntimeUnavailableError, ShimError, ShimUnavailable
from probectl.client import ENDPOINT_ENV
from tests.support.daemon_env import DaemonProcess, tcp_spec
from tests.support.netns_env import REPO_ROOT, listen

pytestmark = pytest.mark.netns

WATCH_DEADLINE_S = 30


@pytest.fixture
def client(daemon):
    with ProbeShimClient(f"unix://{daemon.socket_path}", timeout_s=10) as c:
        yield c


@contextlib.contextmanager
def watchdog(client: ProbeShimClient, seconds: float = WATCH_DEADLINE_S):
    """Closes the client if the block overruns: a stuck watch then ends instead of hanging the run."""
    timer = threading.Timer(seconds, client.close)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def next_matching(events, predicate, seen=None):
    for event in events:
        if seen is not None:
            seen.append(event)
        if predicate(event):
            return event
    raise AssertionError("the watch ended before the expected event")


def until_snapshot_complete(events):
    return next_matching(events, lambda e: e.type == service_pb.SNAPSHOT_COMPLETE)


# --- reaching the shim ---------------------------------------------------------------------------

def test_version_and_no_runtime_in_embedded_mode(client, daemon):
    version = client.version()
    assert version.api_version == "v1alpha1" and version.runtime_endpoint == "none"
    assert version.instance_id == daemon.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=5).instance_id
    assert client.runtime_version() is None
    assert client.list_pod_sandboxes() is None


def test_endpoint_comes_from_the_environment_then_the_default(daemon, monkeypatch):
    monkeypatch.setenv(ENDPOINT_ENV, f"unix://{daemon.socket_path}")
    with ProbeShimClient() as c:
        assert c.endpoint == f"unix://{daemon.socket_path}"
        assert c.version().runtime_endpoint == "none"
    monkeypatch.delenv(ENDPOINT_ENV)
    with ProbeShimClient() as c:
        assert c.endpoint == "unix:///run/probe-shim/probe-shim.sock"
    with ProbeShimClient(daemon.socket_path) as c:  # a bare path, as crictl accepts it
        assert c.version().runtime_endpoint == "none"


def test_nobody_serving_the_socket_is_shim_unavailable(tmp_path):
    missing = f"unix://{tmp_path}/missing.sock"
    with ProbeShimClient(missing) as c, pytest.raises(ShimUnavailable) as err:
        c.probes()
    assert str(err.value) == (f"cannot reach the probe shim at {missing}: is `probe-shim serve` running? "
                              "(set -r/--runtime-endpoint or PROBE_SHIM_ENDPOINT)")
    # A socket file left by a crashed daemon: it exists, nobody accepts.
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as leftover:
        leftover.bind(str(stale))
        with ProbeShimClient(f"unix://{stale}") as c, pytest.raises(ShimUnavailable) as err:
            c.version()
    assert "connection refused" in err.value.details.lower()
    with ProbeShimClient(missing) as c, pytest.raises(ShimUnavailable):
        next(c.watch())  # the first open is not retried


def test_malformed_endpoint_is_a_value_error():
    for endpoint in ("none", "unix://relative.sock", "http://x"):
        with pytest.raises(ValueError, match="endpoint"):
            ProbeShimClient(endpoint)


# --- probes ------------------------------------------------------------------------------------------

def test_run_list_get_and_stop_probes(client, daemon, pod_netns):
    server = listen(pod_netns)
    probe_id = client.run_probe(pod_netns.name, "app", spec_pb.READINESS, tcp_spec(server.port),
                                labels={"team": "web"},
                                container_ports=[spec_pb.ContainerPort(name="web", container_port=server.port)])
    with watchdog(client):
        ready = next_matching(client.watch(every_attempt=True),
                              lambda e: e.probe.probe_id == probe_id and e.probe.status.state == spec_pb.STATE_SUCCESS)
    assert ready.probe.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"

    (listed,) = client.probes(pod_sandbox_id=pod_netns.name)
    assert listed.probe_id == probe_id and listed.container_name == "app" and dict(listed.labels) == {"team": "web"}
    assert [p.probe_id for p in client.probes(labels={"team": "web"}, probe_type=spec_pb.READINESS)] == [probe_id]
    assert client.probes(labels={"team": "db"}) == [] and client.probes(probe_type=spec_pb.LIVENESS) == []
    got = client.probe(probe_id)
    assert got.container_ports[0].name == "web" and got.status.worker.state == service_pb.WORKER_RUNNING

    (sandbox,) = [s for s in client.sandboxes() if s.id == pod_netns.name]
    assert sandbox.probes == 1 and sandbox.netns_path == pod_netns.path and sandbox.worker.pid > 0

    assert client.stop_probes(probe_id=probe_id) == [probe_id]
    assert client.stop_probes(probe_id=probe_id) == []  # idempotent
    with pytest.raises(NotFoundError) as err:
        client.probe(probe_id)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and probe_id in str(err.value)


def test_stop_by_container_then_by_sandbox(client, pod_netns):
    server = listen(pod_netns)
    ids = {(name, kind): client.run_probe(pod_netns.name, name, kind, tcp_spec(server.port))
           for name, kind in (("a", spec_pb.READINESS), ("a", spec_pb.LIVENESS), ("b", spec_pb.STARTUP))}
    assert len(set(ids.values())) == 3
    stopped = client.stop_probes(pod_sandbox_id=pod_netns.name, container_id="a")
    assert sorted(stopped) == sorted([ids["a", spec_pb.READINESS], ids["a", spec_pb.LIVENESS]])
    assert client.stop_probes(pod_sandbox_id=pod_netns.name) == [ids["b", spec_pb.STARTUP]]
    assert client.probes() == []


def test_daemon_errors_are_one_line_with_their_code(client, pod_netns):
    bad = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(port=spec_pb.PortRef(number=0)), success_threshold=3)
    with pytest.raises(ShimError) as err:
        client.run_probe(pod_netns.name, "app", spec_pb.LIVENESS, bad)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and not isinstance(err.value, NotFoundError)
    message = str(err.value)
    assert "\n" not in message and message.startswith("INVALID_ARGUMENT: ")
    assert "spec.http_get.port: Invalid value: 0" in message and "spec.success_threshold" in message
    # The same errors as data, field by field, as the message words them.
    assert [(v.field, v.type, v.value, v.detail) for v in err.value.violations] == [
        ("spec.http_get.port", "Invalid value", "0", "must be between 1 and 65535, inclusive"),
        ("spec.success_threshold", "Invalid value", "3", "must be 1"),
    ]
    assert "; ".join(f"{v.field}: {v.type}: {v.value}: {v.detail}" for v in err.value.violations) == err.value.details
    with pytest.raises(NotFoundError) as err:
        client.run_probe("cps-no-such-netns", "app", spec_pb.READINESS, tcp_spec(80))
    assert "cps-no-such-netns" in str(err.value)


def test_exec_probe_returns_the_attempt_and_its_trace(client, pod_netns):
    server = listen(pod_netns, host="127.0.0.1")
    parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = client.exec_probe(pod_netns.name, tcp_spec(server.port, target=spec_pb.LOOPBACK),
                               traceparent=f"00-{parent_trace}-00f067aa0ba902b7-01")
    assert answer.attempt.result == spec_pb.RESULT_SUCCESS
    assert answer.attempt.address == f"127.0.0.1:{server.port}"
    assert answer.trace_id == parent_trace and [p.name for p in answer.attempt.phases] == ["connect"]
    # Nobody listens on the pod IP at that port (the server is bound to the pod's loopback).
    refused = client.exec_probe(pod_netns.name, tcp_spec(server.port), probe_type=spec_pb.LIVENESS)
    assert refused.attempt.result == spec_pb.RESULT_FAILURE and "connection refused" in refused.attempt.output


# --- watch ---------------------------------------------------------------------------------------------

class UnixRelay:
    """A byte relay from one unix socket to the daemon's: cut() drops every live connection (as a broken
    transport would) while the daemon keeps running, and new connections keep working."""

    def __init__(self, path: str, upstream: str) -> None:
        self.path, self.upstream = path, upstream
        self.accepted = 0
        self._live: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(path)
        self._listener.listen(16)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.upstream)
            with self._lock:
                self.accepted += 1
                self._live += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            live, self._live = self._live, []
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def test_watch_resumes_after_a_dropped_connection_without_a_snapshot(tmp_path, daemon, client, pod_netns):
    server = listen(pod_netns)
    first = client.run_probe(pod_netns.name, "a", spec_pb.READINESS, tcp_spec(server.port))
    relay = UnixRelay(str(tmp_path / "relay.sock"), daemon.socket_path)
    reconnects = []
    try:
        with ProbeShimClient(f"unix://{relay.path}", timeout_s=10) as through_relay, watchdog(through_relay):
            events = through_relay.watch(on_reconnect=lambda error, delay: reconnects.append(error))
            seen = []
            complete = next_matching(events, lambda e: e.type == service_pb.SNAPSHOT_COMPLETE, seen)
            assert [e.probe.probe_id for e in seen if e.type == service_pb.SNAPSHOT] == [first]
            # Drop the transport, then change the state while the watch is away: the changes must come
            # as a replay from the revision the client had, not as a new snapshot.
            relay.cut()
            second = client.run_probe(pod_netns.name, "b", spec_pb.READINESS, tcp_spec(server.port))
            client.stop_probes(probe_id=first)
            after = []
            next_matching(events, lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == first, after)
    finally:
        relay.close()
    assert relay.accepted == 2, "the watch re-opened over a new connection"
    assert reconnects and isinstance(reconnects[0], ShimUnavailable)
    assert all(e.type in (service_pb.UPDATED, service_pb.REMOVED) for e in after), [e.type for e in after]
    assert all(e.instance_id == complete.instance_id and e.revision > complete.revision for e in after)
    assert any(e.type == service_pb.UPDATED and e.probe.probe_id == second for e in after)
    revisions = [e.revision for e in after]
    assert revisions == sorted(set(revisions)), "no change delivered twice"


def test_watch_resumes_across_a_daemon_crash_without_a_full_state(tmp_path, pod_netns):
    server = listen(pod_netns)
    d = DaemonProcess(tmp_path).start()
    restarted = None
    reconnects = []
    try:
        with ProbeShimClient(f"unix://{d.socket_path}", timeout_s=10) as c, watchdog(c):
            probe_id = c.run_probe(pod_netns.name, "app", spec_pb.READINESS, tcp_spec(server.port))
            events = c.watch(every_attempt=True, on_reconnect=lambda error, delay: reconnects.append(error))
            before = until_snapshot_complete(events)
            # Steady: ready, and two attempts since (the state change is in the store some ms after it is shown).
            next_matching(events, lambda e: e.probe.status.state == spec_pb.STATE_SUCCESS
                          and e.probe.status.consecutive_successes >= 3)
            d.crash()
            restarted = DaemonProcess(tmp_path).start()  # same socket and state dir: the same board goes on
            resumed = []
            after = next_matching(events, lambda e: e.type == service_pb.ATTEMPT, resumed)
            assert after.instance_id == before.instance_id == c.version().instance_id
            assert [e for e in resumed if e.type in (service_pb.SNAPSHOT, service_pb.SNAPSHOT_COMPLETE,
                                                     service_pb.RESYNC)] == []
            assert {e.probe.probe_id for e in resumed} == {probe_id}
            assert {e.probe.status.state for e in resumed} == {spec_pb.STATE_SUCCESS}
    finally:
        for daemon in (d, restarted):
            if daemon is not None and daemon.proc.poll() is None:
                daemon.stop()
    assert reconnects and all(isinstance(error, ShimUnavailable) for error in reconnects)


def test_close_from_another_thread_ends_a_watch(client, pod_netns):
    snapshot_done = threading.Event()
    received = []

    def follow():
        for event in client.watch():
            received.append(event.type)
            if event.type == service_pb.SNAPSHOT_COMPLETE:
                snapshot_done.set()

    follower = threading.Thread(target=follow)
    follower.start()
    assert snapshot_done.wait(WATCH_DEADLINE_S)
    client.close()
    follower.join(WATCH_DEADLINE_S)
    assert not follower.is_alive() and received == [service_pb.SNAPSHOT_COMPLETE]


def test_without_reconnect_a_drop_raises(tmp_path, daemon, pod_netns):
    relay = UnixRelay(str(tmp_path / "relay.sock"), daemon.socket_path)
    try:
        with ProbeShimClient(f"unix://{relay.path}", timeout_s=10) as c, watchdog(c):
            events = c.watch(reconnect=False)
            until_snapshot_complete(events)
            relay.cut()
            with pytest.raises(ShimUnavailable):
                next(events)
    finally:
        relay.close()


# --- in front of a runtime -----------------------------------------------------------------------------

SANDBOX = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def runtime(tmp_path, pod_netns):
    sock = tmp_path / "cri.sock"
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests/support/servers/fake_runtime.py"), "--socket", str(sock),
         "--sandbox-id", SANDBOX, "--netns", pod_netns.path, "--ip", pod_netns.ipv4],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    assert ready and proc.stdout.readline().startswith("READY")
    yield proc, f"unix://{sock}"
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=10)
    proc.stdout.close()


def test_runtime_version_and_sandboxes_through_the_proxy(tmp_path, runtime):
    proc, endpoint = runtime
    d = DaemonProcess(tmp_path, ["--runtime-endpoint", endpoint]).start()
    try:
        with ProbeShimClient(f"unix://{d.socket_path}", timeout_s=10) as c:
            assert c.version().runtime_endpoint == endpoint
            version = c.runtime_version()
            assert (version.runtime_name, version.runtime_version) == ("fake-runtime", "9.9")
            (pod,) = c.list_pod_sandboxes()
            assert (pod.id, pod.state) == (SANDBOX, cri_pb.SANDBOX_READY)

            proc.terminate()
            proc.wait(timeout=10)
            # The shim answers, the runtime behind it does not: never "is probe-shim serve running?".
            with pytest.raises(RuntimeUnavailableError) as err:
                c.runtime_version()
            assert "container runtime behind the shim" in str(err.value)
            with pytest.raises(ShimError) as err:
                c.run_probe(SANDBOX, "app", spec_pb.READINESS, tcp_spec(80))
            assert not isinstance(err.value, ShimUnavailable) and err.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        d.stop()
    assert not os.path.exists(d.socket_path)
