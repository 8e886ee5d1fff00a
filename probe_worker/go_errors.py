"""Go's error texts for what a probe meets on the wire, exactly as the kubelet prints them. Pure, no I/O.

A kubelet probe's output is a Go error's Error(): operators grep for these strings, so every probe kind words its
failures with the same few functions, kept here in one place whichever probe meets them:
  - net: a dial (`dial tcp 10.0.0.1:80: connect: connection refused`), a lookup, a read or write on an established
    connection (net.OpError), with syscall.Errno's spelling (`errno_text`);
  - context: the deadline every call bounded by the probe's timeout ends with;
  - net/http's client: the url.Error around every failure (`Get "URL": ...`), its timeouts, what its transport
    refuses before dialing, a broken HTTP/1.x transport, the scheme mismatch of an HTTPS request answered in plain
    HTTP;
  - crypto/tls: alerts and local failures (`tls_error_text`, from OpenSSL's reason codes) and the check of the
    server's first record (`first_record_error`);
  - x/net/http2's ErrCode names (the HTTP/2 probe's errors and grpc-go's RST_STREAM text both print them);
  - strconv's errors (a port name read as a number, grpc-go's statuses) and net/http's StatusText (grpc-go's
    statuses quote it).
The rules that decide WHEN a probe fails are beside each probe (probes/http/, probes/grpc/); Go's formatting of
values (quoting, durations, host:port) is probe_api.gostrings', which the daemon shares.
"""

from __future__ import annotations

import errno
import os
import re

from probe_api.gostrings import go_quote, join_host_port

# context.DeadlineExceeded.Error(): what every Go call bounded by the probe's deadline ends with.
CONTEXT_DEADLINE = "context deadline exceeded"


# ---------------------------------------------------------------------------
# net


def errno_text(code: int) -> str:
    """Go's syscall.Errno strings are libc's, lower-cased at the start."""
    if code == errno.ETIMEDOUT:
        return "connection timed out"
    text = os.strerror(code)
    return text[:1].lower() + text[1:]


def dial_error(address: str, exc: BaseException | None, timed_out: bool = False) -> str:
    """The error text of net.Dial: `dial tcp 10.0.0.1:80: connect: connection refused`."""
    if timed_out:
        return f"dial tcp {address}: i/o timeout"
    if isinstance(exc, OSError) and exc.errno:
        return f"dial tcp {address}: connect: {errno_text(exc.errno)}"
    return f"dial tcp {address}: {exc}"


def lookup_error(host: str, reason: str) -> str:
    """net.Dial of a name the resolver could not turn into an address."""
    return f"dial tcp: lookup {host}: {reason}"


def invalid_port_error(host: str, port: str) -> str:
    """net.Dial of an address whose port is out of range (Go's canonicalAddr kept it as written)."""
    return f"dial tcp: address {join_host_port(host, port)}: invalid port"


def net_op_error(op: str, local: str, remote: str, exc: OSError) -> str:
    """net.OpError for a read/write on an established connection: `read tcp L->R: read: connection reset by peer`."""
    reason = errno_text(exc.errno) if exc.errno else str(exc)
    return f"{op} tcp {local}->{remote}: {op}: {reason}"


# ---------------------------------------------------------------------------
# net/http's client

SCHEME_MISMATCH = "http: server gave HTTP response to HTTPS client"
NO_HOST = "http: no Host in request URL"


def url_error(url: str, error: str) -> str:
    """*url.Error as the kubelet prints it: `Get "http://10.0.0.1:80/": <error>`."""
    return f"Get {go_quote(url)}: {error}"


def awaiting_headers(error: str) -> str:
    """Client.do's suffix when the client timeout expired before the response headers."""
    return f"{error} (Client.Timeout exceeded while awaiting headers)"


TIMEOUT_AWAITING_HEADERS = awaiting_headers(CONTEXT_DEADLINE)
TIMEOUT_READING_BODY = f"{CONTEXT_DEADLINE} (Client.Timeout or context cancellation while reading body)"


def unsupported_scheme(scheme: str) -> str:
    return f"unsupported protocol scheme {go_quote(scheme)}"


def invalid_header_name(key: str) -> str:
    return f"net/http: invalid header field name {go_quote(key)}"


def invalid_header_value(key: str) -> str:
    return f"net/http: invalid header field value for {go_quote(key)}"


def transport_broken(error: str) -> str:
    """A failure after the response started: the connection is marked broken."""
    return f"net/http: HTTP/1.x transport connection broken: {error}"


def head_too_large(limit: int) -> str:
    """The response head passed the transport's MaxResponseHeaderBytes (`limit`)."""
    return transport_broken(f"net/http: server response headers exceeded {limit} bytes; aborted")


def too_many_informational() -> str:
    return transport_broken("net/http: too many 1xx informational responses")


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


# ---------------------------------------------------------------------------
# x/net/http2

# ErrCode.String(), by code.
HTTP2_ERROR_NAMES = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
    "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
    "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)


def http2_error_name(code: int) -> str:
    if 0 <= code < len(HTTP2_ERROR_NAMES):
        return HTTP2_ERROR_NAMES[code]
    return f"unknown error code 0x{code:x}"


# ---------------------------------------------------------------------------
# strconv


def strconv_error(func: str, text: str, reason: str) -> str:
    """strconv.NumError: `strconv.Atoi: parsing "x": invalid syntax`."""
    return f"strconv.{func}: parsing {go_quote(text)}: {reason}"


def go_parse_int32(text: str) -> tuple[int | None, str]:
    """strconv.ParseInt(text, 10, 32): (value, "") or (None, Go's error text)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None, strconv_error("ParseInt", text, "invalid syntax")
    value = int(text)
    if not -(2**31) <= value < 2**31:
        return None, strconv_error("ParseInt", text, "value out of range")
    return value, ""


# ---------------------------------------------------------------------------
# crypto/tls (Go's texts for what OpenSSL reports)

_ALERTS = {
    "UNEXPECTED_MESSAGE": "unexpected message",
    "BAD_RECORD_MAC": "bad record MAC",
    "DECRYPTION_FAILED": "decryption failed",
    "RECORD_OVERFLOW": "record overflow",
    "DECOMPRESSION_FAILURE": "decompression failure",
    "HANDSHAKE_FAILURE": "handshake failure",
    "BAD_CERTIFICATE": "bad certificate",
    "UNSUPPORTED_CERTIFICATE": "unsupported certificate",
    "CERTIFICATE_REVOKED": "revoked certificate",
    "CERTIFICATE_EXPIRED": "expired certificate",
    "CERTIFICATE_UNKNOWN": "unknown certificate",
    "ILLEGAL_PARAMETER": "illegal parameter",
    "UNKNOWN_CA": "unknown certificate authority",
    "ACCESS_DENIED": "access denied",
    "DECODE_ERROR": "error decoding message",
    "DECRYPT_ERROR": "error decrypting message",
    "EXPORT_RESTRICTION": "export restriction",
    "PROTOCOL_VERSION": "protocol version not supported",
    "INSUFFICIENT_SECURITY": "insufficient security level",
    "INTERNAL_ERROR": "internal error",
    "INAPPROPRIATE_FALLBACK": "inappropriate fallback",
    "USER_CANCELLED": "user canceled",
    "NO_RENEGOTIATION": "no renegotiation",
    "MISSING_EXTENSION": "missing extension",
    "UNSUPPORTED_EXTENSION": "unsupported extension",
    "CERTIFICATE_UNOBTAINABLE": "certificate unobtainable",
    "UNRECOGNIZED_NAME": "unrecognized name",
    "BAD_CERTIFICATE_STATUS_RESPONSE": "bad certificate status response",
    "BAD_CERTIFICATE_HASH_VALUE": "bad certificate hash value",
    "UNKNOWN_PSK_IDENTITY": "unknown PSK identity",
    "CERTIFICATE_REQUIRED": "certificate required",
    "NO_APPLICATION_PROTOCOL": "no application protocol",
}
_ALERT_REASON = re.compile(r"(?:SSLV3|TLSV1|TLSV13)_(?:ALERT_)?(?P<name>[A-Z_]+)")
_EOF_REASONS = frozenset({"UNEXPECTED_EOF_WHILE_READING", "EOF"})


def tls_error_text(reason: str) -> str:
    """An OpenSSL reason code (ssl.SSLError.reason) as Go's crypto/tls would word it."""
    if reason in _EOF_REASONS:
        return "EOF"
    match = _ALERT_REASON.fullmatch(reason)
    if match and match.group("name") in _ALERTS:
        return f"remote error: tls: {_ALERTS[match.group('name')]}"
    return "tls: " + reason.lower().replace("_", " ") if reason else "tls: handshake failure"


def first_record_error(header: bytes, eof: bool) -> str | None:
    """Go's check of the server's first TLS record header (5 bytes); None while it looks fine."""
    if len(header) < 5:
        if eof:
            return "EOF" if not header else "unexpected EOF"
        return None
    record_type, version = header[0], int.from_bytes(header[1:3], "big")
    if record_type in (21, 22) and version < 0x1000:  # alert or handshake, plausible version
        return None
    if header[:5] == b"HTTP/":
        return SCHEME_MISMATCH
    return "tls: first record does not look like a TLS handshake"
