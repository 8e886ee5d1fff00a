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

from probe_api.worker_protocol import FrameDecoder, encode


class ChannelClosed(Exception):
    """The other side closed the socket."""


class AsyncChannel:
    """Worker side: one reader task, any number of writers whose frames never interleave."""

    def __init__(self, sock: socket.socket, decoder: FrameDecoder | None = None, pending: list[bytes] | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._decoder = decoder or FrameDecoder()
        self._pending: list[bytes] = pending or []
        # Bytes the kernel has not taken yet, in order, and the task writing them out.
        self._unsent: collections.deque[bytes] = collections.deque()
        self._flusher: asyncio.Future[None] | None = None

    async def send(self, message: Message) -> None:
        """Returns once the frame is handed to the kernel; raises OSError if the daemon is gone."""
        data = encode(message)
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
        self._sock.close()

    async def recv(self) -> bytes:
        loop = asyncio.get_running_loop()
        while not self._pending:
            data = await loop.sock_recv(self._sock, 65536)
            if not data:
                raise ChannelClosed()
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)


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
