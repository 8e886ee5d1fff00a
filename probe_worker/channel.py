"""The worker's ends of the daemon <-> worker socketpair: frames (probe_api.worker_protocol) over a socket.

The asyncio side is used by the worker; the blocking side by the zygote, the daemon's spawning code and tests.
"""

from __future__ import annotations

import asyncio
import collections
import select
import socket
import time

from google.protobuf.message import Message

from probe_api.worker_protocol import FrameDecoder, FrameError, encode

RECV_SIZE = 65536
# Frames read ahead of the consumer, at most: past it the channel stops reading, and the sender waits.
MAX_READ_AHEAD = 64


class ChannelClosed(Exception):
    """The other side closed the socket."""


class AsyncChannel:
    """Worker side: one reader task, any number of writers whose frames never interleave."""

    def __init__(self, sock: socket.socket, decoder: FrameDecoder | None = None, pending: list[bytes] | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._decoder = decoder or FrameDecoder()
        self._pending: collections.deque[bytes] = collections.deque(pending or ())
        # The reader stays registered from the first recv() on: a frame costs one recv() and no epoll_ctl.
        # (loop.sock_recv registers and unregisters the socket for every frame that it waits for.)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._end: BaseException | None = None  # why no frame comes any more, once the reader saw it
        self._waiter: asyncio.Future[None] | None = None
        # Bytes the kernel has not taken yet, in order, and the task writing them out.
        self._unsent: collections.deque[bytes] = collections.deque()
        self._flusher: asyncio.Future[None] | None = None

    async def send(self, message: Message) -> None:
        """Returns once the frame is handed to the kernel; raises OSError if the daemon is gone."""
        await self._send_bytes(encode(message))

    async def send_all(self, messages: list[Message]) -> None:
        """Several frames in one write (one syscall, one wake-up of the daemon); as send() otherwise."""
        await self._send_bytes(b"".join(map(encode, messages)))

    async def _send_bytes(self, data: bytes) -> None:
        if not self._unsent:
            # Nearly always the kernel takes a whole frame at once: written here, with no
            # task and no extra turn of the event loop (a fifth of a TCP attempt's cost).
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        # The rest, and every frame after it, queue up behind: nothing interleaves.
        self._unsent.append(data)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        # Shielded: a probe task cancelled mid-write (probe removed) must not leave
        # half a frame on the socket; the write finishes in the background instead.
        await asyncio.shield(self._flusher)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._unsent:
                await loop.sock_sendall(self._sock, self._unsent[0])
                self._unsent.popleft()
        except BaseException:
            self._unsent.clear()  # the socket is broken: later sends find out for themselves
            raise

    def close(self) -> None:
        self._stop_reading()
        self._sock.close()

    async def recv(self) -> bytes:
        """The next frame; ChannelClosed at EOF, OSError or FrameError when the socket or the stream broke."""
        while True:
            frame = self.take()
            if frame is not None:
                return frame
            await self.wait()

    def take(self) -> bytes | None:
        """A frame already read, or None; raises what ended the stream once every frame before it was taken."""
        if self._pending:
            frame = self._pending.popleft()
            if len(self._pending) < MAX_READ_AHEAD and not self._reading and self._end is None:
                self._start_reading()  # it paused with a full queue
            return frame
        if self._end is not None:
            raise self._end
        return None

    async def wait(self, *interrupts: asyncio.Future) -> None:
        """Until a frame (or the stream's end) can be taken, or one of `interrupts` is done."""
        if self._pending or self._end is not None:
            return
        loop = self._loop or asyncio.get_running_loop()
        if not self._reading:
            self._start_reading(loop)
        waiter = self._waiter = loop.create_future()
        for future in interrupts:
            future.add_done_callback(self._wake)
        try:
            await waiter
        finally:
            self._waiter = None
            for future in interrupts:
                future.remove_done_callback(self._wake)

    def _wake(self, _: object = None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _start_reading(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = self._loop or loop or asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        self._reading = True

    def _stop_reading(self) -> None:
        if self._reading and self._loop is not None:
            self._reading = False
            if self._sock.fileno() >= 0:
                self._loop.remove_reader(self._sock.fileno())

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        if not data:
            self._finish(ChannelClosed())
            return
        try:
            self._pending.extend(self._decoder.feed(data))
        except FrameError as exc:
            self._finish(exc)
            return
        if len(self._pending) >= MAX_READ_AHEAD:
            self._stop_reading()  # the reader of the frames is behind: the sender's buffer fills instead
        self._wake()

    def _finish(self, end: BaseException) -> None:
        self._end = end
        self._stop_reading()
        self._wake()


class BlockingChannel:
    """Parent side: blocking send, receive with a timeout."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._decoder = FrameDecoder()
        self._pending: list[bytes] = []

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, message: Message) -> None:
        self._sock.sendall(encode(message))

    def recv(self, timeout: float | None = None) -> bytes:
        """The next frame; raises TimeoutError when none arrives within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._sock], [], [], remaining)
            if not readable:
                raise TimeoutError("no frame from the worker in time")
            data = self._sock.recv(65536)
            if not data:
                raise ChannelClosed()
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def close(self) -> None:
        self._sock.close()

    def to_async(self) -> AsyncChannel:
        """Hands the socket to asyncio, with any frames already read ahead."""
        return AsyncChannel(self._sock, self._decoder, self._pending)
