"""The HTTP/2 side of one gRPC health check connection, without I/O.

A probe connection carries exactly one call, on stream 1, in grpc-go's order:
our preface and SETTINGS; the server's SETTINGS make the transport ready; then
the SETTINGS ack, HEADERS and DATA go out together (as far as the server's
stream quota and flow-control windows allow, as grpc-go's loopy writer does);
the answer comes back; a GOAWAY closes. `Request` holds what never changes for
a given target, user agent and service (frames by hyperframe, the header block
by hpack from an empty table, as every new connection's is): only grpc-timeout
is encoded per call. `Connection` turns the server's bytes into input for
unary_call.UnaryCall: frames split by h2's FrameBuffer (lengths judged early),
header blocks decoded by hpack, SETTINGS values checked by h2.settings.

h2's H2Connection did all of this before, but for a one-call connection its
general machinery (connection and stream state machines, encoding the same
headers again for every call, a repr() of every received frame for a debug log
even when nothing logs) was half of a gRPC probe's CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h2.errors
import h2.exceptions
import h2.frame_buffer
import h2.settings
import hpack
import hpack.exceptions
import hyperframe.exceptions
import hyperframe.frame as frames

from probe_api import grpc_codes as codes
from probe_api.grpc_wire_rules import encode_timeout
from probe_worker.go_errors import http2_error_name
from probe_worker.probes.grpc import rules, unary_call

STREAM_ID = 1
Codes = h2.settings.SettingCodes
# Our SETTINGS, as h2 sent them for us: no server push, a bounded header list.
LOCAL_SETTINGS = {
    Codes.HEADER_TABLE_SIZE: 4096,
    Codes.ENABLE_PUSH: 0,
    Codes.INITIAL_WINDOW_SIZE: 65535,
    Codes.MAX_FRAME_SIZE: 16384,
    Codes.ENABLE_CONNECT_PROTOCOL: 0,
    Codes.MAX_HEADER_LIST_SIZE: rules.MAX_HEADER_LIST_BYTES,
}
# RFC 9113 defaults: the server's values until its SETTINGS say otherwise.
DEFAULT_TABLE_SIZE = 4096
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1

# golang.org/x/net/http2 frame types, for grpc-go's "%T" of an unexpected first frame
# (grpc-go's framer decodes header blocks: its headers arrive as MetaHeadersFrame).
GO_FRAME_TYPES = {
    frames.DataFrame: "*http2.DataFrame", frames.HeadersFrame: "*http2.MetaHeadersFrame",
    frames.PriorityFrame: "*http2.PriorityFrame", frames.RstStreamFrame: "*http2.RSTStreamFrame",
    frames.SettingsFrame: "*http2.SettingsFrame", frames.PushPromiseFrame: "*http2.PushPromiseFrame",
    frames.PingFrame: "*http2.PingFrame", frames.GoAwayFrame: "*http2.GoAwayFrame",
    frames.WindowUpdateFrame: "*http2.WindowUpdateFrame", frames.ContinuationFrame: "*http2.ContinuationFrame",
}


def _serialize(*parts: frames.Frame) -> bytes:
    return b"".join(part.serialize() for part in parts)


def _settings(values: dict[int, int]) -> frames.SettingsFrame:
    frame = frames.SettingsFrame(0)
    frame.settings = dict(values)
    return frame


OPENING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _serialize(_settings(LOCAL_SETTINGS))
SETTINGS_ACK = _serialize(frames.SettingsFrame(0, flags=["ACK"]))
# What grpc-go's client sends when it closes its transport.
GOAWAY = _serialize(frames.GoAwayFrame(0, last_stream_id=0, error_code=0,
                                       additional_data=b"client transport shutdown"))
# Only ever used for never-indexed literals, which leave its table untouched: shared safely.
_LITERALS = hpack.Encoder()
# Only used to check the server's values (a stateless method): shared safely.
_PEER_SETTINGS = h2.settings.Settings(client=False)


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def _data_frames(body: bytes, max_frame: int, end_stream: bool) -> bytes:
    parts = [frames.DataFrame(STREAM_ID, data=chunk) for chunk in _split(body, max_frame)]
    if end_stream:
        parts[-1].flags.add("END_STREAM")
    return _serialize(*parts)


@dataclass(frozen=True)
class Request:
    """What every connection sends for one Check call, but for the grpc-timeout value."""

    fixed_headers: tuple[tuple[str, str], ...]
    header_block: bytes    # hpack block of fixed_headers, encoded from an empty table
    message: bytes         # the length-prefixed HealthCheckRequest
    data: bytes            # the message as DATA frames with END_STREAM, when the windows take it whole

    @classmethod
    def build(cls, authority: str, kube_agent: str, service: str, tls: bool = False) -> "Request":
        fixed = tuple(rules.fixed_request_headers(authority, kube_agent, tls))
        message = rules.check_request(service)
        return cls(fixed_headers=fixed, header_block=hpack.Encoder().encode(fixed), message=message,
                   data=_data_frames(message, DEFAULT_MAX_FRAME, end_stream=True))

    def headers(self, remaining_ns: int, table_size: int, max_frame: int) -> bytes:
        """HEADERS (+ CONTINUATION) frames opening the stream.

        grpc-timeout changes with every call: a never-indexed literal, so that the
        cached block stays valid. A server that changed its hpack table size gets a
        block encoded for that size, which starts with the size update it expects.
        """
        timeout = ("grpc-timeout", encode_timeout(remaining_ns), True)
        if table_size == DEFAULT_TABLE_SIZE:
            block = self.header_block + _LITERALS.encode([timeout])
        else:
            encoder = hpack.Encoder()
            encoder.header_table_size = table_size
            block = encoder.encode([*self.fixed_headers, timeout])
        pieces = _split(block, max_frame)
        parts: list[frames.Frame] = [frames.HeadersFrame(STREAM_ID, data=pieces[0])]
        parts += [frames.ContinuationFrame(STREAM_ID, data=piece) for piece in pieces[1:]]
        parts[-1].flags.add("END_HEADERS")
        return _serialize(*parts)


class ConnectionFailed(Exception):
    """The connection cannot carry the call any more; `error` is what grpc-go reports."""

    def __init__(self, error: unary_call.RpcError) -> None:
        super().__init__(error.message)
        self.error = error


def protocol_error(code: int) -> unary_call.RpcError:
    """A connection error found while reading (golang.org/x/net/http2 ConnectionError text)."""
    return unary_call.connection_error(f"error reading from server: connection error: {http2_error_name(code)}")


_MALFORMED = (h2.exceptions.H2Error, hyperframe.exceptions.HyperframeError)


class EagerFrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's FrameBuffer, which judges a frame's length only once the whole frame is buffered (up to 16 MiB from a
    hostile server): here the header alone decides, as Go's framer does, before any payload is waited for."""

    def __next__(self) -> frames.Frame:
        header = self._data[:3]  # h2 4.x keeps the unparsed bytes here (tests/unit/test_grpc_probe_wire.py pins it)
        if len(header) == 3 and int.from_bytes(header, "big") > self.max_frame_size:
            raise h2.exceptions.FrameTooLargeError(
                f"Received overlong frame: length {int.from_bytes(header, 'big')}, max {self.max_frame_size}")
        return super().__next__()


@dataclass
class Connection:
    """The client side of a one-call connection after our OPENING went out.

    `ready` once the server's first frame, a SETTINGS frame, arrived: grpc-go's
    transport is ready then, and failures before it fail the connection attempt.
    `data_to_send()` gives what is to be written next, in order.
    """

    request: Request
    call: unary_call.UnaryCall = field(default_factory=unary_call.UnaryCall)
    ready: bool = False
    _out: list[bytes] = field(default_factory=list)
    _stream_queued: bool = False      # HEADERS are in _out or sent
    _stream_sent: bool = False        # ... and sent: the server's frames for the stream count
    _unsent: bytes | None = None      # request body the windows held back; None once END_STREAM is out
    _quota: int | None = None         # the server's SETTINGS_MAX_CONCURRENT_STREAMS (None: unlimited)
    _table_size: int = DEFAULT_TABLE_SIZE
    _max_frame: int = DEFAULT_MAX_FRAME
    _initial_window: int = DEFAULT_WINDOW
    _connection_window: int = DEFAULT_WINDOW
    _stream_window: int = DEFAULT_WINDOW
    _response_started: bool = False   # a final (non-1xx) HEADERS block arrived on our stream
    _frames: h2.frame_buffer.FrameBuffer = field(default_factory=EagerFrameBuffer)
    _decoder: hpack.Decoder = field(default_factory=hpack.Decoder)

    def __post_init__(self) -> None:
        self._frames.max_frame_size = LOCAL_SETTINGS[Codes.MAX_FRAME_SIZE]
        self._decoder.max_header_list_size = rules.MAX_HEADER_LIST_BYTES

    def receive(self, data: bytes, remaining_ns: int) -> None:
        """Reads whatever complete frames `data` finishes; stops once the call has a result.

        `remaining_ns` is what is left of the probe deadline (the call's grpc-timeout
        if the stream opens now). Raises ConnectionFailed for bytes that break the connection.
        """
        try:
            self._frames.add_data(data)
            for frame in self._frames:
                self._on_frame(frame, remaining_ns)
                if self.call.result is not None:
                    return
        except hpack.exceptions.OversizedHeaderListError:
            raise ConnectionFailed(unary_call.RpcError(codes.INTERNAL, "peer header list size exceeded limit")) from None
        except hpack.exceptions.HPACKError:
            raise ConnectionFailed(protocol_error(h2.errors.ErrorCodes.COMPRESSION_ERROR)) from None
        except _MALFORMED as exc:
            raise ConnectionFailed(protocol_error(int(getattr(exc, "error_code", 1)))) from None

    def data_to_send(self) -> bytes:
        data, self._out = b"".join(self._out), []
        self._stream_sent = self._stream_queued
        return data

    def _on_frame(self, frame: frames.Frame, remaining_ns: int) -> None:
        if not self.ready:
            if not isinstance(frame, frames.SettingsFrame):
                name = GO_FRAME_TYPES.get(type(frame), "*http2.UnknownFrame")
                raise ConnectionFailed(unary_call.connection_error(
                    f"initial http2 frame from server is not a settings frame: {name}"))
            self.ready = True
        if isinstance(frame, frames.SettingsFrame):
            if "ACK" not in frame.flags:
                self._on_settings(frame.settings)
                self._out.append(SETTINGS_ACK)
                self._open_stream(remaining_ns)
        elif isinstance(frame, frames.PingFrame):
            if "ACK" not in frame.flags:
                self._out.append(frames.PingFrame(0, flags=["ACK"], opaque_data=frame.opaque_data).serialize())
        elif isinstance(frame, frames.WindowUpdateFrame):
            self._on_window_update(frame.stream_id, frame.window_increment)
        elif isinstance(frame, frames.GoAwayFrame):
            # As with h2 before, which read nothing after a GOAWAY: an open call cannot finish.
            self.call.on_error(unary_call.connection_error("the connection is draining"))
        elif isinstance(frame, frames.PushPromiseFrame):
            raise ConnectionFailed(protocol_error(h2.errors.ErrorCodes.PROTOCOL_ERROR))  # our SETTINGS disabled push
        elif isinstance(frame, frames.HeadersFrame):
            # Every header block is decoded, whatever its stream: they share the hpack table.
            fields = self._decoder.decode(frame.data, raw=True)
            if frame.stream_id == STREAM_ID and self._stream_sent:
                self._on_headers(fields, end_stream="END_STREAM" in frame.flags)
        elif frame.stream_id != STREAM_ID or not self._stream_sent:
            return  # grpc-go ignores frames for streams it does not have
        elif isinstance(frame, frames.DataFrame):
            self.call.on_data(frame.data, end_stream="END_STREAM" in frame.flags)
        elif isinstance(frame, frames.RstStreamFrame):
            self.call.on_reset(frame.error_code, deadline_passed=remaining_ns <= 0)

    def _on_settings(self, values: dict[int, int]) -> None:
        for setting, value in values.items():
            _PEER_SETTINGS.validate_received_setting(setting, value)
        self._quota = values.get(Codes.MAX_CONCURRENT_STREAMS, self._quota)
        self._table_size = values.get(Codes.HEADER_TABLE_SIZE, self._table_size)
        self._max_frame = values.get(Codes.MAX_FRAME_SIZE, self._max_frame)
        window = values.get(Codes.INITIAL_WINDOW_SIZE)
        if window is not None:
            # RFC 9113 §6.9.2: the change applies to the open stream's window too.
            self._stream_window += window - self._initial_window
            self._initial_window = window
            if self._stream_window > MAX_WINDOW:
                raise ConnectionFailed(protocol_error(h2.errors.ErrorCodes.FLOW_CONTROL_ERROR))
            self._send_body()

    def _on_window_update(self, stream_id: int, increment: int) -> None:
        """Windows beyond 2^31-1 are errors, as h2 judged them: of the connection, or of our stream."""
        if stream_id == 0:
            self._connection_window += increment
            if self._connection_window > MAX_WINDOW:
                raise ConnectionFailed(protocol_error(h2.errors.ErrorCodes.FLOW_CONTROL_ERROR))
        elif stream_id == STREAM_ID and self._stream_sent:
            self._stream_window += increment
            if self._stream_window > MAX_WINDOW:
                self.call.on_reset(h2.errors.ErrorCodes.FLOW_CONTROL_ERROR, deadline_passed=False)
                return
        self._send_body()

    def _open_stream(self, remaining_ns: int) -> None:
        """grpc-go opens the stream once the transport is ready and its stream quota allows."""
        if self._stream_queued or self._quota == 0:
            return
        self._stream_queued = True
        self._out.append(self.request.headers(remaining_ns, self._table_size, self._max_frame))
        self._unsent = self.request.message
        self._send_body()

    def _send_body(self) -> None:
        """DATA as far as both flow-control windows allow; END_STREAM with the last of it."""
        body = self._unsent
        if not self._stream_queued or body is None:
            return
        room = min(self._connection_window, self._stream_window)
        if len(body) <= room:
            whole = len(body) == len(self.request.message)
            # The common case, the whole message at once: its frames are built once per request.
            self._out.append(self.request.data if whole else _data_frames(body, self._max_frame, end_stream=True))
            sent = len(body)
        elif room <= 0:
            return  # wait for a WINDOW_UPDATE
        else:
            sent = room
            self._out.append(_data_frames(body[:sent], self._max_frame, end_stream=False))
        self._connection_window -= sent
        self._stream_window -= sent
        self._unsent = body[sent:] if sent < len(body) else None

    def _on_headers(self, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        if not self._response_started and _is_informational(fields):
            if end_stream:  # as h2 judged it: a 1xx response cannot end the stream
                raise ConnectionFailed(protocol_error(h2.errors.ErrorCodes.PROTOCOL_ERROR))
            return  # a 1xx before the real response, skipped
        self._response_started = True
        self.call.on_headers(fields, end_stream=end_stream)



def _is_informational(fields: list[tuple[bytes, bytes]]) -> bool:
    """The block's :status is 1xx (h2's reading: pseudo-headers come first)."""
    for name, value in fields:
        if not name.startswith(b":"):
            return False
        if name == b":status":
            return value.startswith(b"1")
    return False
