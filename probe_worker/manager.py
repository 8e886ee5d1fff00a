"""The probes of one sandbox: one asyncio task per probe (the kubelet's worker.go).

Timing decisions come from probe_worker.scheduling, threshold bookkeeping from
probe_worker.thresholds; this module only wires them to the clock, the prober
and the channel. Results go out as events: an AttemptReport per attempt (the
attempt, with the due time of the tick it ran for and the ticks dropped before it, so the
daemon can count late and missed attempts, and the worker's fields of the probe's status after
it) and a StateChange only when the thresholded state changes (emit on change).

A probe's status is the service's ProbeStatus, one per probe, which the worker updates: the
daemon may start a probe from one (`status` of its registration), and a Snapshot reports it
back. The worker owns the fields probe_api/status.py names WORKER_OWNED; every other field
goes back as it came.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.attempts import count_attempt
from probe_api.status import WORKER_OWNED, copy_status, status_copy
from probe_api.validation import Timing, effective_timing
from probe_worker.prober import Prober
from probe_worker.scheduling import PhaseGrid, gate
from probe_worker.thresholds import ThresholdTracker, container_started

Emit = Callable[[worker_pb.WorkerEvent], Awaitable[None]]


@dataclass
class _Probe:
    reg: worker_pb.ProbeRegistration  # as added, status cleared
    timing: Timing
    tracker: ThresholdTracker
    started_at_ms: float              # container start, on the event loop's clock
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # Where the probe stands, as the service's ProbeStatus: the daemon's fields (DAEMON_OWNED) as it gave them, handed
    # back in a Snapshot untouched; the worker's own (WORKER_OWNED) kept here at every attempt, the totals and the
    # last attempt included, so that events lost with a daemon that died do not make an adopting daemon's wrong.
    status: service_pb.ProbeStatus = field(default_factory=service_pb.ProbeStatus)

    def show_thresholds(self) -> None:
        """The tracker's bookkeeping onto the status (after an attempt, a resume or a new container)."""
        t, status = self.tracker, self.status
        status.state, status.consecutive_successes, status.consecutive_failures, status.on_hold = (
            t.state, t.consecutive_successes, t.consecutive_failures, t.on_hold)

    def take(self, attempt: spec_pb.Attempt) -> bool:
        """One attempt's result into the thresholds and the status; True iff the thresholded state changed."""
        changed = self.tracker.observe(attempt.result)
        self.status.last_attempt.CopyFrom(attempt)
        count_attempt(self.status.totals, attempt.result)
        self.show_thresholds()
        if changed:
            self.status.state_changed_at = time.time_ns()
        return changed

    def report(self, sandbox_id: str) -> worker_pb.AttemptReport:
        """The attempt just taken and where the probe stands after it: the worker's fields of its status."""
        out = worker_pb.AttemptReport(probe_id=self.reg.probe_id, sandbox_id=sandbox_id)
        copy_status(self.status, out.status, only=WORKER_OWNED)
        return out


class ProbeManager:
    """The probes of one sandbox; its events carry the sandbox's id (a worker serves several)."""

    def __init__(self, prober: Prober, emit: Emit, rand: Callable[[], float] = random.random,
                 sandbox_id: str = "", grid: PhaseGrid | None = None) -> None:
        """grid: the worker's tick grids, shared by all its sandboxes (see scheduling); a new one if not given."""
        self._prober = prober
        self.sandbox_id = sandbox_id
        self._emit = emit
        self._grid = grid if grid is not None else PhaseGrid(rand)
        self._probes: dict[str, _Probe] = {}

    def __len__(self) -> int:
        return len(self._probes)

    async def add(self, reg: worker_pb.ProbeRegistration) -> None:
        """Adds or replaces a validated probe and starts its loop.

        A replacement keeps the threshold bookkeeping when type and thresholds are
        unchanged; for a new container ID it resets the state to the initial value
        and lifts "on hold", as the kubelet's worker does. A new probe with a `status`
        goes on from it (the daemon knows the state already: no change is emitted).
        """
        old = self._probes.pop(reg.probe_id, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        previous = old.tracker.state if old is not None else spec_pb.STATE_UNKNOWN
        timing = effective_timing(reg.spec)
        resumed = old is None and reg.HasField("status")
        if old is not None and old.reg.type == reg.type and (
            old.timing.success_threshold, old.timing.failure_threshold
        ) == (timing.success_threshold, timing.failure_threshold):
            tracker = old.tracker
            if old.reg.container.id != reg.container.id:
                tracker.new_container()
        else:
            tracker = ThresholdTracker(reg.type, timing.success_threshold, timing.failure_threshold)
        stored = worker_pb.ProbeRegistration()
        stored.CopyFrom(reg)
        stored.ClearField("status")
        probe = _Probe(reg=stored, timing=timing, tracker=tracker, started_at_ms=self._container_start_ms(reg))
        if resumed:
            p = reg.status
            tracker.resume(p.state, p.consecutive_successes, p.consecutive_failures, p.on_hold)
            probe.status = status_copy(p)
        elif old is not None:
            probe.status = old.status
        probe.show_thresholds()
        self._probes[reg.probe_id] = probe
        if not resumed and tracker.state != previous:
            probe.status.state_changed_at = time.time_ns()
            await self._emit_change(reg.probe_id, previous, tracker.state, "registered", probe.status.state_changed_at)
        probe.task = asyncio.create_task(self._run(probe), name=f"probe {reg.probe_id}")

    def snapshot(self) -> list[worker_pb.ProbeSnapshot]:
        """Every probe as it runs and where it stands (for a daemon adopting this worker)."""
        return [worker_pb.ProbeSnapshot(registration=p.reg, status=p.status) for p in self._probes.values()]

    def remove(self, probe_id: str) -> bool:
        probe = self._probes.pop(probe_id, None)
        if probe is None:
            return False
        if probe.task is not None:
            probe.task.cancel()
        return True

    async def close(self) -> None:
        tasks = [p.task for p in self._probes.values() if p.task is not None]
        self._probes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _container_start_ms(self, reg: worker_pb.ProbeRegistration) -> float:
        now_ms = asyncio.get_running_loop().time() * 1000
        started_ns = reg.container.started_at_unix_ns
        if not started_ns:
            return now_ms
        return now_ms - max(0.0, (time.time_ns() - started_ns) / 1e6)

    def _container_started(self, container_id: str) -> bool:
        startup = next(
            (p.tracker.state for p in self._probes.values()
             if p.reg.type == spec_pb.STARTUP and p.reg.container.id == container_id),
            None,
        )
        return container_started(startup)

    async def _run(self, probe: _Probe) -> None:
        loop = asyncio.get_running_loop()
        reg, timing, tracker = probe.reg, probe.timing, probe.tracker
        now_ms = loop.time() * 1000
        ticker = self._grid.ticker(now_ms, timing.period_ms, reg.start_now)
        missed_reported = 0
        while True:
            wait_ms = ticker.next_fire() - loop.time() * 1000
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            # Both clocks read back to back: the tick's due time goes on the wall clock, which the attempt's start
            # is reported on, and a preemption between the two reads would shift it.
            now_ms, wall_ns = loop.time() * 1000, time.time_ns()
            due_ms = ticker.consume(now_ms)
            scheduled_at_ns = wall_ns - round((now_ms - due_ms) * 1e6)
            skip = gate(
                reg.type,
                now_ms=now_ms,
                container_started_at_ms=probe.started_at_ms,
                initial_delay_ms=timing.initial_delay_ms,
                container_started=self._container_started(reg.container.id),
                on_hold=tracker.on_hold,
            )
            if skip is not None:
                continue
            attempt = await self._prober.run(reg.spec, reg.container.ports)
            attempt.scheduled_at_unix_ns = scheduled_at_ns
            attempt.ticks_missed, missed_reported = ticker.missed - missed_reported, ticker.missed
            previous = tracker.state
            changed = probe.take(attempt)
            await self._emit(worker_pb.WorkerEvent(attempt=probe.report(self.sandbox_id)))
            if changed:
                await self._emit_change(reg.probe_id, previous, tracker.state, attempt.output,
                                        probe.status.state_changed_at)

    async def _emit_change(self, probe_id: str, previous: int, state: int, output: str, at_ns: int) -> None:
        await self._emit(worker_pb.WorkerEvent(state_change=worker_pb.StateChange(
            probe_id=probe_id, previous=previous, state=state, output=output, sandbox_id=self.sandbox_id,
            changed_at_unix_ns=at_ns,
        )))
