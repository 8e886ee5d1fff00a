"""The kubelet's HTTP probe request, from spec to bytes, as pure functions. No I/O.

The kubelet (pkg/probe/http NewRequestForHTTPGetAction, newProbeRequest) builds a Go
http.Request and sends it with a net/http client; this module mirrors what decides its bytes:
  - the URL from scheme/host/port/path, with Go's re-parse (`probe_url`), and the header
    defaults: User-Agent kube-probe/V (kube-lifecycle/V for a hook), Accept */* (`new_probe_request`);
  - the client's transport (`Transport`): the prober's disables keep-alives and compression,
    the lifecycle client's (kubelet.go insecureContainerLifecycleHTTPClient) keeps Go's defaults,
    so a hook's request carries `Accept-Encoding: gzip` and no `Connection: close`;
  - what the transport refuses before dialing (`preflight_error`) and where it dials (`dial_address`);
  - the exact wire order of the header lines, as Request.write emits them (`wire_request`).
What becomes of the response is probes/http/response.py's; a hook's own rules are probes/http/hooks.py's.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, replace

from probe_api.gostrings import join_host_port
from probe_worker.go_errors import (
    NO_HOST, invalid_header_name, invalid_header_value, invalid_port_error, unsupported_scheme,
)
from probe_worker.probes.http.headers import (
    Header, clean_value, has_token, punycode_host_port, remove_zone, valid_header_name, valid_header_value,
    valid_host_header, values_contain_token,
)
from probe_worker.probes.http.url import GoURL, URLError, parse

DEFAULT_PORTS = {"http": 80, "https": 443}
GO_DEFAULT_USER_AGENT = "Go-http-client/1.1"

# Header keys Request.write emits itself (or never) instead of from the Header map.
_WRITTEN_SEPARATELY = frozenset({"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"})


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
                return invalid_header_name(key)
            if not all(valid_header_value(v) for v in request.header.values(key)):
                return invalid_header_value(key)
    else:
        return unsupported_scheme(scheme)
    if request.url.host == "":
        return NO_HOST
    return None


def dial_address(url: GoURL) -> tuple[str, int] | str:
    """Go's canonicalAddr: hostname and port (the scheme's default when absent), or a dial error."""
    hostname = url.hostname()
    port_text = url.port() or str(DEFAULT_PORTS.get(url.scheme, 80))
    port = int(port_text)
    if port > 65535:
        return invalid_port_error(hostname, port_text)
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
    lines: list[tuple[str, str]] = [("Host", remove_zone(host))]

    user_agent = header.get("User-Agent") if header.has("User-Agent") else GO_DEFAULT_USER_AGENT
    if user_agent != "":
        lines.append(("User-Agent", clean_value(user_agent)))

    for key in sorted(header.keys(), key=lambda k: k.encode()):
        if key in _WRITTEN_SEPARATELY or not valid_header_name(key):
            continue
        lines.extend((key, clean_value(value)) for value in header.values(key))

    lines.extend(transport_headers(header, transport))
    return WireRequest(target=request.url.request_uri(), headers=tuple(lines))


def adds_gzip(header: Header, transport: Transport) -> bool:
    """persistConn.roundTrip's requestedGzip: the transport asks for gzip itself, and then decompresses it."""
    return not transport.disable_compression and header.get("Accept-Encoding") == "" and header.get("Range") == ""


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
        switching = header.get("Upgrade") != "" and values_contain_token(header.values("Connection"), "Upgrade")
        if not wants_close and not switching:
            extra.append(("Connection", "close"))
    return extra
