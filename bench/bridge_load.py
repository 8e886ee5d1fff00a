"""Scenario "bridge_load" (a node cost target): what one bridged probe costs the shim at 30 and at 300 probes/s.

A bridged probe is the marker ExecSync the kubelet sends for a readiness httpGet that `probectl convert` turned
into an exec probe (bench/exec_compare.py's `bridged_argv`); the shim answers it from a worker in the pod's netns.
Against the private containerd of bench/containerd_rig.py (pods running busybox httpd on their 127.0.0.1:8080),
one client sends such ExecSyncs through the shim's socket at a paced rate (a fixed grid, as the kubelet's probe
workers tick), spread round robin over the pods' containers, each answered from the pod's /www/healthz (200, body
"ok <session token>": the body proves the answer came from the pod's server). Per rate, over a window:
- the daemon's CPU per call, and its descendants' (zygote, broker, workers) per call: user + system time over the
  window divided by the calls made (the client's own CPU is not counted);
- latency as the caller sees it (median, p99), one call at a time;
- every answer checked: exit code 0 and the pod's body; anything else is counted as a bad answer.
With more than one shim (`shims`: e.g. the code before a change, started from another checkout, see bench/ab.py),
the windows alternate between them in rounds, so that whatever else the machine does hits each alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

from bench import procstats
from bench.cri_calls import HEALTHZ_PATH
from bench.exec_compare import bridged_argv
from bench.stats import summarize
from cri_proto import cri_runtime_v1_pb2 as cri_pb

RUNTIME_EXEC_SYNC = "/runtime.v1.RuntimeService/ExecSync"
CALL_DEADLINE_S = 10.0
EXPECTED_BODY = b"ok "   # /www/healthz of the test image: "ok <session token>\n"


@dataclass(frozen=True)
class BridgeLoadParams:
    rates: tuple[float, ...]    # bridged probes per second
    window_s: float             # per rate and shim, split into `rounds` windows
    rounds: int = 2             # alternations between shims (and windows per rate with one shim)
    warmup_calls: int = 60      # per shim, before the first window: every pod's worker up and warm


@dataclass
class Tally:
    """What one shim's windows at one rate added up to."""
    calls: int = 0
    wall_s: float = 0.0
    daemon_cpu_s: float = 0.0
    workers_cpu_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    bad_answers: dict[str, int] = field(default_factory=dict)

    def add_window(self, calls: int, wall_s: float, daemon_cpu_s: float, workers_cpu_s: float,
                   latencies_ms: list[float], bad: Mapping[str, int]) -> None:
        self.calls += calls
        self.wall_s += wall_s
        self.daemon_cpu_s += daemon_cpu_s
        self.workers_cpu_s += workers_cpu_s
        self.latencies_ms += latencies_ms
        for what, n in bad.items():
            self.bad_answers[what] = self.bad_answers.get(what, 0) + n

    def figures(self, rate: float) -> dict:
        """The scenario's figures for one rate (pure): CPU per call in ms, latency, answers."""
        per_call = 1000 / self.calls if self.calls else 0.0
        return {"rate_per_s": rate, "achieved_per_s": round(self.calls / self.wall_s, 1) if self.wall_s else 0.0,
                "calls": self.calls, "window_s": round(self.wall_s, 1),
                "daemon_ms_per_call": round(self.daemon_cpu_s * per_call, 3),
                "workers_ms_per_call": round(self.workers_cpu_s * per_call, 3),
                "latency_ms": summarize(self.latencies_ms) if self.latencies_ms else None,
                "bad_answers": dict(self.bad_answers)}


def cpu_used_s(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds the processes used between two samples (pure): one started in between counts from 0; one
    that ended in between counts up to the last sample that saw it (its remainder is lost, as in procstats)."""
    return sum(max(0.0, used - before.get(pid, 0.0)) for pid, used in after.items())


def answer_problem(response: cri_pb.ExecSyncResponse) -> str | None:
    """None for a probe the pod answered 200 with its body; else what was wrong (pure)."""
    if response.exit_code != 0:
        return f"exit {response.exit_code}"
    if not response.stdout.startswith(EXPECTED_BODY):
        return "unexpected body"
    return None


def descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


class BridgedCaller:
    """Paced marker ExecSyncs through one shim, round robin over the containers."""

    def __init__(self, daemon, container_ids: list[str], port: int) -> None:
        self.daemon = daemon
        stub = daemon.channel.unary_unary(RUNTIME_EXEC_SYNC,
                                          request_serializer=cri_pb.ExecSyncRequest.SerializeToString,
                                          response_deserializer=cri_pb.ExecSyncResponse.FromString)
        self.call: Callable[[cri_pb.ExecSyncRequest], cri_pb.ExecSyncResponse] = (
            lambda request: stub(request, timeout=CALL_DEADLINE_S))
        # timeout 1: what the kubelet sends for timeoutSeconds: 1
        self.requests = [cri_pb.ExecSyncRequest(container_id=cid, cmd=bridged_argv(port, HEALTHZ_PATH), timeout=1)
                         for cid in container_ids]
        self.sent = 0

    def warm_up(self, calls: int) -> None:
        for _ in range(calls):
            problem = answer_problem(self._next())
            if problem is not None:
                raise RuntimeError(f"bridged ExecSync during the warm-up: {problem}")

    def _next(self) -> cri_pb.ExecSyncResponse:
        request = self.requests[self.sent % len(self.requests)]
        self.sent += 1
        return self.call(request)

    def window(self, rate: float, window_s: float, tally: Tally) -> None:
        """`rate` calls a second on a fixed grid for `window_s`; a call that runs late does not shift the grid."""
        daemon_pid = self.daemon.proc.pid
        count = max(1, round(rate * window_s))
        latencies, bad = [], {}
        workers_before = procstats.cpu_seconds(descendants(daemon_pid))
        daemon_before = procstats.cpu_seconds([daemon_pid])
        begin = time.perf_counter()
        for i in range(count):
            start = time.perf_counter()
            response = self._next()
            latencies.append((time.perf_counter() - start) * 1000)
            problem = answer_problem(response)
            if problem is not None:
                bad[problem] = bad.get(problem, 0) + 1
            pause = begin + (i + 1) / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the load, not synchronisation
        wall = time.perf_counter() - begin
        daemon_after = procstats.cpu_seconds([daemon_pid])
        workers_after = procstats.cpu_seconds(descendants(daemon_pid))
        tally.add_window(count, wall, cpu_used_s(daemon_before, daemon_after),
                         cpu_used_s(workers_before, workers_after), latencies, bad)


def measure(shims: Mapping[str, object], container_ids: list[str], port: int, params: BridgeLoadParams) -> dict:
    """{shim name: {"rates": [figures per rate]}}, the shims' windows alternating round by round."""
    callers = {name: BridgedCaller(daemon, container_ids, port) for name, daemon in shims.items()}
    for caller in callers.values():
        caller.warm_up(params.warmup_calls)
    tallies = {name: {rate: Tally() for rate in params.rates} for name in shims}
    names = list(callers)
    for rate in params.rates:
        for turn in range(params.rounds):
            for i in range(len(names)):  # each round starts one shim further: neither always goes first
                name = names[(turn + i) % len(names)]
                callers[name].window(rate, params.window_s / params.rounds, tallies[name][rate])
    return {name: {"rates": [tallies[name][rate].figures(rate) for rate in params.rates]} for name in names}


def with_containerd(rig, params: BridgeLoadParams) -> dict:
    """The suite's scenario on its containerd rig: the shim under test, and the rig's other shims beside it."""
    shims = {"shim": rig.shim, **rig.others}
    container_ids = [pod.containers["http"] for pod in rig.pods]
    measured = measure(shims, container_ids, rig.http_port, params)
    result = {"pods": len(rig.pods), "path": HEALTHZ_PATH, **measured.pop("shim")}
    if measured:
        result["beside"] = measured  # e.g. {"before": {...}}: the same windows on another checkout's shim
    return result
