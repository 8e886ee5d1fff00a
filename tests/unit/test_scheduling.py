"""Probe timing: the tick grid, Go-ticker semantics and the per-tick gate, driven by a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cri_proto import probe_spec_pb2 as pb
from probe_api.defaults import LATE_AFTER_NS, is_late
from probe_worker.scheduling import (
    MAX_GRIDS,
    SKIP_INITIAL_DELAY,
    SKIP_ON_HOLD,
    SKIP_STARTUP_DONE,
    SKIP_WAITING_FOR_STARTUP,
    PhaseGrid,
    Ticker,
    gate,
    grid_point,
)

LIVENESS, READINESS, STARTUP = pb.LIVENESS, pb.READINESS, pb.STARTUP


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def sleep_until(self, when: float) -> None:
        self.now = max(self.now, when)   # a deadline in the past returns at once

    def advance(self, ms: float) -> None:
        self.now += ms


def simulate(ticker: Ticker, clock: FakeClock, attempts: int,
             probe_ms: Callable[[int], float] = lambda i: 0.0,
             skip: Callable[[float], bool] = lambda now: False) -> list[float]:
    """The caller's loop from the scheduling module docstring; returns when each probe ran."""
    started = []
    while len(started) < attempts:
        clock.sleep_until(ticker.next_fire())
        ticker.consume(clock.now)
        if skip(clock.now):
            continue
        started.append(clock.now)
        clock.advance(probe_ms(len(started) - 1))
    return started


# --- the grid ------------------------------------------------------------------------

@pytest.mark.parametrize("at, after, expected", [
    (0.0, False, 250.0),
    (250.0, False, 250.0),       # on the grid: that point
    (250.0, True, 1_250.0),      # ... unless strictly after it is asked for
    (251.0, False, 1_250.0),
    (-800.0, False, -750.0),
    (1e7 + 250.0, False, 1e7 + 250.0),
])
def test_grid_point(at, after, expected):
    assert grid_point(at, 1_000.0, 250.0, after=after) == expected


def test_float_grid_points_stay_on_the_right_side():
    for k in range(1, 200):
        at = 0.3 + k * 0.1       # not exact in binary floating point
        assert grid_point(at, 0.1, 0.3) >= at > grid_point(at, 0.1, 0.3) - 0.1
        assert grid_point(at, 0.1, 0.3, after=True) > at


def draws(*values: float) -> Callable[[], float]:
    it = iter(values)
    return lambda: next(it)


def test_a_phase_is_drawn_once_per_period():
    grid = PhaseGrid(draws(0.25, 0.5))   # a third draw would raise StopIteration
    assert grid.phase_ms(1_000) == 250.0
    assert grid.phase_ms(10_000) == 5_000.0
    assert grid.phase_ms(1_000) == 250.0


def test_phases_stay_bounded_however_many_periods_come_and_go():
    grid = PhaseGrid(lambda: 0.5)
    for period in range(1, 10 * MAX_GRIDS):
        assert grid.phase_ms(period) == period / 2
    assert len(grid._phases) <= MAX_GRIDS


@pytest.mark.parametrize("bad", [1.0, -0.1, 2.0])
def test_phase_rejects_rand_outside_unit_interval(bad):
    with pytest.raises(ValueError):
        PhaseGrid(lambda: bad).phase_ms(1_000)


def test_probes_of_one_period_tick_together_whenever_they_were_added():
    grid = PhaseGrid(draws(0.25))
    first, second = grid.ticker(100.0, 1_000, False), grid.ticker(1_830.0, 1_000, False)
    assert simulate(first, FakeClock(100.0), 4) == [250.0, 1_250.0, 2_250.0, 3_250.0]
    assert simulate(second, FakeClock(1_830.0), 2) == [2_250.0, 3_250.0]


def test_each_probe_alone_still_waits_a_uniform_part_of_a_period_first():
    # Over phases spread evenly across a period, the first tick comes 0 .. period later, evenly.
    delays = sorted(PhaseGrid(lambda f=i / 1000: f).ticker(12_345.0, 300, False).next_fire() - 12_345.0
                    for i in range(1000))
    assert delays[0] >= 0.0 and delays[-1] < 300
    assert [round(d / 30) for d in delays[::100]] == list(range(10))


def test_start_now_runs_at_once_then_joins_the_grid():
    grid = PhaseGrid(draws(0.25))
    ticker = grid.ticker(100.0, 1_000, start_now=True)
    assert simulate(ticker, FakeClock(100.0), 3) == [100.0, 250.0, 1_250.0]


def test_start_now_on_a_grid_point_fires_once_for_it():
    ticker = PhaseGrid(draws(0.25)).ticker(1_250.0, 1_000, start_now=True)
    assert simulate(ticker, FakeClock(1_250.0), 2) == [1_250.0, 2_250.0]


def test_a_start_now_attempt_that_outlasts_the_first_grid_point_takes_it_late():
    ticker = PhaseGrid(draws(0.25)).ticker(100.0, 1_000, start_now=True)
    assert run_and_report(ticker, FakeClock(100.0), 3, lambda i: 400.0 if i == 0 else 1.0) == [
        (100.0, 100.0, 0), (500.0, 250.0, 0), (1_250.0, 1_250.0, 0)]


# --- ticker --------------------------------------------------------------------------

def test_first_attempt_at_first_fire_then_on_the_grid():
    clock = FakeClock(100.0)
    ticker = Ticker(first_fire_ms=100.0 + 2_500.0, period_ms=10_000)
    assert simulate(ticker, clock, 4) == [2_600.0, 12_600.0, 22_600.0, 32_600.0]


def test_slow_probe_runs_once_immediately_then_realigns():
    # The second attempt takes 2.5 periods: ticks at 20 and 30 are missed. Go buffers
    # one (delivered at once, at 45), drops the other, and the grid stays on 10s.
    clock = FakeClock()
    ticker = Ticker(0.0, 10.0)
    durations = {1: 25.0}
    assert simulate(ticker, clock, 5, lambda i: durations.get(i, 1.0)) == [
        0.0, 10.0, 35.0, 40.0, 50.0]


def test_probe_slightly_longer_than_a_period_runs_back_to_back_then_realigns():
    clock = FakeClock()
    ticker = Ticker(0.0, 10.0)
    assert simulate(ticker, clock, 4, lambda i: 12.0 if i == 0 else 1.0) == [
        0.0, 12.0, 20.0, 30.0]


def test_every_probe_slower_than_the_period_never_overlaps():
    clock = FakeClock()
    ticker = Ticker(0.0, 10.0)
    assert simulate(ticker, clock, 4, lambda i: 15.0) == [0.0, 15.0, 30.0, 45.0]


def test_next_fire_returns_the_missed_tick_in_the_past():
    ticker = Ticker(0.0, 10.0)
    ticker.consume(0.0)
    assert ticker.next_fire() == 10.0
    # Nothing consumed while the probe ran until 37: the earliest tick is due now.
    assert ticker.next_fire() < 37.0
    ticker.consume(37.0)                 # takes the tick, drops 20 and 30
    assert ticker.next_fire() == 40.0


@pytest.mark.parametrize("consume_at, next_fire", [
    (0.0, 10.0),
    (9.999, 10.0),
    (10.0, 20.0),
    (95.0, 100.0),
])
def test_consume_drops_every_tick_up_to_now(consume_at, next_fire):
    ticker = Ticker(0.0, 10.0)
    ticker.consume(consume_at)
    assert ticker.next_fire() == next_fire


@pytest.mark.parametrize("early_by", [1e-9, 1e-6, 0.5])
def test_an_early_wake_up_still_takes_the_pending_tick(early_by):
    # asyncio may wake a sleeper up to its clock resolution early: the tick it
    # waited for must be taken anyway, or a second attempt would follow at once.
    ticker = Ticker(0.0, 10.0)
    ticker.consume(0.0)
    ticker.consume(10.0 - early_by)
    assert ticker.next_fire() == 20.0


def test_consume_never_brings_ticks_back():
    ticker = Ticker(0.0, 10.0)
    ticker.consume(50.0)
    assert ticker.next_fire() == 60.0
    ticker.consume(20.0)                  # a stale reading still takes just the pending tick
    assert ticker.next_fire() == 70.0


def test_early_wake_ups_do_not_double_fire_in_the_loop():
    class EarlyClock(FakeClock):
        def sleep_until(self, when: float) -> None:
            self.now = max(self.now, when - 1e-6)

    clock = EarlyClock()
    ticker = Ticker(0.0, 10.0)
    started = simulate(ticker, clock, 4)
    assert started == pytest.approx([0.0, 10.0, 20.0, 30.0], abs=1e-5)


def test_float_grid_never_fires_twice_for_one_tick():
    # 0.1 + k * 0.1 is not exact in binary floating point; each tick must still fire once.
    clock = FakeClock()
    ticker = Ticker(0.1, 0.1)
    started = simulate(ticker, clock, 50)
    assert len(set(started)) == 50
    assert started == sorted(started)
    assert all(b - a == pytest.approx(0.1) for a, b in zip(started, started[1:]))


def run_and_report(ticker: Ticker, clock: FakeClock, attempts: int,
                   probe_ms: Callable[[int], float]) -> list[tuple[float, float, int]]:
    """The manager's loop: (started, due, ticks missed since the previous attempt) per attempt."""
    out, reported = [], 0
    while len(out) < attempts:
        clock.sleep_until(ticker.next_fire())
        due = ticker.consume(clock.now)
        out.append((clock.now, due, ticker.missed - reported))
        reported = ticker.missed
        clock.advance(probe_ms(len(out) - 1))
    return out


def test_consume_returns_the_due_time_of_the_tick_it_takes():
    ticker = Ticker(5.0, 10.0)
    assert ticker.consume(5.0) == 5.0
    assert ticker.consume(15.0 - 1e-6) == 15.0     # woken a hair early: still that tick
    assert ticker.consume(31.0) == 25.0            # late: the buffered tick, due at 25


def test_a_punctual_probe_misses_no_tick_and_starts_on_time():
    clock = FakeClock()
    assert run_and_report(Ticker(0.0, 10.0), clock, 4, lambda i: 3.0) == [
        (0.0, 0.0, 0), (10.0, 10.0, 0), (20.0, 20.0, 0), (30.0, 30.0, 0)]


def test_an_overrun_delivers_the_buffered_tick_late_and_counts_the_dropped_ones():
    # The second attempt runs 10..45: the tick due at 20 waits in Go's one-slot channel
    # and starts the third attempt 15 ms late; 30 and 40 found the slot full: dropped.
    clock = FakeClock()
    report = run_and_report(Ticker(0.0, 10.0), clock, 4, lambda i: 35.0 if i == 1 else 1.0)
    assert report == [(0.0, 0.0, 0), (10.0, 10.0, 0), (45.0, 20.0, 2), (50.0, 50.0, 0)]


def test_a_probe_always_slower_than_its_period_drops_every_other_tick():
    # 15 ms attempts every 10 ms, as with Go's ticker: 10 and 20 wait in the slot, 30 is dropped.
    clock = FakeClock()
    report = run_and_report(Ticker(0.0, 10.0), clock, 4, lambda i: 15.0)
    assert report == [(0.0, 0.0, 0), (15.0, 10.0, 0), (30.0, 20.0, 1), (45.0, 40.0, 0)]


def test_a_stalled_loop_drops_every_tick_it_slept_through():
    ticker = Ticker(0.0, 1_000.0)
    ticker.consume(0.0)
    assert ticker.consume(10_500.0) == 1_000.0
    assert ticker.missed == 9


@pytest.mark.parametrize("scheduled, started, late", [
    (1_000_000_000, 1_000_000_000, False),
    (1_000_000_000, 1_000_000_000 + LATE_AFTER_NS, False),      # exactly at the bound: on time
    (1_000_000_000, 1_000_000_000 + LATE_AFTER_NS + 1, True),
    (1_000_000_000, 999_000_000, False),                         # woken early
    (0, 5_000_000_000, False),                                   # no tick: a one-off attempt
])
def test_is_late(scheduled, started, late):
    assert is_late(scheduled, started) is late


@pytest.mark.parametrize("period", [0, -1])
def test_ticker_rejects_non_positive_period(period):
    with pytest.raises(ValueError):
        Ticker(0.0, period)


# --- gate ----------------------------------------------------------------------------

def gate_at(probe_type=READINESS, *, now=10_000.0, started_at=0.0, delay=0,
            container_started=True, on_hold=False):
    return gate(probe_type, now_ms=now, container_started_at_ms=started_at,
                initial_delay_ms=delay, container_started=container_started, on_hold=on_hold)


@pytest.mark.parametrize("kwargs, reason", [
    ({}, None),
    ({"probe_type": LIVENESS}, None),
    # On hold wins over everything.
    ({"probe_type": LIVENESS, "on_hold": True, "now": 0.0, "delay": 5_000}, SKIP_ON_HOLD),
    ({"probe_type": STARTUP, "on_hold": True, "container_started": False}, SKIP_ON_HOLD),
    # Initial delay, in milliseconds, before startup gating.
    ({"now": 4_999.0, "delay": 5_000}, SKIP_INITIAL_DELAY),
    ({"now": 5_000.0, "delay": 5_000}, None),
    ({"now": 1_250.0, "started_at": 1_000.0, "delay": 250}, None),
    ({"now": 1_249.9, "started_at": 1_000.0, "delay": 250}, SKIP_INITIAL_DELAY),
    ({"probe_type": STARTUP, "now": 10.0, "delay": 100, "container_started": True},
     SKIP_INITIAL_DELAY),
    ({"probe_type": LIVENESS, "now": 10.0, "delay": 100, "container_started": False},
     SKIP_INITIAL_DELAY),
    # Startup gating.
    ({"probe_type": STARTUP, "container_started": False}, None),
    ({"probe_type": STARTUP, "container_started": True}, SKIP_STARTUP_DONE),
    ({"probe_type": LIVENESS, "container_started": False}, SKIP_WAITING_FOR_STARTUP),
    ({"probe_type": READINESS, "container_started": False}, SKIP_WAITING_FOR_STARTUP),
])
def test_gate(kwargs, reason):
    assert gate_at(**kwargs) == reason


def test_initial_delay_gates_ticks_until_it_has_passed():
    # Period 1 s, container started at 0, delay 2.5 s, first tick at 0.3 s:
    # ticks at 0.3, 1.3, 2.3 are skipped, 3.3 is the first attempt.
    clock = FakeClock()
    ticker = Ticker(300.0, 1_000.0)
    skipped: list[float] = []

    def skip(now: float) -> bool:
        reason = gate_at(now=now, started_at=0.0, delay=2_500)
        if reason is not None:
            skipped.append(now)
        return reason is not None

    assert simulate(ticker, clock, 2, skip=skip) == [3_300.0, 4_300.0]
    assert skipped == [300.0, 1_300.0, 2_300.0]


def test_liveness_waits_for_startup_then_startup_stops():
    # The startup probe succeeds at its third attempt (t=20); from the next tick on
    # liveness probes and startup idles.
    startup_results = iter([False, False, True])
    started = False
    startup_ran, liveness_ran = [], []
    for now in [0.0, 10.0, 20.0, 30.0, 40.0]:
        if gate_at(STARTUP, now=now, container_started=started) is None:
            startup_ran.append(now)
            started = next(startup_results)
        if gate_at(LIVENESS, now=now, container_started=started) is None:
            liveness_ran.append(now)
    assert startup_ran == [0.0, 10.0, 20.0]
    # Same tick as the success: the kubelet's workers are independent goroutines, a
    # worker whose tick comes after the startup result may already probe.
    assert liveness_ran == [20.0, 30.0, 40.0]
