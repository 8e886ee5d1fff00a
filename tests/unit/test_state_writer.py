"""shim/state/writer.py and the board's resume point: what survives a restart, written only when it changes.

A real SQLite store in tmp_path and a real StatusBoard on a real event loop; the writer's delays are shortened
and every wait is on the writer's own flush.
"""

from __future__ import annotations

import asyncio

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import StatusBoard
from shim.state.store import ProbeStore
from shim.state.writer import REVISION_BLOCK, BoardIdentity, StateWriter, board_identity, durable_key

S, F = spec_pb.STATE_SUCCESS, spec_pb.STATE_FAILURE


STATUS_FIELDS = frozenset(service_pb.ProbeStatus.DESCRIPTOR.fields_by_name)


def probe(probe_id: str = "p", **fields) -> service_pb.Probe:
    """A probe; keyword arguments naming a ProbeStatus field go into its status."""
    status = service_pb.ProbeStatus(**{k: fields.pop(k) for k in list(fields) if k in STATUS_FIELDS})
    return service_pb.Probe(probe_id=probe_id, pod_sandbox_id="sb", container_id="c1", type=spec_pb.READINESS,
                            spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(
                                port=spec_pb.PortRef(number=80)), success_threshold=1, failure_threshold=3),
                            status=status, **fields)


# --- pure ----------------------------------------------------------------------------------------------------

def test_a_steady_run_keeps_its_key_once_past_the_threshold():
    keys = {durable_key(probe(state=S, consecutive_successes=n), 1, 3) for n in (1, 2, 50)}
    assert len(keys) == 1
    below = [durable_key(probe(state=S, consecutive_failures=n), 1, 3) for n in (1, 2, 3, 4)]
    assert below[0] != below[1] != below[2] == below[3]


def test_a_first_start_gets_a_new_instance_and_numbers_from_zero():
    identity = board_identity({})
    assert (identity.revision, identity.resume_point) == (0, None) and len(identity.instance_id) == 32


def test_after_a_clean_stop_numbering_goes_on_exactly():
    assert board_identity({"instance_id": "i", "revision": "41", "revision_reserved": "41"}) == \
        BoardIdentity("i", 41, 41)


def test_after_a_crash_numbering_starts_above_the_reservation():
    identity = board_identity({"instance_id": "i", "revision": "41", "revision_reserved": str(41 + REVISION_BLOCK)})
    assert identity == BoardIdentity("i", 41 + REVISION_BLOCK, 41)


# --- the board's resume point --------------------------------------------------------------------------------

async def _drain(board: StatusBoard, request: service_pb.WatchProbeStatusRequest) -> list:
    events = []
    async with asyncio.timeout(5):
        async for event in board.watch(request):
            events.append(event)
            if event.type in (service_pb.UPDATED, service_pb.SNAPSHOT_COMPLETE):
                return events
    return events


def test_a_watcher_at_the_stored_revision_resumes_across_a_crash():
    async def main():
        board = StatusBoard(instance_id="i", revision=1000, resume_point=41)
        board.restore([probe(state=S, revision=40)])
        board.update("p", lambda p: p.status.worker.CopyFrom(service_pb.WorkerStatus(pid=7)))
        resumed = await _drain(board, service_pb.WatchProbeStatusRequest(instance_id="i", since_revision=41))
        assert [(e.type, e.revision) for e in resumed] == [(service_pb.UPDATED, 1001)]
        # One that saw a revision the crashed daemon never stored gets the whole state instead.
        unknown = await _drain(board, service_pb.WatchProbeStatusRequest(instance_id="i", since_revision=45))
        assert [e.type for e in unknown] == [service_pb.SNAPSHOT, service_pb.SNAPSHOT_COMPLETE]

    asyncio.run(main())


def test_ending_the_watches_hands_each_its_resume_point():
    async def main():
        board = StatusBoard(instance_id="i")
        board.put(probe())
        stream = board.watch(service_pb.WatchProbeStatusRequest())
        first = [await anext(stream), await anext(stream)]
        assert [e.type for e in first] == [service_pb.SNAPSHOT, service_pb.SNAPSHOT_COMPLETE]
        board.end_watches()
        last = await anext(stream)
        assert (last.type, last.revision) == (service_pb.RESYNC, 1)
        late = [e.type async for e in board.watch(service_pb.WatchProbeStatusRequest(instance_id="i",
                                                                                     since_revision=1))]
        assert late == [service_pb.RESYNC] and board.watcher_count == 0

    asyncio.run(main())


def test_restore_makes_no_revision_and_no_event():
    board = StatusBoard(revision=10)
    board.restore([probe(revision=9)])
    assert board.revision == 10 and board.get("p").revision == 9


# --- the writer with a real store ----------------------------------------------------------------------------

class Flushes:
    """Counts the writer's transactions and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.event = asyncio.Event()

    def __call__(self, rows: int) -> None:
        self.rows.append(rows)
        self.event.set()

    async def next(self) -> int:
        async with asyncio.timeout(5):
            await self.event.wait()
        self.event.clear()
        return self.rows[-1]


def test_a_state_change_is_written_soon_and_a_steady_probe_not_at_all(tmp_path):
    async def main():
        store = ProbeStore(tmp_path / "probes.db")
        identity = board_identity({})
        board = StatusBoard(instance_id=identity.instance_id)
        flushes = Flushes()
        writer = StateWriter(store, board, soon_s=0.001, lazy_s=3600, on_write=flushes)
        await writer.start(identity)
        store.save(probe())
        board.put(probe(state=F))
        assert await flushes.next() == 1
        board.record_attempt("p", lambda p: setattr(p.status, "consecutive_successes", 1))
        assert writer.urgent  # a run began: the thresholds need it
        board.update("p", lambda p: setattr(p.status, "state", S))
        assert await flushes.next() == 1
        for n in range(6, 20):
            board.record_attempt("p", lambda p, n=n: setattr(p.status, "consecutive_successes", n))
            assert not writer.urgent  # kept for the lazy write: the thresholds need nothing new
        await writer.close()  # the rest, fsynced
        stored = store.load_observed()["p"]
        assert (stored.status.state, stored.status.consecutive_successes) == (S, 19)
        meta = store.load_meta()
        assert meta["revision"] == meta["revision_reserved"] == str(board.revision)
        assert meta["instance_id"] == board.instance_id
        store.close()

    asyncio.run(main())


def test_a_removed_probe_leaves_no_observation(tmp_path):
    async def main():
        store = ProbeStore(tmp_path / "probes.db")
        board = StatusBoard()
        flushes = Flushes()
        writer = StateWriter(store, board, soon_s=0.001, lazy_s=3600, on_write=flushes)
        await writer.start(board_identity({}))
        board.put(probe())
        await flushes.next()
        board.remove("p")
        await flushes.next()
        assert store.load_observed() == {}
        await writer.close()
        store.close()

    asyncio.run(main())


def test_revisions_are_reserved_ahead_durably(tmp_path):
    async def main():
        store = ProbeStore(tmp_path / "probes.db")
        board = StatusBoard(revision=5)
        writer = StateWriter(store, board, soon_s=0.001, lazy_s=3600)
        await writer.start(BoardIdentity("i", 5, None))
        assert store.load_meta()["revision_reserved"] == str(5 + REVISION_BLOCK)
        store.close()

    asyncio.run(main())
