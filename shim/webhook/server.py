"""The webhook's HTTPS server: the daemon's bounded HTTP/1.1 server (shim/http1_server.py) over TLS
(shim/webhook/tls.py, its certificate reloaded when the files change), with this server's routes and bounds.

Routes: `POST /mutate` (an AdmissionReview, shim/webhook/admission.py), `GET /healthz` (serving), `GET /readyz`
(serving and not stopping: a Service takes the replica out before it goes), `GET /metrics` (Prometheus text).

Bounds, so that no client can hang it or grow it (each measured against what the kube-apiserver sends):
- a TLS handshake must finish within HANDSHAKE_TIMEOUT_S, a request (head and body) within REQUEST_TIMEOUT_S of
  its first byte, and a kept-alive connection must start its next request within IDLE_TIMEOUT_S: a client that
  sends a byte a second, or never finishes its handshake, is cut and costs one small task meanwhile;
- a head of at most MAX_HEAD_BYTES and a body of at most MAX_BODY_BYTES (the API server's own limit on a request
  is 3 MiB; a larger Content-Length is refused before a byte of the body is read, 413);
- at most MAX_CONNECTIONS at once; more are closed at once;
- an answer written within REQUEST_TIMEOUT_S, else the connection is cut (a client that never reads).
Each refusal or cut is counted by reason (probe_shim_webhook_requests_refused_total).
The admission itself is pure CPU (about a millisecond for a typical pod) and runs inline.

Stopping (SIGTERM, as the kubelet stops a pod): /readyz answers 503, the listener closes, idle connections are
closed, requests in flight finish (up to STOP_GRACE_S), then it returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shim.http1_server import Bounds, Http1Server, Request, Response
from shim.webhook import admission
from shim.webhook.tls import ReloadingContext

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 90.0        # the API server keeps connections to webhooks alive between admissions
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_CONNECTIONS = 512
STOP_GRACE_S = 10.0


@dataclass
class WebhookConfig:
    listen_host: str = "0.0.0.0"
    listen_port: int = 8443
    cert_file: str = "/etc/probe-shim/webhook/tls.crt"
    key_file: str = "/etc/probe-shim/webhook/tls.key"
    own_namespace: str = ""          # never mutated: the webhook's pods must not depend on it
    allow_host: bool = False         # convert handlers with a host outside the pod (the nodes' shims must allow it)
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S


@dataclass
class _Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.admissions = Counter("probe_shim_webhook_admissions_total", "Admission requests by result",
                                  ["result", "dry_run"], registry=self.registry)
        self.duration = Histogram("probe_shim_webhook_admission_duration_seconds",
                                  "Time from a request's last byte to its answer", registry=self.registry,
                                  buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.refused = Counter("probe_shim_webhook_requests_refused_total",
                               "Requests answered with an HTTP error or cut", ["reason"], registry=self.registry)
        self.connections = Gauge("probe_shim_webhook_connections", "Open client connections",
                                 registry=self.registry)  # read from the server (WebhookServer)


class WebhookServer:
    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.tls = ReloadingContext(config.cert_file, config.key_file)
        self.metrics = _Metrics()
        Gauge("probe_shim_webhook_certificate_reloads_total", "Certificate pairs loaded after the first",
              registry=self.metrics.registry).set_function(lambda: self.tls.reloads)
        self.ready = False
        self.port = 0
        self.http = Http1Server(self._route, Bounds(
            max_connections=MAX_CONNECTIONS, max_head_bytes=MAX_HEAD_BYTES, max_body_bytes=MAX_BODY_BYTES,
            request_timeout_s=config.request_timeout_s, write_timeout_s=config.request_timeout_s,
            idle_timeout_s=IDLE_TIMEOUT_S, keep_alive=True, timeout_status=408, stop_grace_s=STOP_GRACE_S),
            on_refused=lambda reason: self.metrics.refused.labels(reason).inc())
        self.metrics.connections.set_function(lambda: self.http.connections)

    async def start(self) -> None:
        context = self.tls.listening_context()
        await self.http.start(self.config.listen_host, self.config.listen_port, ssl=context,
                              ssl_handshake_timeout=self.config.handshake_timeout_s)
        self.port = self.http.addresses[0][1]
        self.ready = True
        log.info("webhook serving", extra={"port": self.port, "cert_file": self.config.cert_file})

    async def stop(self) -> None:
        self.ready = False
        self.http.close()
        await self.http.wait_closed()
        log.info("webhook stopped")

    # --- routes ---

    async def _route(self, request: Request) -> Response:
        method, path = request.method, request.path
        if path == "/mutate":
            if method != "POST":
                return _text(405, b"POST an AdmissionReview\n")
            return Response(200, [("content-type", "application/json")], self._admit(request.body))
        if method != "GET":
            return _text(405, b"GET only\n")
        if path == "/healthz":
            return _text(200, b"ok\n")
        if path == "/readyz":
            return _text(200, b"ok\n") if self.ready else _text(503, b"stopping\n")
        if path == "/metrics":
            return Response(200, [("content-type", "text/plain; version=0.0.4")],
                            generate_latest(self.metrics.registry))
        return _text(404, b"not found\n")

    def _admit(self, body: bytes) -> bytes:
        began = time.perf_counter()
        try:
            request = admission.request_of(body)
        except admission.BadReview as exc:
            uid = admission.uid_of(body)
            self.metrics.admissions.labels(admission.REFUSED, "false").inc()
            log.warning("admission refused: %s", exc, extra={"uid": uid})
            return json.dumps(admission.refusal(uid, str(exc))).encode()
        try:
            decided = admission.admit(request, own_namespace=self.config.own_namespace,
                                      allow_host=self.config.allow_host)
        except Exception:  # noqa: BLE001 - a bug must not become a hung or dropped admission: refuse, with the uid
            log.exception("admission failed", extra={"uid": request["uid"]})
            self.metrics.admissions.labels(admission.REFUSED, "false").inc()
            return json.dumps(admission.refusal(request["uid"], "internal error converting the pod")).encode()
        answer = json.dumps(decided.review(), separators=(",", ":")).encode()
        elapsed = time.perf_counter() - began
        self.metrics.admissions.labels(decided.outcome, str(decided.dry_run).lower()).inc()
        self.metrics.duration.observe(elapsed)
        log.info("admission", extra={"uid": decided.uid, "namespace": decided.namespace, "pod": decided.name,
                                     "result": decided.outcome, "reason": decided.reason,
                                     "patch_ops": len(decided.patch), "warnings": len(decided.warnings),
                                     "dry_run": decided.dry_run, "duration_ms": round(elapsed * 1000, 3)})
        return answer


def _text(status: int, body: bytes) -> Response:
    return Response(status, [("content-type", "text/plain")], body)


async def serve(config: WebhookConfig) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully."""
    server = WebhookServer(config)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop()
