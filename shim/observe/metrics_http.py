"""The HTTP endpoint that serves the daemon's metrics (GET /metrics), on the daemon's event loop.

Served by the daemon's own bounded HTTP/1.1 server (shim/http1_server.py) rather than prometheus_client's
(start_http_server), because of hardening: that server is a ThreadingHTTPServer with one thread per connection and
no read deadline, so a client that opens connections and sends a byte a minute holds a thread each, without bound,
inside the daemon that runs every probe of the node. Here the bounds are this endpoint's: MAX_CONNECTIONS, the
request head (MAX_REQUEST_HEAD), the time to read it and to write the answer, one request per connection with its
body never read, and a closing client drained with a bound (tests/hardening/test_access.py holds it to that). The
exposition itself is prometheus_client's (choose_encoder, gzip), rendered in a thread.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client.exposition import gzip_accepted

from shim.config import ConfigError
from shim.http1_server import Bounds, Http1Server, Request, Response

if TYPE_CHECKING:
    from shim.observe.metrics import ShimMetrics

# The endpoint's bounds against a misbehaving client (it may be bound beyond loopback). Read when a server is made.
MAX_CONNECTIONS = 16
MAX_REQUEST_HEAD = 16 * 1024
REQUEST_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024


def parse_listen(listen: str) -> tuple[str, int]:
    """ "127.0.0.1:9555", "[::1]:9555", "localhost:9555" -> (host, port).

    The host is required: an empty host would mean every interface, and the
    endpoint must bind only where the operator said (0.0.0.0 if that is meant).
    """
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"metrics listen address {listen!r}: write an IPv6 address in brackets, e.g. [::1]:9555")
    if not sep or not host:
        raise ConfigError(
            f"metrics listen address {listen!r}: must be host:port, e.g. 127.0.0.1:9555 "
            "(0.0.0.0:9555 for every interface; an empty value turns the endpoint off)"
        )
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics listen address {listen!r}: port must be a number from 0 to 65535")
    return host, int(port)


class MetricsServer(Http1Server):
    """GET /metrics, one request per connection, on the daemon's event loop. Rendering runs in a thread so a
    large exposition never stalls probing; prometheus_client's metrics are thread-safe."""

    def __init__(self, metrics: ShimMetrics) -> None:
        # A request's body is never read (GET only), so its connection cannot be kept: one request each, its
        # timeout from the connection's start, and a stalled one cut unanswered, as Go's server cuts it.
        super().__init__(self._answer, Bounds(
            max_connections=MAX_CONNECTIONS, max_head_bytes=MAX_REQUEST_HEAD, max_body_bytes=None,
            request_timeout_s=REQUEST_TIMEOUT_S, write_timeout_s=WRITE_TIMEOUT_S, linger_s=LINGER_S,
            linger_bytes=LINGER_BYTES))
        self._metrics = metrics

    async def start(self, host: str, port: int) -> None:
        await super().start(host, port, reuse_address=True)

    async def _answer(self, request: Request) -> Response:
        if request.path != "/metrics":
            return Response(404, [("content-type", "text/plain; charset=utf-8")], b"404 page not found\n")
        if request.method != "GET":
            return Response(405, [("allow", "GET"), ("content-type", "text/plain; charset=utf-8")],
                            b"405 method not allowed\n")
        accept = request.headers.get(b"accept", b"").decode("latin-1")
        compress = gzip_accepted(request.headers.get(b"accept-encoding", b"").decode("latin-1"))
        # ~0.1 s of CPU for 750 probes: off the event loop.
        body, content_type = await asyncio.to_thread(self._metrics.render_for, accept, compress=compress)
        headers = [("content-type", content_type)]
        if compress:
            headers.append(("content-encoding", "gzip"))
        return Response(200, headers, body)
