"""python-hyper's h2 as a gRPC client over a real unix socket, for the tests of the daemon's server that need to
do what no gRPC library does: send ahead of the windows' news, reset a call in the same write that opens it, hold
a call open without reading, or see the frames the server sends. `sync()` is the barrier: a call the server
answers as it reads it, after everything it sent in answer to what was sent before it."""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.events

from shim.rpc import grpc_wire

BOUND_S = 10.0
SYNC_PATH = "/sync.Barrier/Sync"


def request_headers(path: str, extra: list | None = None) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])]


class H2SocketClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.events: list = []
        self.closed = False

    @classmethod
    async def connect(cls, path: str) -> H2SocketClient:
        reader, writer = await asyncio.open_unix_connection(path)
        client = cls(reader, writer)
        client.h2.initiate_connection()
        await client.send()
        return client

    async def send(self, raw: bytes = b"") -> None:
        self.writer.write(self.h2.data_to_send() + raw)
        await self.writer.drain()

    def open(self, path: str, extra: list | None = None, *, end_stream: bool = False) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, request_headers(path, extra), end_stream=end_stream)
        return stream_id

    def message(self, stream_id: int, payload: bytes, *, end_stream: bool = True) -> None:
        """One message, in as many DATA frames as the frame size needs (the windows must have room for it)."""
        data, size = grpc_wire.message(payload), self.h2.max_outbound_frame_size
        for offset in range(0, len(data), size):
            last = offset + size >= len(data)
            self.h2.send_data(stream_id, data[offset:offset + size], end_stream=end_stream and last)

    async def read_once(self) -> list:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), BOUND_S)
        except ConnectionResetError:  # a server closing with our bytes unread: what it sent before was read
            data = b""
        if not data:
            self.closed = True
            return []
        events = self.h2.receive_data(data)
        self.events += events
        await self.send()  # h2's own answers (SETTINGS and PING acks)
        return events

    async def sync(self) -> None:
        """Returns once the server has read everything sent before: a call to a method no server has, which it
        answers (UNIMPLEMENTED) as it reads it, after what it answered to the frames before. Not a PING: those
        count as strikes (grpc-go's keepalive policy)."""
        stream_id = self.open(SYNC_PATH, end_stream=True)
        await self.send()
        await self.answer(stream_id)

    async def answer(self, stream_id: int) -> dict[bytes, bytes]:
        """The call's response headers and trailers as one dict, once it ended (not when it was reset)."""
        headers: dict[bytes, bytes] = {}
        seen = 0
        while True:
            for event in self.events[seen:]:
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    headers.update(event.headers)
                elif isinstance(event, h2.events.StreamEnded):
                    return headers
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream {stream_id} was reset ({event.error_code!r})")
            seen = len(self.events)
            await self.read_once()
            assert not self.closed, "the server closed the connection before the call ended"

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
