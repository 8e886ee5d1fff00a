"""The client side of one HTTP/2 connection (the daemon's calls to the runtime): sans-IO, on the same core as the
server's side (h2_core.py: frames, SETTINGS, PING, WINDOW_UPDATE and both directions of flow control, GOAWAY,
RST_STREAM). This side differs where RFC 9113 makes the sides differ: it sends the preface, it opens the (odd)
streams, and the header blocks it receives are responses: a stream's first block is the response's headers
(ResponseHeaders), a block with END_STREAM its trailers (or, first, both); and it keeps to the server's
SETTINGS_MAX_CONCURRENT_STREAMS (`may_open`: the caller waits while it is False). It keeps no budgets: its peer is
the node's container runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from shim.rpc.h2_core import Connection
from shim.rpc.h2_frames import (
    CONNECTION_WINDOW, END_STREAM, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, PREFACE,
    PROTOCOL_ERROR, STREAM_WINDOW, ConnectionError_, Stream,
)
from shim.rpc.limits import HEADER_LIST_BYTES

MAX_STREAM_ID = 2**31 - 1


@dataclass(slots=True)
class ResponseHeaders:
    stream_id: int
    headers: list[tuple[bytes, bytes]]
    ended: bool  # END_STREAM: trailers (after DATA), or Trailers-Only as the first block


class ClientConnection(Connection):
    def __init__(self) -> None:
        super().__init__({MAX_HEADER_LIST_SIZE: HEADER_LIST_BYTES, ENABLE_PUSH: 0},
                         stream_window=STREAM_WINDOW, connection_window=CONNECTION_WINDOW)
        self._out.insert(0, PREFACE)  # before this side's SETTINGS, which the core queued
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
        stream = self._streams[stream_id] = Stream(self._peer_window, self._stream_window)
        self.queued_bytes += len(body)
        self._headers_frames(stream_id, block, False)
        stream.pending.append(body)
        stream.end_with_data = True
        self._flush(stream_id, stream)
        return stream_id

    def _setting(self, key: int, value: int) -> None:
        if key == MAX_CONCURRENT_STREAMS:
            self.peer_max_streams = value

    def _goaway_last_stream(self) -> int:
        # The last stream the *receiver* opened (RFC 9113 6.8): a server opens none here (push is off), while
        # `last_stream_id` is this side's own last stream.
        return 0

    @property
    def streams_left(self) -> int:
        return (MAX_STREAM_ID - self._next_stream_id) // 2

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list) -> None:
        if stream_id % 2 == 0 and stream_id:  # the base drops DATA of a stream below the last one: a closed one
            raise ConnectionError_(PROTOCOL_ERROR, f"DATA on stream {stream_id}: a server opens none")
        super()._data(flags, stream_id, payload, events)

    def _header_block(self, stream_id: int, flags: int, headers: list[tuple[bytes, bytes]], events: list) -> None:
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
