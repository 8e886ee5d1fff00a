"""Every decision of the kubelet's HTTP probe and HTTP lifecycle hook, as pure functions. No I/O.

The kubelet (pkg/probe/http, Go net/http client with DisableKeepAlives,
DisableCompression, no proxy, Client.Timeout = probe timeout, and a CheckRedirect
that follows same-hostname redirects only) decides, and this module mirrors:
  - the request: URL from scheme/host/port/path, Go's header defaults and the
    exact wire order of the header lines (`new_probe_request`, `wire_request`);
  - what the transport refuses before dialing (`preflight_error`);
  - redirects: which are followed, with which Host and Referer (`follow_redirect`);
  - the result: status code and body to SUCCESS/WARNING/FAILURE (`response_outcome`);
  - error texts, exactly as Go prints them (`url_error` and friends).

A lifecycle hook (pkg/kubelet/lifecycle/handlers.go runHTTPHandler, ConsistentHTTPGetHandlers)
builds the same request with User-Agent kube-lifecycle/V, but sends it with the kubelet's
insecureContainerLifecycleHTTPClient: a plain http.Transport (keep-alives on, compression on,
so no `Connection: close` and an `Accept-Encoding: gzip`; `LIFECYCLE_TRANSPORT`), the same
redirect checker, and no timeout of its own (the worker bounds it by the spec's timeout).
Any response is success and its body is discarded (`hook_response_outcome`,
`hook_discard_budget`, with Go's view of the length, `response_length`); a drained
response leaves its connection to the next request (`keeps_alive`); an HTTPS hook
answered in plain HTTP is sent once more over http (`lifecycle_fallback`).
probe_worker/probes/http/executor.py only moves bytes according to these.
"""

from __future__ import annotations

import base64
import encodings.punycode  # noqa: F401  loaded now: the worker cannot import after dropping privileges
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING
from probe_api.gostrings import errno_text, join_host_port
from probe_worker.probes.http.url import GoURL, URLError, go_quote, parse

MAX_BODY_BYTES = 10240            # kubelet maxRespBodyLength: the body is read up to here, silently cut
MAX_HEAD_BYTES = 64 * 1024        # response head limit (Go allows 10 MiB; a probe target gets less)
MAX_INFORMATIONAL = 5             # Go transport max1xxResponses
MAX_REDIRECT_REQUESTS = 10        # Go's "stopped after 10 redirects"
REDIRECT_DRAIN_BYTES = 2 << 10    # Go reads this much of a redirect's body before closing it
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
DEFAULT_PORTS = {"http": 80, "https": 443}
GO_DEFAULT_USER_AGENT = "Go-http-client/1.1"

TIMEOUT_AWAITING_HEADERS = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
TIMEOUT_READING_BODY = "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
SCHEME_MISMATCH = "http: server gave HTTP response to HTTPS client"

# Header keys Request.write emits itself (or never) instead of from the Header map.
_WRITTEN_SEPARATELY = frozenset({"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"})
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_VALID_HOST_CHARS = frozenset(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!$%&()*+,-.:;=[]'_~"
)


# ---------------------------------------------------------------------------
# Headers (net/http Header, net/textproto)


def canonical_header_key(name: str) -> str:
    """textproto.CanonicalMIMEHeaderKey: "x-foo-bar" -> "X-Foo-Bar"; invalid names stay as given."""
    if not name or any(c not in _TOKEN_CHARS for c in name):
        return name
    out = []
    upper = True
    for c in name:
        if upper and "a" <= c <= "z":
            c = c.upper()
        elif not upper and "A" <= c <= "Z":
            c = c.lower()
        out.append(c)
        upper = c == "-"
    return "".join(out)


def valid_header_name(name: str) -> bool:
    return bool(name) and all(c in _TOKEN_CHARS for c in name)


def valid_header_value(value: str) -> bool:
    """httpguts.ValidHeaderFieldValue: no control bytes except horizontal tab."""
    return not any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value)


def _clean_value(value: str) -> str:
    # headerNewlineToSpace + textproto.TrimString
    return value.replace("\n", " ").replace("\r", " ").strip(" \t\r\n")


class Header:
    """Go's http.Header: canonical keys, each with its values in the order added."""

    def __init__(self, items: dict[str, list[str]] | None = None) -> None:
        self._items: dict[str, list[str]] = {k: list(v) for k, v in (items or {}).items()}

    def add(self, name: str, value: str) -> None:
        self._items.setdefault(canonical_header_key(name), []).append(value)

    def set(self, name: str, value: str) -> None:
        self._items[canonical_header_key(name)] = [value]

    def get(self, name: str) -> str:
        values = self._items.get(canonical_header_key(name))
        return values[0] if values else ""

    def has(self, name: str) -> bool:
        return canonical_header_key(name) in self._items

    def values(self, name: str) -> list[str]:
        return list(self._items.get(canonical_header_key(name), ()))

    def delete(self, name: str) -> None:
        self._items.pop(canonical_header_key(name), None)

    def keys(self) -> list[str]:
        return list(self._items)

    def copy(self) -> "Header":
        return Header(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Header) and self._items == other._items

    def __repr__(self) -> str:
        return f"Header({self._items!r})"


def has_token(value: str, token: str) -> bool:
    """net/http hasToken: `token` appears in a comma/space separated header value (ASCII case-insensitive)."""
    if not token or len(token) > len(value):
        return False
    boundary = " ,\t"
    lowered = token.lower()
    for start in range(len(value) - len(token) + 1):
        end = start + len(token)
        if start > 0 and value[start - 1] not in boundary:
            continue
        if end != len(value) and value[end] not in boundary:
            continue
        if value[start:end].lower() == lowered:
            return True
    return False


def _values_contain_token(values: Iterable[str], token: str) -> bool:
    # httpguts.HeaderValuesContainsToken
    return any(
        part.strip(" \t").lower() == token.lower() for value in values for part in value.split(",")
    )


# ---------------------------------------------------------------------------
# The request


@dataclass(frozen=True)
class ProbeRequest:
    """One request of an attempt (the first, or a redirect hop): Go's Request fields that matter."""

    url: GoURL
    host: str          # Request.Host; "" means "the URL's host"
    header: Header


@dataclass(frozen=True)
class Transport:
    """The http.Transport settings that change the bytes a request goes out as."""

    disable_keep_alives: bool
    disable_compression: bool


# pkg/probe/http NewWithTLSConfig: DisableKeepAlives, DisableCompression ("removes Accept-Encoding header").
PROBE_TRANSPORT = Transport(disable_keep_alives=True, disable_compression=True)
# kubelet.go insecureContainerLifecycleHTTPClient: &http.Transport{TLSClientConfig: ...}, Go's defaults otherwise.
LIFECYCLE_TRANSPORT = Transport(disable_keep_alives=False, disable_compression=False)


@dataclass
class ResponseHead:
    """What the prober needs of a response head, whichever HTTP version carried it."""

    status: int
    location: str | None = None
    content_length: int | None = None   # None: unknown (chunked, until close, or not given)
    framed: bool = True                  # False: h11 could not parse it; there is no body to read
    content_encoding: str = ""           # the first Content-Encoding


@dataclass(frozen=True)
class WireRequest:
    """The request head exactly as Go's Request.write emits it."""

    target: str                               # request-target, Go's URL.RequestURI()
    headers: tuple[tuple[str, str], ...]      # in wire order, Host first

    @property
    def request_line(self) -> str:
        return f"GET {self.target} HTTP/1.1"

    def head(self) -> bytes:
        """The whole request head as Go writes it: the target as it is (a raw query keeps its spaces and
        non-ASCII bytes), then each header line, then the empty line."""
        lines = [self.request_line, *(f"{name}: {value}" for name, value in self.headers), "", ""]
        return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def probe_url(scheme: str, host: str, port: int, path: str) -> GoURL:
    """The request URL: kubelet formatURL, then http.NewRequest's re-parse of its text.

    Raises URLError when Go's NewRequest would fail (the kubelet then reports an
    error, which the worker turns into UNKNOWN).
    """
    try:
        url = parse(path or "/")
    except URLError:
        # formatURL: "Something is busted with the path, but it's too late to reject it."
        url = GoURL(path=path)
    url = replace(url, scheme=scheme, host=join_host_port(host, port))
    url = parse(url.string())
    if url.port() == "" and url.host.endswith(":"):  # NewRequest's removeEmptyPort
        url = replace(url, host=url.host[:-1])
    return url


def new_probe_request(
    scheme: str, host: str, port: int, path: str, headers: Sequence[tuple[str, str]], user_agent: str
) -> ProbeRequest:
    """kubelet NewRequestForHTTPGetAction + newProbeRequest. Raises URLError."""
    header = Header()
    for name, value in headers:
        header.add(name, value)
    if not header.has("User-Agent"):
        header.set("User-Agent", user_agent)
    if not header.has("Accept"):
        header.set("Accept", "*/*")
    elif header.get("Accept") == "":
        header.delete("Accept")
    return ProbeRequest(url=probe_url(scheme, host, port, path), host=header.get("Host"), header=header)


def retarget(request: ProbeRequest, address: str) -> ProbeRequest:
    """The same request with the URL naming `address`, the pod IP actually reached."""
    host = f"[{address}]" if ":" in address else address
    if request.url.port():
        host += ":" + request.url.port()
    return replace(request, url=replace(request.url, host=host))


def preflight_error(request: ProbeRequest) -> str | None:
    """What Go's Transport.RoundTrip rejects before dialing, in its order."""
    scheme = request.url.scheme
    if scheme in ("http", "https"):
        for key in sorted(request.header.keys()):  # Go walks a map; sorted keeps it deterministic
            if not valid_header_name(key):
                return f"net/http: invalid header field name {go_quote(key)}"
            if not all(valid_header_value(v) for v in request.header.values(key)):
                return f"net/http: invalid header field value for {go_quote(key)}"
    else:
        return f"unsupported protocol scheme {go_quote(scheme)}"
    if request.url.host == "":
        return "http: no Host in request URL"
    return None


def dial_address(url: GoURL) -> tuple[str, int] | str:
    """Go's canonicalAddr: hostname and port (the scheme's default when absent), or a dial error."""
    hostname = url.hostname()
    port_text = url.port() or str(DEFAULT_PORTS.get(url.scheme, 80))
    port = int(port_text)
    if port > 65535:
        return f"dial tcp: address {join_host_port(hostname, port_text)}: invalid port"
    return hostname, port


def request_header(request: ProbeRequest) -> Header:
    """Client.send: credentials in the URL become Basic auth unless Authorization is set."""
    header = request.header
    user = request.url.user
    if user is not None and header.get("Authorization") == "":
        header = header.copy()
        token = base64.b64encode(f"{user.username}:{user.password}".encode()).decode()
        header.set("Authorization", "Basic " + token)
    return header


def wire_request(request: ProbeRequest, transport: Transport = PROBE_TRANSPORT) -> WireRequest:
    """Request.write: Host, User-Agent, the sorted user headers, then the transport's extra headers.

    A probe ends with `Connection: close`, a lifecycle hook with `Accept-Encoding: gzip`
    (see `transport_headers`).
    """
    header = request_header(request)
    host = punycode_host_port(request.host or request.url.host)
    if not valid_host_header(host):
        host = ""  # Go sends an empty Host rather than an invalid one (request smuggling guard)
    lines: list[tuple[str, str]] = [("Host", _remove_zone(host))]

    user_agent = header.get("User-Agent") if header.has("User-Agent") else GO_DEFAULT_USER_AGENT
    if user_agent != "":
        lines.append(("User-Agent", _clean_value(user_agent)))

    for key in sorted(header.keys(), key=lambda k: k.encode()):
        if key in _WRITTEN_SEPARATELY or not valid_header_name(key):
            continue
        lines.extend((key, _clean_value(value)) for value in header.values(key))

    lines.extend(transport_headers(header, transport))
    return WireRequest(target=request.url.request_uri(), headers=tuple(lines))


def valid_host_header(host: str) -> bool:
    """httpguts.ValidHostHeader."""
    return all(c in _VALID_HOST_CHARS for c in host)


def adds_gzip(header: Header, transport: Transport) -> bool:
    """persistConn.roundTrip's requestedGzip: the transport asks for gzip itself, and then decompresses it."""
    return not transport.disable_compression and header.get("Accept-Encoding") == "" and header.get("Range") == ""


def response_length(content_length: int | None, content_encoding: str, added_gzip: bool) -> int | None:
    """Response.ContentLength as Go's transport hands it over (None for Go's -1, unknown).

    When the transport asked for gzip and got it, it decompresses the body itself and
    reports the length as unknown.
    """
    if added_gzip and content_encoding.lower() == "gzip":
        return None
    return content_length


def transport_headers(header: Header, transport: Transport) -> list[tuple[str, str]]:
    """persistConn.roundTrip's extraHeaders, which Request.write emits after the request's own, sorted by key.

    Compression on: `Accept-Encoding: gzip` unless the request has a non-empty
    Accept-Encoding (an empty one is sent as well, as given) or a Range. Keep-alives
    off: `Connection: close` unless the user asked for it already or is switching
    protocols. "Accept-Encoding" sorts before "Connection".
    """
    extra: list[tuple[str, str]] = []
    if adds_gzip(header, transport):
        extra.append(("Accept-Encoding", "gzip"))
    if transport.disable_keep_alives:
        wants_close = has_token(header.get("Connection"), "close")
        switching = header.get("Upgrade") != "" and _values_contain_token(header.values("Connection"), "Upgrade")
        if not wants_close and not switching:
            extra.append(("Connection", "close"))
    return extra


def punycode_host_port(value: str) -> str:
    """httpguts.PunycodeHostPort with idna's Punycode profile (labels converted as is)."""
    if value.isascii():
        return value
    host, port = value, ""
    match = re.fullmatch(r"(\[.*\]|[^:]*):(\d*)", value)
    if match:
        host, port = match.group(1), match.group(2)
    labels = [
        label if label.isascii() else "xn--" + label.encode("punycode").decode("ascii")
        for label in host.split(".")
    ]
    host = ".".join(labels)
    return f"{host}:{port}" if match else host


def _remove_zone(host: str) -> str:
    if not host.startswith("["):
        return host
    close = host.rfind("]")
    if close < 0:
        return host
    zone = host[:close].rfind("%")
    if zone < 0:
        return host
    return host[:zone] + host[close:]


# ---------------------------------------------------------------------------
# Redirects (Go Client.do + kubelet RedirectChecker(followNonLocalRedirects=false))


@dataclass(frozen=True)
class RedirectDecision:
    """What to do with a response. Neither `follow` nor `error`: it goes to the prober as is."""

    follow: ProbeRequest | None = None
    failure: tuple[str, str] | None = None   # the url.Error the attempt fails with: (URL, its Err)
    drain: bool = False          # read up to 2 KiB of this body first (only timing depends on it)

    @property
    def error(self) -> str | None:
        """The full url.Error text, as the kubelet prints it."""
        return None if self.failure is None else url_error(*self.failure)


def follow_redirect(
    current: ProbeRequest, first: ProbeRequest, requests_made: int, status: int, location: str | None
) -> RedirectDecision:
    if status not in REDIRECT_STATUSES or not location:
        return RedirectDecision()  # a 3xx without Location is returned, not an error (Go issue 49281)
    try:
        next_url = current.url.parse_reference(location)
    except URLError as exc:
        text = f"failed to parse Location header {go_quote(location)}: {exc}"
        return RedirectDecision(failure=(current.url.redacted_string(), text))

    # Host through redirects, Go's rule (issue 22233): a custom Host header is kept
    # only when the Location is relative (no scheme; "//host/x" counts as relative);
    # after an absolute Location the Host is the new URL's. So "a same-host redirect
    # keeps the user Host header" holds for the relative case, the common one.
    host = ""
    if current.host and current.host != current.url.host and not parse(location).is_abs():
        host = current.host

    # Headers are copied from the FIRST request. Go strips credentials when the
    # hostname changes, but such redirects are never followed here.
    header = first.header.copy()
    referer = referer_for_url(current.url, next_url, header.get("Referer"))
    if referer:
        header.set("Referer", referer)

    if next_url.hostname() != first.url.hostname():
        return RedirectDecision()  # http.ErrUseLastResponse: not our host, the prober gets the 3xx
    if requests_made >= MAX_REDIRECT_REQUESTS:
        # Go names the Location as written, not the resolved URL, in this one error.
        return RedirectDecision(failure=(location, "stopped after 10 redirects"), drain=True)
    return RedirectDecision(follow=ProbeRequest(url=next_url, host=host, header=header), drain=True)


def referer_for_url(last: GoURL, new: GoURL, explicit: str) -> str:
    """net/http refererForURL: no Referer from https to http; an explicit one wins; no userinfo."""
    if last.scheme == "https" and new.scheme == "http":
        return ""
    if explicit:
        return explicit
    referer = last.string()
    if last.user is not None:
        referer = referer.replace(last.user.string() + "@", "", 1)
    return referer


def keeps_alive(transport: Transport, complete: bool) -> bool:
    """Whether Go's transport puts the connection back in its idle pool after a response.

    Only with keep-alives on, and once the body was read to its end (a redirect's
    2 KiB drain may not get there) with neither side having asked to close
    (persistConn.readLoop). A probe's connection never outlives its request.
    """
    return not transport.disable_keep_alives and complete


def drain_budget(content_length: int | None) -> int:
    """Bytes of a redirect's body Go reads before closing it (unknown length counts as small)."""
    if content_length is None or content_length <= REDIRECT_DRAIN_BYTES:
        return REDIRECT_DRAIN_BYTES
    return 0


# ---------------------------------------------------------------------------
# Results


def response_outcome(status: int, body: bytes) -> tuple[int, str]:
    """kubelet DoHTTPProbe: 2xx SUCCESS with the body, 3xx WARNING, anything else FAILURE."""
    text = body[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
    if 200 <= status < 400:
        if status >= 300:
            return WARNING, f"Probe terminated redirects, Response body: {text}"
        return SUCCESS, text
    # The body is never shown for failures (kubernetes issue 99425).
    return FAILURE, f"HTTP probe failed with statuscode: {status}"


def hook_response_outcome(status: int) -> tuple[int, str]:
    """handlers.go runHTTPHandler: a hook that got any response succeeded; status and body are ignored.

    (1xx responses never get here: the transport skips them, as for probes.)
    """
    return SUCCESS, ""


def hook_discard_budget(content_length: int | None) -> int:
    """handlers.go discardHTTPRespBody: up to 10 KiB of the body is read, and only when Content-Length <= 10 KiB.

    `content_length` is Go's (`response_length`): an unknown one counts as small. Go reads
    10 KiB of a body it decompresses, the worker 10 KiB of raw bytes: only timing differs.
    Read errors do not matter.
    """
    if content_length is None or content_length <= MAX_BODY_BYTES:
        return MAX_BODY_BYTES
    return 0


def lifecycle_fallback(sent: ProbeRequest, cause: str | None) -> ProbeRequest | None:
    """handlers.go: a hook whose error says the server answered HTTPS in plain HTTP is sent once more over http.

    isHTTPResponseError looks for SCHEME_MISMATCH in the url.Error's own error (`cause`),
    whatever the scheme of the request (an https redirect hop may be the one answered in
    plain HTTP); the retry is always a clone of the first request with scheme http and no
    Authorization header (URL credentials still become one, as in any Client.send).
    None: no retry.
    """
    if cause is None or SCHEME_MISMATCH not in cause:
        return None
    header = sent.header.copy()
    header.delete("Authorization")
    return replace(sent, url=replace(sent.url, scheme="http"), header=header)


def fallback_wins(retry_result: int) -> bool:
    """`if httpErr == nil { err = nil }`: only a retry that got a response replaces the first error."""
    return retry_result == SUCCESS


def body_error_outcome(error: str) -> tuple[int, str]:
    """A body read error is a prober error in the kubelet (DoHTTPProbe returns ReadAtMost's err as it is): the
    worker throws the result away, and the error's own text is what the kubelet shows (its event's `%s`)."""
    return UNKNOWN, error


def url_error(url: str, error: str) -> str:
    """*url.Error as the kubelet prints it: `Get "http://10.0.0.1:80/": <error>`."""
    return f"Get {go_quote(url)}: {error}"


def awaiting_headers(error: str) -> str:
    """Client.do's suffix when the client timeout expired before the response headers."""
    return f"{error} (Client.Timeout exceeded while awaiting headers)"


def transport_broken(error: str) -> str:
    """A failure after the response started: the connection is marked broken."""
    return f"net/http: HTTP/1.x transport connection broken: {error}"


def head_too_large() -> str:
    return transport_broken(f"net/http: server response headers exceeded {MAX_HEAD_BYTES} bytes; aborted")


def too_many_informational() -> str:
    return transport_broken("net/http: too many 1xx informational responses")


def net_op_error(op: str, local: str, remote: str, exc: OSError) -> str:
    """net.OpError for a read/write on an established connection."""
    reason = errno_text(exc.errno) if exc.errno else str(exc)
    return f"{op} tcp {local}->{remote}: {op}: {reason}"


def go_status_line(line: bytes) -> int | str:
    """Go's readResponse on the status line: the status code, or its error text."""
    text = line.rstrip(b"\r\n").decode("utf-8", "surrogateescape")
    proto, sep, status = text.partition(" ")
    if not sep:
        return f"malformed HTTP response {go_quote(text)}"
    code = status.lstrip(" ").split(" ", 1)[0]
    if len(code) != 3 or not re.fullmatch(r"[+-]?[0-9]+", code) or int(code) < 0:
        return f"malformed HTTP status code {go_quote(code)}"
    if not _valid_http_version(proto):
        return f"malformed HTTP version {go_quote(proto)}"
    return int(code)


def status_line_error(head: bytes) -> str | None:
    """Go's verdict on the status line as soon as it is complete, before any header.

    Go reads the status line alone and fails at once on a bad one; h11 waits for
    the whole head. Without this, a server that sends one line and then waits (an
    SSH or SMTP banner on the probed port) would fail only at the timeout, with
    the timeout's text. None while the line is incomplete or fine.
    """
    line, newline, _ = head.partition(b"\n")
    if not newline:
        return None
    status = go_status_line(line)
    return transport_broken(status) if isinstance(status, str) else None


def _valid_http_version(proto: str) -> bool:
    return proto in ("HTTP/1.1", "HTTP/1.0") or re.fullmatch(r"HTTP/[0-9]\.[0-9]", proto) is not None


def h11_cannot_frame(status: int) -> bool:
    """Final statuses Go accepts that h11 refuses to parse (101 without an upgrade, < 100)."""
    return status == 101 or status < 100


# ---------------------------------------------------------------------------
# TLS (Go crypto/tls texts for what OpenSSL reports)

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
