"""shim/state/results.py: worker events in, the status board, spans and the kubelet's metrics out; emit on change."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.attempts import count_attempt
from shim.observe.metrics import ShimMetrics
from shim.observe.tracing import AttemptTracer
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import SandboxInfo
from shim.state.board import StatusBoard
from shim.state.results import ResultsManager

SANDBOX = SandboxInfo(id="sb-1", netns_path="/var/run/netns/x", name="web-0", namespace="shop", uid="uid-1")
NOW = 1_700_000_000 * 10**9


def rig() -> tuple[ResultsManager, StatusBoard, ShimMetrics]:
    board, metrics = StatusBoard(), ShimMetrics()
    sandboxes = SandboxDirectory(source=None)  # identities only: nothing is resolved here
    sandboxes.note(SANDBOX)
    results = ResultsManager(board=board, tracer=AttemptTracer("none"), metrics=metrics, sandboxes=sandboxes)
    board.put(service_pb.Probe(probe_id="p1", pod_sandbox_id="sb-1", container_name="web", type=spec_pb.READINESS))
    return results, board, metrics


def attempt_event(result=spec_pb.RESULT_SUCCESS, **status) -> worker_pb.WorkerEvent:
    """The worker's report of its first attempt (its totals count it) with the status fields given."""
    attempt = spec_pb.Attempt(result=result, started_at_unix_ns=NOW, duration_ns=2_000_000, output="ok")
    totals = service_pb.AttemptTotals()
    count_attempt(totals, result)
    return worker_pb.WorkerEvent(attempt=worker_pb.AttemptReport(probe_id="p1", status=service_pb.ProbeStatus(
        last_attempt=attempt, totals=totals, **status)))


def sample(metrics: ShimMetrics, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_an_attempt_updates_the_probe_and_its_series_without_a_revision():
    results, board, metrics = rig()
    revision = board.revision
    results.on_event("sb-1", attempt_event(consecutive_successes=4))
    probe = board.get("p1")
    assert board.revision == revision, "an attempt is not a state change"
    assert (probe.status.last_attempt.output, probe.status.consecutive_successes, probe.status.totals.success) == ("ok", 4, 1)
    assert len(probe.status.last_trace_id) == 32 and len(probe.status.last_span_id) == 16
    assert sample(metrics, "prober_probe_total", pod="web-0", namespace="shop", pod_uid="uid-1", container="web",
                  probe_type="Readiness", result="successful") == 1


def test_a_state_change_is_a_revision():
    results, board, _ = rig()
    revision = board.revision
    results.on_event("sb-1", worker_pb.WorkerEvent(state_change=worker_pb.StateChange(
        probe_id="p1", previous=spec_pb.STATE_FAILURE, state=spec_pb.STATE_SUCCESS)))
    assert board.revision == revision + 1 and board.get("p1").status.state == spec_pb.STATE_SUCCESS


def test_an_attempt_of_a_removed_probe_is_dropped():
    results, board, metrics = rig()
    board.remove("p1")
    results.on_event("sb-1", attempt_event())
    assert sample(metrics, "prober_probe_total") is None


def test_worker_life_reaches_the_probes_and_the_worker_gauges():
    results, board, metrics = rig()
    results.on_worker("sb-1", service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=42))
    assert board.get("p1").status.worker.pid == 42 and sample(metrics, "probe_shim_workers") == 1
    results.on_worker("sb-1", service_pb.WorkerStatus(state=service_pb.WORKER_BACKOFF, restarts=1))
    assert sample(metrics, "probe_shim_workers") == 0 and sample(metrics, "probe_shim_worker_restarts_total") == 1
    results.on_worker("sb-1", service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, restarts=1))
    assert sample(metrics, "probe_shim_worker_restarts_total") == 1, "the same restart counts once"


def test_a_worker_shown_as_it_was_makes_no_revision_unless_the_registry_asks():
    results, board, _ = rig()
    running = service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=42)
    results.show_worker("p1", running)
    revision = board.revision
    results.on_worker("sb-1", running)  # an adopted worker, as it was
    assert board.revision == revision
    results.show_worker("p1", running, unchanged_too=True)  # after a registration: watchers see it again
    assert board.revision == revision + 1 and board.get("p1").status.worker == running
    results.show_worker("gone", running)  # a probe not on the board: nothing
    assert board.revision == revision + 1


def test_a_removed_probe_takes_its_series_and_trace_parent_along():
    results, board, metrics = rig()
    results.set_traceparent("p1", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    results.on_event("sb-1", attempt_event())
    assert board.get("p1").status.last_trace_id == "0af7651916cd43dd8448eb211c80319c"
    results.probe_removed(board.get("p1"))
    assert sample(metrics, "prober_probe_total") is None
    board.put(service_pb.Probe(probe_id="p1", pod_sandbox_id="sb-1", container_name="web", type=spec_pb.READINESS))
    results.on_event("sb-1", attempt_event())
    assert board.get("p1").status.last_trace_id != "0af7651916cd43dd8448eb211c80319c", "the removed probe's parent stayed"


def test_attempts_carry_the_rows_labels_as_they_are_now():
    board, metrics, sandboxes = StatusBoard(), ShimMetrics(), SandboxDirectory(source=None)
    sandboxes.note(SANDBOX)
    results = ResultsManager(board=board, tracer=AttemptTracer("none"), metrics=metrics, sandboxes=sandboxes)
    board.put(service_pb.Probe(probe_id="p1", pod_sandbox_id="sb-1", container_name="web", type=spec_pb.READINESS))
    results.on_event("sb-1", attempt_event())
    board.update("p1", lambda p: setattr(p, "container_name", "api"))  # a new revision of the row
    results.on_event("sb-1", attempt_event())
    sandboxes.note(SandboxInfo(id="sb-1", netns_path="/var/run/netns/x", name="web-1", namespace="shop",
                                        uid="uid-2"))  # the sandbox's identity, as resolved anew
    results.on_event("sb-1", attempt_event())
    counts = [sample(metrics, "prober_probe_total", container=c, pod=p, pod_uid=u, result="successful")
              for c, p, u in (("web", "web-0", "uid-1"), ("api", "web-0", "uid-1"), ("api", "web-1", "uid-2"))]
    assert counts == [1, 1, 1]


def test_a_bridged_handler_is_put_once_then_only_gets_attempts():
    results, board, metrics = rig()
    row = service_pb.Probe(probe_id="b1", pod_sandbox_id="sb-1", container_name="web", type=spec_pb.LIVENESS,
                           spec=spec_pb.ProbeSpec(timeout_ms=1000), created_at=NOW,
                           bridged=service_pb.BridgedHandler(role="liveness", last_exec_at=NOW))
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_FAILURE, started_at_unix_ns=NOW, duration_ns=1)
    worker = service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=7)
    results.bridged_attempt(row, attempt, None, counts_as_probe=True, worker=worker)
    after_first = board.revision
    later = service_pb.Probe()
    later.CopyFrom(row)
    later.created_at, later.bridged.last_exec_at = NOW + 10, NOW + 10
    results.bridged_attempt(later, attempt, None, counts_as_probe=True, worker=worker)
    stored = board.get("b1")
    assert board.revision == after_first, "a second attempt of the same handler is no new revision"
    assert (stored.status.totals.failure, stored.created_at, stored.bridged.last_exec_at, stored.status.worker.pid) == (
        2, NOW, NOW + 10, 7)
    assert sample(metrics, "prober_probe_total", probe_type="Liveness", result="failed") == 2
    hook = service_pb.Probe(probe_id="h1", pod_sandbox_id="sb-1", container_name="web",
                            bridged=service_pb.BridgedHandler(role="preStop"))
    results.bridged_attempt(hook, attempt, None, counts_as_probe=False, worker=worker)
    assert board.get("h1").status.totals.failure == 1
    assert sample(metrics, "prober_probe_total", probe_type="Liveness", result="failed") == 2, "hooks are no probes"
