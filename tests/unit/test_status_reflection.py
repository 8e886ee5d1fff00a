"""Every field of ProbeStatus survives every place a status moves: the board, the store, a worker, a resumed watch,
an attempt report.

The status is built by reflection over ProbeStatus's descriptor (every field, recursively, set to a value that is
not its default), so a field added to the message later is covered without touching this test: if one of the
places drops it, a test here fails, instead of the field being lost silently across a restart or a handover.
"""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.status import DAEMON_OWNED, WORKER_OWNED, status_copy
from probe_api.worker_protocol import FrameDecoder, encode
from probe_worker.manager import ProbeManager
from shim.observe.metrics import ShimMetrics
from shim.observe.tracing import AttemptTracer
from shim.sandboxes.directory import SandboxDirectory
from shim.state.board import StatusBoard
from shim.state.registry import _with_stored_observations
from shim.state.results import ResultsManager
from shim.state.store import ProbeStore
from shim.state.writer import StateWriter, board_identity

# Fields of ProbeStatus the store does not keep, by design, and why. Empty: the store keeps the board's row whole.
# A field that must not outlive the daemon goes here, with its reason, never silently.
STORE_DOES_NOT_KEEP: dict[str, str] = {}

MAX_DEPTH = 3  # Phase nests Phase: deep enough to reach every field, finite


def _value(field: FieldDescriptor, salt: int):
    """A value of the field's type that is not its default."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{salt}"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return field.name.encode()
    if field.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE or field.cpp_type == FieldDescriptor.CPPTYPE_FLOAT:
        return 0.5 + salt
    return 1000 + salt  # every integer type holds it


def fill(message: Message, depth: int = 0) -> Message:
    """Sets every field of `message` (one member of each real oneof) to a non-default value, recursively."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1 and oneof.fields[0] is not field:
            continue
        salt = field.number + 100 * depth
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            container = getattr(message, field.name)
            if entry.message_type is not None:
                fill(container[f"key-{salt}"], depth + 1)
            else:
                container[f"key-{salt}"] = _value(entry, salt)
        elif field.message_type is not None:
            if field.is_repeated:
                if depth < MAX_DEPTH:
                    fill(getattr(message, field.name).add(), depth + 1)
            else:
                fill(getattr(message, field.name), depth + 1)
                getattr(message, field.name).SetInParent()
        elif field.is_repeated:
            getattr(message, field.name).append(_value(field, salt))
        else:
            setattr(message, field.name, _value(field, salt))
    return message


def full_status() -> service_pb.ProbeStatus:
    status = fill(service_pb.ProbeStatus())
    status.state = spec_pb.STATE_SUCCESS  # a state a worker's thresholds can go on from
    return status


def probe_with(status: service_pb.ProbeStatus, probe_id: str = "p1") -> service_pb.Probe:
    return service_pb.Probe(
        probe_id=probe_id, pod_sandbox_id="sb1", container_id="c1", container_name="app", type=spec_pb.READINESS,
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80)),
                               period_ms=60_000),
        status=status)


def unset_fields(message: Message, prefix: str = "") -> list[str]:
    """The fields of `message` (recursively, through the first element of repeated messages) left at default."""
    missing = []
    present = {field.name: value for field, value in message.ListFields()}
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1 and oneof.fields[0] is not field:
            continue
        path = prefix + field.name
        if field.name not in present:
            missing.append(path)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            value = present[field.name]
            if not field.is_repeated:
                missing += unset_fields(value, path + ".")
            elif value and field.message_type is not message.DESCRIPTOR:
                missing += unset_fields(value[0], path + "[0].")
    return missing


def test_the_built_status_sets_every_field():
    assert unset_fields(full_status()) == []


# --- (a) the board -------------------------------------------------------------------------------------------------

def test_the_board_keeps_every_field():
    status = full_status()
    board = StatusBoard()
    board.put(probe_with(status))
    assert board.get("p1").status == status
    assert board.list()[0].status == status
    board.record_attempt("p1", lambda p: None)  # the per-attempt path copies the row
    board.update("p1", lambda p: None)
    assert board.get("p1").status == status
    restored = StatusBoard()
    restored.restore(board.list())
    assert restored.get("p1").status == status


# --- (b) the store ---------------------------------------------------------------------------------------------------

def test_a_store_round_trip_keeps_every_field(tmp_path):
    status = full_status()
    path = tmp_path / "probes.db"

    async def write() -> None:
        store = ProbeStore(path)
        board = StatusBoard()
        writer = StateWriter(store, board)
        await writer.start(board_identity({}))
        probe = probe_with(status)
        await store.run(store.save, probe)
        board.put(probe)
        await writer.close()
        store.close()

    asyncio.run(write())
    with ProbeStore(path) as store:
        (registration,) = store.load_all()
        observed = store.load_observed()
    # As the registry restores it: the registration with what was observed of it.
    kept = _with_stored_observations(registration, observed["p1"]).status
    expected = status_copy(status)
    for name in STORE_DOES_NOT_KEEP:
        expected.ClearField(name)
        kept.ClearField(name)
    assert kept == expected


# --- (c) a worker's progress -----------------------------------------------------------------------------------------

class NeverDone:
    """A prober whose attempt never ends: the worker reports where the probe stood, no attempt on top."""

    async def run(self, spec, ports, **kwargs) -> spec_pb.Attempt:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def over_the_wire(message: Message, kind: type[Message]) -> Message:
    """Framed and parsed as the daemon <-> worker socket carries it."""
    (payload,) = FrameDecoder().feed(encode(message))
    return kind.FromString(payload)


def test_a_workers_progress_keeps_every_field_it_does_not_own():
    status = full_status()
    board = StatusBoard()
    results = ResultsManager(board=board, tracer=AttemptTracer("none"), metrics=ShimMetrics(),
                             sandboxes=SandboxDirectory(source=None))
    board.put(probe_with(status))
    progress = results.progress_of("p1")
    assert progress == status  # the daemon hands the worker its status whole

    async def through_a_worker() -> worker_pb.WorkerEvent:
        async def emit(event: worker_pb.WorkerEvent) -> None:
            pass

        manager = ProbeManager(NeverDone(), emit, sandbox_id="sb1")
        registration = worker_pb.ProbeRegistration(probe_id="p1", sandbox_id="sb1", type=spec_pb.READINESS,
                                                   spec=board.get("p1").spec, status=progress)
        request = over_the_wire(worker_pb.WorkerRequest(add_probe=worker_pb.AddProbe(probe=registration)),
                                worker_pb.WorkerRequest)
        await manager.add(request.add_probe.probe)
        snapshot = worker_pb.Snapshot(probes=manager.snapshot())
        await manager.close()
        return over_the_wire(worker_pb.WorkerEvent(snapshot=snapshot), worker_pb.WorkerEvent)

    event = asyncio.run(through_a_worker())
    (reported,) = event.snapshot.probes
    not_owned = [f.name for f in service_pb.ProbeStatus.DESCRIPTOR.fields if f.name not in WORKER_OWNED]
    assert not_owned, "the worker owns every field: this test checks nothing"
    assert status_copy(reported.status, only=not_owned) == status_copy(status, only=not_owned)
    # Back on the daemon's board: its own fields as they were, the worker's as the worker has them.
    results.on_event("sb1", event)
    on_board = board.get("p1").status
    assert status_copy(on_board, only=not_owned) == status_copy(status, only=not_owned)
    assert status_copy(on_board, only=WORKER_OWNED) == status_copy(reported.status, only=WORKER_OWNED)


# --- (d) a resumed watch ---------------------------------------------------------------------------------------------

def test_a_resumed_watch_delivers_every_field():
    status = full_status()

    async def run() -> service_pb.WatchProbeStatusResponse:
        board = StatusBoard()
        board.put(probe_with(service_pb.ProbeStatus(), probe_id="other"))
        first = board.watch(service_pb.WatchProbeStatusRequest())
        seen = [await anext(first) for _ in range(2)]  # SNAPSHOT, SNAPSHOT_COMPLETE
        await first.aclose()
        assert seen[-1].type == service_pb.SNAPSHOT_COMPLETE
        board.put(probe_with(status))  # while nobody watched
        resumed = board.watch(service_pb.WatchProbeStatusRequest(instance_id=board.instance_id,
                                                                 since_revision=seen[-1].revision))
        missed = await anext(resumed)
        await resumed.aclose()
        return missed

    missed = asyncio.run(run())
    assert (missed.type, missed.probe.probe_id) == (service_pb.UPDATED, "p1")
    assert missed.probe.status == status


# --- (e) an attempt report -------------------------------------------------------------------------------------------

class OneFullAttempt:
    """A prober whose first attempt sets every field of Attempt (with the result asked for), then never ends."""

    def __init__(self, result: int) -> None:
        self.result, self.calls = result, 0

    async def run(self, spec, ports, **kwargs) -> spec_pb.Attempt:
        self.calls += 1
        if self.calls > 1:
            await asyncio.Event().wait()
        attempt = fill(spec_pb.Attempt())
        attempt.result = self.result
        return attempt


MOVED_BY_STATE_CHANGES_ONLY = frozenset({"state", "state_changed_at"})
# Three attempts that between them leave every field the worker owns at a value other than its default: a success,
# a failure under the threshold, a liveness failure at the threshold (on hold; the state changes with it).
ATTEMPTS = {
    "success": (spec_pb.READINESS, 0, spec_pb.RESULT_SUCCESS),
    "failure": (spec_pb.READINESS, 0, spec_pb.RESULT_FAILURE),
    "held": (spec_pb.LIVENESS, 2, spec_pb.RESULT_FAILURE),
}


def through_an_attempt(case: str) -> tuple[service_pb.ProbeStatus, worker_pb.WorkerEvent,
                                           service_pb.ProbeStatus, service_pb.ProbeStatus]:
    """The board's status before, the worker's report of one attempt (over the wire), the worker's own status
    after it (its Snapshot), and the board's status once the daemon took the report."""
    probe_type, failures_before, result = ATTEMPTS[case]
    status = full_status()
    status.on_hold, status.consecutive_successes, status.consecutive_failures = False, 0, failures_before
    board = StatusBoard()
    results = ResultsManager(board=board, tracer=AttemptTracer("none"), metrics=ShimMetrics(),
                             sandboxes=SandboxDirectory(source=None))
    row = probe_with(status)
    row.type = probe_type
    board.put(row)

    async def one_attempt() -> tuple[worker_pb.WorkerEvent, service_pb.ProbeStatus]:
        reports: asyncio.Queue[worker_pb.WorkerEvent] = asyncio.Queue()

        async def emit(event: worker_pb.WorkerEvent) -> None:
            if event.WhichOneof("msg") == "attempt":
                reports.put_nowait(over_the_wire(event, worker_pb.WorkerEvent))

        manager = ProbeManager(OneFullAttempt(result), emit, sandbox_id="sb1")
        await manager.add(worker_pb.ProbeRegistration(probe_id="p1", sandbox_id="sb1", type=probe_type,
                                                      spec=row.spec, status=results.progress_of("p1"),
                                                      start_now=True))
        event = await asyncio.wait_for(reports.get(), 10)
        (own,) = manager.snapshot()
        await manager.close()
        return event, own.status

    event, own = asyncio.run(one_attempt())
    results.on_event("sb1", event)
    return status, event, own, board.get("p1").status


@pytest.mark.parametrize("case", sorted(ATTEMPTS))
def test_an_attempt_report_moves_every_field_the_worker_owns_onto_the_board(case):
    """The hot path: a worker's attempt goes out as an AttemptReport, over the wire, onto the daemon's board. The
    report holds the worker's fields of its status exactly as the worker has them, and nothing of the daemon's;
    every one but the state (which moves with its StateChange, a revision) lands on the board, and the daemon's
    own fields stay as they were (but the span ids, which are the attempt's)."""
    before, event, own, on_board = through_an_attempt(case)
    reported = event.attempt.status
    assert status_copy(reported, only=WORKER_OWNED) == status_copy(own, only=WORKER_OWNED)
    assert reported == status_copy(reported, only=WORKER_OWNED), "a report carries no field of the daemon's"
    # ticks_missed is the manager's own count (0: no tick was missed here); the rest is the prober's, every field set.
    assert unset_fields(reported.last_attempt) == ["ticks_missed"], "the attempt lost a field on its way out"
    taken = WORKER_OWNED - MOVED_BY_STATE_CHANGES_ONLY  # not ATTEMPT_FIELDS: this checks that one
    assert status_copy(on_board, only=taken) == status_copy(reported, only=taken)
    kept = [name for name in DAEMON_OWNED if name not in ("last_trace_id", "last_span_id")]
    assert status_copy(on_board, only=kept) == status_copy(before, only=kept)
    assert (on_board.state, on_board.state_changed_at) == (before.state, before.state_changed_at)
    assert on_board.totals.ByteSize() and on_board.totals != before.totals  # counted by the worker, taken as is


def test_the_attempts_above_set_every_field_the_worker_reports():
    """Otherwise a field dropped on the attempt path could hide behind its default value."""
    set_somewhere = set()
    for case in ATTEMPTS:
        _, event, _, _ = through_an_attempt(case)
        set_somewhere |= {field.name for field, _ in event.attempt.status.ListFields()}
    assert set_somewhere == set(WORKER_OWNED)
