"""The webhook's HTTPS server: asyncio streams, TLS (shim/webhook/tls.py), HTTP/1.1 framed by h11 (sans-IO).

Routes: `POST /mutate` (an AdmissionReview, shim/webhook/admission.py), `GET /healthz` (serving), `GET /readyz`
(serving and not stopping: a Service takes the replica out before it goes), `GET /metrics` (Prometheus text).

Bounds, so that no client can hang it or grow it (each measured against what the kube-apiserver sends):
- a TLS handshake must finish within HANDSHAKE_TIMEOUT_S, a request (head and body) within REQUEST_TIMEOUT_S of
  its first byte, and a kept-alive connection must start its next request within IDLE_TIMEOUT_S: a client that
  sends a byte a second, or never finishes its handshake, is cut and costs one small task meanwhile;
- a head of at most MAX_HEAD_BYTES and a body of at most MAX_BODY_BYTES (the API server's own limit on a request
  is 3 MiB; a larger Content-Length is refused before a byte of the body is read, 413);
- at most MAX_CONNECTIONS at once; more are closed at once.
The admission itself is pure CPU (about a millisecond for a typical pod) and runs inline.

Stopping (SIGTERM, as the kubelet stops a pod): /readyz answers 503, the listener closes, idle connections are
closed, requests in flight finish (up to STOP_GRACE_S), then it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass, field

import h11
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
READ_CHUNK = 65536


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


class _Refused(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # the metric's label: a fixed word, never the client's bytes


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
                                 registry=self.registry)


class WebhookServer:
    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.tls = ReloadingContext(config.cert_file, config.key_file)
        self.metrics = _Metrics()
        Gauge("probe_shim_webhook_certificate_reloads_total", "Certificate pairs loaded after the first",
              registry=self.metrics.registry).set_function(lambda: self.tls.reloads)
        self.ready = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._idle: set[asyncio.Task] = set()
        self._busy: set[asyncio.Task] = set()

    async def start(self) -> None:
        context = self.tls.listening_context()
        self._server = await asyncio.start_server(
            self._connection, self.config.listen_host, self.config.listen_port, ssl=context,
            ssl_handshake_timeout=self.config.handshake_timeout_s, limit=READ_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]
        self.ready = True
        log.info("webhook serving", extra={"port": self.port, "cert_file": self.config.cert_file})

    async def stop(self) -> None:
        self.ready = False
        if self._server is not None:
            self._server.close()
        for task in list(self._idle):
            task.cancel()
        if self._busy:
            await asyncio.wait(list(self._busy), timeout=STOP_GRACE_S)
        for task in list(self._busy):
            task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), STOP_GRACE_S)
        log.info("webhook stopped")

    # --- one connection ---

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._idle) + len(self._busy) >= MAX_CONNECTIONS:
            self.metrics.refused.labels("too many connections").inc()
            writer.close()
            return
        self.metrics.connections.inc()
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            while self.ready:
                self._idle.add(task)
                try:
                    first = await asyncio.wait_for(self._first_bytes(conn, reader), IDLE_TIMEOUT_S)
                finally:
                    self._idle.discard(task)
                if not first:
                    return
                self._busy.add(task)
                try:
                    keep_open = await self._one_request(conn, reader, writer)
                finally:
                    self._busy.discard(task)
                if not keep_open or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (asyncio.TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            return
        finally:
            self.metrics.connections.dec()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _first_bytes(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bool:
        """Waits for the next request's first bytes (data already buffered by h11 counts); False at EOF."""
        if conn.trailing_data[0]:
            return True
        data = await reader.read(READ_CHUNK)
        conn.receive_data(data)
        return bool(data)

    async def _one_request(self, conn, reader, writer) -> bool:
        """Reads one request within the request timeout and answers it; whether the connection may be kept."""
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                request, body = await self._read(conn, reader)
        except TimeoutError:
            self.metrics.refused.labels("request timeout").inc()
            await self._send(conn, writer, 408, b"request not received in time\n", close=True)
            return False
        except _Refused as exc:
            self.metrics.refused.labels(exc.reason).inc()
            await self._send(conn, writer, exc.status, f"{exc}\n".encode(), close=True)
            return False
        if request is None:
            return False
        status, content_type, payload = self._route(request, body)
        await self._send(conn, writer, status, payload, content_type=content_type)
        return True

    async def _read(self, conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request | None, bytes]:
        request, body = None, bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Refused(exc.error_status_hint, f"bad request: {exc}", "bad request") from None
            if event is h11.NEED_DATA:
                data = await reader.read(READ_CHUNK)
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    return None, b""
            elif isinstance(event, h11.Request):
                request = event
                length = dict(event.headers).get(b"content-length")
                if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                    raise _Refused(413, f"request body larger than {MAX_BODY_BYTES} bytes", "body too large")
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise _Refused(413, f"request body larger than {MAX_BODY_BYTES} bytes", "body too large")
            elif isinstance(event, h11.EndOfMessage):
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def _send(self, conn, writer, status: int, payload: bytes, *, content_type: str = "text/plain",
                    close: bool = False) -> None:
        headers = [("content-type", content_type), ("content-length", str(len(payload)))]
        if close or not self.ready:
            headers.append(("connection", "close"))
        try:
            data = conn.send(h11.Response(status_code=status, headers=headers))
            data += conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            return  # the request was too broken to answer in HTTP: the connection just closes
        writer.write(data)
        await asyncio.wait_for(writer.drain(), self.config.request_timeout_s)

    # --- routes ---

    def _route(self, request: h11.Request, body: bytes) -> tuple[int, str, bytes]:
        method, path = request.method.decode(), request.target.decode("latin-1").split("?", 1)[0]
        if path == "/mutate":
            if method != "POST":
                return 405, "text/plain", b"POST an AdmissionReview\n"
            return 200, "application/json", self._admit(body)
        if method != "GET":
            return 405, "text/plain", b"GET only\n"
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            return (200, "text/plain", b"ok\n") if self.ready else (503, "text/plain", b"stopping\n")
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", generate_latest(self.metrics.registry)
        return 404, "text/plain", b"not found\n"

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
