"""The status board's resumable, revisioned watch (shim/state/board.py): a snapshot, then SNAPSHOT_COMPLETE, then live
changes without gap or duplicate; a resume with the same instance id gets only what it missed, one that cannot be
served a full snapshot. No sleeps: each test drives the board and consumes the watch iterator."""

from __future__ import annotations

import asyncio

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import StatusBoard
from tests.support.board_watch import (
    COMPLETE, EVENT_WAIT_S, REMOVED, SNAPSHOT, UPDATED, brief, expect_only_marker_next, next_event, probe, take,
    watch_request,
)


def test_snapshot_then_complete_then_live_without_gap_or_duplicate():
    async def main():
        board = StatusBoard(instance_id="inst-1")
        board.put(probe("p2", sandbox="s2"))
        board.put(probe("p1", sandbox="s1"))
        stream = board.watch(watch_request())
        first = await take(stream, 3)
        assert [brief(r) for r in first] == [("SNAPSHOT", "p1", 2), ("SNAPSHOT", "p2", 2), ("SNAPSHOT_COMPLETE", "", 2)]
        assert first[0].probe.revision == 2 and first[1].probe.revision == 1, "each probe keeps its own revision"
        assert board.watcher_count == 1
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_SUCCESS))
        board.put(probe("p3", sandbox="s3"))
        board.remove("p2")
        live = await take(stream, 3)
        assert [brief(r) for r in live] == [("UPDATED", "p1", 3), ("UPDATED", "p3", 4), ("REMOVED", "p2", 5)]
        assert live[0].probe.status.state == spec_pb.STATE_SUCCESS
        removed = live[2].probe
        assert (removed.pod_sandbox_id, removed.container_id, removed.type) == ("s2", "c1", spec_pb.READINESS)
        assert {r.instance_id for r in first + live} == {"inst-1"}
        await expect_only_marker_next(board, stream)
        await stream.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_changes_between_creating_and_iterating_the_watch_are_neither_lost_nor_doubled():
    async def main():
        board = StatusBoard()
        board.put(probe("p1"))
        stream = board.watch(watch_request())
        board.put(probe("p2", container="c2"))  # before the first anext: part of the snapshot, not an event
        got = await take(stream, 3)
        assert [brief(r) for r in got] == [("SNAPSHOT", "p1", 2), ("SNAPSHOT", "p2", 2), ("SNAPSHOT_COMPLETE", "", 2)]
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


def test_watches_opened_while_a_producer_runs_see_every_revision_exactly_once():
    """Producer and watchers interleave on the loop; each watcher's view must end equal to the board."""

    async def main():
        board = StatusBoard(watcher_queue=10_000)

        async def produce():
            for n in range(300):
                if n % 7 == 3:
                    board.remove(f"p{(n * 5) % 20}")
                else:
                    board.put(probe(f"p{n % 20}", container=f"c{n % 20}", labels={"n": str(n)}))
                await asyncio.sleep(0)  # a scheduling point, so that watches start in between changes

        async def follow() -> None:
            stream = board.watch(watch_request())
            snapshot: dict[str, int] = {}
            view: dict[str, int] | None = None
            seen: list[int] = []
            async for response in stream:
                if response.type == SNAPSHOT:
                    snapshot[response.probe.probe_id] = response.probe.revision
                elif response.type == COMPLETE:
                    view, start = dict(snapshot), response.revision
                elif response.type == UPDATED:
                    seen.append(response.revision)
                    view[response.probe.probe_id] = response.probe.revision
                else:
                    assert response.type == REMOVED and response.probe.probe_id in view
                    seen.append(response.revision)
                    del view[response.probe.probe_id]
                if view is not None and "end" in view:
                    break
            await stream.aclose()
            assert seen == list(range(start + 1, board.revision + 1)), "a gap or a duplicate"
            assert view == {p.probe_id: p.revision for p in board.list()}

        producer = asyncio.create_task(produce())
        followers = []
        for _ in range(8):
            followers.append(asyncio.create_task(follow()))
            for _ in range(30):
                await asyncio.sleep(0)  # let the producer move on before the next watch starts
        await producer
        board.put(probe("end"))
        await asyncio.wait_for(asyncio.gather(*followers), EVENT_WAIT_S)
        assert board.watcher_count == 0

    asyncio.run(main())


def test_empty_state_is_just_snapshot_complete():
    async def main():
        board = StatusBoard()
        stream = board.watch(watch_request())
        assert [brief(r) for r in await take(stream, 1)] == [("SNAPSHOT_COMPLETE", "", 0)]
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


def test_resume_with_same_instance_gets_only_what_was_missed_including_removals():
    async def main():
        board = StatusBoard(instance_id="inst")
        board.put(probe("p1", sandbox="s1"))
        board.put(probe("p2", sandbox="s1", container="c2"))
        board.put(probe("other", sandbox="s2"))
        first = board.watch(watch_request(pod_sandbox_id="s1"))
        got = await take(first, 3)
        last_seen = got[-1].revision
        assert got[-1].type == COMPLETE and last_seen == 3
        await first.aclose()
        # While disconnected:
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_FAILURE))  # 4
        board.remove("p2")  # 5
        board.put(probe("other", sandbox="s2", container="c9"))  # 6, not in the filter
        board.put(probe("p3", sandbox="s1", container="c3"))  # 7
        resumed = board.watch(watch_request(instance_id="inst", since=last_seen, pod_sandbox_id="s1"))
        missed = await take(resumed, 3)
        assert [brief(r) for r in missed] == [("UPDATED", "p1", 4), ("REMOVED", "p2", 5), ("UPDATED", "p3", 7)]
        assert missed[0].probe.status.state == spec_pb.STATE_FAILURE
        board.put(probe("p4", sandbox="s1", container="c4"))  # live after the replay
        assert brief(await next_event(resumed)) == ("UPDATED", "p4", 8)
        await resumed.aclose()

    asyncio.run(main())


def test_resume_at_the_current_revision_gets_nothing_but_live_changes():
    async def main():
        board = StatusBoard(instance_id="inst")
        board.put(probe("p1"))
        stream = board.watch(watch_request(instance_id="inst", since=board.revision))
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("case", ["other-instance", "older-than-history", "future-revision", "no-instance"])
def test_resume_that_cannot_be_served_gets_a_full_snapshot(case):
    async def main():
        board = StatusBoard(instance_id="inst", history_size=2)
        for n in range(5):
            board.put(probe(f"p{n}", container=f"c{n}"))
        request = {
            "other-instance": watch_request(instance_id="previous-daemon", since=4),
            "older-than-history": watch_request(instance_id="inst", since=2),  # history holds 4 and 5 only
            "future-revision": watch_request(instance_id="inst", since=99),
            "no-instance": watch_request(since=4),
        }[case]
        stream = board.watch(request)
        got = await take(stream, 6)
        assert [brief(r) for r in got] == [("SNAPSHOT", f"p{n}", 5) for n in range(5)] + [("SNAPSHOT_COMPLETE", "", 5)]
        assert {r.instance_id for r in got} == {"inst"}
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


def test_the_oldest_retained_revision_can_still_be_resumed_from_just_before_it():
    async def main():
        board = StatusBoard(instance_id="inst", history_size=2)
        for n in range(5):
            board.put(probe(f"p{n}", container=f"c{n}"))
        stream = board.watch(watch_request(instance_id="inst", since=3))  # needs 4 and 5: both retained
        assert [brief(r) for r in await take(stream, 2)] == [("UPDATED", "p3", 4), ("UPDATED", "p4", 5)]
        await stream.aclose()

    asyncio.run(main())
