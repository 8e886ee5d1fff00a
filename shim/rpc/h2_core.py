"""What both ends of the daemon's HTTP/2 connections do alike (RFC 9113, as much as gRPC uses): a sans-IO core.

Bytes in (`receive`), events out; `send_headers` / `send_data` / `reset` queue frames, `data_to_send` takes them. It
never touches a socket, so every rule is tested without one, with python-hyper's h2 as the peer. The server's side
(h2_server.py: the preface it reads, the streams a client opens, the budgets it keeps) and the client's side
(h2_client.py: the streams it opens, the responses it reads) differ only where RFC 9113 makes the sides differ.

Not h2's own state machine, which is the reference but costs as much CPU per call as grpcio's whole server.

Flow control, both ways:
- What the peer sends counts against the windows this side announced, and a peer that sends beyond them broke the
  connection (FLOW_CONTROL_ERROR). The windows are given back as the data is *consumed* (`consume`: a handler took
  the message, a proxied peer wrote it), not as it arrives, so a peer can never have more in flight than the
  windows say (Go's net/http2 server does the same). Bytes this side drops (padding, a stream that is gone) are
  given back at once.
- What this side sends waits for the peer's windows, queued per stream; a WINDOW_UPDATE or SETTINGS that lets a
  stream's queue move reports it (`WindowOpened`), so that only its writer is woken.
A broken rule of the connection ends it with GOAWAY and the error code (ConnectionEnded) and nothing more is read;
a broken rule of one stream resets that stream.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import hpack
from hpack.exceptions import HPACKError

from shim.rpc.h2_frames import (
    _FRAME_HEAD, _SETTING, _U32, ACK, CANCEL, COMPRESSION_ERROR, CONTINUATION, DATA,
    DEFAULT_FRAME_SIZE, DEFAULT_WINDOW, ENABLE_PUSH, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR, GOAWAY, HEADERS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_WINDOW, NO_ERROR, PING, PRIORITY,
    PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE, RST_STREAM, SETTINGS, STREAM_CLOSED, WINDOW_UPDATE,
    ConnectionEnded, ConnectionError_, DataReceived, Event, Stream, StreamReset, WindowOpened, frame,
    settings_payload, unpadded,
)
from shim.rpc.limits import HEADER_BLOCK_BYTES


class Connection:
    """One HTTP/2 connection's shared rules; subclasses say how header blocks and new streams are read."""

    def __init__(self, settings: dict[int, int], *, stream_window: int, connection_window: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._out: list[bytes] = []
        self._stream_window = stream_window  # the receive windows this side announces
        self._connection_window = connection_window
        self._buffer = bytearray()
        self._clock = clock
        # No list size limit inside the decoder: it would stop mid-block and leave its table behind the peer's.
        # The raw block is bounded (HEADER_BLOCK_BYTES) and the decoded size judged afterwards, per stream.
        self._decoder = hpack.Decoder(max_header_list_size=sys.maxsize)
        self._streams: dict[int, Stream] = {}
        self._queued: dict[int, Stream] = {}  # the streams with DATA or trailers waiting for a window, in order
        self.last_stream_id = 0
        self._peer_window = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self._peer_frame_size = DEFAULT_FRAME_SIZE
        self._send_window = DEFAULT_WINDOW  # the connection's, for what this side sends
        self._receive_window = connection_window  # what the peer may still send on the connection
        self._consumed = 0  # bytes consumed and not yet given back on the connection's window
        self._continuing: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)
        self.closed: ConnectionEnded | None = None
        self._last_served: int | None = None  # the last stream id of this side's GOAWAY, once sent
        self._broken = False  # this side sent GOAWAY with an error: nothing more is read
        self.induced = 0  # frames queued in answer to the peer (acks, resets) since the socket last drained
        self._induced_limit = sys.maxsize  # the server's side sets limits.INDUCED_FRAMES
        self.queued_bytes = 0  # DATA waiting for the peer's windows, all streams
        self.sent_frames = False  # HEADERS or DATA went out (since the server's side last looked: ping strikes)
        self._out.append(frame(SETTINGS, 0, 0, settings_payload({**settings, INITIAL_WINDOW_SIZE: stream_window})))
        self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(connection_window - DEFAULT_WINDOW)))

    # --- bytes in ------------------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """The events `data` completes. After a connection error (GOAWAY with its code) nothing more is read."""
        if self._broken:
            return []
        events: list[Event] = []
        buffer = self._buffer
        buffer += data
        try:
            offset, size = 0, len(buffer)
            while size - offset >= 9:
                high, low, kind, flags, stream_id = _FRAME_HEAD.unpack_from(buffer, offset)
                length = high << 8 | low
                if length > DEFAULT_FRAME_SIZE:  # this side never announces a larger SETTINGS_MAX_FRAME_SIZE
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                end = offset + 9 + length
                if end > size:
                    break
                payload = bytes(buffer[offset + 9:end])
                offset = end
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload, events)
                if self.induced > self._induced_limit:  # Go's net/http2 answer to a peer that does not read
                    raise ConnectionError_(ENHANCE_YOUR_CALM, "too many control frames queued for a peer that "
                                                              "does not read")
            del buffer[:offset]
        except ConnectionError_ as error:
            events.append(self._end(error.code, str(error)))
        return events

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if self._continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload, events)
        elif kind == HEADERS:
            if stream_id == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
            block = unpadded(flags, payload)
            if flags & PRIORITY_FLAG:
                block = block[5:]
            if flags & END_HEADERS:
                try:  # every block is decoded, whatever becomes of its stream: the table must follow the peer's
                    headers = self._decoder.decode(block, raw=True)
                except HPACKError as error:
                    raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None
                self._header_block(stream_id, flags, headers, events)
            else:
                if not block:
                    self._glitch("an empty header block fragment")
                self._continuing = (stream_id, flags, bytearray(block))
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload, events)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload, events)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, events)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a malformed PING")
            if flags & ACK:
                self._glitch("a PING acknowledgement never asked for")
            else:
                self._ping_received()
                self._induce(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a RST_STREAM not of 4 bytes")
            if stream_id == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            if stream_id in self._streams:
                self._forget(stream_id)
                self._peer_reset()
                events.append(StreamReset(stream_id, _U32.unpack(payload)[0]))
            elif stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM of an idle stream")
        elif kind == GOAWAY:
            if stream_id != 0 or len(payload) < 8:
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed GOAWAY")
            ended = ConnectionEnded(_U32.unpack_from(payload, 4)[0], payload[8:].decode("utf-8", "replace"),
                                    by_peer=True, last_stream_id=_U32.unpack_from(payload)[0] & 0x7FFFFFFF)
            if self.closed is None:
                self.closed = ended
            events.append(ended)
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE: push is off")
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a malformed PRIORITY")
            self._glitch("PRIORITY")
        else:
            self._glitch("a frame of an unknown type")  # ignored otherwise (RFC 9113 section 4.1)

    def _continuation(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if self._continuing is None or self._continuing[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        if not payload and not flags & END_HEADERS:
            self._glitch("an empty CONTINUATION")
        block = self._continuing[2]
        block += payload
        if len(block) > HEADER_BLOCK_BYTES:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "a header block over the limit")
        if flags & END_HEADERS:
            _, first_flags, _ = self._continuing
            self._continuing = None
            self._header_block(stream_id, first_flags, self._decode(bytes(block)), events)

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        # The whole frame counts against the connection's window, whatever becomes of the stream.
        self._receive_window -= size
        if self._receive_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            self._give_back(size)  # reset a moment ago: RFC 9113 5.4.2, the frames in flight are dropped
            return
        if not stream.remote_open:
            self._give_back(size)
            self._stream_error(stream_id, STREAM_CLOSED, events)
            return
        stream.receive_window -= size
        if stream.receive_window < 0:
            self._give_back(size)
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        data = unpadded(flags, payload)
        if len(data) < size:
            self.consume(stream_id, size - len(data))  # the padding: nobody else will
        ended = bool(flags & END_STREAM)
        if not data and not ended:
            self._glitch("an empty DATA frame")
        if ended:
            self._remote_closed(stream_id, stream)
        events.append(DataReceived(stream_id, data, ended))

    def _header_block(self, stream_id: int, flags: int, headers: list[tuple[bytes, bytes]],
                      events: list[Event]) -> None:
        """A whole header block, decoded: what it means is the side's (a request, a response)."""
        raise NotImplementedError

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Every block is decoded, whatever becomes of its stream: the decoder's table must follow the peer's."""
        try:
            return self._decoder.decode(block, raw=True)
        except HPACKError as error:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None

    def _settings(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6")
        self._settings_received()
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta, self._peer_window = value - self._peer_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= 16_777_215:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame_size = value
            elif key == ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            else:
                self._setting(key, value)
            # HEADER_TABLE_SIZE: this side's blocks use no dynamic table. MAX_HEADER_LIST_SIZE: advisory.
        self._induce(frame(SETTINGS, ACK, 0))
        self._flush_all(events)

    def _setting(self, key: int, value: int) -> None:
        """A setting the core does not act on itself (the client's side reads MAX_CONCURRENT_STREAMS)."""

    def _window_update(self, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            self._flush_all(events)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of an idle stream")
            return  # frames in flight when the stream closed (RFC 9113 5.1): not a glitch
        if increment == 0 or stream.send_window + increment > MAX_WINDOW:
            self._stream_error(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR, events)
            return
        stream.send_window += increment
        if stream_id in self._queued:
            self._flush(stream_id, stream)
            events.append(WindowOpened(stream_id))

    def _remote_closed(self, stream_id: int, stream: Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            del self._streams[stream_id]

    # --- what the sides police (the server's side keeps budgets; the client's trusts its runtime) -----------------

    def _glitch(self, what: str) -> None:
        """A frame that moves nothing forward."""

    def _peer_reset(self) -> None:
        """The peer reset a stream that was open."""

    def _ping_received(self) -> None:
        """A PING to acknowledge."""

    def _settings_received(self) -> None:
        """A SETTINGS frame to acknowledge (the first one is the server's sign that the client connected)."""

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        """The peer broke a rule of one stream: it is reset (RFC 9113 5.4.2)."""
        self._reset(stream_id, code)
        events.append(StreamReset(stream_id, code))

    # --- flow control in -----------------------------------------------------------------------------------------

    def consume(self, stream_id: int, size: int) -> None:
        """`size` bytes of the stream's DATA were consumed: they go back to the peer's windows (a WINDOW_UPDATE once
        half a window is used up). Of a stream that is gone, only to the connection's."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.remote_open:
            stream.consumed += size
            if stream.consumed >= self._stream_window // 2:
                stream.receive_window += stream.consumed
                self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.consumed)))
                stream.consumed = 0
        self._give_back(size)

    def _give_back(self, size: int) -> None:
        self._consumed += size
        if self._consumed >= self._connection_window // 2:
            self._receive_window += self._consumed
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._consumed)))
            self._consumed = 0

    # --- bytes out -----------------------------------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        """A header block (grpc_wire's encoding). With end_stream it closes this side once queued data is out."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.local_open or stream.trailers is not None:
            return  # reset meanwhile: nothing more goes out on it
        if end_stream and stream.pending:
            stream.trailers = block
            return
        self._headers_frames(stream_id, block, end_stream)
        if end_stream:
            self._local_closed(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes) -> None:
        """DATA payload, sent as the peer's windows allow (the rest waits in the stream's queue)."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.local_open or stream.trailers is not None or not data:
            return
        stream.pending.append(data)
        self.queued_bytes += len(data)
        self._flush(stream_id, stream)

    def backlog(self, stream_id: int) -> int:
        """Bytes queued on the stream waiting for a window (0 for a stream that is gone)."""
        stream = self._streams.get(stream_id)
        return sum(map(len, stream.pending)) if stream is not None else 0

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        if self._streams.get(stream_id) is not None:
            self._reset(stream_id, code)

    def go_away(self, code: int = NO_ERROR, reason: str = "") -> ConnectionEnded:
        """Tells the peer no stream after `last_stream_id` will be served; the open ones go on (NO_ERROR)."""
        return self._end(code, reason)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def written(self) -> None:
        """Everything `data_to_send` gave is in the socket: the frames induced by the peer are out."""
        self.induced = 0

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def sending(self) -> bool:
        """A stream still has DATA or its trailers waiting for the peer's windows: closing now would cut them."""
        return bool(self._queued)

    # --- internals -----------------------------------------------------------------------------------------------

    def _end(self, code: int, reason: str) -> ConnectionEnded:
        """GOAWAY: once gracefully (NO_ERROR), and once more if a rule is broken later."""
        if self._broken or (code == NO_ERROR and self._last_served is not None):
            return self.closed
        if self._last_served is None:
            self._last_served = self._goaway_last_stream()
        self._out.append(frame(GOAWAY, 0, 0, _U32.pack(self._last_served) + _U32.pack(code)
                               + reason.encode()[:256]))
        self._broken = code != NO_ERROR
        if self.closed is None or self.closed.by_peer or self._broken:
            self.closed = ConnectionEnded(code, reason, by_peer=False)
        return self.closed

    def _goaway_last_stream(self) -> int:
        """A GOAWAY names the last stream its *receiver* opened that this side served (RFC 9113 6.8)."""
        return self.last_stream_id

    def _induce(self, data: bytes) -> None:
        self.induced += 1
        self._out.append(data)

    def _reset(self, stream_id: int, code: int) -> None:
        self._forget(stream_id)
        self._induce(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def _forget(self, stream_id: int) -> None:
        """The stream is gone: what it still had queued is dropped."""
        stream = self._streams.pop(stream_id)
        if self._queued.pop(stream_id, None) is not None:
            self.queued_bytes -= sum(map(len, stream.pending))

    def _headers_frames(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        self.sent_frames = True
        size = self._peer_frame_size
        first, rest = block[:size], block[size:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        self._out.append(frame(HEADERS, flags, stream_id, first))
        while rest:
            chunk, rest = rest[:size], rest[size:]
            self._out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk))

    def _local_closed(self, stream_id: int, stream: Stream) -> None:
        stream.local_open = False
        self._queued.pop(stream_id, None)
        if not stream.remote_open:
            del self._streams[stream_id]

    def _flush(self, stream_id: int, stream: Stream) -> None:
        """What the windows let out of the stream's queue; a stream the windows hold back stays in `_queued` (one
        that closes leaves it in _local_closed)."""
        pending = stream.pending
        if pending:
            self.sent_frames = True
        while pending:
            room = min(stream.send_window, self._send_window, self._peer_frame_size)
            if room <= 0:
                self._queued[stream_id] = stream
                return
            chunk = pending[0]
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
            self.queued_bytes -= len(chunk)
            stream.send_window -= len(chunk)
            self._send_window -= len(chunk)
            if not pending and stream.end_with_data:  # a request's last DATA carries END_STREAM itself
                stream.end_with_data = False
                self._out.append(frame(DATA, END_STREAM, stream_id, chunk))
                self._local_closed(stream_id, stream)
                return
            self._out.append(frame(DATA, 0, stream_id, chunk))
        if stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._headers_frames(stream_id, block, True)
            self._local_closed(stream_id, stream)
        elif stream.end_with_data:
            stream.end_with_data = False
            self._out.append(frame(DATA, END_STREAM, stream_id))
            self._local_closed(stream_id, stream)
        elif stream_id in self._queued:
            del self._queued[stream_id]  # all out, the stream stays open

    def _flush_all(self, events: list[Event]) -> None:
        """The connection's window or every stream's grew: the streams with something queued send what fits."""
        for stream_id, stream in list(self._queued.items()):
            if self._send_window <= 0:
                return
            self._flush(stream_id, stream)
            events.append(WindowOpened(stream_id))
