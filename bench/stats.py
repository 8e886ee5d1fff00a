"""Summaries every benchmark prints the same way."""

from __future__ import annotations

import statistics


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summarize(values_ms: list[float]) -> dict[str, float]:
    s = sorted(values_ms)
    return {
        "min": round(s[0], 3),
        "median": round(statistics.median(s), 3),
        "p90": round(percentile(s, 0.90), 3),
        "p99": round(percentile(s, 0.99), 3),
        "max": round(s[-1], 3),
    }
