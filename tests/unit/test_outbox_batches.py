"""A worker's events go to the daemon in batches (probe_worker/outbox.py): one write for the routine reports of a
few milliseconds, news (a state change, a streak's first report) at once, replies after the events before them,
nothing lost or reordered when the daemon goes."""

from __future__ import annotations

import asyncio

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.outbox import Outbox


class RecordingChannel:
    """The channel as the outbox uses it: each write is recorded; `broken` makes writes fail like a gone daemon."""

    def __init__(self) -> None:
        self.writes: list[list[int]] = []  # per write, the seq (or heartbeat marker) of each event
        self.broken = False

    async def send_all(self, events) -> None:
        self._write([e.seq for e in events])

    async def send(self, event) -> None:
        self._write([event.seq])

    def _write(self, seqs: list[int]) -> None:
        if self.broken:
            raise BrokenPipeError("the daemon is gone")
        self.writes.append(seqs)


def event(seq: int, streak: int = 5) -> worker_pb.WorkerEvent:
    """An attempt report of a probe answering as it did the last `streak - 1` times."""
    return worker_pb.WorkerEvent(seq=seq, attempt=worker_pb.AttemptReport(
        probe_id=f"p{seq}", status=service_pb.ProbeStatus(consecutive_failures=streak)))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_events_of_one_window_go_in_one_write():
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=0.005)
        for seq in (1, 2, 3):
            await outbox.send(event(seq))
        assert channel.writes == []  # waiting for the window's end
        await outbox.flush()  # what the window's timer does
        return channel.writes

    assert run(scenario()) == [[1, 2, 3]]


def test_the_window_ends_by_itself():
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=0.001)
        await outbox.send(event(1))
        while not channel.writes:  # the timer's flush, awaited as an event of the loop (bounded by run())
            await asyncio.sleep(0)
        return channel.writes

    assert run(scenario()) == [[1]]


def test_a_state_change_is_written_at_once_with_the_reports_before_it():
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=10)
        await outbox.send(event(1))
        await outbox.send(worker_pb.WorkerEvent(seq=2, state_change=worker_pb.StateChange(probe_id="p1")))
        return channel.writes

    assert run(scenario()) == [[1, 2]]


def test_a_report_that_starts_a_streak_is_written_at_once_with_the_reports_before_it():
    # A probe's first result, or a result unlike the last: news, like a state change (the first result after RunProbe).
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=10)
        await outbox.send(event(1))
        await outbox.send(event(2, streak=1))
        await outbox.send(event(3))
        return channel.writes

    assert run(scenario()) == [[1, 2]]


def test_a_reply_never_overtakes_the_events_before_it():
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=10)
        await outbox.send(event(1))
        await outbox.send(event(2))
        await outbox.reply(channel, event(3))
        return channel.writes

    assert run(scenario()) == [[1, 2], [3]]


def test_a_batch_the_daemon_did_not_take_goes_first_to_the_next_daemon():
    async def scenario():
        gone, next_daemon = RecordingChannel(), RecordingChannel()
        gone.broken = True
        outbox = Outbox(gone, coalesce_s=10)
        await outbox.send(event(1))
        await outbox.send(event(2))
        await outbox.flush()  # fails: the events go back, in front of the queue
        await outbox.send(event(3))  # queued behind them (no daemon now)
        await outbox.attach(next_daemon)
        return outbox.queued, next_daemon.writes

    queued, writes = run(scenario())
    assert queued == 0
    assert [seq for write in writes for seq in write] == [1, 2, 3]


def test_detach_moves_the_unwritten_batch_into_the_queue_in_order():
    async def scenario():
        channel = RecordingChannel()
        outbox = Outbox(channel, coalesce_s=10)
        await outbox.send(event(1))
        outbox.detach(channel)
        await outbox.send(event(2))
        return outbox.queued, channel.writes

    assert run(scenario()) == (2, [])
