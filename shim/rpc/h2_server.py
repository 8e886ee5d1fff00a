"""The server's side of one HTTP/2 connection (the daemon's socket): the core's rules (h2_core.py) and what only a
server does: it reads the client's preface, the streams it serves are the ones the client opens, and it keeps the
budgets that end a connection abusing it (shim/rpc/limits.py has the numbers and why).

Tested with python-hyper's h2 as the client (tests/unit/test_rpc_server_h2.py): whatever h2's client accepts from
it, and what it does with h2's frames.

Beyond RFC 9113's own rules, a client's connection ends with GOAWAY ENHANCE_YOUR_CALM when it resets streams faster
than the reset budget (HTTP/2 rapid reset, and made-you-reset: stream errors this side sends count too), sends
frames that move nothing forward faster than the glitch budget, pings more often than grpc-go's keepalive policy
allows, or leaves more than INDUCED_FRAMES answers to its frames unread. A graceful GOAWAY, either way, ends no
stream: the streams already open go on (their DATA, WINDOW_UPDATEs and PINGs are still read, RFC 9113 6.8), and the
streams a client opens after this side's GOAWAY are ignored (the client retries them on a new connection).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import chain

from shim.rpc.h2_core import Connection
from shim.rpc.h2_frames import (  # noqa: F401 - the vocabulary, re-exported for the tests and the server
    PREFACE, DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
    CONTINUATION, END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG, NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR,
    FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM, HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, DEFAULT_WINDOW, DEFAULT_FRAME_SIZE, MAX_WINDOW, _FRAME_HEAD, _SETTING, _U32, frame, settings_payload, ConnectionError_, StreamOpened,
    DataReceived, StreamEnded, StreamReset, WindowOpened, ConnectionEnded, Event, Stream, unpadded,
)
from shim.rpc.limits import (
    CONCURRENT_CALLS, GLITCH_BURST, GLITCHES_PER_S, HEADER_LIST_BYTES, INDUCED_FRAMES, REQUEST_CONNECTION_WINDOW,
    REQUEST_STREAM_WINDOW, RESET_BURST, RESETS_PER_S, Budget, PingPolicy,
)

# The receive windows this side announces (the client side's are h2_frames'), under the names the tests know.
STREAM_WINDOW, CONNECTION_WINDOW = REQUEST_STREAM_WINDOW, REQUEST_CONNECTION_WINDOW
CONCURRENT_STREAMS = CONCURRENT_CALLS
HEADER_LIST_LIMIT = HEADER_LIST_BYTES


class ServerConnection(Connection):
    def __init__(self, *, max_concurrent_streams: int = CONCURRENT_CALLS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__({MAX_CONCURRENT_STREAMS: max_concurrent_streams, MAX_HEADER_LIST_SIZE: HEADER_LIST_BYTES,
                          ENABLE_PUSH: 0}, stream_window=STREAM_WINDOW, connection_window=CONNECTION_WINDOW,
                         clock=clock)
        # The calls a client may have are counted by the server as it dispatches them (server.py: a handler of a
        # reset stream still counts); one read may open thousands of streams before any is answered (a deadline of
        # 1n is answered at dispatch), so this side's own refusal is a bound of the stream table, at twice that.
        self._stream_limit = 2 * max_concurrent_streams
        self._preface_seen = False
        self.connected = False  # the preface and the client's first SETTINGS arrived
        self._resets = Budget(RESET_BURST, RESETS_PER_S)
        self._glitches = Budget(GLITCH_BURST, GLITCHES_PER_S)
        self._pings = PingPolicy()
        self._settings_frames = 0
        self._induced_limit = INDUCED_FRAMES

    def receive(self, data: bytes) -> list[Event]:
        if self._broken:
            return []
        if not self._preface_seen:
            buffer = self._buffer
            buffer += data
            if not (PREFACE.startswith(bytes(buffer)) or buffer.startswith(PREFACE)):
                return [self._end(PROTOCOL_ERROR, "not an HTTP/2 client preface")]
            if len(buffer) < len(PREFACE):
                return []
            del buffer[:len(PREFACE)]
            self._preface_seen = True
            data = b""
        if not self.connected and len(self._buffer) + len(data) >= 9:
            # RFC 9113 3.4: the preface is followed by SETTINGS; checked on the first frame's head, once.
            head = (self._buffer + data)[:9]
            if head[3] != SETTINGS or head[4] & ACK:
                return [self._end(PROTOCOL_ERROR, "the client preface is not followed by SETTINGS")]
            self.connected = True
        return super().receive(data)


    def _header_block(self, stream_id: int, flags: int, headers: list[tuple[bytes, bytes]],
                      events: list[Event]) -> None:
        ended = bool(flags & END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they must end its side
            if not ended or not stream.remote_open:
                raise ConnectionError_(PROTOCOL_ERROR, "a second HEADERS block that does not end the stream")
            self._remote_closed(stream_id, stream)
            events.append(StreamEnded(stream_id))
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, f"HEADERS opening stream {stream_id} out of order")
        self.last_stream_id = stream_id
        if self._last_served is not None:
            return  # opened after this side's GOAWAY, which told the client it is not served
        if len(self._streams) >= self._stream_limit:
            self._refuse(stream_id)
            return
        stream = self._streams[stream_id] = Stream(self._peer_window, self._stream_window)
        if ended:
            self._remote_closed(stream_id, stream)
        size = sum(map(len, chain.from_iterable(headers))) + 32 * len(headers)  # RFC 9113 6.5.2
        events.append(StreamOpened(stream_id, headers, ended, size))

    def refuse(self, stream_id: int) -> None:
        """A stream this side will not serve (over the calls limit): the client may retry it elsewhere. Counts
        against the reset budget, which may end the connection (`closed` says so)."""
        if self._streams.get(stream_id) is not None:
            self._forget(stream_id)
        try:
            self._refuse(stream_id)
        except ConnectionError_ as error:
            self._end(error.code, str(error))

    def _refuse(self, stream_id: int) -> None:
        self._induce(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
        self._made_reset()

    def finish_stream(self, stream_id: int) -> None:
        """After this side's END_STREAM: a client still sending is told no more is read (RST_STREAM NO_ERROR)."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.remote_open and not stream.local_open and stream.trailers is None:
            self._reset(stream_id, NO_ERROR)

    # --- budgets -------------------------------------------------------------------------------------------------

    def _glitch(self, what: str) -> None:
        if not self._glitches.spend(self._clock()):
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"too many frames that do nothing ({what})")

    def _peer_reset(self) -> None:
        if not self._resets.spend(self._clock()):
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many streams reset")

    def _made_reset(self) -> None:
        if not self._resets.spend(self._clock()):
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many streams this side had to reset")

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        super()._stream_error(stream_id, code, events)
        self._made_reset()

    def _ping_received(self) -> None:
        if self.sent_frames:  # HEADERS or DATA went out since the last ping: strikes forgiven (grpc-go)
            self.sent_frames = False
            self._pings.sent_data()
        if not self._pings.received(self._clock(), calls_open=bool(self._streams)):
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too_many_pings")  # grpc-go's debug data, word for word

    def _settings_received(self) -> None:
        self._settings_frames += 1
        if self._settings_frames > 1:  # the first is the client's part of the preface
            self._glitch("SETTINGS")
