"""Results: what the workers report, turned into status, spans and metrics (the kubelet's results_manager).

In: the supervisor's sink (`on_event`: attempts and state changes of a sandbox's probes; `on_worker`: a worker's
life), one-off attempts (`exec_attempt` for ExecProbe, `bridged_attempt` for the kubelet bridge). Out: the status
board's observed fields (a thresholded state change is a new revision that watchers get; an attempt only updates
the last attempt, counters and totals, and reaches every_attempt watchers as ATTEMPT), one span per attempt and the
kubelet's metrics. Emit on change, as the kubelet's results manager does: the worker reports a state change only
when the state changes, and nothing else here makes a revision per attempt.

Registrations are not this module's: the registry puts and removes probes on the board and tells this module who a
sandbox is (`note_sandbox`: its pod's name, namespace and uid label spans and metrics) and which trace parents a
probe's attempts (`set_traceparent`). One `ProbeLabels` value is what a span and a metric series carry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import count_attempt, is_late
from shim.sandboxes.resolver import SandboxInfo


@dataclass(frozen=True)
class ProbeLabels:
    """Who an attempt is of: the identity its span carries and its metric series are labelled with."""

    probe_id: str
    probe_type: int
    sandbox_id: str
    container_name: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""


class ResultsManager:
    def __init__(self, *, board, tracer, metrics) -> None:
        self._board = board
        self._tracer = tracer
        self._metrics = metrics
        self._sandboxes: dict[str, SandboxInfo] = {}
        self._traceparents: dict[str, str] = {}
        self._restarts_seen: dict[str, int] = {}
        self._running: dict[str, int] = {}  # sandbox -> pid of the worker serving it, for probe_shim_workers

    # --- who is who (from the registry and the bridge) ------------------------------------------------------

    def note_sandbox(self, sandbox: SandboxInfo) -> None:
        self._sandboxes[sandbox.id] = sandbox

    def sandbox(self, sandbox_id: str) -> SandboxInfo | None:
        return self._sandboxes.get(sandbox_id)

    def known_sandboxes(self) -> dict[str, SandboxInfo]:
        return dict(self._sandboxes)

    def forget_sandbox(self, sandbox_id: str) -> None:
        self._sandboxes.pop(sandbox_id, None)

    def set_traceparent(self, probe_id: str, traceparent: str | None) -> None:
        """The caller's trace parents this probe's attempt spans (kept in memory only)."""
        if traceparent:
            self._traceparents[probe_id] = traceparent
        else:
            self._traceparents.pop(probe_id, None)

    def labels(self, probe: service_pb.Probe) -> ProbeLabels:
        info = self._sandboxes.get(probe.pod_sandbox_id)
        return ProbeLabels(
            probe_id=probe.probe_id, probe_type=probe.type, sandbox_id=probe.pod_sandbox_id,
            container_name=probe.container_name, pod_name=info.name if info else "",
            pod_namespace=info.namespace if info else "", pod_uid=info.uid if info else "",
        )

    def probe_removed(self, probe: service_pb.Probe) -> None:
        """A probe left the board: its series go, as the kubelet's worker drops them when it stops."""
        self._traceparents.pop(probe.probe_id, None)
        self._metrics.forget_probe(self.labels(probe))

    # --- the supervisor's sink ------------------------------------------------------------------------------

    def on_event(self, sandbox_id: str, event: worker_pb.WorkerEvent) -> None:
        kind = event.WhichOneof("msg")
        if kind == "attempt":
            self._on_attempt(event.attempt)
        elif kind == "state_change":
            change = event.state_change
            now = change.changed_at_unix_ns or time.time_ns()

            def set_state(p: service_pb.Probe) -> None:
                p.state = change.state
                p.state_changed_at = now

            current = self._board.peek(change.probe_id)
            if current is not None and current.state == change.state and current.state_changed_at:
                return  # the board had it already (a worker resumed from it): no change, no revision
            self._board.update(change.probe_id, set_state)
        elif kind == "snapshot":
            for probe in event.snapshot.probes:
                self._take_progress(probe.registration.probe_id, probe.progress)

    def progress_of(self, probe_id: str) -> worker_pb.ProbeProgress | None:
        """Where a probe stands, for a worker that starts it again; None if no worker ever ran it."""
        probe = self._board.peek(probe_id)
        if probe is None or not probe.state_changed_at:
            return None
        t = probe.totals
        progress = worker_pb.ProbeProgress(
            state=probe.state, state_changed_at_unix_ns=probe.state_changed_at,
            consecutive_successes=probe.consecutive_successes,
            consecutive_failures=probe.consecutive_failures, on_hold=probe.on_hold,
            totals=worker_pb.AttemptCounts(success=t.success, warning=t.warning, failure=t.failure, unknown=t.unknown))
        if probe.HasField("last_attempt"):
            progress.last_attempt.CopyFrom(probe.last_attempt)
        return progress

    def _take_progress(self, probe_id: str, progress: worker_pb.ProbeProgress) -> None:
        """An adopted worker's word on where a probe stands: it ran on while no daemon listened, so it is right.
        The state changes here only if an attempt the daemon never heard of changed it."""
        current = self._board.peek(probe_id)
        if current is None:
            return
        if current.state != progress.state or not current.state_changed_at:
            changed_at = progress.state_changed_at_unix_ns or time.time_ns()

            def set_state(p: service_pb.Probe) -> None:
                p.state = progress.state
                p.state_changed_at = changed_at

            self._board.update(probe_id, set_state)

        def apply(p: service_pb.Probe) -> None:
            if progress.HasField("last_attempt") and \
                    progress.last_attempt.started_at_unix_ns >= p.last_attempt.started_at_unix_ns:
                p.last_attempt.CopyFrom(progress.last_attempt)
            p.consecutive_successes = progress.consecutive_successes
            p.consecutive_failures = progress.consecutive_failures
            p.on_hold = progress.on_hold
            t = progress.totals
            p.totals.success, p.totals.warning, p.totals.failure, p.totals.unknown = \
                t.success, t.warning, t.failure, t.unknown

        self._board.record_attempt(probe_id, apply)

    def on_worker(self, sandbox_id: str, status: service_pb.WorkerStatus) -> None:
        for probe in self._board.list(service_pb.ProbeFilter(pod_sandbox_id=sandbox_id)):
            if probe.worker != status:  # as it was (a worker adopted across a restart): no revision
                self._board.update(probe.probe_id, lambda p: p.worker.CopyFrom(status))
        # A pooled worker's restart reaches each of its sandboxes: counted once, for its group.
        group = status.group or sandbox_id
        if status.restarts > self._restarts_seen.get(group, 0):
            self._metrics.inc_worker_restarts()
        self._restarts_seen[group] = status.restarts
        if status.state == service_pb.WORKER_RUNNING:
            self._running[sandbox_id] = status.pid
        else:
            self._running.pop(sandbox_id, None)
        self._metrics.set_workers(len(set(self._running.values())))

    def _on_attempt(self, report: worker_pb.AttemptReport) -> None:
        probe = self._board.peek(report.probe_id)  # read-only; record_attempt below changes it
        if probe is None:
            return  # removed while the attempt was in flight
        labels = self.labels(probe)
        attempt = report.attempt
        trace_id, span_id = self._tracer.record(
            attempt, labels, spec=probe.spec, traceparent=self._traceparents.get(probe.probe_id))

        def apply(p: service_pb.Probe) -> None:
            p.last_attempt.CopyFrom(attempt)
            p.last_trace_id, p.last_span_id = trace_id, span_id
            p.consecutive_successes = report.consecutive_successes
            p.consecutive_failures = report.consecutive_failures
            p.on_hold = report.on_hold
            count_attempt(p.totals, attempt.result)

        self._board.record_attempt(probe.probe_id, apply)
        self._metrics.observe_attempt(
            labels, attempt.result, attempt.duration_ns / 1e9,
            late=is_late(attempt.scheduled_at_unix_ns, attempt.started_at_unix_ns), ticks_missed=attempt.ticks_missed,
        )

    # --- one-off attempts -----------------------------------------------------------------------------------

    def exec_attempt(self, attempt: spec_pb.Attempt, labels: ProbeLabels, spec: spec_pb.ProbeSpec,
                     traceparent: str | None) -> tuple[str, str]:
        """ExecProbe's attempt: a span, nothing on the board, no probe series. Returns the span's ids."""
        return self._tracer.record(attempt, labels, spec=spec, traceparent=traceparent)

    def bridged_attempt(self, row: service_pb.Probe, attempt: spec_pb.Attempt, traceparent: str | None, *,
                        counts_as_probe: bool, worker: service_pb.WorkerStatus) -> None:
        """A kubelet bridge attempt: a span, the kubelet's probe series for a probe (not for a hook), and its row.

        `row` is the handler's identity and spec; the row is put (a revision, UPDATED) when it is new or its spec
        changed, and otherwise only gets the attempt, like any probe's attempt."""
        labels = self.labels(row)
        trace_id, span_id = self._tracer.record(attempt, labels, spec=row.spec, traceparent=traceparent)
        if counts_as_probe:
            self._metrics.observe_attempt(labels, attempt.result, attempt.duration_ns / 1e9)
        current = self._board.peek(row.probe_id)
        if current is None or current.spec != row.spec:
            fresh = service_pb.Probe()
            fresh.CopyFrom(row)
            if current is not None:
                fresh.created_at = current.created_at
                fresh.totals.CopyFrom(current.totals)
            self._board.put(fresh)
        self._board.record_attempt(row.probe_id, _bridged_apply(attempt, trace_id, span_id, row, worker))


def _bridged_apply(attempt: spec_pb.Attempt, trace_id: str, span_id: str, row: service_pb.Probe,
                   worker: service_pb.WorkerStatus) -> Callable[[service_pb.Probe], None]:
    def apply(probe: service_pb.Probe) -> None:
        probe.last_attempt.CopyFrom(attempt)
        probe.last_trace_id, probe.last_span_id = trace_id, span_id
        probe.bridged.last_exec_at = row.bridged.last_exec_at
        probe.worker.CopyFrom(worker)
        count_attempt(probe.totals, attempt.result)

    return apply
