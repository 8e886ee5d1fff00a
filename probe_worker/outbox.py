"""Where a worker's events go: the daemon's socket, or, while no daemon listens, a bounded queue for the next one.

A worker started with `outlives_daemon` keeps probing when its daemon goes (a crash, or a restart that handed it
over): its attempts and state changes wait here and are written to the next daemon's socket, in order, before
anything newer. The queue is bounded (MAX_QUEUED_BYTES, about ten minutes of a busy group's events): past it the
oldest events go, and are counted. Nothing is lost that matters for the probes' state: the Snapshot the new daemon
asks for next carries each probe's state, counts, totals and last attempt as the worker holds them.

Replies are not queued: a reply belongs to the daemon that asked, and goes nowhere once that daemon is gone.
"""

from __future__ import annotations

import collections

from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import AsyncChannel

MAX_QUEUED_BYTES = 8 << 20


class Outbox:
    def __init__(self, channel: AsyncChannel | None, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.channel = channel  # None while no daemon listens
        self._max_bytes = max_queued_bytes
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
        try:
            await channel.send(event)
        except OSError:
            self.detach(channel)  # the daemon is gone: this event waits for the next one
            self._enqueue(event)

    async def reply(self, channel: AsyncChannel, event: worker_pb.WorkerEvent) -> None:
        """A reply, to the daemon that asked; dropped if that daemon is gone."""
        try:
            await channel.send(event)
        except OSError:
            self.detach(channel)

    def detach(self, channel: AsyncChannel | None = None) -> None:
        """From now on events are queued (for `channel` only if it is still the current one)."""
        if channel is None or channel is self.channel:
            self.channel = None

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

    def _enqueue(self, event: worker_pb.WorkerEvent) -> None:
        size = event.ByteSize()
        self._queue.append((event, size))
        self._bytes += size
        while self._bytes > self._max_bytes and self._queue:
            _, dropped_size = self._queue.popleft()
            self._bytes -= dropped_size
            self.dropped += 1
