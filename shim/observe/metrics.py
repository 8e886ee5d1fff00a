"""The daemon's Prometheus metrics (the HTTP endpoint that serves them is metrics_http.py's).

`prober_probe_total` and `prober_probe_duration_seconds` are the kubelet's
(1.32, pkg/kubelet/prober/prober_manager.go and worker.go): same names, label
names and values, help texts, buckets, and the same rule for which results
observe the histogram, so dashboards and alerts written for the kubelet work
unchanged. `probe_shim_*` are the daemon's own.

Everything lives in a private CollectorRegistry: nothing leaks into, or is
read from, prometheus_client's global one.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import LATE_AFTER_NS
from shim.observe.metrics_http import MetricsServer, parse_listen

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
        self._bridged_series: dict[tuple[str, str], Counter] = {}  # never removed: bounded by roles x answers
        # The labelled series of each probe and result, found with one dict lookup per attempt instead of
        # prometheus_client's label validation and locking; forget_probe drops them with the series.
        self._attempt_series: dict[tuple[ProbeLabels, int], _ProbeSeries] = {}
        # What is exposed: the same metrics without prometheus_client's *_created
        # series, which the kubelet (Go client, text format) does not emit.
        self._exposed = CollectorRegistry()
        self._exposed.register(_WithoutCreated(self.registry))

    def observe_attempt(
        self, labels: ProbeLabels, result: int, duration_s: float, *, late: bool = False, ticks_missed: int = 0,
    ) -> None:
        """One attempt: its result and duration, whether it started late, the ticks dropped before it."""
        # Keyed by the labels value itself (the results manager keeps one per probe): no label strings per attempt.
        series = self._attempt_series.get((labels, result))
        if series is None:
            series = self._attempt_series[labels, result] = self._series_for(
                probe_type_label(labels.probe_type), RESULT_LABELS.get(result, "unknown"), labels.container_name,
                labels.pod_name, labels.pod_namespace, labels.pod_uid)
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
        for key in [k for k in self._attempt_series if _histogram_key(k[0]) == histogram_key]:
            del self._attempt_series[key]

    def observe_bridged(self, role: str, answer: str) -> None:
        # A handful of (role, answer) series, each looked up once: labels() validates and locks at every call.
        series = self._bridged_series.get((role, answer))
        if series is None:
            series = self._bridged_series[role, answer] = self._bridged.labels(role, answer)
        series.inc()

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

    async def serve(self, listen: str) -> MetricsServer | None:
        """Serves GET /metrics on `listen` ("host:port", "[v6]:port"); "" serves nothing."""
        if not listen:
            return None
        host, port = parse_listen(listen)
        server = MetricsServer(self)
        await server.start(host, port)
        return server


def probe_type_label(probe_type: int) -> str:
    return PROBE_TYPE_LABELS.get(probe_type, "UNKNOWN")


def _histogram_key(labels: ProbeLabels) -> tuple[str, str, str, str]:
    """The label values of a probe's per-probe series (prober_probe_duration_seconds's)."""
    return probe_type_label(labels.probe_type), labels.container_name, labels.pod_name, labels.pod_namespace


class _WithoutCreated:
    """A collector that passes another registry's metrics on without *_created samples."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        for metric in self._source.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric
