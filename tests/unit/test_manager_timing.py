"""probe_worker/manager.py: each attempt carries the due time of its tick and the ticks dropped before it,
and a worker's probes of one period tick together.

A fake prober (no sockets) stands in for the real one; the manager runs on a real
event loop, so the times are the loop's own.
"""

from __future__ import annotations

import asyncio
import time

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.manager import ProbeManager

PERIOD_MS = 20
DEADLINE_S = 10.0
# A due time goes from the loop's clock to the wall clock through two clock reads back to back, so a preemption
# between them moves it off the grid by as long as the worker was off the CPU: 2 us typically, 0.1 ms at most in
# 240 ticks beside three CPU burners on 2 cores (measured 2026-11-28). A quarter period keeps a loaded CI run green
# and still tells the grid from a schedule that drifts with its attempts (SLOW_S, half a period, on every tick).
SKEW_NS = PERIOD_MS * 1_000_000 // 4
SLOW_S = PERIOD_MS / 2 / 1000


class FakeProber:
    """Answers SUCCESS; the attempts listed in `slow_s` take that long first."""

    def __init__(self, slow_s: dict[int, float] | None = None) -> None:
        self.slow_s = slow_s or {}
        self.calls = 0

    async def run(self, spec, container_ports) -> spec_pb.Attempt:
        index, self.calls = self.calls, self.calls + 1
        started = time.time_ns()
        await asyncio.sleep(self.slow_s.get(index, 0.0))  # the attempt itself taking time, not a wait for the test
        return spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=started,
                               duration_ns=time.time_ns() - started)


def registration(probe_id: str, start_now: bool = True) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id=probe_id, type=spec_pb.READINESS, start_now=start_now,
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80)),
                               period_ms=PERIOD_MS),
        container=worker_pb.ContainerRef(id="c", name="app"),
    )


async def reports_of(prober: FakeProber, count: int, *regs: worker_pb.ProbeRegistration) -> list[worker_pb.AttemptReport]:
    reports: asyncio.Queue[worker_pb.AttemptReport] = asyncio.Queue()

    async def emit(event: worker_pb.WorkerEvent) -> None:
        if event.WhichOneof("msg") == "attempt":
            reports.put_nowait(event.attempt)

    manager = ProbeManager(prober, emit)
    for reg in regs:
        await manager.add(reg)
    try:
        async with asyncio.timeout(DEADLINE_S):
            return [await reports.get() for _ in range(count)]
    finally:
        await manager.close()


async def attempts_of(prober: FakeProber, count: int) -> list[spec_pb.Attempt]:
    return [report.status.last_attempt for report in await reports_of(prober, count, registration("p"))]


def test_each_attempt_carries_when_its_tick_was_due():
    # Every attempt takes half a period: a schedule counted from the end of the last attempt would drift by that.
    attempts = asyncio.run(attempts_of(FakeProber(slow_s=dict.fromkeys(range(5), SLOW_S)), 5))
    due = [a.scheduled_at_unix_ns for a in attempts]
    assert all(d > 0 for d in due)
    # start_now: the first at once, the second at the worker's next grid point, less than a period later...
    assert 0 < due[1] - due[0] <= PERIOD_MS * 1_000_000 + SKEW_NS
    # ... then on the grid, whatever the attempts' durations and the wake-up delays were.
    for before, after in zip(due[1:], due[2:]):
        assert abs((after - before) - PERIOD_MS * 1_000_000) < SKEW_NS
    # An attempt never starts before its tick (asyncio wakes up at most its clock resolution early).
    assert all(a.started_at_unix_ns - a.scheduled_at_unix_ns > -2_000_000 for a in attempts)
    assert [a.ticks_missed for a in attempts] == [0, 0, 0, 0, 0]


def test_an_attempt_that_outlasts_its_period_delays_the_next_and_drops_ticks():
    # The first attempt takes 3.5 periods: the first grid tick (at most 1 period in) waits in
    # the ticker's slot and starts the second attempt at least 2.5 periods late; the next
    # 2 or 3 ticks are dropped.
    attempts = asyncio.run(attempts_of(FakeProber(slow_s={0: 3.5 * PERIOD_MS / 1000}), 3))
    first, second, third = attempts
    assert first.ticks_missed == 0
    assert second.ticks_missed >= 2
    assert 0 < second.scheduled_at_unix_ns - first.scheduled_at_unix_ns <= PERIOD_MS * 1_000_000 + SKEW_NS
    assert second.started_at_unix_ns - second.scheduled_at_unix_ns >= 2 * PERIOD_MS * 1_000_000
    assert third.scheduled_at_unix_ns > second.scheduled_at_unix_ns


def test_probes_of_one_period_tick_together():
    # Added one after the other, not started at once: all on the worker's one grid for the period.
    reports = asyncio.run(reports_of(FakeProber(), 9, *(registration(p, start_now=False) for p in "abc")))
    due: dict[str, list[int]] = {}
    for report in reports:
        due.setdefault(report.probe_id, []).append(report.status.last_attempt.scheduled_at_unix_ns)
    assert sorted(due) == ["a", "b", "c"]
    # Every tick one probe ran for within another's run, the other ran for too (give or take
    # the clock reads, SKEW_NS): the same instants, not three phases.
    for mine in due.values():
        for theirs in due.values():
            shared = [instant for instant in mine if min(theirs) <= instant <= max(theirs)]
            assert shared  # their runs overlap: 9 attempts came from 3 or 4 ticks
            for instant in shared:
                assert min(abs(instant - other) for other in theirs) < SKEW_NS
