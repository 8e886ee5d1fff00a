"""Faults: nothing acknowledged is lost, and the daemon neither hangs nor crash-loops.

Each scenario runs against the real daemon (`probe-shim serve`), real network namespaces, real target servers,
real workers forked by the real zygote, and (for the runtime) a real containerd:
- a worker killed with SIGKILL while the daemon runs 750 probes/s (25 sandboxes x 3 TCP probes every 100 ms), in
  both worker modes (pooled: groups of 5 sandboxes; strict: one worker per sandbox): restarted within 1 s, the
  probes of its group resume, the restart is counted, no probe of another group misses a beat;
- the zygote (the netns broker) killed with SIGKILL, in both modes: its workers end with it, come back through a
  new zygote, and their probes resume; the next new sandbox gets a worker;
- the daemon killed with SIGKILL while 1000 RunProbe calls are in flight from 4 clients: every call answered OK is
  registered after the restart, and an open watch resyncs through the new instance id;
- containerd stopped and started again under the shim: proxied CRI calls fail with UNAVAILABLE while it is down and
  work again after, without restarting the shim; probes go on and reconciliation drops nothing meanwhile;
- a sandbox's netns deleted under its running worker; the state dir full, or read-only at start-up.

Every wait is on an event (a watch event, a worker's pidfd, a process exit) with a deadline; nothing sleeps.
Each scenario prints one `FAULT <name>: ...` line with what it measured (`pytest -s` shows them).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import psutil
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb
from probectl.client import ProbeShimClient
from tests.support.containerd_env import CriClient, Kubelet, running_containerd
from tests.support.daemon_env import DaemonProcess, run, status, tcp_spec
from tests.support.netns_env import LISTENER, PodNetns, listen

pytestmark = pytest.mark.netns

RUNNING, NONE = service_pb.WORKER_RUNNING, service_pb.WORKER_NONE
WAIT_S = 30  # generous deadlines: the machine is shared; the bounds the issue sets are asserted separately

# The 750 probes/s load: 25 sandboxes x 3 TCP probes x 10 per second.
SANDBOXES, PROBES_PER_SANDBOX, PERIOD_MS = 25, 3, 100
POOL_SIZE = 5  # sandboxes per pooled worker here: 5 groups, so that a group's restart has others to disturb
# The daemon's flags per worker mode, and how many sandboxes share a worker in it.
MODES = {
    "pooled": (["--worker-isolation", "pooled", "--sandboxes-per-worker", str(POOL_SIZE)], POOL_SIZE),
    "strict": (["--worker-isolation", "sandbox"], 1),
}
RESTART_BOUND_S = 1.0  # the bound: a killed worker is running again within 1 s
# How late another probe's attempt may be across the kill: one period plus this margin. The margin is the
# jitter of 26 processes sharing 2 cores with other work (gaps of 100-370 ms measured here with the load average
# between 4 and 40); a stall of the daemon or of the other workers because of the kill would show as seconds.
GAP_MARGIN_MS = 400
RATE_WINDOW_S = 4
MIN_RATE_SHARE = 0.6  # of the nominal rate, measured over RATE_WINDOW_S before the kill (see the report)


def report(name: str, **values) -> None:
    print(f"\nFAULT {name}: " + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)


# --- targets: one listener process serving 127.0.0.1:PORT inside many network namespaces -------------------

MULTI_LISTENER = r"""
import ctypes, os, selectors, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
def enter(fd):
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")
selector, port = selectors.DefaultSelector(), 0
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    enter(fd)
    os.close(fd)
    s = socket.socket()  # lives in the netns it was created in
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1024)
    s.setblocking(False)
    port = s.getsockname()[1]  # the same port in every namespace
    selector.register(s, selectors.EVENT_READ)
enter(home)
print("READY", port, flush=True)
while True:
    for key, _ in selector.select():
        try:
            key.fileobj.accept()[0].close()
        except OSError:
            pass
"""


def serve_loopback(namespaces: list[PodNetns]):
    """A TCP listener on 127.0.0.1 in each namespace (one process for all: 25 servers would cost 25 interpreters)."""
    return namespaces[0].spawn([sys.executable, "-c", MULTI_LISTENER, *(ns.path for ns in namespaces)])


def loopback_spec(port: int, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    return tcp_spec(port, target=spec_pb.LOOPBACK, **kw)


@pytest.fixture
def make_netns():
    """make_netns(n): n fresh pod network namespaces (loopback only), all deleted at teardown."""
    made: list[PodNetns] = []

    def make(count: int) -> list[PodNetns]:
        for _ in range(count):
            made.append(PodNetns.create(with_addresses=False))
        return made[-count:]

    yield make
    for ns in made:
        ns.destroy()


# --- watching a daemon ---------------------------------------------------------------------------------------

@dataclass
class Seen:
    at: float  # time.monotonic() when the event arrived
    type: int
    probe: service_pb.Probe
    instance_id: str


class EventLog:
    """Every event of one WatchProbeStatus stream (every attempt included), read by a thread; tests wait on it."""

    def __init__(self, stub: service_grpc.ProbeServiceStub, every_attempt: bool = True) -> None:
        self.events: list[Seen] = []
        self.error: grpc.RpcError | None = None
        self._cond = threading.Condition()
        self._call = stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(every_attempt=every_attempt))
        self._thread = threading.Thread(target=self._read, name="event log", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                seen = Seen(time.monotonic(), event.type, event.probe, event.instance_id)
                with self._cond:
                    self.events.append(seen)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def wait(self, predicate: Callable[[Seen], bool], since: int = 0, timeout: float = WAIT_S) -> Seen:
        """The first event at or after index `since` that satisfies predicate."""
        deadline = time.monotonic() + timeout
        with self._cond:
            index = since
            while True:
                while index < len(self.events):
                    if predicate(self.events[index]):
                        return self.events[index]
                    index += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"no such event within {timeout}s (watch error: {self.error})")
                self._cond.wait(remaining)

    def attempts(self, since: int = 0) -> list[Seen]:
        with self._cond:
            return [e for e in self.events[since:] if e.type == service_pb.ATTEMPT]

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=10)


class Pidfd:
    """A process watched through a pidfd (works for processes that are not our children, even once reaped)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)

    def kill(self) -> None:
        signal.pidfd_send_signal(self.fd, signal.SIGKILL)

    def wait(self, timeout: float = WAIT_S) -> float:
        """time.monotonic() when the kernel reports the process dead."""
        try:
            readable, _, _ = select.select([self.fd], [], [], timeout)
            assert readable, f"process {self.pid} still alive after {timeout}s"
            return time.monotonic()
        finally:
            os.close(self.fd)


def kill_and_wait(pid: int) -> float:
    """SIGKILL; returns time.monotonic() when the process is dead."""
    process = Pidfd(pid)
    process.kill()
    return process.wait()


def max_gaps_ms(attempts: list[Seen], probe_ids: set[str], window_ns: tuple[int, int]) -> dict[str, float]:
    """Per probe, the longest time between two consecutive attempt starts inside the window."""
    starts: dict[str, list[int]] = {pid: [] for pid in probe_ids}
    for seen in attempts:
        started = seen.probe.status.last_attempt.started_at_unix_ns
        if seen.probe.probe_id in starts and window_ns[0] <= started <= window_ns[1]:
            starts[seen.probe.probe_id].append(started)
    gaps = {}
    for probe_id, times in starts.items():
        times.sort()
        gaps[probe_id] = max((b - a for a, b in zip(times, times[1:])), default=float("inf")) / 1e6
    return gaps


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def daemon_children(daemon: DaemonProcess) -> list[psutil.Process]:
    return psutil.Process(daemon.proc.pid).children()


def zygote_of(daemon: DaemonProcess) -> psutil.Process:
    """The daemon's child running probe_zygote.main that is not a worker (adopted workers carry the zygote's argv too)."""
    workers = {p.status.worker.pid for p in status(daemon).probes}
    (zygote,) = [p for p in daemon_children(daemon)
                 if "probe_zygote" in " ".join(p.cmdline()) and p.pid not in workers]
    return zygote


# --- a worker killed at 750 probes/s --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(MODES))
def test_worker_killed_at_750_probes_per_second_is_back_within_a_second(tmp_path, make_netns, mode):
    flags, group_size = MODES[mode]
    metrics_port = free_tcp_port()
    daemon = DaemonProcess(tmp_path, ["--metrics-listen", f"127.0.0.1:{metrics_port}", *flags]).start()
    events = None
    try:
        namespaces = make_netns(SANDBOXES)
        server = serve_loopback(namespaces)
        events = EventLog(daemon.stub)
        probes: dict[str, str] = {}  # probe id -> sandbox
        for ns in namespaces:
            for c in range(PROBES_PER_SANDBOX):
                probes[run(daemon, ns, loopback_spec(server.port), container=f"c{c}")] = ns.name
        assert len(probes) == SANDBOXES * PROBES_PER_SANDBOX

        # Steady state: every probe has succeeded since all were registered; then the rate the workers
        # achieve, from the attempts' own start times over RATE_WINDOW_S.
        settled = events.mark()
        for probe_id in probes:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, settled)
        window = (time.time_ns(), time.time_ns() + RATE_WINDOW_S * 1_000_000_000)
        for probe_id in probes:  # a probe's attempts arrive in order: past this one, its window is complete
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.started_at_unix_ns >= window[1], settled)
        rate = sum(window[0] <= e.probe.status.last_attempt.started_at_unix_ns < window[1]
                   for e in events.attempts(settled)) / RATE_WINDOW_S

        old = status(daemon, pod_sandbox_id=namespaces[0].name).probes[0].status.worker
        # The victim's group: every sandbox its worker serves.
        victims = {p.pod_sandbox_id for p in status(daemon).probes if p.status.worker.pid == old.pid}
        assert len(victims) == group_size
        victim_probes = {p for p, sid in probes.items() if sid in victims}
        kill_mark = events.mark()
        killed_at_ns = time.time_ns()
        dead_at = kill_and_wait(old.pid)
        running = max((events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.pod_sandbox_id == victim
                                   and e.probe.status.worker.state == RUNNING and e.probe.status.worker.restarts == 1, kill_mark)
                       for victim in victims), key=lambda e: e.at)
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                               and e.at > running.at, kill_mark) for probe_id in victim_probes]
        # Two seconds of the others' attempts after the kill, to look for a gap.
        after = killed_at_ns + 2_000_000_000
        others = set(probes) - victim_probes
        for probe_id in others:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.started_at_unix_ns > after, kill_mark)
        attempts = events.attempts()
        around = max_gaps_ms(attempts, others, (killed_at_ns - 1_000_000_000, after))
        before = max_gaps_ms(attempts, others, (killed_at_ns - 4_000_000_000, killed_at_ns - 1_000_000_000))

        restarted = [p for p in status(daemon).probes if p.pod_sandbox_id in victims]
        assert {p.status.worker.restarts for p in restarted} == {1}
        assert len({p.status.worker.pid for p in restarted}) == 1 and restarted[0].status.worker.pid not in (0, old.pid)
        assert restarted[0].status.worker.last_error == "exited with signal 9 (SIGKILL)"
        assert {p.status.worker.restarts for p in status(daemon).probes if p.pod_sandbox_id not in victims} == {0}
        assert metric(metrics_port, "probe_shim_worker_restarts_total") == 1
        assert metric(metrics_port, "probe_shim_workers") == SANDBOXES // group_size

        restart_s = running.at - dead_at
        resume_s = max(e.at for e in resumed) - dead_at
        worst_gap = max(around.values())
        report(f"worker-kill ({mode})", sandboxes=SANDBOXES, group=group_size, probes=len(probes), period_ms=PERIOD_MS,
               rate_per_s=f"{rate:.0f}", restart_s=f"{restart_s:.3f}", first_attempts_after_s=f"{resume_s:.3f}",
               others_max_gap_ms=f"{worst_gap:.0f}", others_max_gap_before_ms=f"{max(before.values()):.0f}")
        # Below the nominal 750/s only when other work starves the 2 cores; still a heavy load.
        assert rate >= MIN_RATE_SHARE * SANDBOXES * PROBES_PER_SANDBOX * 1000 / PERIOD_MS
        assert restart_s < RESTART_BOUND_S, f"the worker took {restart_s:.3f}s to be running again"
        late = {p: g for p, g in around.items() if g > PERIOD_MS + GAP_MARGIN_MS}
        assert not late, f"other probes missed a beat across the kill: {late}"
    finally:
        if events is not None:
            events.close()
        daemon.stop()


# --- the zygote killed ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
def test_zygote_killed_its_workers_come_back_through_a_new_one_and_probing_resumes(tmp_path, make_netns, mode):
    daemon = DaemonProcess(tmp_path, MODES[mode][0]).start()
    namespaces = make_netns(4)
    server = serve_loopback(namespaces)
    events = EventLog(daemon.stub)
    try:
        probes = {run(daemon, ns, loopback_spec(server.port)): ns.name for ns in namespaces[:3]}
        for probe_id in probes:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
        workers = {p.pod_sandbox_id: p.status.worker.pid for p in status(daemon).probes}
        assert len(set(workers.values())) == (1 if mode == "pooled" else 3)
        zygote = zygote_of(daemon)
        mark = events.mark()
        dead_at = kill_and_wait(zygote.pid)

        # The zygote was the workers' netns broker: they end with it and are started again by a new zygote.
        running = [events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.pod_sandbox_id == sandbox
                               and e.probe.status.worker.state == RUNNING and e.probe.status.worker.restarts == 1, mark)
                   for sandbox in workers]
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                               and e.at > max(r.at for r in running)
                               and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
                   for probe_id in probes]
        new_zygote = zygote_of(daemon)
        assert new_zygote.pid != zygote.pid
        after = status(daemon).probes
        assert {p.status.worker.last_error for p in after} == {"exited with code 3"}  # probe_worker.main.EXIT_BROKER_GONE
        assert {psutil.Process(p.status.worker.pid).ppid() for p in after} == {new_zygote.pid}
        assert [pid for pid in workers.values() if psutil.pid_exists(pid)] == []  # reaped, no zombie left

        # The next new sandbox gets a worker from the new zygote.
        asked = time.monotonic()
        new_probe = run(daemon, namespaces[3], loopback_spec(server.port))
        answered = time.monotonic()
        first = events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == new_probe
                            and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        assert psutil.Process(first.probe.status.worker.pid).ppid() == new_zygote.pid
        report(f"zygote-kill ({mode})", workers=len(set(workers.values())),
               probing_again_after_s=f"{max(e.at for e in resumed) - dead_at:.3f}",
               new_sandbox_run_probe_s=f"{answered - asked:.3f}", new_sandbox_first_attempt_s=f"{first.at - asked:.3f}")
        assert "zygote exited with signal 9 (SIGKILL)" in daemon.logs()
    finally:
        events.close()
        assert daemon.stop() == 0


# --- the daemon killed with RunProbe calls in flight --------------------------------------------------------

class WatchLog:
    """probectl's resumable watch (what probectl watch uses), followed by a thread."""

    def __init__(self, endpoint: str) -> None:
        self.client = ProbeShimClient(endpoint)
        self.events: list[tuple[float, service_pb.WatchProbeStatusResponse]] = []
        self.reconnects: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="watch log", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        watch = self.client.watch(on_reconnect=lambda error, delay: self.reconnects.append(str(error)))
        for event in watch:
            with self._cond:
                self.events.append((time.monotonic(), event))
                self._cond.notify_all()

    def wait(self, predicate: Callable[[service_pb.WatchProbeStatusResponse], bool], timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        with self._cond:
            index = 0
            while True:
                while index < len(self.events):
                    if predicate(self.events[index][1]):
                        return index, self.events[index][0]
                    index += 1
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no such watch event within {timeout}s"
                self._cond.wait(remaining)

    def wait_for_view(self, wanted: set[str], after: float, timeout: float = WAIT_S) -> tuple[float, bool]:
        """Waits until the probes the watcher sees (snapshots and changes applied in order, as a client keeps its
        view) are `wanted`, on events received after `after`; returns when, and whether a full state came."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                view: set[str] = set()
                pending: set[str] | None = None
                resynced = False
                for at, event in self.events:
                    if event.type == service_pb.SNAPSHOT:
                        pending = (pending or set()) | {event.probe.probe_id}
                        resynced = resynced or at > after
                    elif event.type == service_pb.SNAPSHOT_COMPLETE:
                        view, pending = pending or set(), None
                        resynced = resynced or at > after
                    elif event.type == service_pb.UPDATED:
                        view.add(event.probe.probe_id)
                    elif event.type == service_pb.REMOVED:
                        view.discard(event.probe.probe_id)
                if self.events and self.events[-1][0] > after and view == wanted and pending is None:
                    return self.events[-1][0], resynced
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"the watcher's view is not the stored probes within {timeout}s"
                self._cond.wait(remaining)

    def close(self) -> None:
        self.client.close()
        self._thread.join(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_daemon_killed_with_1000_run_probe_calls_in_flight_keeps_every_acknowledged_probe(tmp_path, make_netns):
    clients, calls, sandboxes = 4, 1000, 20  # 50 probes per sandbox (max_probes_per_sandbox is 64)
    kill_after_ok = 300
    namespaces = make_netns(sandboxes)
    server = serve_loopback(namespaces)
    daemon = DaemonProcess(tmp_path).start()
    watch = WatchLog(f"unix://{daemon.socket_path}")
    channels = [grpc.insecure_channel(f"unix://{daemon.socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    restarted = None
    try:
        _, _ = watch.wait(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE)
        old_instance = daemon.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10).instance_id
        ok: dict[str, str] = {}  # container -> probe id, for every call answered OK
        failed: dict[str, grpc.StatusCode] = {}
        lock, enough = threading.Lock(), threading.Event()

        def done(container: str, future: grpc.Future) -> None:
            with lock:
                error = future.exception()
                if error is None:
                    ok[container] = future.result().probe_id
                    if len(ok) >= kill_after_ok:
                        enough.set()
                else:
                    failed[container] = error.code()

        futures = []
        for i in range(calls):
            ns = namespaces[i % sandboxes]
            request = service_pb.RunProbeRequest(
                pod_sandbox_id=ns.name, container_name=f"c{i}", type=spec_pb.READINESS,
                spec=loopback_spec(server.port, period_ms=60_000))
            future = service_grpc.ProbeServiceStub(channels[i % clients]).RunProbe.future(request, timeout=120)
            future.add_done_callback(lambda f, c=f"c{i}": done(c, f))
            futures.append(future)
        assert enough.wait(WAIT_S * 4), f"only {len(ok)} RunProbe calls answered OK"
        daemon.proc.kill()
        killed_at = time.monotonic()
        daemon.proc.wait()
        for future in futures:
            try:
                future.result(timeout=WAIT_S)
            except grpc.RpcError:
                pass
        with lock:
            acknowledged = dict(ok)
            codes = sorted({code.name for code in failed.values()})
        assert len(acknowledged) + len(failed) == calls
        daemon.stop()

        restarted = DaemonProcess(tmp_path).start()
        up_at = time.monotonic()  # start() returns once the new daemon answers its health check
        stored = {p.probe_id for p in status(restarted).probes}
        listed = sum(s.probes for s in restarted.stub.ListProbeSandboxes(
            service_pb.ListProbeSandboxesRequest(), timeout=10).sandboxes)
        missing = set(acknowledged.values()) - stored
        new_instance = restarted.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10).instance_id

        # The open watch comes back by itself, on the same board (its instance id survives): it resumes from its
        # last revision if the store had it, else (a registration the kill caught before its revision was stored)
        # it gets the full state. Either way its view ends up being exactly the stored probes.
        resynced_at, resynced = watch.wait_for_view(stored, after=killed_at)
        report("daemon-kill", clients=clients, calls=calls, ok_before_kill=len(acknowledged),
               failed=len(failed), failure_codes="/".join(codes), stored_after_restart=len(stored),
               acknowledged_missing=len(missing), stored_not_acknowledged=len(stored - set(acknowledged.values())),
               new_daemon_answering_after_kill_s=f"{up_at - killed_at:.2f}",
               watch_caught_up_after_kill_s=f"{resynced_at - killed_at:.2f}", watch_full_state=resynced,
               watch_reopens=len(watch.reconnects))
        assert not missing, f"{len(missing)} acknowledged probes lost: {sorted(missing)[:5]}"
        assert listed == len(stored)
        assert new_instance == old_instance
    finally:
        watch.close()
        for channel in channels:
            channel.close()
        if restarted is not None:
            restarted.stop()
        daemon.stop()


# --- a sandbox's netns deleted under its worker -----------------------------------------------------------

@contextlib.contextmanager
def probing_daemon(tmp_path, ns: PodNetns, port: int):
    """A daemon (reconciling every 0.5 s) with one loopback probe in ns, yielded once that probe has succeeded:
    (daemon, its EventLog, the successful attempt). Stops both on exit."""
    daemon = DaemonProcess(tmp_path, ["--reconcile-interval", "0.5"]).start()
    events = EventLog(daemon.stub)
    try:
        probe_id = run(daemon, ns, loopback_spec(port))
        yield daemon, events, events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                                          and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
    finally:
        events.close()
        daemon.stop()


def test_netns_deleted_under_a_running_worker_stops_it_and_says_why(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = listen(ns, host="127.0.0.1")  # it keeps the namespace alive after its name is deleted
    with probing_daemon(tmp_path, ns, server.port) as (daemon, events, probed):
        probe_id = probed.probe.probe_id
        worker = Pidfd(probed.probe.status.worker.pid)
        mark = events.mark()
        deleted_at = time.monotonic()
        subprocess.run(["ip", "netns", "del", ns.name], check=True)
        why = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                          and e.probe.status.worker.last_error.startswith("sandbox gone"), mark)
        removed = events.wait(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe_id, mark)
        stopped_at = worker.wait()
        in_between = [e for e in events.attempts(mark) if e.probe.probe_id == probe_id and e.at < why.at]
        report("netns-deleted", reconcile_interval_s=0.5, removed_after_s=f"{removed.at - deleted_at:.3f}",
               worker_gone_after_s=f"{stopped_at - deleted_at:.3f}", attempts_in_deleted_netns=len(in_between),
               reason=repr(why.probe.status.worker.last_error))
        assert why.probe.status.worker.last_error == f"sandbox gone: no network namespace at {ns.path} any more"
        assert why.probe.status.worker.state == NONE
        assert status(daemon).probes == []
        assert daemon.proc.poll() is None


def test_netns_replaced_under_the_same_name_is_a_new_sandbox(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = listen(ns, host="127.0.0.1")
    with probing_daemon(tmp_path, ns, server.port) as (daemon, events, probed):
        probe_id = probed.probe.probe_id
        old_inode = probed.probe.status.worker.netns_inode
        mark = events.mark()
        # Faster than a reconcile pass: the worker would otherwise probe the old namespace for ever.
        subprocess.run(["ip", "netns", "del", ns.name], check=True)
        subprocess.run(["ip", "netns", "add", ns.name], check=True)
        new_inode = os.stat(ns.path).st_ino
        why = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                          and e.probe.status.worker.last_error.startswith("sandbox gone"), mark)
        events.wait(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe_id, mark)
        assert why.probe.status.worker.last_error == (f"sandbox gone: the network namespace at {ns.path} was replaced "
                                               f"(inode {old_inode}, now {new_inode})")
        # Registered again (same id: same sandbox, container and type), it runs in the new namespace.
        removed = events.mark()
        assert run(daemon, ns, loopback_spec(server.port)) == probe_id
        moved = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                            and e.probe.status.worker.state == RUNNING, removed)
        assert moved.probe.status.worker.netns_inode == new_inode


# --- the state dir full, or read-only ------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """tmp_path/state as a 1 MiB tmpfs (unmounted at teardown)."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    yield state
    subprocess.run(["umount", "-l", str(state)], check=True)


def fill(directory) -> int:
    """Writes a filler file until the file system is full; returns its size."""
    path = os.path.join(directory, "filler")
    written = 0
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                written += f.write(bytes(65536))
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC
    while True:  # the last partial page too
        try:
            with open(path, "ab", buffering=0) as f:
                written += f.write(bytes(512))
        except OSError:
            return written


def test_full_state_dir_answers_unavailable_stores_nothing_and_recovers(tmp_path, small_tmpfs, make_netns):
    (ns,) = make_netns(1)
    server = serve_loopback([ns])
    daemon = DaemonProcess(tmp_path).start()
    assert daemon.state_dir == str(small_tmpfs)
    restarted = None
    try:
        first = run(daemon, ns, loopback_spec(server.port), container="a")
        fill(small_tmpfs)
        with pytest.raises(grpc.RpcError) as refused:
            run(daemon, ns, loopback_spec(server.port), container="b")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        message = refused.value.details()
        assert f"state directory {small_tmpfs} is not writable: [Errno 28] No space left on device" in message
        # A replacement is refused the same way and the stored registration stays in force.
        with pytest.raises(grpc.RpcError) as replaced:
            run(daemon, ns, loopback_spec(server.port, period_ms=200), container="a")
        assert replaced.value.code() == grpc.StatusCode.UNAVAILABLE
        # So is a removal: the probe stays registered and running rather than come back after a restart.
        with pytest.raises(grpc.RpcError) as stopped:
            daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=first), timeout=10)
        assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not removed" in stopped.value.details()
        (only,) = status(daemon).probes
        assert (only.probe_id, only.spec.period_ms) == (first, PERIOD_MS)
        assert daemon.proc.poll() is None  # no crash, it goes on serving
        assert status(daemon).probes[0].status.worker.state == RUNNING

        os.unlink(small_tmpfs / "filler")
        second = run(daemon, ns, loopback_spec(server.port), container="b")  # recovered without a restart
        daemon.crash()
        restarted = DaemonProcess(tmp_path).start()
        stored = sorted(p.probe_id for p in status(restarted).probes)
        report("state-dir-full", code=refused.value.code().name, message=repr(message),
               stored_after_restart=len(stored))
        assert stored == sorted([first, second])
    finally:
        if restarted is not None:
            restarted.stop()
        daemon.stop()


def serve_once(tmp_path) -> subprocess.CompletedProcess:
    """`probe-shim serve` as DaemonProcess runs it, expected to exit by itself."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(
        [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none", "--listen",
         f"unix://{tmp_path}/shim.sock", "--state-dir", str(tmp_path / "state"), "--metrics-listen", ""],
        capture_output=True, text=True, timeout=60, env=env)


def test_read_only_state_dir_is_a_one_line_error_at_start_and_loses_nothing(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = serve_loopback([ns])
    state = tmp_path / "state"
    daemon = DaemonProcess(tmp_path).start()
    mounted = False
    try:
        first = run(daemon, ns, loopback_spec(server.port), container="a")
        # Read-only over a running daemon: its open database is on the mount below, and it keeps storing there
        # (the kernel refuses a read-only remount of a file system with files open for writing).
        subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
        mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        second = run(daemon, ns, loopback_spec(server.port), container="b")
        assert daemon.stop() == 0

        started = time.monotonic()
        refused = serve_once(tmp_path)
        lines = (refused.stdout + refused.stderr).strip().splitlines()
        report("state-dir-read-only", exit_code=refused.returncode, exit_after_s=f"{time.monotonic() - started:.2f}",
               output=repr(lines))
        assert refused.returncode == 1
        assert len(lines) == 1 and "Traceback" not in lines[0]
        assert f"state directory {state} is not writable: [Errno 30] Read-only file system" in lines[0]
        assert not [name for name in os.listdir(state) if "corrupt" in name]  # nothing moved aside

        subprocess.run(["umount", str(state)], check=True)
        mounted = False
        daemon = DaemonProcess(tmp_path).start()
        assert sorted(p.probe_id for p in status(daemon).probes) == sorted([first, second])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(state)], check=False)
        daemon.stop()


# --- containerd restarted under the shim --------------------------------------------------------------------

@pytest.fixture(scope="module")
def containerd():
    """A private real containerd (tests/support/containerd_env.py), as the e2e suite starts it."""
    with running_containerd(unavailable=pytest.skip) as env:
        yield env
        if env.proc.poll() is not None:  # a test failed while it was down: the teardown removes pods through it
            env.start_containerd()


def in_netns(netns_path: str, argv: list[str]) -> tuple[subprocess.Popen, int]:
    """Runs argv in a network namespace (nsenter) and waits for its `READY <port>` line."""
    proc = subprocess.Popen(["nsenter", f"--net={netns_path}", *argv], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv} printed {line!r}, not READY")
    return proc, int(line.split()[1])


def cri_error(cri, method: str, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        cri.call(method, request, timeout_s=10)
    return caught.value


RECONCILE_S = 0.5
RECOVERY_POLL_S = 0.05  # the shim's upstream channel reconnects by itself; nothing signals it: ask this often


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_containerd_restarted_under_the_shim_unavailable_then_back_without_restarting_it(tmp_path, containerd):
    shim = DaemonProcess(tmp_path, ["--runtime-endpoint", containerd.endpoint,
                                    "--reconcile-interval", str(RECONCILE_S)]).start()
    cri = CriClient(shim.channel)
    listener = events = None
    try:
        pod = Kubelet(cri, containerd).run_pod("faults")
        listener, port = in_netns(pod.netns_path, [sys.executable, "-c", LISTENER, "0.0.0.0", "0"])
        events = EventLog(shim.stub)

        def register(container: str) -> str:
            return shim.stub.RunProbe(service_pb.RunProbeRequest(
                pod_sandbox_id=pod.id, container_name=container, type=spec_pb.READINESS,
                spec=tcp_spec(port, period_ms=PERIOD_MS)), timeout=10).probe_id

        probe_id = register("app")
        probed = events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                             and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
        assert probed.probe.status.last_attempt.address == f"{pod.ip}:{port}"
        worker_pid, shim_pid = probed.probe.status.worker.pid, shim.proc.pid

        # containerd down.
        mark = events.mark()
        down_at_ns = time.time_ns()
        containerd.stop_containerd()
        asked = time.monotonic()
        version_error = cri_error(cri, "Version", cri_pb.VersionRequest(version="v1"))
        failed_in_s = time.monotonic() - asked
        list_error = cri_error(cri, "ListPodSandbox", cri_pb.ListPodSandboxRequest())
        with pytest.raises(grpc.RpcError) as run_error:  # the sandbox cannot be resolved: nothing is stored
            register("other")
        with pytest.raises(grpc.RpcError) as exec_error:
            shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=pod.id, spec=tcp_spec(port)), timeout=10)
        # Probing goes on, and four reconcile passes later nothing was dropped.
        down_for = down_at_ns + int(4 * RECONCILE_S * 1e9)
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                    and e.probe.status.last_attempt.started_at_unix_ns > down_for
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        during = [p.probe_id for p in status(shim).probes]
        skipped = shim.logs().count("reconcile skipped")

        # containerd back: the same shim serves the CRI again, on its own (its channel reconnects).
        containerd.start_containerd()
        up_at = time.monotonic()
        while True:
            try:
                cri.call("Version", cri_pb.VersionRequest(version="v1"), timeout_s=10)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - up_at < WAIT_S, exc
                threading.Event().wait(RECOVERY_POLL_S)
        recovered_s = time.monotonic() - up_at
        listed = {s.id: s.state for s in cri.list_sandboxes()}
        second = register("other")
        back_at_ns = time.time_ns()
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == second
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        # Two reconcile passes with containerd back drop nothing either.
        settled = back_at_ns + int(2 * RECONCILE_S * 1e9)
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                    and e.probe.status.last_attempt.started_at_unix_ns > settled, mark)
        after = status(shim).probes
        gaps = max_gaps_ms(events.attempts(mark), {probe_id}, (down_at_ns, settled))

        report("containerd-restart", cri_code_while_down=version_error.code().name,
               cri_failed_in_s=f"{failed_in_s:.3f}", run_probe_while_down=run_error.value.code().name,
               exec_probe_while_down=exec_error.value.code().name, reconcile_passes_skipped=skipped,
               probe_max_gap_ms=f"{max(gaps.values()):.0f}", cri_back_after_s=f"{recovered_s:.2f}",
               shim_restarted=shim.proc.pid != shim_pid, worker_restarted=after[0].status.worker.pid != worker_pid)
        for error in (version_error, list_error, run_error.value, exec_error.value):
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        assert during == [probe_id] and skipped >= 1
        assert listed.get(pod.id) == cri_pb.SANDBOX_READY
        assert sorted(p.probe_id for p in after) == sorted([probe_id, second])
        assert {(p.status.worker.pid, p.status.worker.restarts) for p in after} == {(worker_pid, 0)}
        assert shim.proc.poll() is None and shim.proc.pid == shim_pid
        assert not [e for e in events.events[mark:] if e.type == service_pb.REMOVED]
        assert max(gaps.values()) <= PERIOD_MS + GAP_MARGIN_MS

        # The shim restarted while containerd is down: every probe is restored and waits (saying why), and
        # probing resumes by itself once containerd is back (a reconcile pass starts the worker).
        events.close()
        containerd.stop_containerd()
        assert shim.stop() == 0
        shim = DaemonProcess(tmp_path, shim.extra_args).start()
        events = EventLog(shim.stub)
        waiting = status(shim).probes
        assert sorted(p.probe_id for p in waiting) == sorted([probe_id, second])
        assert {p.status.worker.state for p in waiting} == {NONE}
        assert all(p.status.worker.last_error.startswith("waiting for the runtime: PodSandboxStatus") for p in waiting)
        back_at = time.monotonic()
        containerd.start_containerd()
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == p
                               and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS) for p in (probe_id, second)]
        report("containerd-down-at-shim-start", probes_restored=len(waiting),
               probing_again_after_containerd_started_s=f"{max(e.at for e in resumed) - back_at:.2f}")
    finally:
        if events is not None:
            events.close()
        if listener is not None:
            listener.kill()
            listener.wait()
            listener.stdout.close()
        shim.stop()
        if containerd.proc.poll() is None:
            containerd.remove_all_sandboxes()
