"""grpc-go's client side of one unary call: how what the server sends becomes the call's result. Pure, no I/O.

The kubelet's Health/Check is one unary call of grpc-go 1.65 (internal/transport/http2_client.go operateHeaders,
handleData, handleRSTStream; rpc_util.go recvMsg, checkRecvPayload; stream.go). What h2 decoded is fed to a
`UnaryCall`, which decides as grpc-go does, first error wins: the response headers and trailers (HTTP status,
content-type, grpc-status and a percent-decoded grpc-message), the messages in the body (size limit, compression
flag), an RST_STREAM, a broken connection. Its result is the response message or an `RpcError` (a status, or a bare
Go error), which probes/grpc/rules.py turns into the kubelet's output. The message prefix and grpc-message's escapes
are read by probe_api/grpc_wire_rules.py, shared with the daemon.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from probe_api.gostrings import go_quote
from probe_api.grpc_codes import (
    CANCELED, DEADLINE_EXCEEDED, INTERNAL, OK, PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNAUTHENTICATED, UNAVAILABLE,
    UNIMPLEMENTED, UNKNOWN, code_name,
)
from probe_api.grpc_wire_rules import COMPRESSED, PREFIX_BYTES, UNCOMPRESSED, decode_grpc_message, read_prefix
from probe_worker.go_errors import CONTEXT_DEADLINE, GO_STATUS_TEXT, go_parse_int32, http2_error_name

# A real HealthCheckResponse is at most a few bytes; grpc-go's own limit (4 MiB) is far beyond what a probe may
# buffer from a possibly hostile server.
MAX_MESSAGE_BYTES = 16 * 1024

# internal/transport/http_util.go HTTPStatusConvTab; any other status is Unknown.
HTTP_STATUS_TO_CODE = {
    400: INTERNAL, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 404: UNIMPLEMENTED,
    429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: UNAVAILABLE,
}

# grpc-go's http2ErrConvTab: what an RST_STREAM with that HTTP/2 error code becomes.
RST_STREAM_TO_CODE = {
    0: INTERNAL, 1: INTERNAL, 2: INTERNAL, 3: RESOURCE_EXHAUSTED, 4: INTERNAL, 5: INTERNAL,
    6: INTERNAL, 7: UNAVAILABLE, 8: CANCELED, 9: INTERNAL, 10: INTERNAL, 11: RESOURCE_EXHAUSTED,
    12: PERMISSION_DENIED, 13: INTERNAL,
}


@dataclass(frozen=True)
class RpcError:
    """A failed call. `is_status` False is a bare Go error (status.FromError fails)."""

    code: int
    message: str
    is_status: bool = True

    def text(self) -> str:
        """err.Error(): status errors print as `rpc error: code = X desc = Y`."""
        if not self.is_status:
            return self.message
        return f"rpc error: code = {code_name(self.code)} desc = {self.message}"


DEADLINE = RpcError(DEADLINE_EXCEEDED, CONTEXT_DEADLINE)
# grpc-go 1.65 returns io.EOF itself from a unary call that got status OK and no message.
BARE_EOF = RpcError(UNKNOWN, "EOF", is_status=False)


def rst_stream_error(error_code: int, deadline_passed: bool) -> RpcError:
    """http2Client.handleRSTStream."""
    code = RST_STREAM_TO_CODE.get(error_code, UNKNOWN)
    if code == CANCELED and deadline_passed:
        code = DEADLINE_EXCEEDED  # our deadline likely caused the cancellation
    return RpcError(code, f"stream terminated by RST_STREAM with error code: {http2_error_name(error_code)}")


def connection_error(desc: str) -> RpcError:
    """A transport failure mid-call: toRPCErr(ConnectionError) is Unavailable with its desc."""
    return RpcError(UNAVAILABLE, desc)


def _content_subtype_ok(value: bytes) -> bool:
    """grpcutil.ContentSubtype validity: exactly application/grpc, or followed by + or ;."""
    base = b"application/grpc"
    return value == base or (value.startswith(base) and value[len(base) : len(base) + 1] in (b"+", b";"))


@dataclass
class UnaryCall:
    """The client side of one unary call, fed with what h2 decoded.

    `result` stays None while the call is pending; then it holds either the
    response payload (bytes) or an RpcError, decided the way grpc-go decides
    (first error wins, later frames are ignored).
    """

    max_message: int = MAX_MESSAGE_BYTES
    result: bytes | RpcError | None = None
    _body: bytearray = field(default_factory=bytearray)
    _headers_seen: bool = False
    _recv_compress: str = ""

    def on_headers(self, fields: Iterable[tuple[bytes, bytes]], end_stream: bool) -> None:
        """http2Client.operateHeaders, for the response headers and the trailers."""
        if self.result is not None:
            return
        initial = not self._headers_seen
        if not initial and not end_stream:
            self._fail(INTERNAL, "a HEADERS frame cannot appear in the middle of a stream")
            return
        is_grpc = not initial
        content_type_err = "malformed header: missing HTTP content-type"
        http_status: int | None = None
        http_status_err = "malformed header: missing HTTP status" if initial else ""
        raw_code, grpc_message, recv_compress = UNKNOWN, "", ""
        for name, value in fields:
            if name == b"content-type":
                if _content_subtype_ok(value):
                    content_type_err, is_grpc = "", True
                else:
                    content_type_err = f"transport: received unexpected content-type {go_quote(value)}"
            elif name == b"grpc-encoding":
                recv_compress = value.decode("latin-1")
            elif name == b"grpc-status":
                code, err = go_parse_int32(value.decode("latin-1"))
                if code is None:
                    self._fail(INTERNAL, f"transport: malformed grpc-status: {err}")
                    return
                raw_code = code & 0xFFFFFFFF  # codes.Code(uint32(code))
            elif name == b"grpc-message":
                # Go keeps the raw bytes; probe outputs travel in proto strings, which must be UTF-8.
                grpc_message = decode_grpc_message(value).decode("utf-8", "replace")
            elif name == b":status":
                if value == b"200":
                    http_status, http_status_err = 200, ""
                    continue
                status, err = go_parse_int32(value.decode("latin-1"))
                if status is None:
                    self._fail(INTERNAL, f"transport: malformed http-status: {err}")
                    return
                http_status = status
                http_status_err = (
                    f"unexpected HTTP status code received from server: {status} ({GO_STATUS_TEXT.get(status, '')})"
                )
        if not is_grpc or http_status_err:
            code = INTERNAL if http_status is None else HTTP_STATUS_TO_CODE.get(http_status, UNKNOWN)
            self._fail(code, "; ".join(e for e in (http_status_err, content_type_err) if e))
            return
        if initial:
            self._headers_seen = True
            self._recv_compress = recv_compress
        if end_stream:
            self._finish(RpcError(raw_code, grpc_message) if raw_code != OK else None)

    def on_data(self, data: bytes, end_stream: bool) -> None:
        if self.result is not None:
            return
        self._body += data
        # grpc-go rejects an oversized message as soon as its length prefix arrives.
        early = _oversized(bytes(self._body), self.max_message)
        if early is not None:
            self.result = early
        elif end_stream:
            # handleData closes the stream with this status; the body is still read first.
            self._finish(RpcError(INTERNAL, "server closed the stream without sending trailers"))

    def on_reset(self, error_code: int, deadline_passed: bool) -> None:
        if self.result is None:
            self.result = rst_stream_error(error_code, deadline_passed)

    def on_error(self, error: RpcError) -> None:
        if self.result is None:
            self.result = error

    def _fail(self, code: int, message: str) -> None:
        self.result = RpcError(code, message)

    def _finish(self, status: RpcError | None) -> None:
        """csAttempt.recvMsg for a unary call: one message, then EOF."""
        first, rest, err = _next_message(bytes(self._body), self.max_message, self._recv_compress)
        if err is not None:
            self.result = err
        elif first is None:
            self.result = status or BARE_EOF
        else:
            second, _, err = _next_message(rest, self.max_message, self._recv_compress)
            if err is not None:
                self.result = err
            elif second is not None:
                self.result = RpcError(UNKNOWN, "grpc: client streaming protocol violation: get <nil>, want <EOF>")
            else:
                self.result = status or first


def _oversized(body: bytes, max_message: int) -> RpcError | None:
    offset = 0
    while len(body) - offset >= PREFIX_BYTES:
        _, length = read_prefix(body, offset)
        if length > max_message:
            return RpcError(RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({length} vs. {max_message})")
        offset += PREFIX_BYTES + length
    return None


def _next_message(body: bytes, max_message: int, recv_compress: str) -> tuple[bytes | None, bytes, RpcError | None]:
    """parser.recvMsg + checkRecvPayload on a complete body: (payload, rest, error); payload None at EOF."""
    if not body:
        return None, b"", None
    if len(body) < PREFIX_BYTES:
        return None, b"", RpcError(INTERNAL, "unexpected EOF")
    flag, length = read_prefix(body)
    if length > max_message:
        return None, b"", RpcError(RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({length} vs. {max_message})")
    end = PREFIX_BYTES + length
    if len(body) < end:
        return None, b"", RpcError(INTERNAL, "unexpected EOF")
    if flag == COMPRESSED:
        if recv_compress in ("", "identity"):
            return None, b"", RpcError(INTERNAL, "grpc: compressed flag set with identity or empty encoding")
        # The kubelet registers no decompressor, and we advertise none.
        return None, b"", RpcError(UNIMPLEMENTED, f"grpc: Decompressor is not installed for grpc-encoding {go_quote(recv_compress)}")
    if flag != UNCOMPRESSED:
        return None, b"", RpcError(INTERNAL, f"grpc: received unexpected payload format {flag}")
    return body[PREFIX_BYTES:end], body[end:], None

