"""Late and missed attempts, computed from what a watcher saw (pure).

The worker schedules each probe on a fixed grid, first_fire + k * period (Go's
time.Ticker: a slow attempt drops the ticks it outlasted, the grid never shifts).
An attempt is late when it starts more than LATE_NS after its tick; a tick is missed
when no attempt ran for it.

Three ways to know, best first (bench/scale.py takes the best the daemon offers):
- `from_counters`: the daemon counts them itself (probe_shim_attempts_late_total,
  probe_shim_ticks_missed_total on /metrics); only the change over the window is read.
- `from_due_times`: each attempt reports the tick it ran for (Attempt.scheduled_at_unix_ns),
  seen through an every_attempt watch; exact.
- `from_start_times`: only start times are known; the grid is recovered from them.
  Lateness only ever delays an attempt, so each probe's grid is placed at the phase
  (start time modulo the period) that makes its attempts least late in total. Exact
  while most attempts of the probe in the window were on time; a probe whose every
  attempt is late by the same amount looks punctual, so this method can only
  under-count lateness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

LATE_NS = 100_000_000


@dataclass(frozen=True)
class Punctuality:
    attempts: int
    late: int
    missed: int
    max_lateness_ms: float | None  # None when only counts are known
    method: str

    def as_dict(self) -> dict:
        return {"attempts": self.attempts, "late": self.late, "missed": self.missed,
                "max_lateness_ms": None if self.max_lateness_ms is None else round(self.max_lateness_ms, 3),
                "method": self.method}


def grid_phase(starts_ns: list[int], period_ns: int) -> int:
    """The phase (in [0, period)) of the grid the start times were scheduled on.

    Lateness only delays, so the grid's phase is the observed phase that leaves the
    attempts, taken together, least late: for punctual attempts that is the earliest
    phase of their cluster, and a few late outliers cannot move it.
    """
    phases = sorted({s % period_ns for s in starts_ns})
    return min(phases, key=lambda p: sum((s - p) % period_ns for s in starts_ns))


def ticks_and_lateness(starts_ns: list[int], period_ns: int) -> list[tuple[int, int]]:
    """(tick index, lateness in ns) of each start time against the recovered grid."""
    phase = grid_phase(starts_ns, period_ns)
    out = []
    for s in starts_ns:
        lateness = (s - phase) % period_ns
        out.append(((s - phase - lateness) // period_ns, lateness))
    return out


def _missed(ticks: Iterable[int]) -> int:
    seen = sorted(set(ticks))
    return (seen[-1] - seen[0] + 1) - len(seen) if seen else 0


def _total(per_probe: Iterable[tuple[list[int], list[int]]], late_ns: int, method: str) -> Punctuality:
    """Sums each probe's (tick indexes, latenesses in ns) into one Punctuality."""
    attempts = late = missed = 0
    worst = 0
    for ticks, lateness in per_probe:
        attempts += len(lateness)
        late += sum(1 for x in lateness if x > late_ns)
        worst = max([worst, *lateness])
        missed += _missed(ticks)
    return Punctuality(attempts, late, missed, worst / 1e6, method)


def from_start_times(starts_by_probe: Mapping[str, list[int]], period_ns: int,
                     late_ns: int = LATE_NS) -> Punctuality:
    def placed(starts: list[int]) -> tuple[list[int], list[int]]:
        pairs = ticks_and_lateness(starts, period_ns)
        return [tick for tick, _ in pairs], [lateness for _, lateness in pairs]
    return _total((placed(s) for s in starts_by_probe.values() if s), late_ns,
                  "grid recovered from attempt start times")


def from_due_times(attempts_by_probe: Mapping[str, list[tuple[int, int]]], period_ns: int,
                   late_ns: int = LATE_NS) -> Punctuality:
    """attempts_by_probe: (due_ns, started_ns) of each attempt."""
    def placed(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        first = min(due for due, _ in pairs)
        return ([round((due - first) / period_ns) for due, _ in pairs],
                [max(0, started - due) for due, started in pairs])
    return _total((placed(p) for p in attempts_by_probe.values() if p), late_ns,
                  "due time reported with each attempt")


def from_counters(attempts: int, late: int, missed: int) -> Punctuality:
    return Punctuality(attempts, late, missed, None, "daemon counters (probe_shim_attempts_late_total, "
                                                    "probe_shim_ticks_missed_total)")
