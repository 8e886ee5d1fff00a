"""What the kubelet's gRPC health probe decides, as pure functions (no I/O).

The kubelet (pkg/probe/grpc, 1.32) is a grpc-go 1.65 client: grpc.DialContext
with WithBlock, then one unary Health/Check. Its probe output embeds grpc-go's
status texts, so this module reproduces the grpc-go behaviour that reaches the
output: the status code names, how response headers, trailers, RST_STREAM and
the response body turn into a status (internal/transport/http2_client.go,
rpc_util.go, stream.go), the grpc-timeout encoding, grpc-message
percent-decoding, the connection backoff (backoff/backoff.go,
internal/backoff) and finally the kubelet's own output strings.
probe_worker/probes/grpc/executor.py feeds it bytes from h2 and applies its decisions.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from cri_proto import grpc_health_pb2 as health_pb
from probe_api.gostrings import go_duration, go_quote
from probe_api.grpc_codes import (
    CANCELED, DEADLINE_EXCEEDED, INTERNAL, OK, PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNAUTHENTICATED, UNAVAILABLE,
    UNIMPLEMENTED, UNKNOWN, code_name, serving_status_of,
)
from probe_worker.attempt import FAILURE, SUCCESS, Outcome

# google.golang.org/grpc version in kubelet 1.32's go.mod; grpc-go appends
# "grpc-go/<version>" to every user agent, so servers see the pair.
GRPC_GO_VERSION = "1.65.0"

HEALTH_SERVICE = "grpc.health.v1.Health"
CHECK_PATH = f"/{HEALTH_SERVICE}/Check"

# Bounds of one probe attempt against a possibly hostile server. A real
# HealthCheckResponse is at most a few bytes; grpc-go's own limits (4 MiB
# messages, 16 MiB header lists) are far beyond what a probe may buffer.
MAX_MESSAGE_BYTES = 16 * 1024
MAX_HEADER_LIST_BYTES = 16 * 1024
MAX_READ_BYTES = 64 * 1024

# internal/transport/http_util.go HTTPStatusConvTab; any other status is Unknown.
HTTP_STATUS_TO_CODE = {
    400: INTERNAL, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 404: UNIMPLEMENTED,
    429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: UNAVAILABLE,
}

# HTTP/2 error codes: golang.org/x/net/http2 ErrCode.String() and grpc-go's
# http2ErrConvTab (what an RST_STREAM with that code becomes).
HTTP2_ERROR_NAMES = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
    "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
    "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)
RST_STREAM_TO_CODE = {
    0: INTERNAL, 1: INTERNAL, 2: INTERNAL, 3: RESOURCE_EXHAUSTED, 4: INTERNAL, 5: INTERNAL,
    6: INTERNAL, 7: UNAVAILABLE, 8: CANCELED, 9: INTERNAL, 10: INTERNAL, 11: RESOURCE_EXHAUSTED,
    12: PERMISSION_DENIED, 13: INTERNAL,
}

# Go net/http StatusText (it differs from Python's http.HTTPStatus phrases in places).
GO_STATUS_TEXT = {
    100: "Continue", 101: "Switching Protocols", 102: "Processing", 103: "Early Hints",
    200: "OK", 201: "Created", 202: "Accepted", 203: "Non-Authoritative Information",
    204: "No Content", 205: "Reset Content", 206: "Partial Content", 207: "Multi-Status",
    208: "Already Reported", 226: "IM Used",
    300: "Multiple Choices", 301: "Moved Permanently", 302: "Found", 303: "See Other",
    304: "Not Modified", 305: "Use Proxy", 307: "Temporary Redirect", 308: "Permanent Redirect",
    400: "Bad Request", 401: "Unauthorized", 402: "Payment Required", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
    407: "Proxy Authentication Required", 408: "Request Timeout", 409: "Conflict", 410: "Gone",
    411: "Length Required", 412: "Precondition Failed", 413: "Request Entity Too Large",
    414: "Request URI Too Long", 415: "Unsupported Media Type",
    416: "Requested Range Not Satisfiable", 417: "Expectation Failed", 418: "I'm a teapot",
    421: "Misdirected Request", 422: "Unprocessable Entity", 423: "Locked",
    424: "Failed Dependency", 425: "Too Early", 426: "Upgrade Required",
    428: "Precondition Required", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 451: "Unavailable For Legal Reasons",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported",
    506: "Variant Also Negotiates", 507: "Insufficient Storage", 508: "Loop Detected",
    510: "Not Extended", 511: "Network Authentication Required",
}

# Connection backoff (grpc-go backoff.DefaultConfig) and minConnectTimeout.
BACKOFF_BASE_S = 1.0
BACKOFF_MULTIPLIER = 1.6
BACKOFF_JITTER = 0.2
BACKOFF_MAX_S = 120.0
MIN_CONNECT_TIMEOUT_S = 20.0


# ---------------------------------------------------------------- statuses


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


DEADLINE = RpcError(DEADLINE_EXCEEDED, "context deadline exceeded")
# grpc-go 1.65 returns io.EOF itself from a unary call that got status OK and no message.
BARE_EOF = RpcError(UNKNOWN, "EOF", is_status=False)


def http2_error_name(code: int) -> str:
    if 0 <= code < len(HTTP2_ERROR_NAMES):
        return HTTP2_ERROR_NAMES[code]
    return f"unknown error code 0x{code:x}"


def rst_stream_error(error_code: int, deadline_passed: bool) -> RpcError:
    """http2Client.handleRSTStream."""
    code = RST_STREAM_TO_CODE.get(error_code, UNKNOWN)
    if code == CANCELED and deadline_passed:
        code = DEADLINE_EXCEEDED  # our deadline likely caused the cancellation
    return RpcError(code, f"stream terminated by RST_STREAM with error code: {http2_error_name(error_code)}")


def connection_error(desc: str) -> RpcError:
    """A transport failure mid-call: toRPCErr(ConnectionError) is Unavailable with its desc."""
    return RpcError(UNAVAILABLE, desc)


def read_error_desc(local: str, remote: str, reason: str) -> str:
    """`error reading from server: read tcp L->R: read: connection reset by peer` (net.OpError)."""
    return f"error reading from server: read tcp {local}->{remote}: read: {reason}"


# ---------------------------------------------------------------- Go string helpers





def go_parse_int32(text: str) -> tuple[int | None, str]:
    """strconv.ParseInt(text, 10, 32): (value, "") or (None, Go's error text)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None, f"strconv.ParseInt: parsing {go_quote(text)}: invalid syntax"
    value = int(text)
    if not -(2**31) <= value < 2**31:
        return None, f"strconv.ParseInt: parsing {go_quote(text)}: value out of range"
    return value, ""


def decode_grpc_message(value: bytes) -> str:
    """decodeGrpcMessage: %XX escapes become bytes; a broken escape stays literal."""
    out = bytearray()
    i = 0
    while i < len(value):
        c = value[i]
        if c == 0x25 and i + 2 < len(value) and _is_hex_pair(value[i + 1 : i + 3]):
            out.append(int(value[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(c)
            i += 1
    # Go keeps raw bytes; probe outputs travel in proto strings, which must be UTF-8.
    return out.decode("utf-8", "replace")


def _is_hex_pair(pair: bytes) -> bool:
    return all(chr(b) in "0123456789abcdefABCDEF" for b in pair)


def encode_timeout(ns: int) -> str:
    """grpcutil.EncodeDuration: the smallest unit whose rounded-up value has at most 8 digits."""
    if ns <= 0:
        return "0n"
    for unit, size in (("n", 1), ("u", 1_000), ("m", 1_000_000), ("S", 1_000_000_000), ("M", 60_000_000_000)):
        value = -(-ns // size)
        if value <= 99_999_999:
            return f"{value}{unit}"
    return f"{-(-ns // 3_600_000_000_000)}H"


def user_agent(kube_agent: str) -> str:
    return f"{kube_agent} grpc-go/{GRPC_GO_VERSION}"


def request_headers(authority: str, kube_agent: str, remaining_ns: int, tls: bool = False) -> list[tuple[str, str]]:
    """http2Client.createHeaderFields for a call with a deadline and no metadata."""
    return fixed_request_headers(authority, kube_agent, tls) + [("grpc-timeout", encode_timeout(remaining_ns))]


def fixed_request_headers(authority: str, kube_agent: str, tls: bool = False) -> list[tuple[str, str]]:
    """The request headers before grpc-timeout, the only one that changes from call to call. :scheme is https
    over TLS transport credentials (grpc-go's http2Client: "https" when the transport is secure)."""
    return [
        (":method", "POST"),
        (":scheme", "https" if tls else "http"),
        (":path", CHECK_PATH),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", user_agent(kube_agent)),
        ("te", "trailers"),
    ]


# grpc-go's credentials/tls.go ClientHandshake, when the server selected no ALPN protocol (enforced by default since
# grpc-go 1.67, which kubelet 1.37 builds with); like any handshake failure, the dial retries until its deadline.
MISSING_ALPN = "credentials: cannot check peer: missing selected ALPN property"


def frame_message(payload: bytes) -> bytes:
    """gRPC length-prefixed message: flag 0 (uncompressed), 4-byte big-endian length."""
    return struct.pack(">BI", 0, len(payload)) + payload


def check_request(service: str) -> bytes:
    return frame_message(health_pb.HealthCheckRequest(service=service).SerializeToString())


# ---------------------------------------------------------------- backoff


def backoff_delay(retries: int, uniform: Callable[[], float]) -> float:
    """backoff.Exponential.Backoff, seconds; `uniform` is a [0, 1) random source.

    The first retry waits exactly the base delay: grpc-go applies no jitter to it.
    """
    if retries == 0:
        return BACKOFF_BASE_S
    delay = BACKOFF_BASE_S
    while delay < BACKOFF_MAX_S and retries > 0:
        delay *= BACKOFF_MULTIPLIER
        retries -= 1
    delay = min(delay, BACKOFF_MAX_S)
    delay *= 1 + BACKOFF_JITTER * (uniform() * 2 - 1)
    return max(delay, 0.0)


def connect_window(backoff: float) -> float:
    """How long one connection attempt (TCP + HTTP/2 preface) may take: resetTransport's dialDuration."""
    return max(MIN_CONNECT_TIMEOUT_S, backoff)


# ---------------------------------------------------------------- one unary call


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
                grpc_message = decode_grpc_message(value)
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
    while len(body) >= 5:
        length = struct.unpack(">I", body[1:5])[0]
        if length > max_message:
            return RpcError(RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({length} vs. {max_message})")
        body = body[5 + length :]
    return None


def _next_message(body: bytes, max_message: int, recv_compress: str) -> tuple[bytes | None, bytes, RpcError | None]:
    """parser.recvMsg + checkRecvPayload on a complete body: (payload, rest, error); payload None at EOF."""
    if not body:
        return None, b"", None
    if len(body) < 5:
        return None, b"", RpcError(INTERNAL, "unexpected EOF")
    flag, length = struct.unpack(">BI", body[:5])
    if length > max_message:
        return None, b"", RpcError(RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({length} vs. {max_message})")
    if len(body) < 5 + length:
        return None, b"", RpcError(INTERNAL, "unexpected EOF")
    if flag == 1:
        if recv_compress in ("", "identity"):
            return None, b"", RpcError(INTERNAL, "grpc: compressed flag set with identity or empty encoding")
        # The kubelet registers no decompressor, and we advertise none.
        return None, b"", RpcError(UNIMPLEMENTED, f"grpc: Decompressor is not installed for grpc-encoding {go_quote(recv_compress)}")
    if flag != 0:
        return None, b"", RpcError(INTERNAL, f"grpc: received unexpected payload format {flag}")
    return body[5 : 5 + length], body[5 + length :], None


# ---------------------------------------------------------------- kubelet outputs


def serving_status_name(value: int) -> str:
    """protobuf-go enum String(): the name, or the number for values it does not know."""
    try:
        return health_pb.HealthCheckResponse.ServingStatus.Name(value)
    except ValueError:
        return str(value)


def check_outcome(result: bytes | RpcError, timeout_ns: int) -> Outcome:
    """The kubelet's verdict on the Check call (grpcProber.Probe after DialContext)."""
    if isinstance(result, RpcError):
        return Outcome(FAILURE, rpc_error_output(result, timeout_ns), grpc_code=result.code)
    try:
        response = health_pb.HealthCheckResponse.FromString(result)
    except DecodeError:
        # Go's proto.Unmarshal wording; protobuf-python's text differs.
        error = RpcError(INTERNAL, "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data")
        return check_outcome(error, timeout_ns)
    name = serving_status_name(response.status)
    serving = serving_status_of(response.status)
    if response.status != health_pb.HealthCheckResponse.SERVING:
        return Outcome(FAILURE, f"service unhealthy (responded with {go_quote(name)})", grpc_serving=serving)
    return Outcome(SUCCESS, "service healthy", grpc_serving=serving)


def rpc_error_output(error: RpcError, timeout_ns: int) -> str:
    if error.is_status and error.code == UNIMPLEMENTED:
        return f"error: this server does not implement the grpc health protocol ({HEALTH_SERVICE}): {error.message}"
    if error.is_status and error.code == DEADLINE_EXCEEDED:
        return f"timeout: health rpc did not complete within {go_duration(timeout_ns)}"
    return f"error: health rpc probe failed: {error.text()}"


def dial_timeout_output(target: str, timeout_ns: int) -> str:
    """DialContext with WithBlock gives up only when the probe deadline passes."""
    return f"timeout: failed to connect service {go_quote(target)} within {go_duration(timeout_ns)}: context deadline exceeded"

