"""The client side of one HTTP/2 connection (the daemon's calls to the runtime): sans-IO, like the server's side.

Everything the two sides share (frames, SETTINGS, PING, WINDOW_UPDATE and both directions of flow control,
GOAWAY, RST_STREAM) is h2_connection.ServerConnection's; this side differs where RFC 9113 makes the sides differ:
it sends the preface, it opens the (odd) streams, and the header blocks it receives are responses: a stream's first
block is the response's headers (ResponseHeaders), a block with END_STREAM its trailers (or, first, both); and
it keeps to the server's SETTINGS_MAX_CONCURRENT_STREAMS (`may_open`: the caller waits while it is False).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hpack.exceptions import HPACKError

from shim.rpc.h2_connection import (
    COMPRESSION_ERROR, END_STREAM, PREFACE, PROTOCOL_ERROR, ConnectionEnded, ConnectionError_, ServerConnection,
    Stream,
)
from shim.rpc.h2_frames import ACK, MAX_CONCURRENT_STREAMS

MAX_STREAM_ID = 2**31 - 1
_SETTING = struct.Struct(">HL")


@dataclass(slots=True)
class ResponseHeaders:
    stream_id: int
    headers: list[tuple[bytes, bytes]]
    ended: bool  # END_STREAM: trailers (after DATA), or Trailers-Only as the first block


class ClientConnection(ServerConnection):
    def __init__(self) -> None:
        super().__init__()
        self._out.insert(0, PREFACE)  # before this side's SETTINGS, which the base queued
        self._preface_seen = True  # a server sends no preface: its first frame is its SETTINGS
        self._next_stream_id = 1
        self.peer_max_streams = MAX_STREAM_ID  # unlimited until the server's SETTINGS say otherwise

    @property
    def may_open(self) -> bool:
        """A new stream stays within the server's SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 5.1.2)."""
        return len(self._streams) < self.peer_max_streams

    def open_stream(self, block: bytes, body: bytes) -> int:
        """A request: its header block, then `body` (DATA, ending the request) as the server's windows allow."""
        stream_id = self._next_stream_id
        if stream_id > MAX_STREAM_ID:
            raise ConnectionError_(PROTOCOL_ERROR, "stream ids used up")  # the caller opens a new connection
        self._next_stream_id += 2
        self.last_stream_id = stream_id
        stream = self._streams[stream_id] = Stream(self._peer_window)
        self._headers_frames(stream_id, block, False)
        stream.pending.append(body)
        stream.end_with_data = True
        self._flush(stream_id, stream)
        return stream_id

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        super()._settings(flags, stream_id, payload)  # first: it refuses a malformed frame
        if not flags & ACK:
            for offset in range(0, len(payload), 6):
                key, value = _SETTING.unpack_from(payload, offset)
                if key == MAX_CONCURRENT_STREAMS:
                    self.peer_max_streams = value

    def _end(self, code: int, reason: str) -> ConnectionEnded:
        # A GOAWAY names the last stream its *receiver* opened (RFC 9113 6.8): a server opens none here (push is
        # off), while `last_stream_id` is this side's own last stream, which the base would send.
        opened, self.last_stream_id = self.last_stream_id, 0
        try:
            return super()._end(code, reason)
        finally:
            self.last_stream_id = opened

    @property
    def streams_left(self) -> int:
        return (MAX_STREAM_ID - self._next_stream_id) // 2

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id % 2 == 0 and stream_id:  # the base drops DATA of a stream below the last one: a closed one
            raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {stream_id}: a server opens none")
        super()._data(flags, stream_id, payload, events)

    def _header_block(self, stream_id: int, flags: int, block: bytes, events: list) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)  # always: the decoder's table follows the peer's
        except HPACKError as error:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == 0 or stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, never opened")
            return  # reset by this side a moment ago
        if not stream.remote_open:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS after the response ended")
        ended = bool(flags & END_STREAM)
        if ended:
            self._remote_closed(stream_id, stream)
        events.append(ResponseHeaders(stream_id, headers, ended))
