"""Scenario 7: the daemon restarted under N sandboxes x 3 probes (HTTP, TCP, gRPC) at 1 s, without a flap.

One state dir, one daemon at a time (embedded mode, pooled workers, --handover-timeout-s far above any gap), the
sandboxes in NAMESPACES Kubernetes-like namespaces as in bench/scale.py, one target process, no flapping target:
every probe stays SUCCESS, so any state change a watcher sees across a restart is a flap. Measured:
- steady state, over a window: attempts/s (prober_probe_total) and what the store behind the board costs at that
  rate: transactions/s and rows/s (probe_shim_state_writes_total, probe_shim_state_rows_written_total);
- per restart, in this order: SIGTERM (the workers are handed over), then kill -9 (they are left running), each
  followed by a new daemon on the same state dir:
  - stop: signal to the old daemon's exit (a SIGTERM'd one ends its watch streams at once, detaches its workers
    and stores the board); start: launch of the new one to its health check answering SERVING, which it does only
    once it has adopted, polled every few ms on a channel of its own (a client's reconnect backoff would add up
    to seconds); gap: signal to SERVING, the time no daemon answers;
  - adoption: the pre-restart workers that serve all their sandboxes again (same pid) at SERVING, the sandboxes
    with the same worker at SERVING and after the settle window, probe_shim_adopted_workers (the daemon's count),
    probe_shim_worker_restarts_total;
  - after a settle window, the new daemon's counters (they start at 0; the attempts made while no daemon
    listened reach it with the ticks they missed): ticks missed + attempts late, and the attempts it counted
    against those due since the old daemon exited (nothing lost: close to 1);
  - a plain watch, run as a client does (its own channel; connected before, ended by the restart, resumed from
    the instance id and revision it last received): its UPDATED events whose state differs from the probe's
    state before the restart (flaps: 0 expected), and whether a SNAPSHOT or RESYNC came instead of the changes
    it missed (none expected). daemon_age_s says how long the daemon ran before its restart.
At the end SIGINT stops the daemon and, through it, every zygote and worker, adopted ones included (checked).

    python bench/suite.py --mode quick --only restart      # root; this scenario alone
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import signal
import time
import urllib.error
from dataclasses import dataclass

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import promtext
from bench.env import SPECS, BenchDaemon
from bench.scale import NAMESPACES, PERIOD_MS
from bench.targets import TargetProcess
from bench.watching import WatchThread
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from shim.workers.grouping import POOLED
from tests.support.netns_env import PodNetns

KINDS = ("SIGTERM", "kill -9")
HANDOVER_TIMEOUT_S = 900  # far above any gap here: the workers must never stop on their own
STOP_TIMEOUT_S = 60.0
SERVING_TIMEOUT_S = 30.0  # DaemonProcess.start gives up (and kills the daemon) after 20 s
WRITES, ROWS, ADOPTED, RESTARTS = ("probe_shim_state_writes_total", "probe_shim_state_rows_written_total",
                                   "probe_shim_adopted_workers", "probe_shim_worker_restarts_total")
PR_SET_CHILD_SUBREAPER = 36
FAST_RECONNECT = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 5),
                  ("grpc.min_reconnect_backoff_ms", 5), ("grpc.max_reconnect_backoff_ms", 20)]


@dataclass(frozen=True)
class RestartParams:
    sandboxes: int
    warmup_s: float
    steady_s: float
    settle_s: float


def serving_at(socket_path: str, timeout_s: float = SERVING_TIMEOUT_S) -> float:
    """time.monotonic() of the first health check answering SERVING on that socket."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"unix://{socket_path}", options=FAST_RECONNECT) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1, wait_for_ready=True)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic()
            time.sleep(0.002)
    raise TimeoutError(f"no SERVING on {socket_path} within {timeout_s:g} s")


class ResumingWatch:
    """A plain watch that resumes from the last (instance id, revision) it received, as a client should; between
    two connections it counts the event types and the flaps: UPDATED to a state other than the probe's before.
    A client of its own (its own channel): the daemon, not the benchmark, ends its stream at a restart."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.channel: grpc.Channel | None = None
        self.instance_id, self.revision = "", 0
        self.states: dict[str, int] = {}
        self.before: dict[str, int] = {}
        self.types: collections.Counter = collections.Counter()
        self.flaps = 0
        self.snapshot_changed = 0
        self.thread: WatchThread | None = None

    def connect(self) -> dict:
        """Opens the watch from where the last one ended; returns that point."""
        self.before, self.types, self.flaps, self.snapshot_changed = dict(self.states), collections.Counter(), 0, 0
        self.channel = grpc.insecure_channel(f"unix://{self.socket_path}",
                                             options=[("grpc.use_local_subchannel_pool", 1)])
        stub = service_grpc.ProbeServiceStub(self.channel)
        self.thread = WatchThread(stub, service_pb.WatchProbeStatusRequest(
            instance_id=self.instance_id, since_revision=self.revision), self._on_event)
        return {"instance_id": self.instance_id, "since_revision": self.revision}

    def _on_event(self, _received: int, event: service_pb.WatchProbeStatusResponse) -> None:
        self.types[service_pb.WatchEventType.Name(event.type)] += 1
        self.instance_id = event.instance_id
        if event.type != service_pb.SNAPSHOT:  # a partial snapshot is no resume point; RESYNC's revision is one
            self.revision = event.revision
        probe = event.probe
        changed = probe.probe_id in self.before and probe.status.state != self.before[probe.probe_id]
        self.flaps += changed and event.type == service_pb.UPDATED
        self.snapshot_changed += changed and event.type == service_pb.SNAPSHOT  # a flap a resync would hide
        if event.type in (service_pb.SNAPSHOT, service_pb.UPDATED):
            self.states[probe.probe_id] = probe.status.state
        elif event.type == service_pb.REMOVED:
            self.states.pop(probe.probe_id, None)

    def ended(self, timeout_s: float = 10.0) -> str:
        """Waits for the stream to end (its daemon went); returns how it ended."""
        self.thread.thread.join(timeout_s)
        alive = self.thread.thread.is_alive()
        self.stop()
        return "still open" if alive else self.thread.error or "CANCELLED"

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def child_subreaper(on: bool) -> None:
    """Orphans of our descendants become our children: a zygote whose daemon went is ours to reap (and to see
    among the suite's leftovers), not init's; and its parent is not 1, where the tests' cleanup fixture kills
    every orphaned zygote of the machine (tests/conftest.py)."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class RestartRig:
    def __init__(self, params: RestartParams, stack: contextlib.ExitStack) -> None:
        self.params = params
        child_subreaper(True)
        stack.callback(child_subreaper, False)
        self.targets = TargetProcess()
        stack.callback(self.targets.stop)
        self.sandboxes: list[PodNetns] = []
        stack.callback(self._destroy_sandboxes)
        self.shim_processes: dict[int, psutil.Process] = {}
        stack.callback(self._kill_strays)  # after the daemon: a failed restart leaves its workers running
        self.daemon = BenchDaemon(["--worker-isolation", POOLED, "--embedded-namespace-separator", ".",
                                   "--handover-timeout-s", str(HANDOVER_TIMEOUT_S)])
        stack.callback(self.daemon.close)
        self.serving_since = time.monotonic()  # of the daemon now running
        self.watch = ResumingWatch(self.daemon.process.socket_path)
        stack.callback(self.watch.stop)
        self.probes = 0

    def _destroy_sandboxes(self) -> None:
        for ns in self.sandboxes:
            ns.destroy()

    def populate(self) -> float:
        began = time.monotonic()
        for i in range(self.params.sandboxes):
            ns = PodNetns.create(tenancy=f"ns-{i % NAMESPACES:02d}")
            self.sandboxes.append(ns)
            self.targets.add(ns.name, 0.0)
            for kind, make_spec in SPECS.items():
                self.daemon.run_probe(ns.name, kind, make_spec(PERIOD_MS))
                self.probes += 1
        self.watch.connect()
        return round(time.monotonic() - began, 1)

    # ---------------------------------------------------------------- readings

    def scrape(self) -> tuple[dict[str, float], float]:
        """Every series summed (prober_probe_total too), and the instant of the scrape."""
        for _ in range(50):  # /metrics comes up just after the health check first answers
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                began = time.monotonic()
                text = self.daemon.metrics()
                return promtext.sample_sums(text), (began + time.monotonic()) / 2
            time.sleep(0.1)
        return promtext.sample_sums(self.daemon.metrics()), time.monotonic()

    def worker_of_sandbox(self) -> dict[str, int]:
        """The worker pid (0: none running) of each of our sandboxes (the daemon lists every netns of the node)."""
        ours = {ns.name for ns in self.sandboxes}
        listed = self.daemon.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(), timeout=30).sandboxes
        return {s.id: s.worker.pid for s in listed if s.id in ours}

    def track_shim_processes(self) -> None:
        """The zygote(s) and workers of this state dir (forks of `python -m probe_zygote.main --handover-dir DIR`)."""
        marker = self.daemon.process.state_dir
        for p in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(p.info["cmdline"] or ())
            if "probe_zygote" in cmdline and marker in cmdline:
                self.shim_processes.setdefault(p.pid, p)

    def _wait_shim_processes(self, timeout_s: float) -> list[int]:
        """Waits for every zygote and worker seen to end (reaping those orphaned to us); returns the others."""
        _, alive = psutil.wait_procs(list(self.shim_processes.values()), timeout=timeout_s)
        return [p.pid for p in alive]

    def _kill_strays(self) -> None:
        for p in self.shim_processes.values():
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil refuses a pid that was reused since it was seen
        self._wait_shim_processes(5)

    # ---------------------------------------------------------------- the measurements

    def steady(self) -> dict:
        sums0, at0 = self.scrape()
        time.sleep(self.params.steady_s)
        sums1, at1 = self.scrape()
        d, dt = promtext.delta(sums0, sums1), at1 - at0
        return {"window_s": round(dt, 1), "probes": self.probes,
                "attempts_per_s_expected": round(self.probes * 1000 / PERIOD_MS, 1),
                "attempts_per_s": round(d[promtext.PROBE_TOTAL] / dt, 1),
                "store_writes_per_s": round(d.get(WRITES, 0.0) / dt, 3),
                "store_rows_per_s": round(d.get(ROWS, 0.0) / dt, 2),
                "late": int(d.get(promtext.LATE_TOTAL, 0)), "ticks_missed": int(d.get(promtext.MISSED_TOTAL, 0)),
                "workers": len(set(self.worker_of_sandbox().values()))}

    def _stop(self, kind: str) -> tuple[int, float]:
        """The daemon goes (SIGTERM: hands its workers over; kill -9: leaves them); its exit code and instant."""
        if kind == "SIGTERM":
            code = self.daemon.process.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S)
        else:
            self.daemon.process.crash()
            code = self.daemon.process.proc.returncode
        return code, time.monotonic()

    def _start(self) -> tuple[float, float]:
        """A new daemon on the same state dir: the instants of its launch and of its first SERVING."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            serving = pool.submit(serving_at, self.daemon.process.socket_path)
            launched = time.monotonic()
            self.daemon.start_again()
            served = serving.result()
        return launched, served

    def restart(self, kind: str) -> dict:
        before = self.worker_of_sandbox()
        self.track_shim_processes()
        signalled = time.monotonic()
        age = signalled - self.serving_since
        code, exited = self._stop(kind)
        watch_ended = self.watch.ended()
        survived = sum(psutil.pid_exists(pid) for pid in set(before.values()) if pid)
        launched, served = self._start()
        self.serving_since = served
        after = self.worker_of_sandbox()
        at_serving, _ = self.scrape()
        resumed_from = self.watch.connect()
        time.sleep(self.params.settle_s)
        sums, scraped = self.scrape()
        settled = self.worker_of_sandbox()
        watch = {"ended_by": watch_ended, "resumed_from": resumed_from, "flaps": self.watch.flaps,
                 "snapshot_state_changed": self.watch.snapshot_changed, "events": dict(self.watch.types),
                 "error": self.watch.thread.error}
        # A pre-restart worker is adopted when every sandbox it served has it still.
        workers = collections.defaultdict(set)
        for sandbox, pid in before.items():
            workers[pid].add(after.get(sandbox) == pid)
        attempts = sums.get(promtext.PROBE_TOTAL, 0.0)
        # Attempts made after the old daemon exited all reach the new one (queued meanwhile); a SIGTERM'd daemon
        # still takes attempts until it hands the workers over, late in its stop.
        due = self.probes * (scraped - exited) * 1000 / PERIOD_MS
        return {
            "daemon_age_s": round(age, 1), "exit_code": code, "stop_s": round(exited - signalled, 3),
            "start_to_serving_s": round(served - launched, 3), "gap_s": round(served - signalled, 3),
            "workers_before": len(workers), "workers_alive_without_daemon": survived,
            "workers_adopted": sum(all(same) for same in workers.values()),
            "workers_after": len(set(after.values())), "adopted_workers_metric": int(at_serving.get(ADOPTED, -1)),
            "sandboxes": len(before), "sandboxes_same_worker": sum(after.get(s) == pid for s, pid in before.items()),
            "settle_s": round(scraped - served, 1),
            "sandboxes_same_worker_after_settle": sum(settled.get(s) == pid for s, pid in before.items()),
            "worker_restarts": int(sums.get(RESTARTS, 0)),
            "ticks_missed": int(sums.get(promtext.MISSED_TOTAL, 0)), "late": int(sums.get(promtext.LATE_TOTAL, 0)),
            "attempts_counted": int(attempts), "attempts_due_since_exit": round(due),
            "attempts_counted_ratio": round(attempts / due, 3) if due else None,
            "store_writes": int(sums.get(WRITES, 0)), "store_rows": int(sums.get(ROWS, 0)),
            "watch": watch,
        }

    def stop_all(self) -> dict:
        """SIGINT: the daemon stops its workers, the adopted ones too."""
        self.track_shim_processes()
        self.watch.stop()
        code = self.daemon.process.stop(signal.SIGINT, timeout=STOP_TIMEOUT_S)
        return {"exit_code": code, "shim_processes": len(self.shim_processes),
                "left_running": self._wait_shim_processes(15)}


def run(params: RestartParams) -> dict:
    with contextlib.ExitStack() as stack:
        rig = RestartRig(params, stack)
        registration_s = rig.populate()
        time.sleep(params.warmup_s)
        steady = rig.steady()
        restarts = {kind: rig.restart(kind) for kind in KINDS}
        stopped = rig.stop_all()
    return {"sandboxes": params.sandboxes, "namespaces": NAMESPACES, "period_ms": PERIOD_MS,
            "handover_timeout_s": HANDOVER_TIMEOUT_S, "registration_s": registration_s,
            "steady": steady, "restarts": restarts, "stopped": stopped}
