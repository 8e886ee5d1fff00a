"""Summaries every benchmark prints the same way, and the few statistics the suite derives from them."""

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


def ratio(numerator: float | None, denominator: float | None, digits: int = 2) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


def cdf(values: list[float]) -> tuple[list[float], list[float]]:
    """(sorted values, fraction of values <= each): the points of an empirical CDF."""
    s = sorted(values)
    n = len(s)
    return s, [(i + 1) / n for i in range(n)]


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys against xs (what one more x adds to y); None with fewer than 2 distinct xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
