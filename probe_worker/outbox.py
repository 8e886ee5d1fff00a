"""Where a worker's events go: the daemon's socket, or, while no daemon listens, a bounded queue for the next one.

A worker started with `outlives_daemon` keeps probing when its daemon goes (a crash, or a restart that handed it
over): its attempts and state changes wait here and are written to the next daemon's socket, in order, before
anything newer. The queue is bounded (MAX_QUEUED_BYTES, about ten minutes of a busy group's events): past it the
oldest events go, and are counted. Nothing is lost that matters for the probes' state: the Snapshot the new daemon
asks for next carries each probe's state, counts, totals and last attempt as the worker holds them.

Replies are not queued: a reply belongs to the daemon that asked, and goes nowhere once that daemon is gone.

Attempt reports are written in batches: the first one after a write waits COALESCE_S for the ones that follow,
and they go in one write. A pooled worker starts a period's attempts of all its sandboxes in one wake-up and they
end within a few milliseconds of each other, so their reports reach the daemon in one read instead of one each
(measured in the scale scenario: at 750 attempts/s that was one wake-up of the daemon per attempt). A report is at most COALESCE_S
later for it. What is news does not wait: a state change, and a report that starts a streak (a probe's first
result, or a result unlike the one before) are written at once, with the batch before them; only the reports of
a probe answering as it did last time wait. A reply, too, first writes the batch before it, so the daemon never
sees a reply overtake an event.
"""

from __future__ import annotations

import asyncio
import collections

from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import AsyncChannel

MAX_QUEUED_BYTES = 8 << 20
COALESCE_S = 0.005


class Outbox:
    def __init__(self, channel: AsyncChannel | None, max_queued_bytes: int = MAX_QUEUED_BYTES,
                 coalesce_s: float = COALESCE_S) -> None:
        self.channel = channel  # None while no daemon listens
        self._max_bytes = max_queued_bytes
        self._coalesce_s = coalesce_s
        self._batch: list[worker_pb.WorkerEvent] = []  # events waiting for the batch's write, oldest first
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self._queue: collections.deque[tuple[worker_pb.WorkerEvent, int]] = collections.deque()
        self._bytes = 0
        self.dropped = 0  # events the queue could not keep since the last take_dropped()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def send(self, event: worker_pb.WorkerEvent) -> None:
        """An event of the worker's own (attempt, state change): to the daemon, or queued for the next one."""
        channel = self.channel
        if channel is None or self._queue:  # nothing overtakes what waits already
            self._enqueue(event)
            return
        self._batch.append(event)
        if is_news(event):
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._coalesce_s, self._flush_later)

    async def flush(self) -> None:
        """Writes the batch now (to the current daemon; back to the queue, in order, if it is gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, []
        if not batch:
            return
        channel = self.channel
        if channel is None:
            self._requeue(batch)
            return
        try:
            await channel.send_all(batch)
        except OSError:
            self.detach(channel)  # the daemon is gone: these events wait for the next one
            self._requeue(batch)

    async def reply(self, channel: AsyncChannel, event: worker_pb.WorkerEvent) -> None:
        """A reply, to the daemon that asked, after the events before it; dropped if that daemon is gone."""
        await self.flush()
        try:
            await channel.send(event)
        except OSError:
            self.detach(channel)

    def detach(self, channel: AsyncChannel | None = None) -> None:
        """From now on events are queued (for `channel` only if it is still the current one); the batch not yet
        written goes first in the queue."""
        if channel is None or channel is self.channel:
            self.channel = None
            if self._batch:
                batch, self._batch = self._batch, []
                self._requeue(batch)

    async def attach(self, channel: AsyncChannel) -> None:
        """Writes what was queued to the new daemon, then sends there directly. Events that come meanwhile queue
        up behind and are written in the same loop, so the order holds. OSError: that daemon is gone too."""
        while self._queue:
            event, size = self._queue.popleft()
            self._bytes -= size
            await channel.send(event)
        self.channel = channel  # no await since the queue was seen empty: nothing slipped in between

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped

    def _flush_later(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self.flush())
        self._flushing.add(task)  # held until done: a task only weakly referenced may be collected mid-write
        task.add_done_callback(self._flushing.discard)

    def _requeue(self, batch: list[worker_pb.WorkerEvent]) -> None:
        """Events older than everything queued: they go in front, in their order."""
        queued = list(self._queue)
        self._queue.clear()
        self._bytes = 0
        for event in batch:
            self._enqueue(event)
        for event, _ in queued:
            self._enqueue(event)

    def _enqueue(self, event: worker_pb.WorkerEvent) -> None:
        size = event.ByteSize()
        self._queue.append((event, size))
        self._bytes += size
        while self._bytes > self._max_bytes and self._queue:
            _, dropped_size = self._queue.popleft()
            self._bytes -= dropped_size
            self.dropped += 1


def is_news(event: worker_pb.WorkerEvent) -> bool:
    """Written at once rather than batched: a state change, or an attempt that starts a streak of its result."""
    kind = event.WhichOneof("msg")
    if kind == "state_change":
        return True
    if kind == "attempt":
        status = event.attempt.status
        return status.consecutive_successes + status.consecutive_failures <= 1
    return False
