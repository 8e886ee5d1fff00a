"""The shim beside a real containerd, driven as the kubelet drives it: every CRI call through the shim's socket.

What each test proves:
- the CRI proxy is invisible: the kubelet's pod and container calls through the shim answer exactly what
  containerd answers directly (field for field, unknown fields and errors included);
- probes run inside the pod: an HTTP readiness probe reaches a server bound to the pod's 127.0.0.1 that the
  node cannot reach at all, a TCP liveness probe and a gRPC startup probe reach the pod IP from the pod;
- liveness semantics with a real container: stopping it fails liveness after failureThreshold periods, a
  kubelet-like restart (new container id, new registration) brings it back;
- sandbox life: StopPodSandbox through the shim ends the worker at once and for good (no reconcile pass brings
  it back while containerd is still stopping the pod), a sandbox removed behind the shim's back is noticed by
  reconciliation, and 20 pod lifecycles leak no worker, fd, netns reference or mount;
- probectl against the real pod.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_env import HTTP_PORT, RECONCILE_INTERVAL_S, TCP_PORT, CriClient, Kubelet, Pod, mounts_under
from tests.support.netns_env import REPO_ROOT

pytestmark = pytest.mark.e2e

PERIOD_MS = 200
WATCH_TIMEOUT_S = 60
STOP_BUDGET_S = 1.0                       # StopPodSandbox through the shim: the worker is gone within this
RECONCILE_GRACE_S = 1.5                   # one reconcile pass (a ListPodSandbox) on a busy machine
CYCLES = 20
STOP_ROUNDS = 5


# --- helpers -----------------------------------------------------------------------------------

def same_answer(direct: CriClient, proxied: CriClient, method: str, request):
    """Asks both ways; the shim's answer must be containerd's, field by field (unknown fields too).

    Go marshals maps in random order, so two answers of containerd differ as bytes even when equal: both
    are compared in protobuf's deterministic (map-sorted) form."""
    response_type = getattr(cri_pb, method + "Response")
    via_shim = response_type.FromString(proxied.raw(method, request))
    at_containerd = response_type.FromString(direct.raw(method, request))
    assert via_shim.SerializeToString(deterministic=True) == at_containerd.SerializeToString(deterministic=True), (
        f"{method} through the shim differs from containerd's answer:\nshim:       {via_shim}\n"
        f"containerd: {at_containerd}")
    return via_shim


def same_error(direct: CriClient, proxied: CriClient, method: str, request) -> grpc.RpcError:
    errors = []
    for client in (proxied, direct):
        with pytest.raises(grpc.RpcError) as caught:
            client.raw(method, request)
        errors.append(caught.value)
    via_shim, at_containerd = errors
    assert (via_shim.code(), via_shim.details()) == (at_containerd.code(), at_containerd.details())
    return via_shim


def canonical(items) -> list[bytes]:
    """List answers come in map order: compare the items as a set, every field (unknown ones too)."""
    return sorted(item.SerializeToString(deterministic=True) for item in items)


def http_spec(path="/healthz", port=HTTP_PORT, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=port)), **kw)


def tcp_spec(port=TCP_PORT, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), **kw)


def grpc_spec(port: int, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=port), **kw)


def run_probe(shim, pod: Pod, container: str, probe_type, spec, cri: CriClient | None = None) -> str:
    """RunProbe as the kubelet would call it for a container: its id, name and start time."""
    container_id = pod.containers.get(container, "")
    started_at = cri.container_status(container_id).started_at if cri and container_id else 0
    return shim.stub.RunProbe(service_pb.RunProbeRequest(
        pod_sandbox_id=pod.id, container_id=container_id, container_name=container, type=probe_type, spec=spec,
        container_started_at=started_at), timeout=30).probe_id


def probe_status(shim, probe_id: str) -> service_pb.Probe | None:
    probes = shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(
        filter=service_pb.ProbeFilter(probe_id=probe_id)), timeout=10).probes
    return probes[0] if probes else None


class Watch:
    """A WatchProbeStatus stream opened before the action it observes; `until` reads it up to a deadline."""

    def __init__(self, shim, timeout_s: float = WATCH_TIMEOUT_S, **filter_fields) -> None:
        self.events: list[service_pb.WatchProbeStatusResponse] = []
        self._stream = shim.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
            filter=service_pb.ProbeFilter(**filter_fields), every_attempt=True), timeout=timeout_s)

    def until(self, predicate: Callable[[service_pb.WatchProbeStatusResponse], bool], what: str):
        try:
            for event in self._stream:
                self.events.append(event)
                if predicate(event):
                    return event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        raise AssertionError(f"watch: {what} did not happen; last events: {self.describe(self.events[-8:])}")

    @staticmethod
    def describe(events) -> list[str]:
        return [f"{service_pb.WatchEventType.Name(e.type)} {e.probe.probe_id} "
                f"{spec_pb.ProbeState.Name(e.probe.status.state)} {spec_pb.AttemptResult.Name(e.probe.status.last_attempt.result)} "
                f"{e.probe.status.last_attempt.output[:80]!r}" for e in events]

    def close(self) -> None:
        self._stream.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_state(probe_id: str, state) -> Callable:
    return lambda e: e.type != service_pb.REMOVED and e.probe.probe_id == probe_id and e.probe.status.state == state


def exit_waiter(pid: int):
    """A pidfd: readable once the process has exited (zombie or reaped), whoever its parent is."""
    return os.pidfd_open(pid)


def exited_within(pidfd: int, timeout_s: float) -> bool:
    readable, _, _ = select.select([pidfd], [], [], max(0.0, timeout_s))
    return bool(readable)


def cannot_connect(host: str, port: int) -> bool:
    """True when this process (the node's network namespace) gets no connection: refused or unreachable."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except OSError:
        return True


def wait_listening(host: str, port: int, timeout_s: float = 30) -> None:
    """Polls (bounded) until the workload accepts connections: a container is started before its program
    listens, and a liveness probe that fails failureThreshold times meanwhile would be put on hold."""
    deadline = time.monotonic() + timeout_s
    while cannot_connect(host, port):
        assert time.monotonic() < deadline, f"nothing listens on {host}:{port} after {timeout_s:g}s"
        time.sleep(0.02)  # polling interval of a readiness check


def host_http_body(url: str) -> str | None:
    """What the NODE gets from url: the body, or None when nothing answers (no proxy in the way)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as answer:
            return answer.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError):
        return None


def probectl(shim, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probectl.cli", "-r", f"unix://{shim.socket_path}", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


# --- 1. the proxy is invisible ----------------------------------------------------------------

def test_kubelet_calls_through_the_shim_answer_what_containerd_answers(containerd, shim, kubelet):
    direct, proxied = containerd.cri, shim.cri
    same_answer(direct, proxied, "Version", cri_pb.VersionRequest(version="v1"))

    pod = kubelet.run_pod("same-answers")
    assert pod.id in [s.id for s in direct.list_sandboxes()]
    via_shim = proxied.call("ListPodSandbox", cri_pb.ListPodSandboxRequest())
    at_containerd = direct.call("ListPodSandbox", cri_pb.ListPodSandboxRequest())
    assert canonical(via_shim.items) == canonical(at_containerd.items)
    status = same_answer(direct, proxied, "PodSandboxStatus",
                         cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id, verbose=True))
    assert status.status.state == cri_pb.SANDBOX_READY and status.status.network.ip == pod.ip
    assert status.status.metadata.name == "same-answers" and "info" in status.info

    http = kubelet.start_container(pod, "http", containerd.images.http)
    container = same_answer(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http)).status
    assert container.state == cri_pb.CONTAINER_RUNNING and container.image.image == containerd.images.http
    listing = cri_pb.ListContainersRequest(filter=cri_pb.ContainerFilter(pod_sandbox_id=pod.id))
    containers = proxied.call("ListContainers", listing).containers
    assert canonical(containers) == canonical(direct.call("ListContainers", listing).containers)
    assert [c.id for c in containers] == [http]

    exec_ok = same_answer(direct, proxied, "ExecSync", cri_pb.ExecSyncRequest(
        container_id=http, cmd=["cat", "/www/healthz"], timeout=10))
    assert (exec_ok.exit_code, exec_ok.stdout) == (0, f"ok {containerd.images.token}\n".encode())
    exec_failed = same_answer(direct, proxied, "ExecSync", cri_pb.ExecSyncRequest(
        container_id=http, cmd=["sh", "-c", "echo oops >&2; exit 3"], timeout=10))
    assert (exec_failed.exit_code, exec_failed.stderr) == (3, b"oops\n")
    missing = same_error(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id="nope"))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    same_error(direct, proxied, "CreateContainer", cri_pb.CreateContainerRequest(
        pod_sandbox_id="nope", config=containerd.container_config("x", containerd.images.http), sandbox_config=pod.config))
    same_error(direct, proxied, "StartContainer", cri_pb.StartContainerRequest(container_id="nope"))

    kubelet.stop_container(http)
    stopped = same_answer(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http)).status
    assert stopped.state == cri_pb.CONTAINER_EXITED and stopped.finished_at >= stopped.started_at
    kubelet.remove_container(http)
    gone = same_error(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http))
    assert gone.code() == grpc.StatusCode.NOT_FOUND

    kubelet.stop_pod(pod)
    not_ready = same_answer(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id))
    assert not_ready.status.state == cri_pb.SANDBOX_NOTREADY
    kubelet.remove_pod(pod)
    same_error(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id))
    assert pod.id not in [s.id for s in proxied.list_sandboxes()] + [s.id for s in direct.list_sandboxes()]


# --- 2. probes inside the pod ------------------------------------------------------------------

def test_probes_run_in_the_pod_and_reach_what_the_node_cannot(containerd, shim, kubelet, in_pod):
    pod = kubelet.run_pod("probed")
    kubelet.start_container(pod, "http", containerd.images.http)
    kubelet.start_container(pod, "tcp", containerd.images.tcp)
    grpc_port = in_pod(pod, [sys.executable, str(REPO_ROOT / "tests/support/servers/grpc_health_server.py"),
                             "--host", "0.0.0.0", "--port", "0"])
    wait_listening(pod.ip, TCP_PORT)

    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        # The startup probe gates the same container's readiness, as in the kubelet.
        startup = run_probe(shim, pod, "http", spec_pb.STARTUP, grpc_spec(grpc_port), shim.cri)
        readiness = run_probe(shim, pod, "http", spec_pb.READINESS, http_spec(target=spec_pb.LOOPBACK), shim.cri)
        liveness = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, tcp_spec(), shim.cri)
        seen: dict[str, service_pb.Probe] = {}

        def all_good(event) -> bool:
            if event.type != service_pb.REMOVED:
                seen[event.probe.probe_id] = event.probe
            return (all(p in seen and seen[p].status.state == spec_pb.STATE_SUCCESS for p in (startup, readiness))
                    and liveness in seen and seen[liveness].status.last_attempt.result == spec_pb.RESULT_SUCCESS)

        watch.until(all_good, "startup and readiness success, a successful liveness attempt")
        readiness_states = [e.probe.status.state for e in watch.events
                            if e.probe.probe_id == readiness and e.type in (service_pb.SNAPSHOT, service_pb.UPDATED)]
        first_success = {p: next(i for i, e in enumerate(watch.events)
                                 if e.probe.probe_id == p and e.probe.status.state == spec_pb.STATE_SUCCESS)
                         for p in (startup, readiness)}

    assert readiness_states[0] != spec_pb.STATE_SUCCESS and readiness_states[-1] == spec_pb.STATE_SUCCESS
    assert first_success[startup] < first_success[readiness], "readiness must wait for the startup probe"

    ready = seen[readiness].status.last_attempt
    assert (ready.address, ready.http_status_code) == (f"127.0.0.1:{HTTP_PORT}", 200)
    assert ready.output == f"ok {containerd.images.token}\n"  # the body, from this session's workload
    assert seen[liveness].status.last_attempt.address == f"{pod.ip}:{TCP_PORT}"
    started = seen[startup].status.last_attempt
    assert (started.address, started.output) == (f"{pod.ip}:{grpc_port}", "service healthy")

    worker = probe_status(shim, readiness).status.worker
    assert worker.state == service_pb.WORKER_RUNNING and worker.netns_path == pod.netns_path
    assert worker.netns_inode == os.stat(pod.netns_path).st_ino == os.stat(f"/proc/{pod.pid}/ns/net").st_ino
    # The worker itself sits in an empty netns of its own: the pod's sockets come from the netns broker.
    assert os.stat(f"/proc/{worker.pid}/ns/net").st_ino not in (worker.netns_inode, os.stat("/proc/self/ns/net").st_ino)

    # The node: the pod is routable (the TCP workload listens on every address), but the HTTP workload,
    # bound to the pod's loopback, is not reachable from the node's network namespace.
    assert not cannot_connect(pod.ip, TCP_PORT), "the pod IP should be reachable from the node"
    assert cannot_connect(pod.ip, HTTP_PORT), "the pod's 127.0.0.1-only server answered on the pod IP"
    node_loopback = host_http_body(f"http://127.0.0.1:{HTTP_PORT}/healthz")
    assert node_loopback is None or containerd.images.token not in node_loopback


# --- 3. liveness and a kubelet-like restart ------------------------------------------------------

def test_liveness_fails_when_the_container_stops_and_recovers_after_a_restart(containerd, shim, kubelet):
    pod = kubelet.run_pod("restarts")
    first = kubelet.start_container(pod, "tcp", containerd.images.tcp)
    wait_listening(pod.ip, TCP_PORT)
    failure_threshold = 3
    spec = tcp_spec(failure_threshold=failure_threshold, timeout_ms=500)

    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        liveness = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, spec, shim.cri)
        watch.until(lambda e: e.probe.probe_id == liveness and e.type == service_pb.ATTEMPT
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, "a successful liveness attempt")
        kubelet.stop_container(first)
        failed = watch.until(is_state(liveness, spec_pb.STATE_FAILURE), "liveness turning failure").probe
    # Attempts read after the stop may still include successes from before it: what counts is the run of
    # failures since the last success, which must be exactly failureThreshold long.
    results = [e.probe.status.last_attempt.result for e in watch.events
               if e.type == service_pb.ATTEMPT and e.probe.probe_id == liveness]
    last_success = max(i for i, r in enumerate(results) if r == spec_pb.RESULT_SUCCESS)
    assert results[last_success + 1:] == [spec_pb.RESULT_FAILURE] * failure_threshold
    assert "connect: connection refused" in failed.status.last_attempt.output
    assert probe_status(shim, liveness).status.on_hold  # no more attempts for a dead container

    # The kubelet: kill, restart (attempt 1, a new container id), and a new probe worker for it.
    kubelet.remove_container(first)
    second = kubelet.start_container(pod, "tcp", containerd.images.tcp, attempt=1)
    assert second != first
    wait_listening(pod.ip, TCP_PORT)
    shim.stub.StopProbe(service_pb.StopProbeRequest(probe_id=liveness), timeout=10)
    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        renewed = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, spec, shim.cri)
        recovered = watch.until(lambda e: e.probe.probe_id == renewed and e.type == service_pb.ATTEMPT
                                and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, "liveness success").probe
    assert renewed != liveness and probe_status(shim, liveness) is None
    assert (recovered.container_id, recovered.status.state, recovered.status.on_hold) == (second, spec_pb.STATE_SUCCESS, False)
    assert recovered.status.consecutive_failures == 0


# --- 4. sandbox life ---------------------------------------------------------------------------

def test_stop_pod_sandbox_through_the_shim_ends_the_worker_for_good(containerd, make_shim):
    # Reconciling every 50 ms makes a pass during containerd's own StopPodSandbox (~0.1 s) near certain:
    # the runtime still says READY then, and that must not bring the worker back.
    shim = make_shim(reconcile_interval_s=0.05)
    kubelet = Kubelet(shim.cri, containerd)
    for n in range(STOP_ROUNDS):
        pod = kubelet.run_pod(f"stopped-{n}")
        probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
        worker = probe_status(shim, probe).status.worker
        assert worker.state == service_pb.WORKER_RUNNING
        pidfd = exit_waiter(worker.pid)
        try:
            with Watch(shim, probe_id=probe) as watch:
                watch.until(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE, "the snapshot")
                began = time.monotonic()
                kubelet.stop_pod(pod)
                assert exited_within(pidfd, began + STOP_BUDGET_S - time.monotonic()), \
                    f"worker {worker.pid} still running {STOP_BUDGET_S:g}s after StopPodSandbox"
                # A stopped sandbox never runs again (CRI): the runtime reports it NOTREADY once its stop is
                # done, and reconciliation drops its probes. Until then no worker may start for it again.
                watch.until(lambda e: e.type == service_pb.REMOVED, "reconciliation dropping the stopped pod's probe")
        finally:
            os.close(pidfd)
        restarted = [e.probe.status.worker for e in watch.events if e.type != service_pb.REMOVED
                     and e.probe.status.worker.state in (service_pb.WORKER_STARTING, service_pb.WORKER_RUNNING)
                     and e.probe.status.worker.pid != worker.pid]
        assert not restarted, f"round {n}: a worker was started again for the stopped sandbox: {restarted[-1]}"
        kubelet.remove_pod(pod)
        assert probe_status(shim, probe) is None


def test_sandbox_removed_behind_the_shims_back_is_noticed_by_reconciliation(containerd, shim, kubelet):
    pod = kubelet.run_pod("removed-directly")
    probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
    worker = probe_status(shim, probe).status.worker
    assert worker.state == service_pb.WORKER_RUNNING
    pidfd = exit_waiter(worker.pid)
    try:
        with Watch(shim, timeout_s=RECONCILE_INTERVAL_S + RECONCILE_GRACE_S + 5, probe_id=probe) as watch:
            watch.until(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE, "the snapshot")
            containerd.cri.call("RemovePodSandbox", cri_pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
            removed_at = time.monotonic()
            watch.until(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe, "the probe's removal")
            noticed_after = time.monotonic() - removed_at
        assert noticed_after <= RECONCILE_INTERVAL_S + RECONCILE_GRACE_S, noticed_after
        assert exited_within(pidfd, 10), f"worker {worker.pid} outlived its sandbox"
    finally:
        os.close(pidfd)
    assert probe_status(shim, probe) is None


@dataclass
class Census:
    """What the daemon side holds (fds of the daemon and zygote, workers, netns references) and the mounts."""
    zygote_pid: int
    daemon_fds: list[str]
    zygote_fds: list[str]
    workers: list[int]                    # the zygote's session: live, zombie or reparented workers
    netns_refs: list[str]
    mounts: list[str]                     # under the session's dir: pod rootfs, shm, netns files

    def settled_as(self, base: "Census") -> bool:
        return (self.zygote_pid == base.zygote_pid and len(self.daemon_fds) <= len(base.daemon_fds)
                and len(self.zygote_fds) <= len(base.zygote_fds) and not self.workers
                and self.netns_refs == base.netns_refs and self.mounts == base.mounts)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return []  # exited meanwhile
    for fd in fds:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass  # closed while listing
    return sorted(targets)


def session_members(sid: int) -> list[int]:
    """Processes of a session, wherever they were reparented: the zygote leads its own session and its
    workers never leave it, so a worker that escaped its supervisor is still found here."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # exited while scanning
            fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state ppid pgrp session ...
            if int(fields[3]) == sid:
                members.append(int(entry))
    return sorted(members)


def census(shim, netns_dir: str, session_dir: str) -> Census:
    daemon = shim.proc.pid
    zygotes = []
    for child in psutil.Process(daemon).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "probe_zygote" in " ".join(child.cmdline()):
                zygotes.append(child.pid)
    assert len(zygotes) == 1, f"expected one zygote among the daemon's children, found {zygotes}"
    zygote = zygotes[0]
    workers = [pid for pid in session_members(zygote) if pid != zygote]
    home = f"net:[{os.stat('/proc/self/ns/net').st_ino}]"  # the broker's way back to the node's netns: kept
    refs = [f"{pid}:{target}" for pid in [daemon, zygote, *workers] for target in _fd_targets(pid)
            if (target.startswith("net:[") and target != home) or target.startswith(netns_dir)]
    return Census(zygote, _fd_targets(daemon), _fd_targets(zygote), workers, sorted(refs), mounts_under(session_dir))


def test_twenty_pod_lifecycles_leak_no_worker_fd_netns_or_mount(containerd, shim, kubelet):
    netns_dir = containerd.session.netns_dir

    def lifecycle(n: int) -> None:
        pod = kubelet.run_pod(f"cycle-{n}")
        probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
        worker = probe_status(shim, probe).status.worker
        assert worker.state == service_pb.WORKER_RUNNING and worker.netns_path == pod.netns_path
        once = shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=pod.id, spec=tcp_spec()), timeout=30)
        # Refused by the pod's own kernel: the attempt ran inside this pod's namespace.
        assert once.attempt.output.endswith(f"dial tcp {pod.ip}:{TCP_PORT}: connect: connection refused")
        if n == 0:  # the census sees a running worker (it would see a leaked one)
            assert worker.pid in snapshot().workers
        pidfd = exit_waiter(worker.pid)
        try:
            kubelet.stop_pod(pod)
            kubelet.remove_pod(pod)
            assert exited_within(pidfd, 10), f"cycle {n}: worker {worker.pid} survived its sandbox"
        finally:
            os.close(pidfd)
        assert probe_status(shim, probe) is None

    def snapshot() -> Census:
        return census(shim, netns_dir, containerd.session.workdir)

    lifecycle(0)  # warm-up: the first pod makes the daemon open what it keeps (connections, caches)
    deadline = time.monotonic() + 10
    base = snapshot()
    while base.workers and time.monotonic() < deadline:
        base = snapshot()  # until the zygote has reaped the warm-up worker
    assert not base.workers and not base.netns_refs, base

    for n in range(1, CYCLES + 1):
        lifecycle(n)

    # Settling is asynchronous (the zygote reaps, grpc closes a stream): poll, bounded.
    deadline = time.monotonic() + 10
    after = snapshot()
    while not after.settled_as(base) and time.monotonic() < deadline:
        after = snapshot()
    assert after.zygote_pid == base.zygote_pid, "the zygote was restarted"
    assert after.workers == [], f"worker processes left: {after.workers}"
    assert after.netns_refs == base.netns_refs, f"netns references left: {after.netns_refs}"
    assert after.mounts == base.mounts, f"mounts left under containerd's dirs: {after.mounts}"
    leaked_daemon = sorted(set(after.daemon_fds) - set(base.daemon_fds))
    assert len(after.daemon_fds) <= len(base.daemon_fds), f"daemon fds grew by {leaked_daemon}"
    leaked_zygote = sorted(set(after.zygote_fds) - set(base.zygote_fds))
    assert len(after.zygote_fds) <= len(base.zygote_fds), f"zygote fds grew by {leaked_zygote}"


# --- 5. probectl ---------------------------------------------------------------------------------

def test_probectl_pods_ps_exec_and_workers_on_a_real_pod(containerd, shim, kubelet):
    pod = kubelet.run_pod("probectl-pod")
    kubelet.start_container(pod, "http", containerd.images.http)
    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        readiness = run_probe(shim, pod, "http", spec_pb.READINESS, http_spec(target=spec_pb.LOOPBACK), shim.cri)
        watch.until(is_state(readiness, spec_pb.STATE_SUCCESS), "readiness success")
    worker = probe_status(shim, readiness).status.worker

    pods = probectl(shim, "pods")
    assert pods.returncode == 0, pods.stderr
    (row,) = [line for line in pods.stdout.splitlines() if line.startswith(pod.id[:13])]
    assert all(text in row for text in ("probectl-pod", "e2e", "Ready", pod.netns_path, str(worker.pid)))

    ps = probectl(shim, "ps", "--pod", pod.id)
    assert ps.returncode == 0, ps.stderr
    (row,) = [line for line in ps.stdout.splitlines() if "readiness" in line]
    assert all(text in row for text in ("http", "http-get", "success"))

    execd = probectl(shim, "exec", "--pod", pod.id, "--http-get", f":{HTTP_PORT}/healthz", "--target", "loopback")
    assert execd.returncode == 0, execd.stdout + execd.stderr
    out = execd.stdout
    assert "success" in out and f"127.0.0.1:{HTTP_PORT}" in out and f"ok {containerd.images.token}" in out
    waterfall = out[out.index("PHASE"):].splitlines()
    assert {"connect", "request", "transfer"} <= {line.split()[0] for line in waterfall[1:] if line.strip()}
    assert all("|" in line for line in waterfall[1:] if line.strip())

    # The same server on the pod IP: refused, since it listens on the pod's loopback only. Exit 4: failure.
    refused = probectl(shim, "exec", "--pod", pod.id, "--http-get", f":{HTTP_PORT}/healthz")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert f"{pod.ip}:{HTTP_PORT}: connect: connection refused" in refused.stdout

    workers = probectl(shim, "workers")
    assert workers.returncode == 0, workers.stderr
    (row,) = [line for line in workers.stdout.splitlines() if line.startswith(str(worker.pid))]
    # One row per worker: its group is named after the pod's Kubernetes namespace (CRI metadata).
    assert row.split()[1:4] == [f"{pod.config.metadata.namespace}#1", "1", pod.id[:13]]
