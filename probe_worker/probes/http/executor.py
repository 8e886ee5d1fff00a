"""HTTP probe and HTTP lifecycle hook executor: one attempt's requests, connections and outcome.

The decisions are pure rules beside it: the request (request.py, headers.py, url.py), what
becomes of a response and its redirects (response.py), a hook's own rules (hooks.py), Go's
error texts (probe_worker/go_errors.py). This module only moves bytes as they decide.

One attempt is one Go `client.Do`: a request, then every same-hostname redirect,
each over a new connection (the kubelet disables keep-alives), all bounded by
ctx.deadline. A request goes over an exchange: HTTP/1.1 is h1_exchange.py's (h11);
HTTP/2 (an HTTPS server that picks h2 by ALPN, or `protocol: HTTP2`, h2c with prior
knowledge) is h2_exchange.py's, behind the same interface, and a request the HTTP/2
server refused goes again over a new connection, as Go's client sends it. An h2c
probe redirected to https goes over TLS as kubelet 1.37's h2c transport dials it: the
server verified against the node's roots, no ALPN, HTTP/1.1. The connection, with its
TLS over memory buffers, is probe_worker/tls_stream.py's.

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

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import is_ip_literal
from probe_worker import go_errors
from probe_worker.attempt import FAILURE, UNKNOWN, AttemptContext, Endpoint, Outcome
from probe_worker.connect import ConnectError, connect
from probe_worker.probes.http import hooks, response
from probe_worker.probes.http import request as request_rules
from probe_worker.probes.http.h1_exchange import H1Exchange, H1Request
from probe_worker.probes.http.h2_exchange import H2Exchange, RetryOnNewConnection
from probe_worker.probes.http.request import ProbeRequest
from probe_worker.probes.http.url import URLError
from probe_worker.tls_stream import DEFAULT_TLS, LIFECYCLE_TLS, Stream, StreamError, verifying_tls_context
from probe_worker.trace import PhaseRecord


class Prepared:
    """A request and everything derived from it alone, worked out once per request.

    Go builds the probe request again for every attempt, but nothing in it depends on
    what an attempt observes except the pod IP that answered, so the first request of
    a spec is built once (`_prepare`) and reused, with one retargeted copy per IP.
    """

    def __init__(self, request: ProbeRequest, transport: request_rules.Transport) -> None:
        self.request = request
        self.transport = transport
        self.preflight_error = request_rules.preflight_error(request)
        self._retargeted: dict[str, Prepared] = {}

    @functools.cached_property
    def adds_gzip(self) -> bool:
        return request_rules.adds_gzip(self.request.header, self.transport)

    @functools.cached_property
    def wire(self) -> request_rules.WireRequest:
        return request_rules.wire_request(self.request, self.transport)

    def retarget(self, ip: str) -> "Prepared":
        prepared = self._retargeted.get(ip)
        if prepared is None:
            prepared = self._retargeted[ip] = Prepared(request_rules.retarget(self.request, ip), self.transport)
        return prepared

    @functools.cached_property
    def h1(self) -> H1Request:
        """The request as HTTP/1.1 sends it (HTTP/2 sends `request` and `transport` instead)."""
        return H1Request(self.wire)


# Distinct first requests (one per HTTP probe spec) kept prepared in a worker.
PREPARED_CACHE_SIZE = 64
# Asked of the same few hosts on every attempt; parsing an address each time is not free.
_is_ip_literal = functools.lru_cache(maxsize=PREPARED_CACHE_SIZE)(is_ip_literal)


@functools.lru_cache(maxsize=PREPARED_CACHE_SIZE)
def _prepare(
    scheme: str, host: str, port: int, path: str, headers: tuple[tuple[str, str], ...], user_agent: str,
    transport: request_rules.Transport,
) -> Prepared | URLError:
    """The first request of every attempt of one spec; a URLError is cached like a request."""
    try:
        return Prepared(request_rules.new_probe_request(scheme, host, port, path, headers, user_agent), transport)
    except URLError as exc:
        return exc


def _transport(ctx: AttemptContext) -> request_rules.Transport:
    """The kubelet's probe client, or its lifecycle client for a hook."""
    return request_rules.LIFECYCLE_TRANSPORT if ctx.lifecycle_hook else request_rules.PROBE_TRANSPORT


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

    async def run(self, first: Prepared) -> Outcome:
        hop = await self.send(first, self.ctx)
        while hop.follow is not None:
            with self.ctx.trace.sub("redirect", hop.follow.url.redacted_string()) as trace:
                hop = await self.send(Prepared(hop.follow, self.transport),
                                      dataclasses.replace(self.ctx, trace=trace))
        assert hop.outcome is not None
        return hop.outcome

    def outcome(self, result: int, output: str) -> Outcome:
        return Outcome(result, output, address=self.address, http_status_code=self.status)

    def fail(self, request: ProbeRequest, error: str) -> _Hop:
        return self.failed(request.url.redacted_string(), error)

    def failed(self, url: str, error: str) -> _Hop:
        self.cause = error
        return _Hop(self.outcome(FAILURE, go_errors.url_error(url, error)))

    def response(self, status: int, body: bytes) -> _Hop:
        if self.hook:
            return _Hop(self.outcome(*hooks.hook_response_outcome(status)))
        return _Hop(self.outcome(*response.response_outcome(status, body)))

    def close(self) -> None:
        for stream in self.idle.values():
            stream.close()
        self.idle.clear()

    async def send(self, prepared: Prepared, ctx: AttemptContext) -> _Hop:
        """One request (Go's Client.send): over an idle connection of the same scheme and port, else a new one."""
        self.requests_made += 1
        request = prepared.request
        if prepared.preflight_error:
            return self.fail(request, prepared.preflight_error)
        endpoint = self.endpoint
        if self.first is not None:
            # A followed redirect has the first request's hostname, maybe another port.
            target = request_rules.dial_address(request.url)
            if isinstance(target, str):
                return self.fail(request, target)
            endpoint = dataclasses.replace(endpoint, port=target[1])
        if asyncio.get_running_loop().time() >= ctx.deadline:
            return self.fail(request, go_errors.TIMEOUT_AWAITING_HEADERS)
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
                return self.fail(request, go_errors.awaiting_headers(str(exc)) if exc.timed_out else str(exc))
            if self.first is None:
                if _is_ip_literal(self.endpoint.host):
                    # Several pod IPs may race (ip_family ANY): the URL and Host name the
                    # one that answered, and redirects go back to that one.
                    ip = self.address.rsplit(":", 1)[0].strip("[]")
                    if self.endpoint.addresses != (ip,) or self.endpoint.host != ip:  # one pod IP: nothing to do
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
                return self.fail(request, go_errors.TIMEOUT_AWAITING_HEADERS)
            endpoint = dataclasses.replace(self.endpoint, port=endpoint.port)  # the pod IP that answered

    async def exchange(
        self, stream: Stream, prepared: Prepared, ctx: AttemptContext, key: tuple[str, int], reused: bool = False
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
        self, stream: Stream, prepared: Prepared, ctx: AttemptContext, reused: bool
    ) -> _Hop | None:
        request = prepared.request
        exchange: H1Exchange | H2Exchange = H1Exchange(stream)
        trace = ctx.trace
        try:
            async with ctx.timeout():
                if request.url.scheme == "https" and not reused:
                    hostname = request.url.hostname()
                    server_name = None if is_ip_literal(hostname) else hostname
                    with trace.phase("tls", hostname) as phase:
                        if self.h2c:
                            # 1.37's h2c transport has no TLSClientConfig: Go's default one verifies the server,
                            # and offers no ALPN, so the exchange is HTTP/1.1.
                            phase.detail = await stream.start_tls(verifying_tls_context(), server_name, hostname)
                        else:
                            phase.detail = await stream.start_tls(self.tls, server_name)
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
            return self.fail(request, go_errors.TIMEOUT_AWAITING_HEADERS)
        except StreamError as exc:
            return None if reused else self.fail(request, str(exc))
        if reused and exchange.eof:
            return None
        with trace.phase("transfer") as transfer:
            return await self.respond(exchange, prepared, ctx, transfer)

    async def respond(
        self, exchange: H1Exchange | H2Exchange, prepared: Prepared, ctx: AttemptContext, transfer: PhaseRecord
    ) -> _Hop:
        """Reads the response head, then follows it, or reads the body for the prober."""
        request = prepared.request
        try:
            async with ctx.timeout():
                head = await exchange.read_head()
        except TimeoutError:
            transfer.error = go_errors.TIMEOUT_AWAITING_HEADERS
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
        decision = response.follow_redirect(request, self.first, self.requests_made, head.status, head.location)
        length = response.response_length(head.content_length, head.content_encoding, prepared.adds_gzip)
        if decision.drain:
            await self.discard(exchange, response.drain_budget(length), ctx)
        if decision.failure is not None:
            return self.failed(*decision.failure)
        if decision.follow is not None:
            return _Hop(follow=decision.follow, keep_alive=response.keeps_alive(self.transport, exchange.complete))
        if self.hook:
            # The kubelet discards a hook's body (read errors included) before it returns.
            await self.discard(exchange, hooks.hook_discard_budget(length), ctx)
            return self.response(head.status, b"")
        try:
            async with ctx.timeout():
                body = await exchange.read_body(response.MAX_BODY_BYTES)
        except TimeoutError:
            transfer.error = go_errors.TIMEOUT_READING_BODY
            return _Hop(self.outcome(*response.body_error_outcome(transfer.error)))
        except StreamError as exc:
            transfer.error = str(exc)
            return _Hop(self.outcome(*response.body_error_outcome(transfer.error)))
        return self.response(head.status, body)

    async def discard(self, exchange: H1Exchange | H2Exchange, budget: int, ctx: AttemptContext) -> None:
        """Reads up to `budget` bytes of a body nobody looks at (a redirect's, a hook's); errors do not matter."""
        if not budget:
            return
        try:
            async with ctx.timeout():
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
    retry = hooks.lifecycle_fallback(attempt.first, attempt.cause) if attempt.first is not None else None
    if retry is None:
        return outcome
    ctx = attempt.ctx
    # The endpoint as narrowed to the pod IP that answered: the retry clones the request that was sent.
    # Same client, same pool: an http connection an earlier hop left idle carries it.
    with ctx.trace.sub("fallback", retry.url.redacted_string()) as trace:
        second = await _Attempt(attempt.endpoint, dataclasses.replace(ctx, trace=trace), attempt.idle).run(
            Prepared(retry, attempt.transport))
    return second if hooks.fallback_wins(second.result) else outcome
