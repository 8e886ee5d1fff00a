"""What the kubelet's HTTP prober makes of a response, as pure functions. No I/O.

The kubelet's client (Go net/http, with the kubelet's CheckRedirect that follows
same-hostname redirects only) reads a response head, then decides; this module mirrors:
  - the status line as Go's reader judges it, which h11 does not (`go_status_line`,
    `status_line_error`, `h11_cannot_frame`);
  - the body's length as Go's transport reports it (`response_length`);
  - redirects: which are followed, with which Host and Referer, how much of the body is
    drained first, and whether the connection stays reusable (`follow_redirect`, `keeps_alive`);
  - the result: status code and body to SUCCESS/WARNING/FAILURE (`response_outcome`), and a
    body read error (`body_error_outcome`).
The request is probes/http/request.py's; a hook's view of the response is probes/http/hooks.py's.
probes/http/executor.py moves the bytes according to these, over h1_exchange.py or h2_exchange.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probe_api.gostrings import go_quote
from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING
from probe_worker.go_errors import transport_broken, url_error
from probe_worker.probes.http.request import ProbeRequest, Transport
from probe_worker.probes.http.url import GoURL, URLError, parse

MAX_BODY_BYTES = 10240            # kubelet maxRespBodyLength: the body is read up to here, silently cut
MAX_HEAD_BYTES = 64 * 1024        # response head limit (Go allows 10 MiB; a probe target gets less)
MAX_INFORMATIONAL = 5             # Go transport max1xxResponses
MAX_REDIRECT_REQUESTS = 10        # Go's "stopped after 10 redirects"
REDIRECT_DRAIN_BYTES = 2 << 10    # Go reads this much of a redirect's body before closing it
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@dataclass
class ResponseHead:
    """What the prober needs of a response head, whichever HTTP version carried it."""

    status: int
    location: str | None = None
    content_length: int | None = None   # None: unknown (chunked, until close, or not given)
    framed: bool = True                  # False: h11 could not parse it; there is no body to read
    content_encoding: str = ""           # the first Content-Encoding


def response_length(content_length: int | None, content_encoding: str, added_gzip: bool) -> int | None:
    """Response.ContentLength as Go's transport hands it over (None for Go's -1, unknown).

    When the transport asked for gzip and got it, it decompresses the body itself and
    reports the length as unknown.
    """
    if added_gzip and content_encoding.lower() == "gzip":
        return None
    return content_length


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
# The result (kubelet DoHTTPProbe)


def response_outcome(status: int, body: bytes) -> tuple[int, str]:
    """kubelet DoHTTPProbe: 2xx SUCCESS with the body, 3xx WARNING, anything else FAILURE."""
    text = body[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
    if 200 <= status < 400:
        if status >= 300:
            return WARNING, f"Probe terminated redirects, Response body: {text}"
        return SUCCESS, text
    # The body is never shown for failures (kubernetes issue 99425).
    return FAILURE, f"HTTP probe failed with statuscode: {status}"


def body_error_outcome(error: str) -> tuple[int, str]:
    """A body read error is a prober error in the kubelet (DoHTTPProbe returns ReadAtMost's err as it is): the
    worker throws the result away, and the error's own text is what the kubelet shows (its event's `%s`)."""
    return UNKNOWN, error


# ---------------------------------------------------------------------------
# The HTTP/1.1 status line, as Go's reader judges it (h11 judges it otherwise)


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
