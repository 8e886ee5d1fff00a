"""The server side of one HTTP/2 connection, as much of RFC 9113 as gRPC uses: a sans-IO state machine.

Bytes in (`receive`), events out; `send_headers` / `send_data` / `reset` queue frames, `data_to_send` takes them.
It never touches a socket, so every rule is tested without one, with python-hyper's h2 as the peer
(tests/unit/test_grpc_server_h2.py): whatever h2's client accepts from it, and what it does with h2's frames.

Not h2's own state machine, which is the reference but costs as much CPU per call as grpcio's whole server (see
server.py). Header blocks are decoded by hpack's Decoder; the blocks this side sends are literals (grpc_wire.py).

Flow control: what a client sends is acknowledged as it arrives (a WINDOW_UPDATE once half a window is used); the
caller bounds what it buffers (a message is at most 16 MiB). What this side sends waits for the client's windows,
queued per stream, and is sent as WINDOW_UPDATEs open them; `backlog(stream_id)` lets a writer wait.
A broken rule of the connection ends it with GOAWAY and the error code (ConnectionEnded) and nothing more is read;
a broken rule of one stream resets that stream. A graceful GOAWAY, either way, ends no stream: the streams already
open go on (their DATA, WINDOW_UPDATEs and PINGs are still read, RFC 9113 6.8), and the streams a client opens
after this side's GOAWAY are ignored (the client retries them on a new connection).
"""

from __future__ import annotations

import hpack
from hpack.exceptions import HPACKError

from shim.rpc.h2_frames import (  # noqa: F401 - the vocabulary, re-exported for the client's side
    PREFACE, DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE,
    CONTINUATION, END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG, NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR,
    FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM, HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, DEFAULT_WINDOW, DEFAULT_FRAME_SIZE, MAX_WINDOW, STREAM_WINDOW,
    CONNECTION_WINDOW, CONCURRENT_STREAMS, HEADER_LIST_LIMIT, _FRAME_HEAD, _SETTING, _U32, frame,
    settings_payload, ConnectionError_, StreamOpened, DataReceived, StreamEnded, StreamReset, ConnectionEnded,
    Event, Stream, unpadded,
)


# --- the connection --------------------------------------------------------------------------------------------


class ServerConnection:
    def __init__(self, *, max_concurrent_streams: int = CONCURRENT_STREAMS) -> None:
        self._out: list[bytes] = []
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=HEADER_LIST_LIMIT)
        self._streams: dict[int, Stream] = {}
        self._max_streams = max_concurrent_streams
        self.last_stream_id = 0
        self._peer_window = DEFAULT_WINDOW  # SETTINGS_INITIAL_WINDOW_SIZE of the client
        self._peer_frame_size = DEFAULT_FRAME_SIZE
        self._send_window = DEFAULT_WINDOW  # the connection's
        self._unacked = 0
        self._continuing: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)
        self.closed: ConnectionEnded | None = None
        self._last_served: int | None = None  # the last stream id of this side's GOAWAY, once sent
        self._broken = False  # this side sent GOAWAY with an error: nothing more is read
        settings = {MAX_CONCURRENT_STREAMS: max_concurrent_streams, INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    MAX_HEADER_LIST_SIZE: HEADER_LIST_LIMIT, ENABLE_PUSH: 0}
        self._out.append(frame(SETTINGS, 0, 0, settings_payload(settings)))
        self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))

    # --- bytes in ------------------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """The events `data` completes. After a connection error (GOAWAY with its code) nothing more is read."""
        if self._broken:
            return []
        events: list[Event] = []
        buffer = self._buffer
        buffer += data
        try:
            if not self._preface_seen:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                    return events
                if buffer[:len(PREFACE)] != PREFACE:
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                del buffer[:len(PREFACE)]
                self._preface_seen = True
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
                self._header_block(stream_id, flags, block, events)
            else:
                self._continuing = (stream_id, flags, bytearray(block))
        elif kind == CONTINUATION:
            if self._continuing is None or self._continuing[0] != stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            block = self._continuing[2]
            block += payload
            if len(block) > HEADER_LIST_LIMIT:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "a header block over the limit")
            if flags & END_HEADERS:
                _, first_flags, _ = self._continuing
                self._continuing = None
                self._header_block(stream_id, first_flags, bytes(block), events)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, events)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a RST_STREAM not of 4 bytes")
            if stream_id == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            if self._streams.pop(stream_id, None) is not None:
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
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a malformed PRIORITY")
        # Unknown frame types are ignored (RFC 9113 section 4.1).

    def _data(self, flags: int, stream_id: int, payload: bytes, events: list[Event]) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        # The whole frame counts against the connection's window, whatever becomes of the stream.
        self._unacked += len(payload)
        if self._unacked >= CONNECTION_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked)))
            self._unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # reset by this side a moment ago: RFC 9113 5.4.2, the frames in flight are dropped
        if not stream.remote_open:
            self._reset(stream_id, STREAM_CLOSED)
            events.append(StreamReset(stream_id, STREAM_CLOSED))
            return
        stream.unacked += len(payload)
        data = unpadded(flags, payload)
        ended = bool(flags & END_STREAM)
        if ended:
            self._remote_closed(stream_id, stream)
        elif stream.unacked >= STREAM_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
            stream.unacked = 0
        events.append(DataReceived(stream_id, data, ended))

    def _header_block(self, stream_id: int, flags: int, block: bytes, events: list[Event]) -> None:
        try:
            # Every block is decoded, also of a stream about to be refused: the decoder's table must follow the peer's.
            headers = self._decoder.decode(block, raw=True)
        except HPACKError as error:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {error}") from None
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
        if len(self._streams) >= self._max_streams:
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = self._streams[stream_id] = Stream(self._peer_window)
        if ended:
            self._remote_closed(stream_id, stream)
        events.append(StreamOpened(stream_id, headers, ended))

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6")
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
            # HEADER_TABLE_SIZE: this side's blocks use no dynamic table. MAX_HEADER_LIST_SIZE: advisory.
        self._out.append(frame(SETTINGS, ACK, 0))
        self._flush_all()

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
            self._flush_all()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > MAX_WINDOW:
            code = PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR
            self._reset(stream_id, code)
            events.append(StreamReset(stream_id, code))
            return
        stream.send_window += increment
        self._flush(stream_id, stream)

    def _remote_closed(self, stream_id: int, stream: Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            del self._streams[stream_id]

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
        """DATA payload, sent as the client's windows allow (the rest waits in the stream's queue)."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.local_open or stream.trailers is not None or not data:
            return
        stream.pending.append(data)
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

    def finish_stream(self, stream_id: int) -> None:
        """After this side's END_STREAM: a client still sending is told no more is read (RST_STREAM NO_ERROR)."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.remote_open and not stream.local_open and stream.trailers is None:
            self._reset(stream_id, NO_ERROR)

    def go_away(self, code: int = NO_ERROR, reason: str = "") -> ConnectionEnded:
        """Tells the client no stream after `last_stream_id` will be served; the open ones go on."""
        return self._end(code, reason)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def sending(self) -> bool:
        """A stream still has DATA or its trailers waiting for the client's windows: closing now would cut them."""
        return any(stream.pending or stream.trailers is not None for stream in self._streams.values())

    # --- internals -----------------------------------------------------------------------------------------------

    def _end(self, code: int, reason: str) -> ConnectionEnded:
        """GOAWAY: once gracefully (NO_ERROR), and once more if a rule is broken later."""
        if self._broken or (code == NO_ERROR and self._last_served is not None):
            return self.closed
        if self._last_served is None:
            self._last_served = self.last_stream_id
        self._out.append(frame(GOAWAY, 0, 0, _U32.pack(self._last_served) + _U32.pack(code)
                               + reason.encode()[:256]))
        self._broken = code != NO_ERROR
        if self.closed is None or self.closed.by_peer or self._broken:
            self.closed = ConnectionEnded(code, reason, by_peer=False)
        return self.closed

    def _reset(self, stream_id: int, code: int) -> None:
        del self._streams[stream_id]
        self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def _headers_frames(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        size = self._peer_frame_size
        first, rest = block[:size], block[size:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        self._out.append(frame(HEADERS, flags, stream_id, first))
        while rest:
            chunk, rest = rest[:size], rest[size:]
            self._out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk))

    def _local_closed(self, stream_id: int, stream: Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            del self._streams[stream_id]

    def _flush(self, stream_id: int, stream: Stream) -> None:
        pending = stream.pending
        while pending:
            room = min(stream.send_window, self._send_window, self._peer_frame_size)
            if room <= 0:
                return
            chunk = pending[0]
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
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

    def _flush_all(self) -> None:
        for stream_id, stream in list(self._streams.items()):
            if stream.pending or stream.trailers is not None or stream.end_with_data:
                self._flush(stream_id, stream)
            if self._send_window <= 0:
                return
