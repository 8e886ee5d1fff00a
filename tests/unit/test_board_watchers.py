"""The status board's watchers (shim/state/board.py): a slow one gets RESYNC at a safe resume point and never blocks
puts or other watchers; a cancelled or closed one is unregistered. No sleeps: each test drives the board and consumes
the watch iterator."""

from __future__ import annotations

import asyncio

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import StatusBoard
from tests.support.board_watch import (
    COMPLETE, attempted, brief, expect_only_marker_next, next_event, probe, take, watch_request,
)


def test_slow_watcher_gets_resync_and_never_blocks_puts_or_other_watchers():
    async def main():
        board = StatusBoard(watcher_queue=3)
        slow = board.watch(watch_request())
        fast = board.watch(watch_request())
        assert [r.type for r in await take(slow, 1)] == [COMPLETE]
        assert [r.type for r in await take(fast, 1)] == [COMPLETE]
        assert board.watcher_count == 2
        for n in range(10):  # put() is synchronous: it returns whatever the slow watcher does
            assert board.put(probe(f"p{n}", container=f"c{n}")) == n + 1
            assert brief(await next_event(fast)) == ("UPDATED", f"p{n}", n + 1)
            board.record_attempt(f"p{n}", attempted(spec_pb.RESULT_SUCCESS))
        assert board.watcher_count == 1, "the slow watcher was dropped as soon as it overflowed"
        resync = await next_event(slow)
        assert brief(resync) == ("RESYNC", "", 0), "it had delivered the snapshot at revision 0, nothing since"
        assert resync.instance_id == board.instance_id
        with pytest.raises(StopAsyncIteration):
            await next_event(slow)
        # The fast watcher goes on.
        await expect_only_marker_next(board, fast)
        await fast.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_resync_revision_is_a_safe_resume_point():
    async def main():
        board = StatusBoard(instance_id="inst", watcher_queue=2)
        board.put(probe("p0"))
        stream = board.watch(watch_request())
        await take(stream, 2)  # snapshot at 1
        board.put(probe("p1", container="c1"))  # 2
        assert brief(await next_event(stream)) == ("UPDATED", "p1", 2)
        for n in range(2, 5):  # 3, 4, 5: one more than the buffer holds
            board.put(probe(f"p{n}", container=f"c{n}"))
        resync = await next_event(stream)
        assert brief(resync) == ("RESYNC", "", 2)
        resumed = board.watch(watch_request(instance_id="inst", since=resync.revision))
        assert [brief(r) for r in await take(resumed, 3)] == [
            ("UPDATED", "p2", 3), ("UPDATED", "p3", 4), ("UPDATED", "p4", 5)]
        await resumed.aclose()

    asyncio.run(main())


def test_overflow_during_the_snapshot_ends_it_with_resync_at_revision_zero():
    async def main():
        board = StatusBoard(watcher_queue=1)
        for n in range(3):
            board.put(probe(f"p{n}", container=f"c{n}"))
        stream = board.watch(watch_request())
        assert brief(await next_event(stream)) == ("SNAPSHOT", "p0", 3)
        board.put(probe("late-1", container="l1"))
        board.put(probe("late-2", container="l2"))  # the buffer holds one
        assert brief(await next_event(stream)) == ("RESYNC", "", 0), "an incomplete snapshot is no resume point"
        with pytest.raises(StopAsyncIteration):
            await next_event(stream)
        assert board.watcher_count == 0

    asyncio.run(main())


def test_cancelling_a_waiting_watch_unregisters_it():
    async def main():
        board = StatusBoard()
        synced = asyncio.Event()
        received = []

        async def consume():  # what the gRPC servicer does; grpc cancels its task when the client goes
            async for response in board.watch(watch_request()):
                received.append(response.type)
                if response.type == COMPLETE:
                    synced.set()

        task = asyncio.create_task(consume())
        await synced.wait()  # the consumer is now parked waiting for the next change
        assert board.watcher_count == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert board.watcher_count == 0
        assert board.put(probe("p1")) == 1  # nobody to feed; nothing breaks
        assert received == [COMPLETE]

    asyncio.run(main())


def test_closing_the_iterator_unregisters_it():
    async def main():
        board = StatusBoard()
        board.put(probe("p1"))
        stream = board.watch(watch_request())
        await next_event(stream)  # parked in the middle of the snapshot
        assert board.watcher_count == 1
        await stream.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())
