"""Results: what the workers report, turned into status, spans and metrics (the kubelet's results_manager).

In: the supervisor's sink (`on_event`: attempts and state changes of a sandbox's probes; `on_worker`: a worker's
life), one-off attempts (`exec_attempt` for ExecProbe, `bridged_attempt` for the kubelet bridge). Out: the status
board's observed fields (a thresholded state change is a new revision that watchers get; an attempt only updates
the last attempt, counters and totals, and reaches every_attempt watchers as ATTEMPT), one span per attempt and the
kubelet's metrics. Emit on change, as the kubelet's results manager does: the worker reports a state change only
when the state changes, and nothing else here makes a revision per attempt.

Registrations are not this module's: the registry puts and removes probes on the board and tells this module which
trace parents a probe's attempts (`set_traceparent`). Who a sandbox is (its pod's name, namespace and uid label
spans and metrics) is the daemon's sandbox directory's (shim/sandboxes/directory.py). One `ProbeLabels` value is
what a span and a metric series carry.

This module is the one writer of `status.worker` (`show_worker`): which worker serves a probe, as the supervisor
reports it. A worker's progress comes and goes as the probe's ProbeStatus itself (`progress_of`, a Snapshot, and
each attempt report), moved with probe_api/status.py's one copy operation: the worker counts the thresholds and the
totals, the daemon takes them as reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.attempts import count_attempt
from probe_api.defaults import is_late
from probe_api.status import ATTEMPT_FIELDS, copy_status, status_copy
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import SandboxInfo

_ATTEMPT_FIELDS_BUT_THE_ATTEMPT = ATTEMPT_FIELDS - {"last_attempt"}
MAX_KEPT_LABELS = 65536  # probes: far above a node's (a few hundred sandboxes x a few probes)


class ProbeLabels(NamedTuple):
    """Who an attempt is of: the identity its span carries and its metric series are labelled with.

    A named tuple, not a dataclass: one is made per attempt, and a frozen dataclass costs twice as much to make."""

    probe_id: str
    probe_type: int
    sandbox_id: str
    container_name: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""


class ResultsManager:
    def __init__(self, *, board, tracer, metrics, sandboxes: SandboxDirectory) -> None:
        self._board = board
        self._tracer = tracer
        self._metrics = metrics
        self._sandboxes = sandboxes  # read only here: who a sandbox is
        self._traceparents: dict[str, str] = {}
        self._restarts_seen: dict[str, int] = {}
        self._running: dict[str, int] = {}  # sandbox -> pid of the worker serving it, for probe_shim_workers
        # probe id -> (row revision, sandbox identity, labels): _board_labels'
        self._labels: dict[str, tuple[int, SandboxInfo | None, ProbeLabels]] = {}

    # --- who is who (from the registry) ----------------------------------------------------------------------

    def set_traceparent(self, probe_id: str, traceparent: str | None) -> None:
        """The caller's trace parents this probe's attempt spans (kept in memory only)."""
        if traceparent:
            self._traceparents[probe_id] = traceparent
        else:
            self._traceparents.pop(probe_id, None)

    def labels(self, probe: service_pb.Probe) -> ProbeLabels:
        info = self._sandboxes.identity(probe.pod_sandbox_id)
        return ProbeLabels(
            probe_id=probe.probe_id, probe_type=probe.type, sandbox_id=probe.pod_sandbox_id,
            container_name=probe.container_name, pod_name=info.name if info else "",
            pod_namespace=info.namespace if info else "", pod_uid=info.uid if info else "",
        )

    def _board_labels(self, probe: service_pb.Probe) -> ProbeLabels:
        """`labels` of a probe on the board, at every attempt: remembered per probe. What they are made of changes
        only with a new revision of the row (a put or update; an attempt makes none) or a new identity of its
        sandbox (`note` of another resolution), and either makes them again."""
        identity = self._sandboxes.identity(probe.pod_sandbox_id)
        revision = probe.revision
        kept = self._labels.get(probe.probe_id)
        if kept is not None and kept[0] == revision and kept[1] is identity:
            return kept[2]
        labels = self.labels(probe)
        if len(self._labels) >= MAX_KEPT_LABELS:  # only if rows left without probe_removed: start again
            self._labels.clear()
        self._labels[probe.probe_id] = (revision, identity, labels)
        return labels

    def probe_removed(self, probe: service_pb.Probe) -> None:
        """A probe left the board: its series go, as the kubelet's worker drops them when it stops."""
        self._traceparents.pop(probe.probe_id, None)
        self._labels.pop(probe.probe_id, None)
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
                p.status.state = change.state
                p.status.state_changed_at = now

            current = self._board.peek(change.probe_id)
            if current is not None and current.status.state == change.state and current.status.state_changed_at:
                return  # the board had it already (a worker resumed from it): no change, no revision
            self._board.update(change.probe_id, set_state)
        elif kind == "snapshot":
            for probe in event.snapshot.probes:
                self._take_progress(probe.registration.probe_id, probe.status)

    def progress_of(self, probe_id: str) -> service_pb.ProbeStatus | None:
        """Where a probe stands (its status, whole), for a worker that starts it again; None if no worker ever ran
        it (no state reported, no attempt). The worker hands back what it does not own as it was
        (probe_api/status.py), and counts its totals on from these: a startup probe that has not changed state
        yet goes on from its attempts too."""
        probe = self._board.peek(probe_id)
        if probe is None or not (probe.status.state_changed_at or probe.status.HasField("last_attempt")):
            return None
        return status_copy(probe.status)

    def _take_progress(self, probe_id: str, reported: service_pb.ProbeStatus) -> None:
        """An adopted worker's word on where a probe stands (the fields it owns): it ran on while no daemon
        listened, so it is right. The state changes here only if an attempt the daemon never heard of changed it,
        and the last attempt only for a newer one."""
        current = self._board.peek(probe_id)
        if current is None:
            return
        if current.status.state != reported.state or not current.status.state_changed_at:
            changed_at = reported.state_changed_at or time.time_ns()

            def set_state(p: service_pb.Probe) -> None:
                p.status.state = reported.state
                p.status.state_changed_at = changed_at

            self._board.update(probe_id, set_state)

        # The rest as an attempt report moves it; the board's last attempt stays if it is newer than the worker's.
        newer = reported.HasField("last_attempt") and \
            reported.last_attempt.started_at_unix_ns >= current.status.last_attempt.started_at_unix_ns
        fields = ATTEMPT_FIELDS if newer else _ATTEMPT_FIELDS_BUT_THE_ATTEMPT
        self._board.record_attempt(probe_id, lambda p: copy_status(reported, p.status, only=fields))

    def show_worker(self, probe_id: str, worker: service_pb.WorkerStatus, *, unchanged_too: bool = False) -> None:
        """The worker serving a probe, on its row (a revision); a worker status as it was (a worker adopted across
        a restart) makes none, unless `unchanged_too` (the registry's word after a registration)."""
        current = self._board.peek(probe_id)
        if current is not None and (unchanged_too or current.status.worker != worker):
            self._board.update(probe_id, lambda p: _show_worker(p, worker))

    def on_worker(self, sandbox_id: str, status: service_pb.WorkerStatus) -> None:
        for probe in self._board.list(service_pb.ProbeFilter(pod_sandbox_id=sandbox_id)):
            self.show_worker(probe.probe_id, status)
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
        labels = self._board_labels(probe)
        reported = report.status
        attempt = reported.last_attempt
        trace_id, span_id = self._tracer.record(
            attempt, labels, spec=probe.spec, traceparent=self._traceparents.get(probe.probe_id))

        def apply(p: service_pb.Probe) -> None:
            copy_status(reported, p.status, only=ATTEMPT_FIELDS)  # the worker's fields but the state: see status.py
            p.status.last_trace_id, p.status.last_span_id = trace_id, span_id

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
        current = self._board.peek(row.probe_id)
        if current is None or current.spec != row.spec:
            fresh = service_pb.Probe()
            fresh.CopyFrom(row)
            if current is not None:
                fresh.created_at = current.created_at
                fresh.status.totals.CopyFrom(current.status.totals)
            self._board.put(fresh)
            current = self._board.peek(row.probe_id)
        # The board's row has the same identity fields as `row` (a handler's are fixed): its labels are kept.
        labels = self._board_labels(current)
        trace_id, span_id = self._tracer.record(attempt, labels, spec=row.spec, traceparent=traceparent)
        if counts_as_probe:
            self._metrics.observe_attempt(labels, attempt.result, attempt.duration_ns / 1e9)
        self._board.record_attempt(row.probe_id, _bridged_apply(attempt, trace_id, span_id,
                                                                row.bridged.last_exec_at, worker))


def _bridged_apply(attempt: spec_pb.Attempt, trace_id: str, span_id: str, last_exec_at: int,
                   worker: service_pb.WorkerStatus) -> Callable[[service_pb.Probe], None]:
    def apply(probe: service_pb.Probe) -> None:
        probe.status.last_attempt.CopyFrom(attempt)
        probe.status.last_trace_id, probe.status.last_span_id = trace_id, span_id
        probe.bridged.last_exec_at = last_exec_at
        _show_worker(probe, worker)
        count_attempt(probe.status.totals, attempt.result)

    return apply


def _show_worker(probe: service_pb.Probe, worker: service_pb.WorkerStatus) -> None:
    """The one statement that writes a probe's worker status (through show_worker, or a bridged attempt)."""
    probe.status.worker.CopyFrom(worker)
