"""Scenario 1: N sandboxes x 3 probes (HTTP, TCP, gRPC) at period 1 s through a real daemon.

One daemon (embedded mode, traces to nowhere, /metrics on) and one target process for
all sandboxes; N grows step by step (10, 50, ... sandboxes: each step adds sandboxes to
the previous ones). The sandboxes belong to NAMESPACES Kubernetes-like namespaces, round
robin ("ns-03.cps-pod-..." read with embedded_namespace_separator "."), so that pooled
workers are grouped as on a node. The scenario runs once per worker mode (`run(params,
isolation)`): pooled workers and the strict one-worker-per-sandbox mode, side by side in
one run. At each step, after a warm-up, a fixed window measures:
- probes/s achieved: the change of prober_probe_total over the window (/metrics);
- CPU of the daemon, the zygote and all workers (% of one core; the target process apart);
- memory (daemon RSS and PSS, PSS per worker, total PSS), fds and threads, after the window;
- state-change latency: one sandbox in FLAP_EVERY flips its /healthz between 200 and 500
  every FLIP_S seconds; a plain watch (not every_attempt) receives the state changes,
  timed from the end of the attempt that caused each one;
- late and missed attempts: from the daemon's counters when it has them, else from an
  every_attempt watch in a separate pass right after the window (the extra watcher
  would cost the daemon CPU inside the window): see bench/punctuality.py.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass

from bench import procstats, promtext, punctuality
from bench.env import SPECS, BenchDaemon
from bench.stats import slope, summarize
from bench.targets import TargetProcess
from bench.watching import StateChanges, WatchThread, attempt_end_ns
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.workers.grouping import POOLED
from tests.support.netns_env import PodNetns

PERIOD_MS = 1000
FLAP_EVERY = 10
NAMESPACES = 10
FLIP_S = 3.0
DUE_FIELD = "scheduled_at_unix_ns"


@dataclass(frozen=True)
class ScaleParams:
    sandbox_counts: tuple[int, ...]
    warmup_s: float
    window_s: float
    punctuality_s: float


def due_field() -> str | None:
    """The Attempt field carrying when the attempt was due (its tick), if the protos have one."""
    return DUE_FIELD if DUE_FIELD in spec_pb.Attempt.DESCRIPTOR.fields_by_name else None


class ScaleRun:
    def __init__(self, params: ScaleParams, stack: contextlib.ExitStack, isolation: str,
                 extra_flags: tuple[str, ...] = ()) -> None:
        self.params = params
        self.targets = TargetProcess()
        stack.callback(self.targets.stop)
        self.sandboxes: list[PodNetns] = []
        stack.callback(self._destroy_sandboxes)
        self.daemon = BenchDaemon(["--worker-isolation", isolation, "--embedded-namespace-separator", ".",
                                   *extra_flags])
        stack.callback(self.daemon.close)  # first out: the daemon stops before its sandboxes go
        self.changes = StateChanges()
        self.change_latencies: list[tuple[int, float]] = []  # (received wall ns, ms)
        self.watch = WatchThread(self.daemon.stub, service_pb.WatchProbeStatusRequest(), self._on_event)
        stack.callback(self.watch.stop)

    def _destroy_sandboxes(self) -> None:
        for ns in self.sandboxes:
            ns.destroy()

    def _on_event(self, received_ns: int, event: service_pb.WatchProbeStatusResponse) -> None:
        if event.type in (service_pb.SNAPSHOT, service_pb.UPDATED):
            ms = self.changes.observe(event.probe.probe_id, event.probe.status.state, attempt_end_ns(event.probe), received_ns)
            if ms is not None:
                self.change_latencies.append((received_ns, ms))

    def grow_to(self, n: int) -> dict[str, float]:
        """Adds sandboxes (netns, target endpoints, 3 probes each) up to n; returns the seconds each part took."""
        spent = {"netns_s": 0.0, "targets_s": 0.0, "run_probe_s": 0.0}
        while len(self.sandboxes) < n:
            i = len(self.sandboxes)
            t0 = time.monotonic()
            ns = PodNetns.create(tenancy=f"ns-{i % NAMESPACES:02d}")
            self.sandboxes.append(ns)
            t1 = time.monotonic()
            self.targets.add(ns.name, FLIP_S if i % FLAP_EVERY == 0 else 0.0)
            t2 = time.monotonic()
            for kind, make_spec in SPECS.items():
                # failure_threshold 1: each flip of a flapping sandbox is a state change at its next attempt.
                spec = make_spec(PERIOD_MS, failure_threshold=1) if kind == "http" else make_spec(PERIOD_MS)
                self.daemon.run_probe(ns.name, kind, spec)
            t3 = time.monotonic()
            for key, seconds in (("netns_s", t1 - t0), ("targets_s", t2 - t1), ("run_probe_s", t3 - t2)):
                spent[key] += seconds
        return {key: round(seconds, 2) for key, seconds in spent.items()}

    def step(self, n: int) -> dict:
        registration = self.grow_to(n)
        time.sleep(self.params.warmup_s)  # a fixed warm-up: every probe has run, the window starts clean
        daemon_pid, zygote_pid = self.daemon.pid, self.daemon.zygote_pid
        worker_pids = self.daemon.worker_pids()
        roles = {"daemon": [daemon_pid], "zygote": [zygote_pid] if zygote_pid else [], "workers": worker_pids,
                 "targets": [self.targets.pid]}
        every_pid = [pid for pids in roles.values() for pid in pids]

        # The scrapes stay outside the CPU window (rendering costs the daemon); the rate uses their own instants.
        text0, at0 = self._scrape()
        cpu0, wall0, watch0 = procstats.cpu_seconds(every_pid), time.monotonic(), time.time_ns()
        time.sleep(self.params.window_s)
        cpu1, wall1, watch1 = procstats.cpu_seconds(every_pid), time.monotonic(), time.time_ns()
        text1, at1 = self._scrape()

        wall = wall1 - wall0
        cpu = {role: round(procstats.cpu_percent({p: cpu0[p] for p in pids if p in cpu0},
                                                 {p: cpu1[p] for p in pids if p in cpu1}, wall), 2)
               for role, pids in roles.items()}
        cpu["shim_total"] = round(cpu["daemon"] + cpu["zygote"] + cpu["workers"], 2)
        results = promtext.delta(promtext.probe_results(text0), promtext.probe_results(text1))
        attempts = sum(results.values())
        probes = 3 * n
        rate = attempts / (at1 - at0)
        latencies = [ms for received, ms in self.change_latencies if watch0 <= received <= watch1]
        timely = self._punctuality(text0, text1, probes)
        memory = procstats.memory_summary(
            procstats.footprint(daemon_pid), procstats.footprint(zygote_pid) if zygote_pid else None,
            [f for f in map(procstats.footprint, worker_pids) if f is not None])
        return {
            "sandboxes": n, "probes": probes, "workers": len(worker_pids), "registration": registration,
            "window_s": round(wall, 2),
            "probes_per_s_expected": round(probes * 1000 / PERIOD_MS, 1),
            "probes_per_s": round(rate, 1),
            "results": {k: int(v) for k, v in results.items()},
            "punctuality": timely.as_dict(),
            "cpu_percent": cpu,
            "cpu_ms_per_attempt": round(cpu["shim_total"] * 10 / rate, 3) if rate else None,
            "memory": memory,
            "target_process": {"cpu_percent": cpu["targets"]},
            "state_change_latency_ms": {"count": len(latencies),
                                        **(summarize(latencies) if latencies else {})},
        }

    def _scrape(self) -> tuple[str, float]:
        begin = time.monotonic()
        text = self.daemon.metrics()
        return text, (begin + time.monotonic()) / 2

    def _punctuality(self, text0: str, text1: str, probes: int) -> punctuality.Punctuality:
        if promtext.has_punctuality_counters(text1):
            d = promtext.delta(promtext.sample_sums(text0), promtext.sample_sums(text1))
            attempts = sum(promtext.delta(promtext.probe_results(text0), promtext.probe_results(text1)).values())
            return punctuality.from_counters(int(attempts), int(d[promtext.LATE_TOTAL]),
                                             int(d[promtext.MISSED_TOTAL]))
        return self._punctuality_pass(probes)

    def _punctuality_pass(self, probes: int) -> punctuality.Punctuality:
        """An every_attempt watch for punctuality_s: each probe's attempt start (and due) times."""
        due = due_field()
        seen: dict[str, list] = defaultdict(list)

        def on_event(_received: int, event: service_pb.WatchProbeStatusResponse) -> None:
            if event.type == service_pb.ATTEMPT:
                a = event.probe.status.last_attempt
                seen[event.probe.probe_id].append((getattr(a, due), a.started_at_unix_ns) if due
                                                  else a.started_at_unix_ns)

        watch = WatchThread(self.daemon.stub, service_pb.WatchProbeStatusRequest(every_attempt=True), on_event)
        try:
            time.sleep(self.params.punctuality_s)
        finally:
            watch.stop()
        if watch.resyncs or watch.error:
            raise RuntimeError(f"the every_attempt watch fell behind (resyncs {watch.resyncs}, {watch.error})")
        period_ns = PERIOD_MS * 1_000_000
        result = (punctuality.from_due_times(seen, period_ns) if due
                  else punctuality.from_start_times(seen, period_ns))
        # A probe with no attempt at all in the pass missed every one of its ticks.
        silent = probes - len(seen)
        ticks = int(self.params.punctuality_s * 1000 // PERIOD_MS)
        return punctuality.Punctuality(result.attempts, result.late, result.missed + silent * ticks,
                                       result.max_lateness_ms, result.method)


def per_extra_sandbox(steps: list[dict]) -> dict:
    """What one more sandbox adds (least-squares slope over the steps), in MiB of PSS."""
    ns = [s["sandboxes"] for s in steps]
    total = slope(ns, [s["memory"]["total_pss_mib"] for s in steps])
    workers = slope(ns, [s["memory"]["zygote_pss_mib"] + s["memory"]["workers_pss_total_mib"] for s in steps])
    return {"total_pss_mib": round(total, 3) if total is not None else None,
            "zygote_and_workers_pss_mib": round(workers, 3) if workers is not None else None}


def run(params: ScaleParams, isolation: str = POOLED, extra_flags: tuple[str, ...] = ()) -> dict:
    """extra_flags: more `probe-shim serve` flags (e.g. --sandboxes-per-worker, to compare group sizes)."""
    with contextlib.ExitStack() as stack:
        scale = ScaleRun(params, stack, isolation, extra_flags)
        steps = [scale.step(n) for n in params.sandbox_counts]
        if scale.watch.error:
            raise RuntimeError(f"the state watch ended: {scale.watch.error}")
    return {"isolation": isolation, "namespaces": NAMESPACES,
            "period_ms": PERIOD_MS, "flapping": f"1 sandbox in {FLAP_EVERY}, /healthz flips every {FLIP_S:g} s",
            "steps": steps, "per_extra_sandbox": per_extra_sandbox(steps),
            "state_changes_total": len(scale.change_latencies),
            "state_change_latency_all_ms": summarize([ms for _, ms in scale.change_latencies])
            if scale.change_latencies else None,
            "state_watch_resyncs": scale.watch.resyncs}
