#!/usr/bin/env python3
"""CPU and latency of the probe path, for optimizing it: engine vs raw floor, worker and daemon CPU per attempt.

Three measurements, each comparable between two source trees in the same run
(`--tree DIR` runs the measured code from another checkout, e.g. an unmodified
`git archive HEAD`), because on a shared machine only same-run ratios mean much:

  latency  Inside a throwaway pod netns, one process alternates an engine attempt
           (probe_worker.prober.Prober.run, Attempt.duration_ns as the worker
           reports it) with a raw-socket floor attempt (plain asyncio: connect,
           send the kubelet's request, read to EOF; sockets set up like the
           worker's), per kind. Reports medians, engine/floor and CPU per attempt.
  worker   A real worker process in the netns running one HTTP, TCP and gRPC probe
           at a short period: worker CPU (psutil) per attempt, everything included
           (ticker, attempt, report frame).
  daemon   The daemon's side of an attempt in-process: frame decode, then
           ResultsManager.on_event (status board, metrics, trace ids / spans) for
           S sandboxes x 3 probes; CPU per attempt. Stable under
           `valgrind --tool=callgrind` for instruction counts.
  instructions
           The worker's loop in the netns (ProbeManager, Prober, report frames on a
           socketpair) under `valgrind --tool=callgrind`: user-space instructions
           per attempt, per kind (back to back, start_now) and for one sandbox's
           three probes together at --sandbox-period-ms (phases as the worker draws them).
           Counted as (I(3n) - I(n)) / 2n so that start-up and warm-up cancel out;
           immune to the machine's load, blind to the kernel's share.

    python3 bench/perf_probe_path.py latency --count 500        # needs root
    python3 bench/perf_probe_path.py worker --seconds 10
    python3 bench/perf_probe_path.py daemon --count 20000
    python3 bench/perf_probe_path.py instructions --count 100 --tree /tmp/orig   # needs root and valgrind
    python3 bench/perf_probe_path.py all --tree /tmp/orig         # before (tree) vs after (this checkout)

This module owns the runs (each measurement in a child interpreter per tree, interleaved) and the report; what the
children run is bench/probe_path_inside.py, the probes and the netns bench/probe_path_rig.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The bench's own modules (and through bench/floor.py the same floor as the suite's latency scenario), always
# from this checkout: appended to sys.path, so a measured --tree still wins for probe_worker.
sys.path.append(str(REPO_ROOT))
from bench.probe_path_inside import daemon_cpu, latency_inside, manager_attempts, worker_inside  # noqa: E402
from bench.probe_path_rig import KINDS, PodUnderTest, use_tree  # noqa: E402


def _child(args: list[str], tree: str | None, prefix: tuple[str, ...] = ()) -> dict:
    """Runs this script's child mode `args` (with the measured `tree`), after `prefix` (e.g. entering a netns);
    its JSON, or its stderr's tail as the error."""
    argv = [*prefix, sys.executable, __file__, *args]
    if tree:
        argv += ["--tree", tree]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout)


# --- latency: engine vs floor ---------------------------------------------------------------------


def latency(trees: list[str | None], count: int, repeat: int) -> dict:
    results: dict[str, list[dict]] = {}
    with PodUnderTest() as env:
        for _ in range(repeat):
            for tree in trees:  # interleaved, so both trees see the same machine load
                results.setdefault(tree or "this", []).append(_child(
                    ["_inside", "--ports", json.dumps(env.ports), "--count", str(count)], tree,
                    ("ip", "netns", "exec", env.ns.name)))
    return results


# --- worker CPU per attempt -----------------------------------------------------------------------


def worker_cpu(trees: list[str | None], period_ms: int, seconds: float, kinds: tuple[str, ...] = KINDS) -> dict:
    out: dict[str, dict] = {}
    with PodUnderTest() as env:
        for tree in trees:
            out[tree or "this"] = _child(["_worker", "--netns", env.ns.path, "--ports", json.dumps(env.ports),
                                          "--period-ms", str(period_ms), "--seconds", str(seconds),
                                          "--kinds", ",".join(kinds)], tree)
    return out


# --- instructions per attempt (callgrind) --------------------------------------------------------

# Per kind back to back (the hot cost), then "sandbox": the three kinds together at a period
# long enough that callgrind's slowdown (~50x) does not make their attempts run back to back.
INSTRUCTION_RUNS = {"http": ("http",), "tcp": ("tcp",), "grpc": ("grpc",), "sandbox": KINDS}
BACK_TO_BACK_PERIOD_MS = 10


def _callgrind(netns: str, ports: dict[str, int], tree: str | None, run: str, count: int, period_ms: int) -> int:
    argv = ["ip", "netns", "exec", netns, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, __file__, "_cg", "--ports", json.dumps(ports), "--kinds", run,
            "--count", str(count), "--period-ms", str(period_ms)]
    if tree:
        argv += ["--tree", tree]
    # A fixed hash seed: dict and set layouts, hence instruction counts, repeat from run to run.
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    collected = [line for line in res.stderr.splitlines() if "Collected :" in line]
    if res.returncode or not collected:
        raise RuntimeError(res.stderr[-2000:])
    return int(collected[-1].split()[-1])


def instructions(trees: list[str | None], count: int, period_ms: int, runs: tuple[str, ...], repeat: int) -> dict:
    """{tree: {run: median instructions per attempt}}, and each run's repeats under "spread"."""
    samples: dict[str, dict[str, list[int]]] = {}
    with PodUnderTest() as env:
        for run in runs:
            period = BACK_TO_BACK_PERIOD_MS if run in KINDS else period_ms
            for _ in range(repeat):
                for tree in trees:  # interleaved, like the other modes
                    low = _callgrind(env.ns.name, env.ports, tree, run, count, period)
                    high = _callgrind(env.ns.name, env.ports, tree, run, 3 * count, period)
                    samples.setdefault(tree or "this", {}).setdefault(run, []).append(
                        round((high - low) / (2 * count)))
    out: dict[str, dict] = {tree: {run: round(statistics.median(v)) for run, v in by_run.items()}
                            for tree, by_run in samples.items()}
    out["spread"] = samples
    return out


# --- daemon CPU per attempt -----------------------------------------------------------------------


def daemon_cpu_trees(trees: list[str | None], count: int, sandboxes: int, repeat: int) -> dict:
    out: dict[str, list] = {}
    for _ in range(repeat):
        for tree in trees:
            out.setdefault(tree or "this", []).append(
                _child(["_daemon", "--count", str(count), "--sandboxes", str(sandboxes)], tree)["cpu_us_per_attempt"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("latency", "worker", "daemon", "instructions", "all",
                                         "_inside", "_worker", "_daemon", "_cg"))
    parser.add_argument("--tree", action="append", default=[],
                        help="also measure the code of this source tree (repeatable); compared in the same run")
    parser.add_argument("--count", type=int, default=None, help="attempts per kind (latency) or reports (daemon)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="worker: measured seconds")
    parser.add_argument("--period-ms", type=int, default=20, help="worker: probe period")
    parser.add_argument("--sandbox-period-ms", type=int, default=500,
                        help="instructions: period of the three probes run together")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="worker: probe kinds to run; instructions: runs among http,tcp,grpc,sandbox")
    parser.add_argument("--sandboxes", type=int, default=50, help="daemon: sandboxes of 3 probes each")
    parser.add_argument("--profile", action="store_true", help="daemon: print a cProfile of the attempt path")
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--netns", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.what == "_inside":
        use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(asyncio.run(latency_inside(json.loads(args.ports), args.count or 500, warmup=30))))
        return 0
    if args.what == "_worker":
        use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(worker_inside(args.netns, json.loads(args.ports), args.period_ms, args.seconds,
                                        tuple(args.kinds.split(",")))))
        return 0
    if args.what == "_cg":
        use_tree(args.tree[0] if args.tree else None)
        kinds = INSTRUCTION_RUNS[args.kinds]
        asyncio.run(manager_attempts(json.loads(args.ports), kinds, args.period_ms, args.count,
                                      start_now=len(kinds) == 1))
        return 0
    if args.what == "_daemon":
        use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(daemon_cpu(args.count or 20000, args.sandboxes, args.profile)))
        return 0

    trees: list[str | None] = [*args.tree, None]
    report: dict[str, dict] = {}
    if args.what in ("latency", "all"):
        report["latency"] = latency(trees, args.count or 500, args.repeat)
    if args.what in ("worker", "all"):
        report["worker"] = worker_cpu(trees, args.period_ms, args.seconds, tuple(args.kinds.split(",")))
    if args.what in ("daemon", "all"):
        report["daemon"] = daemon_cpu_trees(trees, args.count or 20000, args.sandboxes, args.repeat)
    if args.what == "instructions":
        runs = tuple(args.kinds.split(",")) if args.kinds != ",".join(KINDS) else tuple(INSTRUCTION_RUNS)
        report["instructions"] = instructions(trees, args.count or 100, args.sandbox_period_ms, runs,
                                             args.repeat)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
