"""HTTP probe and HTTP lifecycle hook executor: moves bytes as probe_worker.probes.http.rules decides.

One attempt is one Go `client.Do`: a request, then every same-hostname redirect,
each over a new connection (the kubelet disables keep-alives), all bounded by
ctx.deadline. HTTP/1.1 framing is h11's; HTTP/2 (an HTTPS server that picks h2 by
ALPN, or `protocol: HTTP2`, h2c with prior knowledge) is probe_worker/probes/http/h2_exchange.py's,
behind the same exchange interface, and a request the HTTP/2 server refused goes
again over a new connection, as Go's client sends it. The connection, with its TLS
over memory buffers, is probe_worker/tls_stream.py's.

With ctx.lifecycle_hook it is the kubelet's runHTTPHandler instead: the request
goes out as the lifecycle client sends it (no `Connection: close`, `Accept-Encoding:
gzip`, TLS without ALPN), any response is SUCCESS with its body discarded, and an
HTTPS hook answered in plain HTTP is sent again once over http. Its keep-alives are
on: a redirect whose body was read to its end leaves its connection idle, and the
next request to the same scheme and port (a later hop, or the fallback) reuses it,
dialing again if the server had closed it meanwhile, as Go's transport does. Every
connection is closed when the hook is over (Go would keep the last one idle).

Phases: connect (by connect()), tls, request, processing (until the first
response byte), transfer (response head and body). Each followed redirect is a
"redirect" phase holding the same children for its own hop (no connect or tls
over a reused connection); a hook's retry over http is a "fallback" phase
holding its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from dataclasses import dataclass

import h11

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.probes.http import rules
from probe_worker.attempt import FAILURE, UNKNOWN, AttemptContext, Endpoint, Outcome
from probe_worker.connect import ConnectError, connect
from probe_api.gostrings import go_quote, is_ip_literal
from probe_worker.probes.http.rules import ProbeRequest
from probe_worker.probes.http.h2_exchange import H2Exchange, RetryOnNewConnection
from probe_worker.probes.http.url import URLError
from probe_worker.tls_stream import DEFAULT_TLS, LIFECYCLE_TLS, RECV_SIZE, Stream, StreamError
from probe_worker.trace import PhaseRecord

_Head = rules.ResponseHead


class _Exchange:
    """One HTTP/1.1 request/response over a Stream, framed by h11."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=rules.MAX_HEAD_BYTES)
        self.received = 0
        self.eof = False
        # The raw bytes of the response head being read: h11 drops a head it refuses,
        # and Go's error names the offending status line.
        self.head: bytes | None = b""

    async def send_request(self, prepared: "_Prepared") -> None:
        request = prepared.h11_request()
        try:
            data = self.h11.send(request) + (self.h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as exc:
            raise StreamError(prepared.unsendable(exc)) from None
        if prepared.raw_head is not None:
            data = prepared.raw_head  # h11 has its state (a GET without a body, sent); the bytes are Go's
        await self.stream.send(data)

    async def wait_first_byte(self) -> None:
        await self._receive()

    async def _receive(self, limit: int = RECV_SIZE) -> None:
        data = await self.stream.recv(limit)
        self.eof = not data
        self.received += len(data)
        if self.head is not None:
            self.head += data
        self.h11.receive_data(data)

    async def read_head(self) -> _Head:
        informational = 0
        while True:
            if self.eof and self.received == 0:
                raise StreamError("EOF")  # closed without answering: Go reports the bare EOF
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                return self._unparsable_head(exc)
            if event is h11.NEED_DATA:
                bad_status_line = rules.status_line_error(self.head or b"")
                if bad_status_line:
                    raise StreamError(bad_status_line)
                if self.eof:
                    raise StreamError(self._broken("unexpected EOF"))
                # Never buffer more than one byte past the limit: a head is either
                # within it or refused, whatever the chunking on the wire.
                buffered = len(self.h11.trailing_data[0])
                if buffered > rules.MAX_HEAD_BYTES:
                    raise StreamError(rules.head_too_large())
                try:
                    await self._receive(min(RECV_SIZE, rules.MAX_HEAD_BYTES + 1 - buffered))
                except StreamError as exc:
                    raise StreamError(self._broken(str(exc))) from None
                continue
            if isinstance(event, h11.InformationalResponse):
                informational += 1
                if informational > rules.MAX_INFORMATIONAL:
                    raise StreamError(rules.too_many_informational())
                self.head = self.h11.trailing_data[0]
                continue
            if isinstance(event, h11.Response):
                self.head = None
                return _head_of(event)
            raise StreamError(self._broken("unexpected EOF"))

    def _broken(self, error: str) -> str:
        return rules.transport_broken(error) if self.received else error

    def _unparsable_head(self, exc: h11.RemoteProtocolError) -> _Head:
        """h11 refused the head: say what Go's reader would have, or take the status Go accepts."""
        if exc.error_status_hint == 431:
            raise StreamError(rules.head_too_large())
        line, newline, _ = (self.head or b"").partition(b"\n")
        if not newline:
            raise StreamError(rules.transport_broken("unexpected EOF" if self.eof else "malformed HTTP response"))
        status = rules.go_status_line(line)
        if isinstance(status, str):
            raise StreamError(rules.transport_broken(status))
        if self.eof:  # the status line was fine, the headers never ended
            raise StreamError(rules.transport_broken("unexpected EOF"))
        if rules.h11_cannot_frame(status):
            return _Head(status=status, framed=False)
        raise StreamError(rules.transport_broken("malformed HTTP response"))

    @property
    def complete(self) -> bool:
        """Request sent and response read to its end, and neither side asked to close (h11's keep-alive)."""
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def settle(self) -> None:
        """Takes the end of the response if it is already here, without waiting for anything.

        A body read to exactly its Content-Length has not produced h11's EndOfMessage yet,
        while Go's body reader returns EOF with the last byte (and frees the connection).
        """
        if self.h11.their_state is h11.SEND_BODY:
            try:
                self.h11.next_event()
            except h11.RemoteProtocolError:
                pass

    async def read_body(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body; stops there without waiting for the rest."""
        body = bytearray()
        while len(body) < limit:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise StreamError("unexpected EOF" if "peer closed" in str(exc) else str(exc)) from None
            if event is h11.NEED_DATA:
                await self._receive()
            elif isinstance(event, h11.Data):
                body += event.data[:limit - len(body)]
            else:  # EndOfMessage or ConnectionClosed
                break
        return bytes(body)


def _head_of(response: h11.Response) -> _Head:
    location = None
    content_length = None
    chunked = False
    encoding = None
    for name, value in response.headers:
        if name == b"location" and location is None:
            location = value.decode("utf-8", "surrogateescape")
        elif name == b"content-length":
            content_length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"content-encoding" and encoding is None:
            encoding = value.decode("latin-1")
    return _Head(status=response.status_code, location=location, content_length=None if chunked else content_length,
                 content_encoding=encoding or "")


class _Prepared:
    """A request and everything derived from it alone, worked out once per request.

    Go builds the probe request again for every attempt, but nothing in it depends on
    what an attempt observes except the pod IP that answered, so the first request of
    a spec is built once (`_prepare`) and reused, with one retargeted copy per IP.
    """

    def __init__(self, request: ProbeRequest, transport: rules.Transport) -> None:
        self.request = request
        self.transport = transport
        self.preflight_error = rules.preflight_error(request)
        self._h11: h11.Request | h11.LocalProtocolError | None = None
        self.raw_head: bytes | None = None  # the head as Go writes it, where h11 would refuse to write it
        self._retargeted: dict[str, _Prepared] = {}

    @functools.cached_property
    def adds_gzip(self) -> bool:
        return rules.adds_gzip(self.request.header, self.transport)

    @functools.cached_property
    def wire(self) -> rules.WireRequest:
        return rules.wire_request(self.request, self.transport)

    def retarget(self, ip: str) -> "_Prepared":
        prepared = self._retargeted.get(ip)
        if prepared is None:
            prepared = self._retargeted[ip] = _Prepared(rules.retarget(self.request, ip), self.transport)
        return prepared

    def h11_request(self) -> h11.Request:
        """The request as an h11 event (h11 never changes one, so it is reused); raises StreamError."""
        if self._h11 is None:
            headers = [(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in self.wire.headers]
            try:
                self._h11 = h11.Request(method="GET", target=self.wire.target.encode("utf-8", "surrogateescape"),
                                        headers=headers)
            except h11.LocalProtocolError as exc:
                self._h11 = exc
            if isinstance(self._h11, h11.LocalProtocolError):
                # Go writes a raw query as it is, non-ASCII bytes and spaces included (url.URL.RequestURI keeps
                # RawQuery verbatim), and an ordinary server answers; h11 refuses such a target. Then h11 gets
                # the same request with a placeholder target, to keep its state (the response is still parsed
                # by h11), and the bytes sent are Go's own head.
                try:
                    self._h11 = h11.Request(method="GET", target=b"/", headers=headers)
                    self.raw_head = self.wire.head()
                except h11.LocalProtocolError:
                    pass  # not the target: the headers themselves (preflight_error has Go's word for those)
        if isinstance(self._h11, h11.LocalProtocolError):
            raise StreamError(self.unsendable(self._h11))
        return self._h11

    def unsendable(self, exc: h11.LocalProtocolError) -> str:
        return f"cannot send request-target {go_quote(self.wire.target)}: {exc}"


# Distinct first requests (one per HTTP probe spec) kept prepared in a worker.
PREPARED_CACHE_SIZE = 64
# Asked of the same few hosts on every attempt; parsing an address each time is not free.
_is_ip_literal = functools.lru_cache(maxsize=PREPARED_CACHE_SIZE)(is_ip_literal)


@functools.lru_cache(maxsize=PREPARED_CACHE_SIZE)
def _prepare(
    scheme: str, host: str, port: int, path: str, headers: tuple[tuple[str, str], ...], user_agent: str,
    transport: rules.Transport,
) -> _Prepared | URLError:
    """The first request of every attempt of one spec; a URLError is cached like a request."""
    try:
        return _Prepared(rules.new_probe_request(scheme, host, port, path, headers, user_agent), transport)
    except URLError as exc:
        return exc


def _transport(ctx: AttemptContext) -> rules.Transport:
    """The kubelet's probe client, or its lifecycle client for a hook."""
    return rules.LIFECYCLE_TRANSPORT if ctx.lifecycle_hook else rules.PROBE_TRANSPORT


@dataclass
class _Hop:
    """How one request ended: a final outcome, or the next request to send."""

    outcome: Outcome | None = None
    follow: ProbeRequest | None = None
    keep_alive: bool = False     # the connection may carry the next request
    retry: bool = False          # the HTTP/2 server refused it unanswered: the same request, on a new connection


# New connections for one request whose HTTP/2 server keeps refusing it. Go's client dials again until the
# deadline; past this many, the attempt waits for its deadline instead (same outcome, no busy loop).
MAX_H2_RETRIES = 16


class _Attempt:
    """One Go client.Do: the request and its followed redirects."""

    def __init__(
        self, endpoint: Endpoint, ctx: AttemptContext, idle: dict[tuple[str, int], Stream] | None = None,
        h2c: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.ctx = ctx
        self.hook = ctx.lifecycle_hook
        self.h2c = h2c  # httpGet.protocol HTTP2: http:// requests go as HTTP/2 with prior knowledge
        self.transport = _transport(ctx)
        # Connections left reusable, by Go's connectMethodKey (scheme and port: the hostname never changes).
        self.idle: dict[tuple[str, int], Stream] = {} if idle is None else idle
        self.tls = ctx.tls or (LIFECYCLE_TLS if self.hook else DEFAULT_TLS)
        self.first: ProbeRequest | None = None   # as sent; redirect rules compare against it
        self.requests_made = 0
        self.address = ""
        self.status = 0
        self.cause: str | None = None   # when it failed: the url.Error's own error (Go's urlErr.Err)

    async def run(self, first: _Prepared) -> Outcome:
        hop = await self.send(first, self.ctx)
        while hop.follow is not None:
            with self.ctx.trace.sub("redirect", hop.follow.url.redacted_string()) as trace:
                hop = await self.send(_Prepared(hop.follow, self.transport),
                                      dataclasses.replace(self.ctx, trace=trace))
        assert hop.outcome is not None
        return hop.outcome

    def outcome(self, result: int, output: str) -> Outcome:
        return Outcome(result, output, address=self.address, http_status_code=self.status)

    def fail(self, request: ProbeRequest, error: str) -> _Hop:
        return self.failed(request.url.redacted_string(), error)

    def failed(self, url: str, error: str) -> _Hop:
        self.cause = error
        return _Hop(self.outcome(FAILURE, rules.url_error(url, error)))

    def response(self, status: int, body: bytes) -> _Hop:
        if self.hook:
            return _Hop(self.outcome(*rules.hook_response_outcome(status)))
        return _Hop(self.outcome(*rules.response_outcome(status, body)))

    def close(self) -> None:
        for stream in self.idle.values():
            stream.close()
        self.idle.clear()

    async def send(self, prepared: _Prepared, ctx: AttemptContext) -> _Hop:
        """One request (Go's Client.send): over an idle connection of the same scheme and port, else a new one."""
        self.requests_made += 1
        request = prepared.request
        if prepared.preflight_error:
            return self.fail(request, prepared.preflight_error)
        endpoint = self.endpoint
        if self.first is not None:
            # A followed redirect has the first request's hostname, maybe another port.
            target = rules.dial_address(request.url)
            if isinstance(target, str):
                return self.fail(request, target)
            endpoint = dataclasses.replace(endpoint, port=target[1])
        if asyncio.get_running_loop().time() >= ctx.deadline:
            return self.fail(request, rules.TIMEOUT_AWAITING_HEADERS)
        key = (request.url.scheme, endpoint.port)
        idle = self.idle.pop(key, None)
        if idle is not None:
            self.address = idle.remote
            if self.first is None:  # the fallback's request, over a connection an earlier hop left idle
                self.first = request
            hop = await self.exchange(idle, prepared, ctx, key, reused=True)
            if hop is not None:
                return hop
            # The server had closed it before answering: Go's transport sends a GET again over a
            # new connection (persistConn.shouldRetryRequest on a reused connection).
        retries = 0
        while True:
            try:
                sock, self.address = await connect(endpoint, ctx)
            except ConnectError as exc:
                return self.fail(request, rules.awaiting_headers(str(exc)) if exc.timed_out else str(exc))
            if self.first is None:
                if _is_ip_literal(self.endpoint.host):
                    # Several pod IPs may race (ip_family ANY): the URL and Host name the
                    # one that answered, and redirects go back to that one.
                    ip = self.address.rsplit(":", 1)[0].strip("[]")
                    self.endpoint = dataclasses.replace(self.endpoint, host=ip, addresses=(ip,))
                    prepared = prepared.retarget(ip)
                    request = prepared.request
                self.first = request
            hop = await self.exchange(Stream(sock, self.address), prepared, ctx, key)
            assert hop is not None
            if not hop.retry:
                return hop
            retries += 1
            loop = asyncio.get_running_loop()
            if retries > MAX_H2_RETRIES:
                await asyncio.sleep(max(0.0, ctx.deadline - loop.time()))
            if loop.time() >= ctx.deadline:
                return self.fail(request, rules.TIMEOUT_AWAITING_HEADERS)
            endpoint = dataclasses.replace(self.endpoint, port=endpoint.port)  # the pod IP that answered

    async def exchange(
        self, stream: Stream, prepared: _Prepared, ctx: AttemptContext, key: tuple[str, int], reused: bool = False
    ) -> _Hop | None:
        """The request and its response over `stream`, which is closed after unless kept idle.

        None: `stream` was a reused connection the server had closed (nothing came back).
        """
        hop = None
        try:
            hop = await self._round_trip(stream, prepared, ctx, reused)
            return hop
        finally:
            if hop is not None and hop.keep_alive:
                self.idle[key] = stream
            else:
                stream.close()

    async def _round_trip(
        self, stream: Stream, prepared: _Prepared, ctx: AttemptContext, reused: bool
    ) -> _Hop | None:
        request = prepared.request
        exchange: _Exchange | H2Exchange = _Exchange(stream)
        trace = ctx.trace
        try:
            async with asyncio.timeout_at(ctx.deadline):
                if request.url.scheme == "https" and not reused:
                    hostname = request.url.hostname()
                    with trace.phase("tls", hostname) as phase:
                        phase.detail = await stream.start_tls(self.tls, None if is_ip_literal(hostname) else hostname)
                    if stream.alpn == "h2":
                        exchange = H2Exchange(stream)
                elif request.url.scheme == "http" and self.h2c:
                    exchange = H2Exchange(stream)
                request_line = prepared.wire.request_line
                if isinstance(exchange, H2Exchange):
                    request_line = f"GET {prepared.wire.target} HTTP/2.0"
                with trace.phase("request", request_line):
                    await exchange.send_request(prepared)
                with trace.phase("processing") as processing:
                    await exchange.wait_first_byte()
                    if reused and exchange.eof:
                        processing.error = "EOF"
        except TimeoutError:
            return self.fail(request, rules.TIMEOUT_AWAITING_HEADERS)
        except StreamError as exc:
            return None if reused else self.fail(request, str(exc))
        if reused and exchange.eof:
            return None
        with trace.phase("transfer") as transfer:
            return await self.respond(exchange, prepared, ctx, transfer)

    async def respond(
        self, exchange: _Exchange, prepared: _Prepared, ctx: AttemptContext, transfer: PhaseRecord
    ) -> _Hop:
        """Reads the response head, then follows it, or reads the body for the prober."""
        request = prepared.request
        try:
            async with asyncio.timeout_at(ctx.deadline):
                head = await exchange.read_head()
        except TimeoutError:
            transfer.error = rules.TIMEOUT_AWAITING_HEADERS
            return self.fail(request, transfer.error)
        except RetryOnNewConnection as exc:
            transfer.error = str(exc)
            return _Hop(retry=True)
        except StreamError as exc:
            transfer.error = str(exc)
            return self.fail(request, transfer.error)
        self.status = head.status
        transfer.detail = str(head.status)
        if not head.framed:
            return self.response(head.status, b"")

        assert self.first is not None
        decision = rules.follow_redirect(request, self.first, self.requests_made, head.status, head.location)
        length = rules.response_length(head.content_length, head.content_encoding, prepared.adds_gzip)
        if decision.drain:
            await self.discard(exchange, rules.drain_budget(length), ctx)
        if decision.failure is not None:
            return self.failed(*decision.failure)
        if decision.follow is not None:
            return _Hop(follow=decision.follow, keep_alive=rules.keeps_alive(self.transport, exchange.complete))
        if self.hook:
            # The kubelet discards a hook's body (read errors included) before it returns.
            await self.discard(exchange, rules.hook_discard_budget(length), ctx)
            return self.response(head.status, b"")
        try:
            async with asyncio.timeout_at(ctx.deadline):
                body = await exchange.read_body(rules.MAX_BODY_BYTES)
        except TimeoutError:
            transfer.error = rules.TIMEOUT_READING_BODY
            return _Hop(self.outcome(*rules.body_error_outcome(transfer.error)))
        except StreamError as exc:
            transfer.error = str(exc)
            return _Hop(self.outcome(*rules.body_error_outcome(transfer.error)))
        return self.response(head.status, body)

    async def discard(self, exchange: _Exchange, budget: int, ctx: AttemptContext) -> None:
        """Reads up to `budget` bytes of a body nobody looks at (a redirect's, a hook's); errors do not matter."""
        if not budget:
            return
        try:
            async with asyncio.timeout_at(ctx.deadline):
                await exchange.read_body(budget)
            exchange.settle()
        except (TimeoutError, StreamError):
            pass


async def probe(spec: spec_pb.ProbeSpec, endpoint: Endpoint, ctx: AttemptContext) -> Outcome:
    action = spec.http_get
    scheme = "https" if action.scheme == spec_pb.HTTPS else "http"
    headers = tuple((h.name, h.value) for h in action.http_headers)
    first = _prepare(scheme, endpoint.host, endpoint.port, action.path, headers, ctx.user_agent, _transport(ctx))
    if isinstance(first, URLError):
        return Outcome(UNKNOWN, f"cannot build the probe request: {first}")
    # An h2c probe's hooks have no such field: a lifecycle hook stays HTTP/1.1 (its client is not the prober's).
    attempt = _Attempt(endpoint, ctx, h2c=action.protocol == spec_pb.HTTP2 and not ctx.lifecycle_hook)
    try:
        outcome = await attempt.run(first)
        if ctx.lifecycle_hook:
            outcome = await _fallback(attempt, outcome)
    finally:
        attempt.close()
    return outcome.bounded()


async def _fallback(attempt: _Attempt, outcome: Outcome) -> Outcome:
    """handlers.go: an HTTPS hook answered in plain HTTP is sent once more over http; the first error stays
    unless the retry gets a response. (The kubelet's LifecycleHTTPFallback event and metric are the
    kubelet's to emit: the shim has no event recorder.)"""
    retry = rules.lifecycle_fallback(attempt.first, attempt.cause) if attempt.first is not None else None
    if retry is None:
        return outcome
    ctx = attempt.ctx
    # The endpoint as narrowed to the pod IP that answered: the retry clones the request that was sent.
    # Same client, same pool: an http connection an earlier hop left idle carries it.
    with ctx.trace.sub("fallback", retry.url.redacted_string()) as trace:
        second = await _Attempt(attempt.endpoint, dataclasses.replace(ctx, trace=trace), attempt.idle).run(
            _Prepared(retry, attempt.transport))
    return second if rules.fallback_wins(second.result) else outcome
