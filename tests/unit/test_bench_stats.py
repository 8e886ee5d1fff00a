"""The benchmark's arithmetic: summaries, ratios, slopes, and late / missed attempts (bench/stats.py,
bench/punctuality.py). Pure: no root, no sockets."""

from __future__ import annotations

import pytest

from bench import punctuality
from bench.stats import cdf, ratio, slope, summarize

MS = 1_000_000
PERIOD = 1000 * MS


def test_summary_and_ratio():
    s = summarize([float(v) for v in range(1, 101)])
    assert (s["min"], s["median"], s["p90"], s["p99"], s["max"]) == (1, 50.5, 91, 100, 100)
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None


def test_cdf_points():
    assert cdf([3.0, 1.0, 2.0]) == ([1.0, 2.0, 3.0], [1 / 3, 2 / 3, 1.0])


def test_slope_is_what_one_more_adds():
    assert slope([10, 50, 100], [30 + 2.5 * n for n in (10, 50, 100)]) == pytest.approx(2.5)
    assert slope([10, 10], [1, 2]) is None


def grid(first_ns: int, ticks: list[int], jitter_ns: list[int] | None = None) -> list[int]:
    jitter_ns = jitter_ns or [0] * len(ticks)
    return [first_ns + k * PERIOD + j for k, j in zip(ticks, jitter_ns)]


def test_punctual_attempts_are_neither_late_nor_missed():
    starts = grid(1_700_000_000_123 * MS, list(range(10)), [1 * MS, 3 * MS, 0, 2 * MS, 5 * MS] * 2)
    p = punctuality.from_start_times({"a": starts}, PERIOD)
    assert (p.attempts, p.late, p.missed) == (10, 0, 0)
    assert p.max_lateness_ms == pytest.approx(5)


def test_an_attempt_more_than_100ms_after_its_tick_is_late():
    starts = grid(5 * PERIOD + 400 * MS, list(range(8)), [0, 0, 0, 150 * MS, 0, 99 * MS, 0, 0])
    p = punctuality.from_start_times({"a": starts}, PERIOD)
    assert (p.late, p.missed) == (1, 0)
    assert p.max_lateness_ms == pytest.approx(150)


def test_a_tick_without_attempt_is_missed():
    p = punctuality.from_start_times({"a": grid(0, [0, 1, 2, 4, 5, 8])}, PERIOD)
    assert (p.attempts, p.late, p.missed) == (6, 0, 3)


def test_a_grid_near_the_period_boundary_wraps_without_false_lateness():
    # The grid sits at phase 0.99 s; attempts a little late cross into the next second.
    starts = grid(990 * MS, list(range(6)), [0, 20 * MS, 5 * MS, 30 * MS, 0, 15 * MS])
    p = punctuality.from_start_times({"a": starts}, PERIOD)
    assert (p.late, p.missed) == (0, 0)


def test_one_very_late_attempt_does_not_move_the_grid():
    starts = grid(200 * MS, list(range(10)), [0] * 9 + [700 * MS])
    placed = punctuality.ticks_and_lateness(starts, PERIOD)
    assert [lateness for _, lateness in placed] == [0] * 9 + [700 * MS]
    assert punctuality.from_start_times({"a": starts}, PERIOD).late == 1


def test_probes_are_judged_each_on_its_own_grid():
    p = punctuality.from_start_times({"a": grid(100 * MS, [0, 1, 2]), "b": grid(600 * MS, [0, 1, 3]), "c": []},
                                     PERIOD)
    assert (p.attempts, p.late, p.missed) == (6, 0, 1)


def test_due_times_when_the_attempts_carry_them():
    pairs = [(k * PERIOD, k * PERIOD + lateness) for k, lateness in ((0, 0), (1, 120 * MS), (3, 2 * MS))]
    p = punctuality.from_due_times({"a": pairs}, PERIOD)
    assert (p.attempts, p.late, p.missed) == (3, 1, 1)
    assert p.method == "due time reported with each attempt"
