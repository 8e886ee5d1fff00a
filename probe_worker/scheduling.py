"""When a probe runs: the timing of the kubelet's worker.run loop, on a caller's clock.

Owns the tick grid (one random phase per period for all of a worker's probes),
the ticker (Go's time.Ticker, which drops ticks a slow receiver missed, and here
counts them), the per-tick gate of worker.doProbe (on hold, initial delay, startup
gating), kubelet 1.32, and when an attempt counts as late. Times are float
milliseconds on any monotonic clock the caller chooses; nothing here reads a
clock or sleeps.

Why one grid per period: the kubelet creates a pod's probe workers together
(AddPod), each runs its first doProbe at once and then ticks from that instant,
so the probes of one pod with equal periods fire at nearly the same instants.
We go further on purpose: all of a worker's probes of one period, whatever
sandbox of its group they belong to, start in one wake-up of the worker (one
timer, one pass through the event loop, and caches warmed by the first attempt
for the others: an idle worker runs an attempt about twice as slowly as a busy
one) instead of one wake-up each. At 250 sandboxes x 3 probes at 1 s that took
the workers from 38% of a core to 23%. A pod cannot tell: its probes still come
once a period each. The phase is random per worker and period, drawn once, so
workers do not fire together (what the kubelet's start jitter is for), and each
probe alone still waits a uniform [0, period) for its first tick.

The caller's loop:

    grid = PhaseGrid(random.random)                     # one per worker
    ticker = grid.ticker(now(), period, start_now)      # one per probe
    while running:
        await sleep_until(ticker.next_fire())
        due = ticker.consume(now())   # the tick this attempt runs for
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

# An attempt that starts more than this after its tick was due counts as late
# (the benchmark's and /metrics' definition; far above asyncio's timer slack).


def grid_point(at_ms: float, period_ms: float, phase_ms: float, after: bool = False) -> float:
    """The first point of the grid phase + k * period at or after at_ms (strictly after if `after`)."""
    k = math.ceil((at_ms - phase_ms) / period_ms)
    # The division can land a hair off the grid either way: fix it up exactly.
    while phase_ms + k * period_ms < at_ms or (after and phase_ms + k * period_ms == at_ms):
        k += 1
    while phase_ms + (k - 1) * period_ms > at_ms or (not after and phase_ms + (k - 1) * period_ms == at_ms):
        k -= 1
    return phase_ms + k * period_ms


# Distinct periods a worker keeps phases for; past that (a client changing periods again and
# again), the phases are simply drawn anew: only probes added later land on other grids.
MAX_GRIDS = 256


class PhaseGrid:
    """One worker's tick grids: a random phase per period, drawn the first time the period is used."""

    def __init__(self, rand: Callable[[], float]) -> None:
        self._rand = rand
        self._phases: dict[float, float] = {}

    def phase_ms(self, period_ms: float) -> float:
        phase = self._phases.get(period_ms)
        if phase is None:
            if len(self._phases) >= MAX_GRIDS:
                self._phases.clear()
            fraction = self._rand()
            if not 0.0 <= fraction < 1.0:
                raise ValueError(f"rand() must return a value in [0, 1), got {fraction}")
            phase = self._phases[period_ms] = fraction * period_ms
        return phase

    def ticker(self, now_ms: float, period_ms: float, start_now: bool) -> "Ticker":
        """A new probe's ticker: first tick at the grid's next point, or at once for start_now
        (the caller saw no herd to avoid), then on the grid."""
        if period_ms <= 0:
            raise ValueError(f"period must be positive, got {period_ms}")
        phase = self.phase_ms(period_ms)
        if start_now:
            return Ticker(now_ms, period_ms, grid_phase_ms=phase)
        return Ticker(grid_point(now_ms, period_ms, phase), period_ms)


class Ticker:
    """Go's time.Ticker as the kubelet uses it, plus the attempt made before its first tick.

    Tick 0 is at first_fire_ms (it stands for the doProbe call the kubelet makes
    before waiting on the ticker); the others fall on a fixed grid of period_ms
    steps: through first_fire_ms itself, or through grid_phase_ms from its first
    point after first_fire_ms. The ticker channel holds a single tick: when an
    attempt outlasts one or more ticks, exactly one missed tick is still
    delivered at once, the others are dropped, and the grid never shifts. Go
    1.23's synchronous timer channels keep this observable behaviour. `missed`
    counts the dropped ticks.
    """

    def __init__(self, first_fire_ms: float, period_ms: float, grid_phase_ms: float | None = None):
        if period_ms <= 0:
            raise ValueError(f"period must be positive, got {period_ms}")
        self.first_fire_ms = first_fire_ms
        self.period_ms = period_ms
        phase = first_fire_ms if grid_phase_ms is None else grid_phase_ms
        self._grid_start = grid_point(first_fire_ms, period_ms, phase, after=True)  # tick 1
        self._next_index = 0  # earliest tick not consumed yet
        self.missed = 0       # ticks dropped so far: they came while an attempt still ran

    def _tick(self, index: int) -> float:
        return self.first_fire_ms if index == 0 else self._grid_start + (index - 1) * self.period_ms

    def next_fire(self) -> float:
        """When the next attempt may run; a time in the past means "now"."""
        return self._tick(self._next_index)

    def consume(self, now_ms: float) -> float:
        """Take the pending tick (once per wake-up); every other tick up to now_ms is dropped.

        Returns when the taken tick was due: the earliest one not consumed, which is the
        one Go's single-slot channel holds (later ones found it full). The pending tick
        is taken even when now_ms reads a hair before it: asyncio wakes sleepers up to
        its clock resolution early, and a tick left pending would fire a second attempt
        right after the first.
        """
        index = 0 if now_ms < self._grid_start else 1 + math.floor((now_ms - self._grid_start) / self.period_ms)
        # The division can land a hair off the grid either way: fix it up exactly.
        while self._tick(index + 1) <= now_ms:
            index += 1
        while index >= 0 and self._tick(index) > now_ms:
            index -= 1
        taken = self._next_index
        self.missed += max(0, index - taken)
        self._next_index = max(taken + 1, index + 1)
        return self._tick(taken)



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
