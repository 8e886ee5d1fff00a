"""Timing paths against each other: calls taken in interleaved turns, and the comparison of two paths' times.

Every comparison of the benchmark is interleaved (A, B, A, B, ...) so that whatever else the machine does hits the
paths alike; the median of paired (neighbouring) differences is reported beside the difference of medians. Pure
apart from the calls it is given.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.stats import summarize

Call = Callable[[], object]


def timed(call: Call) -> float:
    begin = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - begin) / 1e6


def interleaved(calls: dict[str, Call], count: int, warmup: int = 0, block: int = 1) -> dict[str, list[float]]:
    """Milliseconds of `count` calls of each path, taken in turns of `block` calls after a warm-up. Each turn
    starts one path further (a b c, b c a, c a b, ...): no path always runs right after the same other one.

    block > 1 is for paths whose cost lingers after they return (an ExecSync leaves containerd and runc
    reaping the exec for milliseconds): one call in `block` follows another path, so each path's median is
    its own cost, while slow drift of the machine still hits every path alike."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    names = list(calls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(-(-count // block)):
        for i in range(len(names)):
            name = names[(turn + i) % len(names)]
            for _ in range(min(block, count - len(out[name]))):
                out[name].append(timed(calls[name]))
    return out


def compare(base_ms: list[float], other_ms: list[float]) -> dict:
    """Summaries of both paths, the difference of medians and the median of paired (neighbouring) differences."""
    base, other = summarize(base_ms), summarize(other_ms)
    paired = [o - b for b, o in zip(base_ms, other_ms)]
    return {
        "base": base, "other": other,
        "added_median_ms": round(other["median"] - base["median"], 3),
        "added_paired_median_ms": round(statistics.median(paired), 3),
        "ratio_median": round(other["median"] / base["median"], 2) if base["median"] else None,
    }
