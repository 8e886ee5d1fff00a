"""The kubelet's HTTP probe over HTTP/2, as pure rules (no I/O): the request as Go's HTTP/2 client encodes it, and
the texts of its errors.

An HTTPS probe speaks HTTP/2 when the server picks `h2` by ALPN (utilnet.SetTransportDefaults configures HTTP/2 on
the kubelet's probe transport: NextProtos ["h2", "http/1.1"]); `httpGet.protocol: HTTP2` (1.37, KEP-5999) speaks it
in cleartext with prior knowledge (h2c). Either way it is golang.org/x/net/http2's client (net/http bundles the same
code): a single-use connection (DisableKeepAlives), one stream, no compression asked for. Sources:
x/net/http2 transport.go (encodeRequestHeaders, handleResponse, processData, processResetStream, processGoAway,
the read loop's cleanup, transportResponseBody.Read), frame.go (readMetaFrame, checkPseudos), errors.go, and
internal/httpcommon EncodeHeaders. Everything before the connection (URL, header validity, redirects, the
outcome of a status) is shared with HTTP/1.1: probes/http/request.py, headers.py and response.py.
"""

from __future__ import annotations

import re

from probe_api.gostrings import go_quote
from probe_worker.go_errors import http2_error_name
from probe_worker.probes.http.headers import Header, punycode_host_port, valid_header_value, valid_host_header
from probe_worker.probes.http.request import ProbeRequest, Transport, adds_gzip, request_header
from probe_worker.probes.http.response import ResponseHead

STREAM_ID = 1
GO_DEFAULT_USER_AGENT = "Go-http-client/2.0"

# x/net/http2 ErrCode values this module names (their names are go_errors.HTTP2_ERROR_NAMES).
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 0x0, 0x1, 0x7, 0x9

FROM_PEER = "received from peer"  # errFromPeer: the cause of a stream error the server sent (RST_STREAM)
FRAME_TOO_LARGE = "http2: frame too large"  # ErrFrameTooLarge
HTTP1_LOOKING_HEADER = b"HTTP/1.1 "  # invalidHTTP1LookingFrameHeader: an HTTP/1.1 server answering the preface
GRACEFUL_GOAWAY = "http2: Transport received Server's graceful shutdown GOAWAY"  # errClientConnGotGoAway
MISSING_STATUS = "malformed response from server: missing status pseudo header"
NON_NUMERIC_STATUS = "malformed response from server: malformed non-numeric status pseudo header"
INFORMATIONAL_END_STREAM = "1xx informational response with END_STREAM flag"
HEADER_LIST_TOO_LARGE = "http2: response header list larger than advertised limit"
MORE_THAN_DECLARED = "net/http: server replied with more than declared Content-Length; truncated"
UNEXPECTED_EOF = "unexpected EOF"  # io.ErrUnexpectedEOF: the read loop's EOF, and a body short of its length

# Request headers the HTTP/2 client never sends from the header map (connection-specific, or its own).
_NOT_SENT = frozenset({"host", "content-length", "connection", "proxy-connection", "transfer-encoding", "upgrade",
                       "keep-alive"})
_REQUEST_PSEUDO = frozenset({":method", ":path", ":scheme", ":authority"})
_GO_ATOI = re.compile(rb"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1
# A header name as the HTTP/2 framer accepts it on the wire (validWireHeaderFieldName): a token, no upper case.
_WIRE_NAME_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def stream_error(code: int, cause: str = "") -> str:
    """StreamError.Error() for our one stream."""
    text = f"stream error: stream ID {STREAM_ID}; {http2_error_name(code)}"
    return f"{text}; {cause}" if cause else text


def connection_error(code: int) -> str:
    return f"connection error: {http2_error_name(code)}"


def frame_too_large(header: bytes) -> str:
    """Framer.ReadFrame on a frame header longer than our SETTINGS_MAX_FRAME_SIZE, checked before its payload is
    read: with a hint when the header is an HTTP/1.1 status line's start."""
    if header == HTTP1_LOOKING_HEADER:
        return (f"http2: failed reading the frame payload: {FRAME_TOO_LARGE}, "
                "note that the frame header looked like an HTTP/1.1 header")
    return FRAME_TOO_LARGE


def goaway_error(last_stream_id: int, code: int, debug: bytes) -> str:
    """GoAwayError: the server said GOAWAY (sparing our stream), then the connection ended before the response did."""
    return (f"http2: server sent GOAWAY and closed the connection; LastStreamID={last_stream_id}, "
            f"ErrCode={http2_error_name(code)}, debug={go_quote(debug)}")


def goaway_refused(code: int) -> str:
    """A GOAWAY with an error that did not spare our stream: not retried."""
    return f"http2: Transport received GOAWAY from server ErrCode:{http2_error_name(code)}"


def retried(reset_code: int | None = None, goaway_code: int | None = None) -> bool:
    """canRetryError: a stream the server refused, or spared by a graceful GOAWAY, is sent again on a new
    connection (net/http dials one for every retry of a single-use connection, until the deadline)."""
    if reset_code is not None:
        return reset_code == REFUSED_STREAM
    return goaway_code == NO_ERROR


def _go_list(values: list[str]) -> str:
    """fmt's %q of a []string."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"


def _connection_headers_error(header: Header) -> str | None:
    """checkConnHeaders: what HTTP/2 cannot carry (HTTP/1.1 would send it as it is)."""
    values = header.values("Connection")
    if values and (len(values) > 1 or values[0] != "" and values[0].lower() not in ("close", "keep-alive")):
        return f"invalid Connection request header: {_go_list(values)}"
    values = header.values("Transfer-Encoding")
    if values and (len(values) > 1 or values[0] not in ("", "chunked")):
        return f"invalid Transfer-Encoding request header: {_go_list(values)}"
    values = header.values("Upgrade")
    if values and values[0] not in ("", "chunked"):
        return f"invalid Upgrade request header: {_go_list(values)}"
    return None


def request_fields(request: ProbeRequest, transport: Transport) -> list[tuple[str, str]] | str:
    """The request's header fields as Go's HTTP/2 client sends them, or the error its RoundTrip returns.

    Pseudo-headers first (:authority, :method, :path, :scheme), then the request's headers under lower-case names
    (Go walks a map: sorted here, for the same bytes every time; order carries no meaning in HTTP/2), minus the
    connection-specific ones; User-Agent's first value only, Go's own when none is set; `accept-encoding: gzip`
    only where the transport asks for compression (never for a probe).
    """
    header = request_header(request)
    problem = _connection_headers_error(header)
    if problem:
        return f"http2: {problem}"
    authority = punycode_host_port(request.host or request.url.host)
    if not valid_host_header(authority):
        return "http2: invalid Host header"  # HTTP/1.1 sends an empty Host instead
    path = request.url.request_uri()
    if not path.startswith("/"):
        return f"http2: invalid request :path {go_quote(path)}"
    fields = [(":authority", authority), (":method", "GET"), (":path", path), (":scheme", request.url.scheme)]
    for key in sorted(header.keys(), key=lambda k: k.encode()):
        name = key.lower()
        if name in _NOT_SENT or not key.isascii():
            continue
        values = header.values(key)
        if name == "user-agent":
            values = values[:1] if values and values[0] else []
        elif name == "cookie":
            values = [part for value in values for part in _cookie_parts(value)]
        fields.extend((name, value) for value in values)
    if adds_gzip(header, transport):
        fields.append(("accept-encoding", "gzip"))
    if not header.has("User-Agent"):
        fields.append(("user-agent", GO_DEFAULT_USER_AGENT))
    return fields


def _cookie_parts(value: str) -> list[str]:
    """Cookies go as one field per pair (RFC 9113 §8.2.3): split at ';', the spaces after it dropped."""
    parts = []
    while (cut := value.find(";")) >= 0:
        parts.append(value[:cut])
        value = value[cut + 1:].lstrip(" ")
    if value:
        parts.append(value)
    return parts


def header_block_error(fields: list[tuple[bytes, bytes]]) -> str | None:
    """readMetaFrame: the first field the framer refuses, else checkPseudos; None when the block is well-formed.
    Each is a PROTOCOL_ERROR stream error with this cause."""
    saw_regular = False
    for name, value in fields:
        invalid = None
        if not valid_header_value(value.decode("latin-1")):
            invalid = f"invalid header field value for {go_quote(name)}"
        if name.startswith(b":"):
            if saw_regular:
                invalid = "pseudo header field after regular"
        else:
            saw_regular = True
            if not name or any(c not in _WIRE_NAME_CHARS for c in name):
                invalid = f"invalid header field name {go_quote(name)}"
        if invalid:
            return invalid
    seen: set[bytes] = set()
    is_request = is_response = False
    for name, _ in fields:
        if not name.startswith(b":"):
            break
        if name.decode("latin-1") in _REQUEST_PSEUDO:
            is_request = True
        elif name == b":status":
            is_response = True
        else:
            return f"invalid pseudo-header {go_quote(name)}"
        if name in seen:
            return f"duplicate pseudo-header {go_quote(name)}"
        seen.add(name)
    if is_request and is_response:
        return "mix of request and response pseudo headers"
    return None


def response_status(fields: list[tuple[bytes, bytes]]) -> int | str:
    """handleResponse: the :status as strconv.Atoi reads it (a sign and digits), or the error's cause."""
    status = next((value for name, value in fields if name == b":status"), None)
    if not status:
        return MISSING_STATUS
    if not _GO_ATOI.fullmatch(status) or abs(int(status)) > _INT64_MAX:
        return NON_NUMERIC_STATUS
    return int(status)


def is_informational(status: int) -> bool:
    return 100 <= status <= 199


def response_head(status: int, fields: list[tuple[bytes, bytes]], end_stream: bool) -> ResponseHead:
    """The final response's head. Content-Length counts only when given once and valid (ParseUint, 63 bits);
    otherwise the length is unknown, or 0 when the headers ended the stream."""
    location = content_encoding = None
    lengths = []
    for name, value in fields:
        if name == b"location" and location is None:
            location = value.decode("utf-8", "surrogateescape")
        elif name == b"content-length":
            lengths.append(value)
        elif name == b"content-encoding" and content_encoding is None:
            content_encoding = value.decode("latin-1")
    length = None
    if len(lengths) == 1 and lengths[0].isdigit() and lengths[0].isascii() and int(lengths[0]) < 2**63:
        length = int(lengths[0])
    elif not lengths and end_stream:
        length = 0
    return ResponseHead(status=status, location=location, content_length=length,
                              content_encoding=content_encoding or "")
