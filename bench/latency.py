"""Scenario 2: the latency of one attempt of each kind, our engine against the raw-socket floor.

Engine: the worker's own measure of an attempt (Attempt.duration_ns), one-shot attempts
asked for with ExecProbe in a sandbox whose worker is already running. Floor:
bench/floor.py, a process inside the same netns doing the bare protocol exchange
against the same server and address, measured two ways in the same run:
- lone (the target's figure): one floor attempt per request, alternating one for one
  with the engine's, so that each side runs as an attempt does, once, after the other
  side and the daemon had the CPU (caches cold alike);
- warm (for information): the floor in a loop of `block` attempts back to back, with
  caches warm from the attempt before, which no probe ever is. On a 2-core Intel VM the
  warm HTTP floor was half the lone one (0.16 against 0.34 ms), the TCP one a quarter.
"""

from __future__ import annotations

import time

from bench.env import PORTS, SPECS, sandbox_rig
from bench.floor import KINDS, FloorProcess
from bench.stats import ratio, summarize
from cri_proto import probe_spec_pb2 as spec_pb


def engine_vs_floor(engine_ms: list[float], floor_ms: list[float]) -> dict:
    engine, floor = summarize(engine_ms), summarize(floor_ms)
    return {"engine_ms": engine, "floor_ms": floor,
            "ratio_median": ratio(engine["median"], floor["median"]),
            "ratio_p99": ratio(engine["p99"], floor["p99"])}


def run(count: int, block: int, warmup: int) -> dict:
    results: dict = {"attempts_per_kind": count, "samples": {}}
    with sandbox_rig() as (daemon, ns, _targets):
        floor = FloorProcess(ns.name, ns.ipv4, PORTS)
        try:
            for kind in KINDS:
                spec = SPECS[kind]()
                for _ in range(warmup):
                    daemon.exec_probe(ns.name, spec)
                floor.measure(kind, warmup)
                engine_ms, wall_ms, floor_ms, warm_ms, failed = [], [], [], [], []
                while len(engine_ms) < count:
                    begin = time.perf_counter_ns()
                    attempt = daemon.exec_probe(ns.name, spec)
                    wall_ms.append((time.perf_counter_ns() - begin) / 1e6)
                    # A failed attempt stays in the figures (it is what a probe cost) and is counted.
                    if attempt.result != spec_pb.RESULT_SUCCESS:
                        failed.append(attempt.output)
                    engine_ms.append(attempt.duration_ns / 1e6)
                    floor_ms += floor.measure(kind, 1)
                while len(warm_ms) < count:
                    warm_ms += floor.measure(kind, min(block, count - len(warm_ms)))
                warm = summarize(warm_ms)
                results[kind] = {**engine_vs_floor(engine_ms, floor_ms), "exec_probe_wall_ms": summarize(wall_ms),
                                 "floor_warm_ms": warm,
                                 "ratio_median_warm": ratio(summarize(engine_ms)["median"], warm["median"]),
                                 "engine_failures": len(failed), "engine_failure_outputs": sorted(set(failed))[:5]}
                results["samples"][kind] = {"engine": [round(v, 4) for v in engine_ms],
                                            "floor": [round(v, 4) for v in floor_ms],
                                            "floor_warm": [round(v, 4) for v in warm_ms]}
        finally:
            floor.stop()
    return results
