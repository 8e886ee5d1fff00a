"""Probe timing: jitter, Go-ticker semantics and the per-tick gate, driven by a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cri_proto import probe_spec_pb2 as pb
from probe_worker.scheduling import (
    SKIP_INITIAL_DELAY,
    SKIP_ON_HOLD,
    SKIP_STARTUP_DONE,
    SKIP_WAITING_FOR_STARTUP,
    Ticker,
    gate,
    initial_jitter_ms,
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


# --- jitter --------------------------------------------------------------------------

@pytest.mark.parametrize("period, start_now, rand_value, expected", [
    (10_000, True, 0.7, 0.0),
    (10_000, False, 0.0, 0.0),
    (10_000, False, 0.25, 2_500.0),
    (10_000, False, 0.999999, 9_999.99),
    (250, False, 0.5, 125.0),
])
def test_initial_jitter(period, start_now, rand_value, expected):
    assert initial_jitter_ms(period, start_now, lambda: rand_value) == pytest.approx(expected)


def test_start_now_does_not_draw_a_random_number():
    def rand() -> float:
        raise AssertionError("rand() called")
    assert initial_jitter_ms(10_000, True, rand) == 0.0


@pytest.mark.parametrize("bad", [1.0, -0.1, 2.0])
def test_jitter_rejects_rand_outside_unit_interval(bad):
    with pytest.raises(ValueError):
        initial_jitter_ms(10_000, False, lambda: bad)


def test_jitter_stays_within_one_period_for_many_draws():
    values = [i / 1000 for i in range(1000)]
    jitters = [initial_jitter_ms(300, False, lambda v=v: v) for v in values]
    assert min(jitters) == 0.0
    assert max(jitters) < 300


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
