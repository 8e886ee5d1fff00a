"""When a probe runs: the timing of the kubelet's worker.run loop, on a caller's clock.

Owns the start jitter, the ticker (Go's time.Ticker, which drops ticks a slow
receiver missed) and the per-tick gate of worker.doProbe (on hold, initial delay,
startup gating), kubelet 1.32. Times are float milliseconds on any monotonic clock
the caller chooses; nothing here reads a clock or sleeps.

The caller's loop:

    ticker = Ticker(start + initial_jitter_ms(period, start_now, random.random), period)
    while running:
        await sleep_until(ticker.next_fire())
        ticker.consume(now())
        if gate(...) is None:
            await probe()          # may take longer than a period
"""

from __future__ import annotations

import math
from collections.abc import Callable

from cri_proto import probe_spec_pb2 as spec_pb

SKIP_ON_HOLD = "on hold until a new container"
SKIP_INITIAL_DELAY = "initial delay"
SKIP_STARTUP_DONE = "startup probe done"
SKIP_WAITING_FOR_STARTUP = "waiting for startup probe"


def initial_jitter_ms(period_ms: int, start_now: bool, rand: Callable[[], float]) -> float:
    """Random wait before the first attempt, in [0, period).

    The kubelet jitters only in its first period after (re)starting, so that a
    restart does not fire every probe of the node at once; start_now is our
    caller's way of saying "no such herd, probe right away".
    """
    if start_now:
        return 0.0
    fraction = rand()
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"rand() must return a value in [0, 1), got {fraction}")
    return fraction * period_ms


class Ticker:
    """Go's time.Ticker as the kubelet uses it, plus the attempt made before its first tick.

    Ticks fall on a fixed grid: first_fire_ms + k * period_ms, k >= 0 (k = 0 stands
    for the doProbe call the kubelet makes before waiting on the ticker). The
    ticker channel holds a single tick: when an attempt outlasts one or more
    periods, exactly one missed tick is still delivered at once, the others are
    dropped, and the grid never shifts. Go 1.23's synchronous timer channels keep
    this observable behaviour.
    """

    def __init__(self, first_fire_ms: float, period_ms: float):
        if period_ms <= 0:
            raise ValueError(f"period must be positive, got {period_ms}")
        self.first_fire_ms = first_fire_ms
        self.period_ms = period_ms
        self._next_index = 0  # earliest tick not consumed yet

    def _tick(self, index: int) -> float:
        return self.first_fire_ms + index * self.period_ms

    def next_fire(self) -> float:
        """When the next attempt may run; a time in the past means "now"."""
        return self._tick(self._next_index)

    def consume(self, now_ms: float) -> None:
        """Take the pending tick (once per wake-up); every other tick up to now_ms is dropped.

        The pending tick is taken even when now_ms reads a hair before it: asyncio
        wakes sleepers up to its clock resolution early, and a tick left pending
        would fire a second attempt right after the first.
        """
        index = math.floor((now_ms - self.first_fire_ms) / self.period_ms)
        # The division can land a hair off the grid either way: fix it up exactly.
        while self._tick(index + 1) <= now_ms:
            index += 1
        while index >= 0 and self._tick(index) > now_ms:
            index -= 1
        self._next_index = max(self._next_index + 1, index + 1)


def gate(probe_type: int, *, now_ms: float, container_started_at_ms: float,
         initial_delay_ms: int, container_started: bool, on_hold: bool) -> str | None:
    """Why this tick is skipped (worker.doProbe's early returns, in its order), or None to probe.

    The kubelet compares whole elapsed seconds (int32 truncation) with whole
    InitialDelaySeconds; for whole-second delays that is the same as comparing
    milliseconds (a start time up to 1 s in the future aside, which truncation
    rounds to 0), and our delays can be sub-second, so we compare milliseconds.
    """
    if on_hold:
        return SKIP_ON_HOLD
    if now_ms - container_started_at_ms < initial_delay_ms:
        return SKIP_INITIAL_DELAY
    if probe_type == spec_pb.STARTUP:
        # Kept idle rather than stopped: a restarted container needs it again.
        return SKIP_STARTUP_DONE if container_started else None
    return None if container_started else SKIP_WAITING_FOR_STARTUP
