"""The daemon's Prometheus metrics and the HTTP endpoint that serves them.

`prober_probe_total` and `prober_probe_duration_seconds` are the kubelet's
(1.32, pkg/kubelet/prober/prober_manager.go and worker.go): same names, label
names and values, help texts, buckets, and the same rule for which results
observe the histogram, so dashboards and alerts written for the kubelet work
unchanged. `probe_shim_*` are the daemon's own.

Everything lives in a private CollectorRegistry: nothing leaks into, or is
read from, prometheus_client's global one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest, gzip_accepted
from prometheus_client.metrics_core import Metric

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import LATE_AFTER_NS
from shim.config import ConfigError

if TYPE_CHECKING:  # the value only: results.py is the metrics' caller, not a dependency
    from shim.state.results import ProbeLabels

# probeType.String() in prober_manager.go.
PROBE_TYPE_LABELS = {spec_pb.LIVENESS: "Liveness", spec_pb.READINESS: "Readiness", spec_pb.STARTUP: "Startup"}
# prober.go turns probe.Warning into results.Success, so a warning counts as successful.
RESULT_LABELS = {
    spec_pb.RESULT_SUCCESS: "successful",
    spec_pb.RESULT_WARNING: "successful",
    spec_pb.RESULT_FAILURE: "failed",
    spec_pb.RESULT_UNKNOWN: "unknown",
}
# worker.go doProbe observes the histogram for Success and in its default
# (unknown) branch, never for Failure.
OBSERVED_RESULTS = frozenset({"successful", "unknown"})
# component-base HistogramOpts without Buckets means prometheus.DefBuckets (Go),
# which differ from prometheus_client's defaults.
GO_DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_PROBE_TOTAL_LABELS = ("probe_type", "result", "container", "pod", "namespace", "pod_uid")
_DURATION_LABELS = ("probe_type", "container", "pod", "namespace")

# The endpoint's bounds against a misbehaving client (it may be bound beyond loopback).
MAX_CONNECTIONS = 16
MAX_REQUEST_HEAD = 16 * 1024
REQUEST_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class _ProbeSeries:
    """The labelled series one attempt updates, looked up once per (probe, result)."""

    total: Counter
    duration: Histogram | None   # None for results the kubelet does not observe
    late: Counter
    missed: Counter


class ShimMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # component-base prefixes the stability level to the help text: prober_probe_total is BETA since kubelet
        # 1.33 (kubernetes#129761, metrics.BETA in pkg/kubelet/prober), the duration histogram still ALPHA.
        self._probe_total = Counter(
            "prober_probe_total",
            "[BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
            _PROBE_TOTAL_LABELS, registry=self.registry,
        )
        self._probe_duration = Histogram(
            "prober_probe_duration_seconds", "[ALPHA] Duration in seconds for a probe response.",
            _DURATION_LABELS, buckets=GO_DEFAULT_BUCKETS, registry=self.registry,
        )
        self._workers = Gauge(
            "probe_shim_workers", "Probe worker processes running (one per pod sandbox with probes).",
            registry=self.registry,
        )
        self._worker_restarts = Counter(
            "probe_shim_worker_restarts_total", "Probe workers restarted after a crash or missed heartbeats.",
            registry=self.registry,
        )
        self._watchers = Gauge(
            "probe_shim_watch_subscribers", "Open WatchProbeStatus streams.", registry=self.registry
        )
        self._probes = Gauge("probe_shim_probes", "Registered probes.", registry=self.registry)
        # Restarts without a flap: what the store costs behind the board, and what this daemon took over.
        self._store_writes = Counter(
            "probe_shim_state_writes_total", "Transactions writing observed probe state to the store.",
            registry=self.registry,
        )
        self._store_rows = Counter(
            "probe_shim_state_rows_written_total", "Probe rows written to the store by those transactions.",
            registry=self.registry,
        )
        self._adopted = Gauge(
            "probe_shim_adopted_workers", "Running workers this daemon adopted from the one before it at start.",
            registry=self.registry,
        )
        # Punctuality, per probe with the labels of prober_probe_duration_seconds (no pod_uid, no
        # result): one series each per probe, like the kubelet's own per-probe series.
        self._late = Counter(
            "probe_shim_attempts_late_total",
            f"Probe attempts that started more than {LATE_AFTER_NS // 1_000_000} ms after their tick was due.",
            _DURATION_LABELS, registry=self.registry,
        )
        self._missed = Counter(
            "probe_shim_ticks_missed_total",
            "Probe ticks dropped because an attempt (or a stalled worker) outlasted the period; "
            "the kubelet's ticker drops them the same way.",
            _DURATION_LABELS, registry=self.registry,
        )
        # The kubelet bridge: every marker ExecSync by role and answer (an exit code, or a gRPC status name).
        # Low cardinality on purpose: the per-pod story is in prober_probe_total and the spans.
        self._bridged = Counter(
            "probe_shim_bridged_execs_total",
            "Marker ExecSync calls the kubelet bridge answered, by role and answer (exit code or gRPC status).",
            ("role", "answer"), registry=self.registry,
        )
        # The labelled series of each probe, found with one dict lookup per attempt instead of
        # prometheus_client's label validation and locking; forget_probe drops them with the series.
        self._attempt_series: dict[tuple, _ProbeSeries] = {}
        # What is exposed: the same metrics without prometheus_client's *_created
        # series, which the kubelet (Go client, text format) does not emit.
        self._exposed = CollectorRegistry()
        self._exposed.register(_WithoutCreated(self.registry))

    def observe_attempt(
        self, labels: ProbeLabels, result: int, duration_s: float, *, late: bool = False, ticks_missed: int = 0,
    ) -> None:
        """One attempt: its result and duration, whether it started late, the ticks dropped before it."""
        key = (probe_type_label(labels.probe_type), RESULT_LABELS.get(result, "unknown"), labels.container_name,
               labels.pod_name, labels.pod_namespace, labels.pod_uid)
        series = self._attempt_series.get(key)
        if series is None:
            series = self._attempt_series[key] = self._series_for(*key)
        series.total.inc()
        if series.duration is not None:
            series.duration.observe(max(duration_s, 0.0))
        if late:
            series.late.inc()
        if ticks_missed > 0:  # the worker's number: a negative one must not make inc() raise
            series.missed.inc(ticks_missed)

    def _series_for(
        self, type_label: str, result_label: str, container: str, pod: str, namespace: str, pod_uid: str
    ) -> _ProbeSeries:
        per_probe = (type_label, container, pod, namespace)
        return _ProbeSeries(
            total=self._probe_total.labels(type_label, result_label, container, pod, namespace, pod_uid),
            duration=self._probe_duration.labels(*per_probe) if result_label in OBSERVED_RESULTS else None,
            # Created with the probe's first attempt, so they read 0 rather than being absent.
            late=self._late.labels(*per_probe),
            missed=self._missed.labels(*per_probe),
        )

    def forget_probe(self, labels: ProbeLabels) -> None:
        """Drops a removed probe's series, as the kubelet's worker does when it stops."""
        type_label = probe_type_label(labels.probe_type)
        container, pod, namespace, pod_uid = (labels.container_name, labels.pod_name, labels.pod_namespace,
                                              labels.pod_uid)
        for result_label in ("successful", "failed", "unknown"):
            self._probe_total.remove(type_label, result_label, container, pod, namespace, pod_uid)
        for per_probe in (self._probe_duration, self._late, self._missed):
            per_probe.remove(type_label, container, pod, namespace)
        # These have no pod_uid label: a namesake pod's probe (a recreated StatefulSet pod)
        # shared the series just removed, and must not keep observing into the removed objects.
        histogram_key = (type_label, container, pod, namespace)
        for key in [k for k in self._attempt_series if (k[0], *k[2:5]) == histogram_key]:
            del self._attempt_series[key]

    def observe_bridged(self, role: str, answer: str) -> None:
        self._bridged.labels(role, answer).inc()

    def set_workers(self, n: int) -> None:
        self._workers.set(n)

    def inc_worker_restarts(self) -> None:
        self._worker_restarts.inc()

    def count_state_write(self, rows: int) -> None:
        self._store_writes.inc()
        self._store_rows.inc(rows)

    def set_adopted_workers(self, n: int) -> None:
        self._adopted.set(n)

    def count_watchers_with(self, count: Callable[[], int]) -> None:
        """Reads the number of watchers at scrape time, so nothing has to poll it."""
        self._watchers.set_function(count)

    def count_probes_with(self, count: Callable[[], int]) -> None:
        """Reads the number of registered probes at scrape time, so no change has to update it."""
        self._probes.set_function(count)

    def render(self) -> bytes:
        """The Prometheus text exposition format (0.0.4), as the kubelet serves it."""
        return generate_latest(self._exposed)

    def render_for(self, accept: str, *, compress: bool = False) -> tuple[bytes, str]:
        """The format a scraper asked for (text or OpenMetrics), maybe gzipped, and its content type."""
        encoder, content_type = choose_encoder(accept)
        body = encoder(self._exposed)
        return (gzip.compress(body) if compress else body), content_type

    async def serve(self, listen: str) -> "MetricsServer | None":
        """Serves GET /metrics on `listen` ("host:port", "[v6]:port"); "" serves nothing."""
        if not listen:
            return None
        host, port = parse_listen(listen)
        server = MetricsServer(self)
        await server.start(host, port)
        return server


def probe_type_label(probe_type: int) -> str:
    return PROBE_TYPE_LABELS.get(probe_type, "UNKNOWN")


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


class _WithoutCreated:
    """A collector that passes another registry's metrics on without *_created samples."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        for metric in self._source.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class MetricsServer:
    """A small asyncio HTTP/1.1 server (h11 framing) on the daemon's event loop.

    One request per connection, every read and write bounded in size and time,
    at most MAX_CONNECTIONS at once. Rendering runs in a thread so a large
    exposition never stalls probing; prometheus_client's metrics are thread-safe.
    """

    def __init__(self, metrics: ShimMetrics) -> None:
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._closing = False

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._on_connection, host, port, reuse_address=True)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each bound socket; the port is the real one when 0 was asked."""
        assert self._server is not None
        return [sock.getsockname()[:2] for sock in self._server.sockets]

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._connections) >= MAX_CONNECTIONS:
                return
            self._connections.add(task)
            await self._serve_one(reader, writer)
        except (ConnectionError, TimeoutError, h11.LocalProtocolError):
            pass  # the client went away or stalled: nothing to answer
        except asyncio.CancelledError:
            # close() cancelled it. Ending normally matters: asyncio (3.11) logs a
            # spurious error for a cancelled client_connected_cb task.
            if not self._closing:
                raise
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                request = await _read_request(reader, conn)
        except h11.RemoteProtocolError as exc:
            # 400, or 431 for a head over MAX_REQUEST_HEAD
            status = exc.error_status_hint
            headers, body = [("content-type", "text/plain; charset=utf-8")], f"{status} bad request\n".encode()
        else:
            if request is None:
                return
            status, headers, body = await self._answer(request)
        headers = [*headers, ("content-length", str(len(body))), ("connection", "close")]
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()
        await _close_gently(reader, writer)

    async def _answer(self, request: h11.Request) -> tuple[int, list[tuple[str, str]], bytes]:
        path = request.target.split(b"?", 1)[0]
        if path != b"/metrics":
            return 404, [("content-type", "text/plain; charset=utf-8")], b"404 page not found\n"
        if request.method != b"GET":
            return 405, [("allow", "GET"), ("content-type", "text/plain; charset=utf-8")], b"405 method not allowed\n"
        request_headers = dict(request.headers)  # h11 lower-cases names
        accept = request_headers.get(b"accept", b"").decode("latin-1")
        compress = gzip_accepted(request_headers.get(b"accept-encoding", b"").decode("latin-1"))
        # ~0.1 s of CPU for 750 probes: off the event loop.
        body, content_type = await asyncio.to_thread(self._metrics.render_for, accept, compress=compress)
        headers = [("content-type", content_type)]
        if compress:
            headers.append(("content-encoding", "gzip"))
        return 200, headers, body


async def _close_gently(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-closes, then drains what the client still sends (bounded), like Go's
    closeWriteAndWait: closing with unread input would make the kernel send a
    reset, and the client could lose the response it has not read yet."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(LINGER_S):
            budget = LINGER_BYTES
            while budget > 0:
                chunk = await reader.read(min(65536, budget))
                if not chunk:
                    break
                budget -= len(chunk)


async def _read_request(reader: asyncio.StreamReader, conn: h11.Connection) -> h11.Request | None:
    """The request head, or None when the client closed first. The head is
    bounded by h11 (max_incomplete_event_size); a body, if any, is never read."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(8192))
            continue
        if isinstance(event, h11.Request):
            return event
        return None  # ConnectionClosed
