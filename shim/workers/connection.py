"""The daemon's end of one worker's socketpair: frames in, requests out, replies matched by seq.

Frames are read by this one protocol and handed on synchronously (no queue); a worker that stops reading its
requests (MAX_WRITE_BUFFER unread) is treated as hung; a lost connection fails every waiting request with
WorkerUnavailable. The frames themselves are probe_api.worker_protocol's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from google.protobuf.message import DecodeError

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import FrameDecoder, FrameError, encode

MAX_WRITE_BUFFER = 1 << 20  # requests a worker has not read; beyond this it is hung
REQUEST_TIMEOUT_S = 10.0


OnReply = Callable[[worker_pb.WorkerEvent], None]


class WorkerUnavailable(Exception):
    """No running worker for the sandbox (failed, restarting, stopped), or it died mid-request."""


class WorkerConnection(asyncio.Protocol):
    """The daemon's end of one worker's socketpair: frames in, requests out, matched by seq."""

    def __init__(self, on_event: Callable[[worker_pb.WorkerEvent], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_event = on_event
        self._decoder = FrameDecoder()
        self._seq = itertools.count(1)
        # seq -> the reply's future, and what runs with the reply in stream order (see submit)
        self._pending: dict[int, tuple[asyncio.Future[worker_pb.WorkerEvent], OnReply | None]] = {}
        self._transport: asyncio.Transport | None = None
        self.first: asyncio.Future[worker_pb.WorkerEvent] = self._loop.create_future()  # Ready or Fatal
        self.lost: asyncio.Future[str] = self._loop.create_future()  # why the connection ended
        self.last_frame = self._loop.time()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_frame = self._loop.time()
        try:
            for payload in self._decoder.feed(data):
                self._dispatch(worker_pb.WorkerEvent.FromString(payload))
                if self.lost.done():
                    return
        except (FrameError, DecodeError) as exc:
            self.fail(f"protocol error: {exc}")

    def eof_received(self) -> bool:
        return False  # close the transport: the worker is gone or going

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail("connection lost" if exc is None else f"connection lost: {exc}")

    def _dispatch(self, event: worker_pb.WorkerEvent) -> None:
        kind = event.WhichOneof("msg")
        if not self.first.done():
            if kind in ("ready", "fatal"):
                self.first.set_result(event)
            else:
                self.fail(f"protocol error: the worker's first frame is {kind}, not ready or fatal")
            return
        if event.seq:
            reply, on_reply = self._pending.pop(event.seq, (None, None))
            if reply is not None and not reply.done():
                if on_reply is not None:
                    on_reply(event)
                reply.set_result(event)
            return  # a reply nobody waits for any more (timed out, or a watchdog heartbeat)
        if kind in ("attempt", "state_change"):
            self._on_event(event)

    # requests
    def submit(self, expect_reply: bool = True, on_reply: OnReply | None = None,
               **msg) -> asyncio.Future[worker_pb.WorkerEvent] | None:
        """Writes one request now (no await: callers rely on the order of writes).

        on_reply runs with the reply at its place among the worker's events: before any event the worker sent
        after it. Whoever awaits the reply runs only later, when events behind it may have been handed on
        already; what must not be overtaken by them (a Snapshot's counts) is taken here."""
        if self.lost.done():
            raise WorkerUnavailable(self.lost.result())
        seq = next(self._seq)
        reply = None
        if expect_reply:
            reply = self._loop.create_future()
            self._pending[seq] = (reply, on_reply)
        self._transport.write(encode(worker_pb.WorkerRequest(seq=seq, **msg)))
        if self._transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.fail("the worker stopped reading its requests")
        return reply

    async def reply(self, reply: asyncio.Future[worker_pb.WorkerEvent], timeout_s: float) -> worker_pb.WorkerEvent:
        """The reply, or TimeoutError after timeout_s (as asyncio.wait_for, without its waiter and callbacks: a
        timer on the reply itself)."""
        timer = self._loop.call_later(timeout_s, _expire, reply)
        try:
            return await reply
        finally:
            timer.cancel()
            for seq, (pending, _) in list(self._pending.items()):
                if pending is reply:
                    del self._pending[seq]

    async def request(self, timeout_s: float = REQUEST_TIMEOUT_S,
                      on_reply: OnReply | None = None,
                      **msg) -> worker_pb.WorkerEvent:
        return await self.reply(self.submit(on_reply=on_reply, **msg), timeout_s)

    def fail(self, reason: str) -> None:
        """Ends the connection (idempotent); waiting requests get WorkerUnavailable."""
        if self.lost.done():
            return
        self.lost.set_result(reason)
        if self._transport is not None:
            self._transport.abort()
        for reply, _ in self._pending.values():
            if not reply.done():
                reply.set_exception(WorkerUnavailable(f"worker lost: {reason}"))
                reply.exception()  # a caller that gave up must not leave it "never retrieved"
        self._pending.clear()


def _expire(reply: asyncio.Future) -> None:
    if not reply.done():
        reply.set_exception(TimeoutError())
