"""Scenario 6: one target under pressure, the kubelet's port-exhaustion case.

60 HTTP probes at period 100 ms (600 probes/s) in ONE sandbox against ONE server: 60 is
within the default max_probes_per_sandbox (64), and many containers probing one port
often is exactly what exhausts ephemeral ports when each probe leaves a TIME_WAIT
socket behind. Over the window: attempts by result from /metrics (failed and unknown
must be 0), requests the server answered, CPU of daemon + workers; at the end, the
TCP sockets in TIME_WAIT inside that netns (`ss -tan state time-wait`).
"""

from __future__ import annotations

import subprocess
import time

from bench import procstats, promtext
from bench.env import http_spec, sandbox_rig

PROBES = 60
PERIOD_MS = 100


def time_wait_sockets(netns_name: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", netns_name, "ss", "-Htan", "state", "time-wait"],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return len(out.splitlines())


def failures(results: dict[str, float]) -> int:
    """Attempts that did not succeed: prober_probe_total's failed and unknown results."""
    return int(results.get("failed", 0) + results.get("unknown", 0))


def run(window_s: float, warmup_s: float) -> dict:
    with sandbox_rig() as (daemon, ns, targets):
        for i in range(PROBES):
            daemon.run_probe(ns.name, f"c{i}", http_spec(PERIOD_MS))
        time.sleep(warmup_s)
        pids = [daemon.pid, *daemon.worker_pids()]
        text0, served0 = daemon.metrics(), targets.stats()
        cpu0, server0, begin = procstats.cpu_seconds(pids), procstats.cpu_seconds([targets.pid]), time.monotonic()
        time.sleep(window_s)
        cpu1, server1 = procstats.cpu_seconds(pids), procstats.cpu_seconds([targets.pid])
        wall = time.monotonic() - begin
        text1, served1 = daemon.metrics(), targets.stats()
        time_wait = time_wait_sockets(ns.name)
    results = promtext.delta(promtext.probe_results(text0), promtext.probe_results(text1))
    attempts = sum(results.values())
    sums = promtext.delta(promtext.sample_sums(text0), promtext.sample_sums(text1))
    return {
        "probes": PROBES, "period_ms": PERIOD_MS, "window_s": round(wall, 1),
        "probes_per_s_expected": PROBES * 1000 / PERIOD_MS,
        "probes_per_s": round(attempts / wall, 1),
        "results": {k: int(v) for k, v in results.items()},
        "failures": failures(results),
        "http_requests_served": served1["http"] - served0["http"],
        "time_wait_sockets": time_wait,
        # The daemon's own counters, when it has them (None otherwise).
        "late": int(sums[promtext.LATE_TOTAL]) if promtext.LATE_TOTAL in sums else None,
        "ticks_missed": int(sums[promtext.MISSED_TOTAL]) if promtext.MISSED_TOTAL in sums else None,
        "cpu_percent_daemon_and_workers": round(procstats.cpu_percent(cpu0, cpu1, wall), 1),
        "cpu_percent_target_server": round(procstats.cpu_percent(server0, server1, wall), 1),
    }
