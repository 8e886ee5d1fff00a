"""One HTTP probe request over HTTP/2: stream 1 of a new connection, which carries nothing else.

The same interface as the HTTP/1.1 exchange (probes/http/h1_exchange.py) (send_request, wait_first_byte, read_head, read_body,
complete, settle), so that an attempt (redirects, outcome, trace) does not care which version carried it. What
Go's client decides is probe_worker.probes.http.h2_rules'; this module moves frames. Frames are parsed by hyperframe and
header blocks coded by hpack, as for gRPC probes (probe_worker/probes/grpc/wire.py): a one-stream client needs none of
h2's connection machinery. Frames are split here: a frame's length is judged from its header, before its payload
is waited for, as Go's framer does (h2's FrameBuffer would buffer a whole oversized frame first).

Bounded against a hostile server: frames of at most 16 KiB (Go's limit too), a header list of at most
MAX_HEAD_BYTES (advertised in our SETTINGS; Go advertises 10 MiB), the body read only as far as the prober reads
it, and everything within the attempt's deadline (the caller's).
"""

from __future__ import annotations

import h2.settings
import hpack
import hpack.exceptions
import hyperframe.exceptions
import hyperframe.frame as frames

from probe_worker.probes.http import h2_rules as rules
from probe_worker.probes.http.request import ProbeRequest, Transport
from probe_worker.probes.http.response import MAX_HEAD_BYTES, ResponseHead
from probe_worker.tls_stream import RECV_SIZE, Stream, StreamError

STREAM_ID = rules.STREAM_ID
MAX_FRAME = 16384
Codes = h2.settings.SettingCodes


def _serialize(*parts: frames.Frame) -> bytes:
    return b"".join(part.serialize() for part in parts)


def _opening() -> bytes:
    """The preface, then the client's SETTINGS and connection window as Go's transport sends them (but the header
    list limit: ours), all written before the request without waiting for the server."""
    settings = frames.SettingsFrame(0)
    settings.settings = {Codes.ENABLE_PUSH: 0, Codes.INITIAL_WINDOW_SIZE: 4 << 20, Codes.MAX_FRAME_SIZE: MAX_FRAME,
                         Codes.MAX_HEADER_LIST_SIZE: MAX_HEAD_BYTES}
    return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _serialize(
        settings, frames.WindowUpdateFrame(0, window_increment=1 << 30))


OPENING = _opening()
SETTINGS_ACK = _serialize(frames.SettingsFrame(0, flags=["ACK"]))


class RetryOnNewConnection(Exception):
    """The server refused the stream before answering (REFUSED_STREAM, or a graceful GOAWAY that did not spare it):
    Go's client sends the request again on a new connection. str() says why."""


def request_frames(fields: list[tuple[str, str]]) -> bytes:
    """HEADERS (+ CONTINUATION) opening stream 1 and ending it: a GET has no body."""
    block = hpack.Encoder().encode([(n.encode(), v.encode("utf-8", "surrogateescape")) for n, v in fields])
    pieces = [block[i:i + MAX_FRAME] for i in range(0, len(block), MAX_FRAME)] or [b""]
    parts: list[frames.Frame] = [frames.HeadersFrame(STREAM_ID, data=pieces[0], flags=["END_STREAM"])]
    parts += [frames.ContinuationFrame(STREAM_ID, data=piece) for piece in pieces[1:]]
    parts[-1].flags.add("END_HEADERS")
    return _serialize(*parts)


class H2Exchange:
    """The client side of a single-use HTTP/2 connection carrying one GET."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.eof = False  # the exchange interface's; never read for HTTP/2 (only a reused connection's is)
        self.complete = False  # a single-use connection is never left for another request
        self._buffer = bytearray()      # received, not yet a whole frame
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._block_ends_stream = False
        self._failed = False            # nothing more is read from the connection
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEAD_BYTES
        self._settings_seen = False
        self._stream_heard = False      # a header block of our stream came (the response has started)
        self._out: list[bytes] = []
        self._head: ResponseHead | None = None
        self._body = bytearray()        # DATA received and not handed to the reader yet
        self._body_total = 0            # DATA received on the stream
        self._ended = False             # END_STREAM received
        self._error: str | None = None  # why the stream cannot go on (after its buffered body, for the reader)
        self._retry: str | None = None
        self._goaway: tuple[int, int, bytes] | None = None  # last stream id, code, debug data

    # --- the request ----------------------------------------------------------------------------------------

    async def send_request(self, prepared) -> None:
        fields = request_fields(prepared.request, prepared.transport)
        await self.stream.send(OPENING + request_frames(fields))

    # --- the response ---------------------------------------------------------------------------------------

    async def wait_first_byte(self) -> None:
        """Until the response starts (a header block on the stream) or the stream cannot go on: the server's
        SETTINGS and other connection frames come first and are not the response."""
        while not self._stream_heard and self._error is None and self._retry is None:
            await self._receive()

    async def read_head(self) -> ResponseHead:
        while self._head is None:
            if self._retry is not None:
                raise RetryOnNewConnection(self._retry)
            if self._error is not None:
                raise StreamError(self._error)
            await self._receive()
        return self._head

    async def read_body(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body, as Go's body reader under ReadAtMost hands them over: buffered data
        first, then the stream's error, if the reader gets that far."""
        body = bytearray()
        while len(body) < limit:
            if self._body:
                take = limit - len(body)
                body += self._body[:take]
                del self._body[:take]
                continue
            declared = self._head.content_length if self._head is not None else None
            if declared is not None and self._body_total > declared and declared < limit:
                raise StreamError(rules.MORE_THAN_DECLARED)
            if self._ended:
                if declared is not None and self._body_total < declared:
                    raise StreamError(rules.UNEXPECTED_EOF)
                break
            if self._error is not None:
                raise StreamError(self._error)
            await self._receive()
        return bytes(body)

    def settle(self) -> None:
        """Nothing to settle: the connection is not reused."""

    # --- frames ---------------------------------------------------------------------------------------------

    async def _receive(self) -> None:
        try:
            data = await self.stream.recv(RECV_SIZE)
        except StreamError as exc:
            self._connection_ended(str(exc))
            return
        if not data:
            self.eof = True
            self._connection_ended(rules.UNEXPECTED_EOF)
            return
        self._buffer += data
        try:
            self._split_frames()
        except hpack.exceptions.OversizedHeaderListError:
            self._fail_stream(rules.stream_error(rules.PROTOCOL_ERROR, rules.HEADER_LIST_TOO_LARGE))
        except hpack.exceptions.HPACKError:
            self._fail(rules.connection_error(rules.COMPRESSION_ERROR))
        except (hyperframe.exceptions.HyperframeError, _ConnectionError):
            self._fail(rules.connection_error(rules.PROTOCOL_ERROR))
        if self._out:
            data, self._out = b"".join(self._out), []
            try:
                await self.stream.send(data)
            except StreamError:
                pass  # the server is gone: the next read says so

    def _split_frames(self) -> None:
        buffer = self._buffer
        while not self._failed and len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if length > MAX_FRAME:
                self._fail(rules.frame_too_large(bytes(buffer[:9])))
                return
            if len(buffer) < 9 + length:
                return
            frame, _ = frames.Frame.parse_frame_header(memoryview(buffer[:9]))
            frame.parse_body(memoryview(buffer[9:9 + length]))
            del buffer[:9 + length]
            self._on_frame(frame)

    def _connection_ended(self, error: str) -> None:
        """The read loop ended (EOF or a read error): after a GOAWAY that spared the stream, Go says GoAwayError."""
        if self._goaway is not None and (error == rules.UNEXPECTED_EOF or error.startswith("read ")):
            error = rules.goaway_error(*self._goaway)
        self._fail(error)

    def _fail(self, error: str) -> None:
        """The connection failed: its stream with it, unless that had ended."""
        if self._error is None and self._retry is None and not self._ended:
            self._error = error
        self._failed = True
        self._buffer.clear()

    def _fail_stream(self, error: str) -> None:
        if self._error is None and self._retry is None and not self._ended:
            self._error = error

    def _on_frame(self, frame: frames.Frame) -> None:
        if self._block is not None:  # a header block goes on in CONTINUATION frames, and nothing else
            if not isinstance(frame, frames.ContinuationFrame) or frame.stream_id != STREAM_ID:
                raise _ConnectionError()
            self._block += frame.data
            if len(self._block) > 2 * MAX_HEAD_BYTES:
                raise _ConnectionError()  # Go: a fragment far past the allowance is a connection error
            if "END_HEADERS" in frame.flags:
                block, self._block = bytes(self._block), None
                self._on_header_block(block, self._block_ends_stream)
            return
        if not self._settings_seen:
            if not isinstance(frame, frames.SettingsFrame) or "ACK" in frame.flags:
                raise _ConnectionError()
            self._settings_seen = True
        if isinstance(frame, frames.SettingsFrame):
            if "ACK" not in frame.flags:
                self._out.append(SETTINGS_ACK)
        elif isinstance(frame, frames.PingFrame):
            if "ACK" not in frame.flags:
                self._out.append(frames.PingFrame(0, flags=["ACK"], opaque_data=frame.opaque_data).serialize())
        elif isinstance(frame, frames.GoAwayFrame):
            self._on_goaway(frame)
        elif isinstance(frame, frames.PushPromiseFrame):
            raise _ConnectionError()  # our SETTINGS disabled push
        elif isinstance(frame, frames.HeadersFrame):
            if frame.stream_id != STREAM_ID:
                raise _ConnectionError()  # a stream the client never opened
            if "END_HEADERS" in frame.flags:
                self._on_header_block(frame.data, "END_STREAM" in frame.flags)
            else:
                self._block, self._block_ends_stream = bytearray(frame.data), "END_STREAM" in frame.flags
        elif isinstance(frame, frames.ContinuationFrame):
            raise _ConnectionError()  # no header block is open
        elif isinstance(frame, frames.DataFrame):
            if frame.stream_id != STREAM_ID:
                raise _ConnectionError()
            self._on_data(frame.data, end_stream="END_STREAM" in frame.flags)
        elif isinstance(frame, frames.RstStreamFrame) and frame.stream_id == STREAM_ID:
            self._on_reset(frame.error_code)

    def _on_goaway(self, frame: frames.GoAwayFrame) -> None:
        # The first GOAWAY's debug data stays, and an error code stays over a later NO_ERROR.
        code = frame.error_code
        debug = frame.additional_data
        if self._goaway is not None:
            code = self._goaway[1] if self._goaway[1] != rules.NO_ERROR else code
            debug = self._goaway[2]
        self._goaway = (frame.last_stream_id, code, debug)
        if frame.last_stream_id < STREAM_ID and not self._ended and self._error is None:
            if not rules.retried(goaway_code=frame.error_code):
                self._error = rules.goaway_refused(frame.error_code)
            elif self._head is None:
                self._retry = rules.GRACEFUL_GOAWAY
            else:  # too late to send it again: the body reader gets the error
                self._error = rules.GRACEFUL_GOAWAY

    def _on_header_block(self, block: bytes, end_stream: bool) -> None:
        fields = self._decoder.decode(block, raw=True)  # decoded whatever the stream's state: one hpack table
        self._on_headers(fields, end_stream)

    def _on_headers(self, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        self._stream_heard = True
        if self._ended or self._error is not None or self._retry is not None:
            return
        if self._head is not None:  # trailers: they must end the stream
            if not end_stream:
                raise _ConnectionError()
            self._ended = True
            return
        cause = rules.header_block_error(fields)
        status = rules.response_status(fields) if cause is None else cause
        if isinstance(status, str):
            self._fail_stream(rules.stream_error(rules.PROTOCOL_ERROR, status))
        elif rules.is_informational(status):
            if end_stream:
                self._fail_stream(rules.stream_error(rules.PROTOCOL_ERROR, rules.INFORMATIONAL_END_STREAM))
        else:
            self._head = rules.response_head(status, fields, end_stream)
            self._ended = end_stream

    def _on_data(self, data: bytes, end_stream: bool) -> None:
        if self._ended or self._error is not None or self._retry is not None:
            return
        if self._head is None:
            self._fail_stream(rules.stream_error(rules.PROTOCOL_ERROR))
            return
        self._body_total += len(data)
        # Kept only as far as any reader goes (the prober reads at most a few KiB; the rest is counted).
        room = MAX_HEAD_BYTES - len(self._body)
        if room > 0:
            self._body += data[:room]
        self._ended = end_stream

    def _on_reset(self, code: int) -> None:
        if self._ended or self._error is not None or self._retry is not None:
            return
        if self._head is None and rules.retried(reset_code=code):
            self._retry = rules.stream_error(code, rules.FROM_PEER)
        else:
            self._error = rules.stream_error(code, rules.FROM_PEER)


class _ConnectionError(Exception):
    """A frame that breaks the connection (Go: ConnectionError(PROTOCOL_ERROR))."""


def request_fields(request: ProbeRequest, transport: Transport) -> list[tuple[str, str]]:
    """rules.request_fields, or the StreamError carrying the error Go's RoundTrip returns."""
    fields = rules.request_fields(request, transport)
    if isinstance(fields, str):
        raise StreamError(fields)
    return fields
