"""gRPC unary calls over HTTP/2, one at a time on one connection: how probectl calls the shim without grpcio.

Why: a command line that calls the shim must start within 80 ms on a 2-core node (crictl starts in 10), and
`import grpc` alone takes 35-57 ms there (its C core and asyncio), h2's 29 ms and hpack's Huffman table 17 ms
(python -X importtime, 2026-11-28). What a unary call needs of HTTP/2 is small: the client's preface and SETTINGS,
one HEADERS and the request's DATA, then the answer's HEADERS, DATA and trailers, with the peer's SETTINGS, PING,
WINDOW_UPDATE, RST_STREAM and GOAWAY honoured (RFC 9113; doc/PROTOCOL-HTTP2.md of grpc/grpc).

Sans-IO: `Connection` turns calls into bytes to write and the bytes read into `Answer`s; probectl/client.py owns the
socket and the clock. Tested against h2's server as the reference peer and hpack's encoder and decoder
(tests/unit/test_probectl_unary_h2.py, test_probectl_client_connections.py), and against the daemon's own server
(tests/system/test_client.py, tests/system/probectl/).

The request's headers are HPACK literals without indexing and without Huffman coding (nothing to keep between
calls); the answer's are decoded in full (probectl/hpack_decoder.py).

Statuses are grpc's (doc/statuscodes.md, doc/http-grpc-status-mapping.md), as numbers: the caller names them.
Bounds: an answer's message at most `max_message` bytes (RESOURCE_EXHAUSTED beyond, as grpcio's channel option), a
header block at most HEADER_BLOCK_BYTES, the dynamic table at most HPACK's default 4096 bytes (which is all this side
advertises), frames at most 16384 bytes (ours: the default SETTINGS_MAX_FRAME_SIZE).
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import NamedTuple

from probe_api.grpc_wire_rules import decode_grpc_message, encode_timeout, frame_message, read_prefix
from probe_api.hpack_literals import literal
from probectl.hpack_decoder import HeaderDecoder, ProtocolError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 1, 2, 4, 5
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
FRAME_BYTES = 16_384  # SETTINGS_MAX_FRAME_SIZE's default: ours, and the peer's until it says otherwise
HEADER_BLOCK_BYTES = 1 << 20  # what one header block may take, encoded (the field violations of a large request)
PROTOCOL_ERROR, REFUSED_STREAM, CANCEL = 0x1, 0x7, 0x8

# grpc's status codes (doc/statuscodes.md).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, PERMISSION_DENIED = 0, 1, 2, 3, 4, 5, 7
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, UNAUTHENTICATED = 8, 12, 13, 14, 16
# An answer's HTTP status that is not 200, as grpc's clients map it (doc/http-grpc-status-mapping.md).
HTTP_STATUS_CODES = {b"400": INTERNAL, b"401": UNAUTHENTICATED, b"403": PERMISSION_DENIED, b"404": UNIMPLEMENTED,
                     b"429": UNAVAILABLE, b"502": UNAVAILABLE, b"503": UNAVAILABLE, b"504": UNAVAILABLE}
# RST_STREAM's error code as grpc core reads it (chttp2 http2_errors / grpc_http2_error_to_grpc_status).
RESET_CODES = {0x0: INTERNAL, 0x7: UNAVAILABLE, 0x8: CANCELLED, 0xB: RESOURCE_EXHAUSTED, 0xC: PERMISSION_DENIED}

_FRAME = struct.Struct(">IBI")  # length (24 bits, packed with the type: see _frame), type, flags, stream id

class Answer(NamedTuple):  # not a dataclass: dataclasses imports inspect, 5 ms of a start
    """How a call ended: grpc's status code (0 OK), its details, the answer's message (None unless OK), the
    trailing metadata as grpcio gives it (text values as str, `-bin` ones decoded to bytes), and whether the peer
    said it never processed the call (GOAWAY before its stream, REFUSED_STREAM): grpc's clients then try it again
    on another connection ("transparent retry")."""
    code: int
    details: str
    message: bytes | None = None
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()
    unprocessed: bool = False


# --- HPACK ---------------------------------------------------------------------------------------------------------

def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Literals without indexing, new names, no Huffman coding (probe_api/hpack_literals.py, shared with the
    daemon's server)."""
    return b"".join(literal(name, value) for name, value in headers)


# --- the connection ------------------------------------------------------------------------------------------------

def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def _metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    out = []
    for name, value in headers:
        if name.startswith(b":") or name in (b"grpc-status", b"grpc-message", b"content-type"):
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except binascii.Error:
                continue  # grpcio drops what it cannot decode, too
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


class _Call:
    __slots__ = ("stream_id", "pending", "headers", "data", "answer")

    def __init__(self, stream_id: int, pending: bytes) -> None:
        self.stream_id = stream_id
        self.pending = pending  # the request's DATA not yet sent (the peer's windows)
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.data = bytearray()
        self.answer: Answer | None = None


class Connection:
    """The client's side of one HTTP/2 connection, a unary call at a time. `call()` starts one; feed what the socket
    reads to `receive()`, write out `data_to_send()`, until `answer` is set (or `closed`: then `ended()`)."""

    def __init__(self, *, authority: bytes = b"localhost", user_agent: bytes = b"probectl",
                 max_message: int = 16 << 20) -> None:
        self.authority, self.user_agent, self.max_message = authority, user_agent, max_message
        self.closed = False  # GOAWAY or a protocol error: no new call on this connection
        self._out = bytearray(PREFACE + _frame(SETTINGS, 0, 0, struct.pack(
            ">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)))
        # The connection's window, opened once to its largest and never given back: a command line's connection
        # does not carry 2 GiB of answers.
        self._out += _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
        self._in = bytearray()
        self._decoder = HeaderDecoder()
        self._next_stream = 1
        self._peer_frame = FRAME_BYTES
        self._peer_initial_window = DEFAULT_WINDOW
        self._send_window = DEFAULT_WINDOW  # the connection's, for our DATA
        self._stream_window = DEFAULT_WINDOW
        self._call: _Call | None = None
        self._goaway_last: int | None = None
        # A header block arriving in CONTINUATION frames: its stream, whether it ends the stream, its bytes. Every
        # block is decoded, also one of a stream given up on: HPACK's table is the connection's.
        self._block: tuple[int, bool, bytearray] | None = None

    # --- calls -------------------------------------------------------------------------------------------------

    def call(self, path: str, request: bytes, *, timeout_s: float | None = None,
             metadata: list[tuple[str, str]] | None = None) -> None:
        if self.closed or self._call is not None and self._call.answer is None:
            raise RuntimeError("the connection is closed or busy")
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode("ascii")),
                   (b":authority", self.authority), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        if timeout_s is not None:
            headers.append((b"grpc-timeout", encode_timeout(round(min(timeout_s, 1e10) * 1e9)).encode("ascii")))
        headers.append((b"user-agent", self.user_agent))
        headers += [(key.lower().encode("ascii"), value.encode("latin-1")) for key, value in metadata or ()]
        stream_id, self._next_stream = self._next_stream, self._next_stream + 2
        block = encode_headers(headers)
        chunks = [block[i:i + self._peer_frame] for i in range(0, len(block), self._peer_frame)] or [b""]
        for index, chunk in enumerate(chunks):
            last = END_HEADERS if index == len(chunks) - 1 else 0
            self._out += _frame(HEADERS if index == 0 else CONTINUATION, last, stream_id, chunk)
        self._stream_window = self._peer_initial_window
        self._call = _Call(stream_id, frame_message(request))
        self._send_pending()

    @property
    def answer(self) -> Answer | None:
        return None if self._call is None else self._call.answer

    def cancel(self) -> None:
        """The caller gave up on the call (its deadline): the stream is reset, the connection stays usable."""
        call = self._call
        if call is not None and call.answer is None:
            self._out += _frame(RST_STREAM, 0, call.stream_id, struct.pack(">I", CANCEL))
            call.answer = Answer(DEADLINE_EXCEEDED, "Deadline Exceeded")

    def ended(self, reason: str = "Socket closed", *, unprocessed: bool = False) -> Answer:
        """The socket closed (or failed) before the call's answer: UNAVAILABLE, as grpc's clients say it;
        `unprocessed` when the caller knows the peer never read the call (it closed before the call was written)."""
        self.closed = True
        call = self._call
        if call is not None and call.answer is None:
            call.answer = Answer(UNAVAILABLE, reason, unprocessed=unprocessed)
        return call.answer if call is not None else Answer(UNAVAILABLE, reason, unprocessed=unprocessed)

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    # --- reading -----------------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        self._in += data
        try:
            while len(self._in) >= 9:
                length_kind, flags, stream_id = _FRAME.unpack_from(self._in)
                length, kind = length_kind >> 8, length_kind & 0xFF
                if length > FRAME_BYTES:
                    raise ProtocolError(f"a frame of {length} bytes, above the {FRAME_BYTES} advertised")
                if len(self._in) < 9 + length:
                    return
                payload = bytes(self._in[9:9 + length])
                del self._in[:9 + length]
                self._frame_received(kind, flags, stream_id & MAX_WINDOW, payload)
        except ProtocolError as exc:
            self.closed = True
            self._out += _frame(GOAWAY, 0, 0, struct.pack(">II", 0, PROTOCOL_ERROR))
            call = self._call
            if call is not None and call.answer is None:
                call.answer = Answer(INTERNAL, f"HTTP/2 protocol error: {exc}")

    def _frame_received(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        call = self._call
        if self._block is not None and kind != CONTINUATION:
            raise ProtocolError("a header block interrupted")
        if kind in (HEADERS, CONTINUATION):
            self._header_frame(kind, flags, stream_id, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                self._out += _frame(SETTINGS, ACK, 0)
        elif kind == PING:
            if not flags & ACK:
                self._out += _frame(PING, ACK, 0, payload)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolError("WINDOW_UPDATE of another size than 4")
            increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
            if stream_id == 0:
                self._send_window += increment
            elif call is not None and stream_id == call.stream_id:
                self._stream_window += increment
            self._send_pending()
        elif kind == GOAWAY:
            self.closed = True
            self._goaway_last = struct.unpack_from(">I", payload)[0] & MAX_WINDOW if len(payload) >= 8 else 0
            if call is not None and call.answer is None and call.stream_id > self._goaway_last:
                call.answer = Answer(UNAVAILABLE, "GOAWAY received", unprocessed=True)
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE, with push disabled")
        elif call is None or stream_id != call.stream_id or call.answer is not None:
            return  # an earlier call's stream ending, or a frame of none: nothing to do for this one
        elif kind == RST_STREAM:
            code = struct.unpack_from(">I", payload)[0] if len(payload) == 4 else PROTOCOL_ERROR
            call.answer = Answer(RESET_CODES.get(code, INTERNAL), f"Received RST_STREAM with error code {code}",
                                 unprocessed=code == REFUSED_STREAM)
        elif kind == DATA:
            self._data(call, flags, payload)

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError("SETTINGS of a size not a multiple of 6")
        for key, value in struct.iter_unpack(">HI", payload):
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                self._stream_window += value - self._peer_initial_window
                self._peer_initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not FRAME_BYTES <= value <= 2**24 - 1:
                    raise ProtocolError("SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame = value
        self._send_pending()

    def _send_pending(self) -> None:
        call = self._call
        while call is not None and call.pending and call.answer is None:
            size = min(len(call.pending), self._send_window, self._stream_window, self._peer_frame)
            if size <= 0:
                return
            chunk, call.pending = call.pending[:size], call.pending[size:]
            self._send_window -= size
            self._stream_window -= size
            self._out += _frame(DATA, 0 if call.pending else END_STREAM, call.stream_id, chunk)

    @staticmethod
    def _unpadded(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ProtocolError("padding longer than the frame")
        return payload[1:len(payload) - payload[0]]

    def _header_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS:
            payload = self._unpadded(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block = (stream_id, bool(flags & END_STREAM), bytearray())
        elif self._block is None or self._block[0] != stream_id:
            raise ProtocolError("CONTINUATION without its header block")
        _, ends, block = self._block
        block += payload
        if len(block) > HEADER_BLOCK_BYTES:
            raise ProtocolError(f"a header block above {HEADER_BLOCK_BYTES} bytes")
        if not flags & END_HEADERS:
            return
        self._block = None
        headers = self._decoder.decode(bytes(block))
        call = self._call
        if call is None or stream_id != call.stream_id or call.answer is not None:
            return  # an earlier call's stream, or a frame of none: decoded for the table, nothing more
        if call.headers is None:
            call.headers = headers
            status = dict(headers).get(b":status")
            if status != b"200":
                # An HTTP answer, not gRPC's: grpc's clients map its status (a 200 without grpc-status is UNKNOWN).
                code = HTTP_STATUS_CODES.get(status or b"", UNKNOWN)
                call.answer = Answer(code, f"Received http2 header with status: {(status or b'').decode('latin-1')}")
                return
            if ends:  # Trailers-Only
                self._finish(call, headers)
        elif not ends:
            raise ProtocolError("trailers without END_STREAM")
        else:
            self._finish(call, headers)

    def _data(self, call: _Call, flags: int, payload: bytes) -> None:
        if call.headers is None:
            raise ProtocolError("DATA before HEADERS")
        call.data += self._unpadded(flags, payload)
        if len(call.data) >= 5:
            length = read_prefix(call.data)[1]
            if length > self.max_message or len(call.data) > 5 + self.max_message:
                self._out += _frame(RST_STREAM, 0, call.stream_id, struct.pack(">I", CANCEL))
                call.answer = Answer(RESOURCE_EXHAUSTED,
                                     f"Received message larger than max ({length} vs. {self.max_message})")
                return
        if flags & END_STREAM:
            call.answer = Answer(INTERNAL, "Server closed the stream without sending trailers")

    def _finish(self, call: _Call, trailers: list[tuple[bytes, bytes]]) -> None:
        fields = dict(trailers)
        details = decode_grpc_message(fields.get(b"grpc-message", b"")).decode("utf-8", "replace")
        metadata = _metadata(trailers)
        code_text = fields.get(b"grpc-status")
        if code_text is None:
            call.answer = Answer(UNKNOWN, "No status received", trailing_metadata=metadata)
            return
        try:
            code = int(code_text)
        except ValueError:
            call.answer = Answer(INTERNAL, "Error parsing 'grpc-status' metadata", trailing_metadata=metadata)
            return
        if code != OK:
            call.answer = Answer(code if 0 < code <= UNAUTHENTICATED else UNKNOWN, details, None, metadata)
            return
        data = bytes(call.data)
        if len(data) < 5:
            call.answer = Answer(INTERNAL, "No message received for a unary call", trailing_metadata=metadata)
            return
        compressed, length = read_prefix(data)
        if compressed or len(data) != 5 + length:
            what = "a compressed message, none asked for" if compressed else "not one whole message"
            call.answer = Answer(INTERNAL, f"Received {what}", trailing_metadata=metadata)
            return
        call.answer = Answer(OK, details, data[5:], metadata)
