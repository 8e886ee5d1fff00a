"""Attempts as OpenTelemetry spans: one span per attempt, one child span per phase.

The worker never loads a tracing SDK: it reports each attempt as data (wall-clock
start, duration, phases as offsets from the start). This module, imported only
by the daemon, replays that data as spans with explicit timestamps, so a span's
times are the attempt's and not the moment the daemon heard about it.

Exporters: "none" (no span is built, but each attempt still gets real trace and
span ids, which status shows), "console" (one JSON line per span) and "otlp"
(OTLP/gRPC, an optional extra).
A W3C `traceparent` from the API caller makes the attempt span its child.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from typing import IO, TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, format_span_id, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.grpc_codes import code_name, serving_status_text
from shim.config import ConfigError

if TYPE_CHECKING:  # the value only: results.py is the tracer's caller, not a dependency
    from shim.state.results import ProbeLabels

EXPORTERS = ("none", "console", "otlp")
OTLP_EXTRA = "cri-probe-shim[otlp]"
# Attribute values are kept short: the full output is in the probe's status.
MAX_OUTPUT_ATTRIBUTE = 1024
# A real attempt has a handful of phases (3 tries, 10 redirect hops at most); the
# worker parses pod bytes, so what it reports is bounded before it becomes spans.
MAX_PHASE_SPANS = 128

_RESULT_NAMES = {
    spec_pb.RESULT_SUCCESS: "success",
    spec_pb.RESULT_WARNING: "warning",
    spec_pb.RESULT_FAILURE: "failure",
    spec_pb.RESULT_UNKNOWN: "unknown",
}
_FAILED = (spec_pb.RESULT_FAILURE, spec_pb.RESULT_UNKNOWN)
_PROPAGATOR = TraceContextTextMapPropagator()


class AttemptTracer:
    """Turns finished attempts into spans and hands them to the configured exporter."""

    def __init__(
        self,
        exporter: str = "none",
        *,
        service_name: str = "cri-probe-shim",
        otlp_endpoint: str | None = None,
        span_processor: SpanProcessor | None = None,
        console_stream: IO[str] | None = None,
    ) -> None:
        if exporter not in EXPORTERS:
            raise ConfigError(f"trace exporter: must be one of {', '.join(EXPORTERS)}, not {exporter!r}")
        # A private provider, not the global one, so tests can build as many as they
        # like; no atexit hook, the daemon calls shutdown() itself, bounded.
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), shutdown_on_exit=False
        )
        self._id_generator = RandomIdGenerator()
        span_exporter = _make_exporter(exporter, otlp_endpoint, console_stream)
        # With nothing to hand spans to, building them (an attempt span plus one per phase,
        # through the SDK's sampler, attribute cleaning and processors) would be most of the
        # daemon's CPU per attempt, for spans that go nowhere: only their ids are kept.
        self._ids_only = span_exporter is None and span_processor is None
        if span_exporter is not None:
            # Exports happen on the processor's thread: a slow collector or a full
            # stderr pipe never stalls the daemon's event loop.
            self._provider.add_span_processor(BatchSpanProcessor(span_exporter))
        if span_processor is not None:
            self._provider.add_span_processor(span_processor)
        self._tracer = self._provider.get_tracer("cri_probe_shim.attempts")

    def record(
        self,
        attempt: spec_pb.Attempt,
        labels: ProbeLabels,
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
        spec: spec_pb.ProbeSpec | None = None,
    ) -> tuple[str, str]:
        """Records one finished attempt; returns its span's (trace id, span id) in hex."""
        if self._ids_only:
            return self._new_ids(traceparent, tracestate)
        kind = handler_kind(spec)
        start = attempt.started_at_unix_ns
        span = self._tracer.start_span(
            span_name(labels.probe_type, kind),
            context=parent_context(traceparent, tracestate),
            kind=SpanKind.CLIENT,
            attributes=attempt_attributes(attempt, labels, kind=kind),
            start_time=start,
        )
        if not span.is_recording():
            # Not sampled (an unsampled caller's traceparent, a ratio or always_off sampler): the SDK drops it, and
            # its phases' spans with it (each built-in sampler decides a child as its parent: by the parent's flag
            # or by the same trace id), so they are not built. Only the ids are kept, as for a recorded span.
            ids = span.get_span_context()
            return format_trace_id(ids.trace_id), format_span_id(ids.span_id)
        if attempt.result in _FAILED:
            span.set_status(Status(StatusCode.ERROR, truncate(attempt.output)))
        inside = trace.set_span_in_context(span, Context())
        budget = [MAX_PHASE_SPANS]
        for phase in attempt.phases:
            self._record_phase(phase, inside, start, budget)
        span.end(end_time=start + max(attempt.duration_ns, 0))
        ids = span.get_span_context()
        return format_trace_id(ids.trace_id), format_span_id(ids.span_id)

    def _new_ids(self, traceparent: str | None, tracestate: str | None) -> tuple[str, str]:
        """The ids the SDK would give the attempt span: the caller's trace id if it sent a valid
        parent, else a new random one, and a new random span id."""
        ids = self._id_generator
        if traceparent:
            parent = trace.get_current_span(parent_context(traceparent, tracestate)).get_span_context()
            trace_id = parent.trace_id if parent.is_valid else ids.generate_trace_id()
        else:  # no parent to read (the kubelet's calls, a worker's own attempts): a new trace
            trace_id = ids.generate_trace_id()
        # format_trace_id / format_span_id's text (lowercase hex, zero-padded), at half their cost: the daemon
        # does this at every attempt.
        return trace_id.to_bytes(16, "big").hex(), ids.generate_span_id().to_bytes(8, "big").hex()

    def _record_phase(self, phase: spec_pb.Phase, parent: Context, attempt_start: int, budget: list[int]) -> None:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        start = attempt_start + phase.start_offset_ns
        attributes = {"probe.phase.detail": phase.detail} if phase.detail else None
        span = self._tracer.start_span(phase.name or "phase", context=parent, attributes=attributes, start_time=start)
        if phase.error:
            span.set_status(Status(StatusCode.ERROR, phase.error))
        inside = trace.set_span_in_context(span, Context())
        for child in phase.children:
            self._record_phase(child, inside, attempt_start, budget)
        span.end(end_time=start + max(phase.duration_ns, 0))

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Exports what is queued, then stops the exporters (once, at daemon exit).

        Bounded: an unreachable OTLP collector makes the SDK retry for many
        seconds, and a stopping daemon must not wait on it. Returns False when
        the exporters had not finished after timeout_s (their spans are lost).
        Blocking: from the event loop, run it with asyncio.to_thread.
        """
        stopper = threading.Thread(target=self._provider.shutdown, name="otel-shutdown", daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        return not stopper.is_alive()


def _make_exporter(exporter: str, otlp_endpoint: str | None, console_stream: IO[str] | None) -> SpanExporter | None:
    if exporter == "console":
        return ConsoleSpanExporter(out=console_stream or sys.stderr, formatter=_one_line)
    if exporter == "otlp":
        return _otlp_exporter(otlp_endpoint)
    return None


def _one_line(span) -> str:
    return span.to_json(indent=None) + "\n"


def _otlp_exporter(endpoint: str | None) -> SpanExporter:
    # Imported here on purpose: OTLP is an optional extra, and only a daemon
    # configured for it should need the package.
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            f"trace exporter 'otlp' needs the OTLP exporter package: pip install '{OTLP_EXTRA}' "
            f"(opentelemetry-exporter-otlp-proto-grpc) ({exc})"
        ) from None
    # None leaves the package's defaults: OTEL_EXPORTER_OTLP_* variables, else localhost:4317.
    return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()


# ----------------------------------------------------------------- pure helpers


def traceparent_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The W3C trace parent a caller sent with its call (gRPC metadata), if any."""
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str):
            return value
    return None


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The caller's span as parent, or an empty context (a new trace).

    Never the ambient current context: an attempt's parent is only ever what the
    API caller sent. A malformed traceparent starts a new trace, as W3C Trace
    Context asks of a receiver that cannot parse the header.
    """
    if not traceparent:
        return Context()
    carrier: Mapping[str, str] = {"traceparent": traceparent}
    if tracestate:
        carrier = {**carrier, "tracestate": tracestate}
    return _PROPAGATOR.extract(carrier, context=Context())


def handler_kind(spec: spec_pb.ProbeSpec | None) -> str:
    if spec is None:
        return ""
    for kind, field in (("http", "http_get"), ("tcp", "tcp_socket"), ("grpc", "grpc")):
        if spec.HasField(field):
            return kind
    return ""


def type_name(probe_type: int) -> str:
    try:
        return spec_pb.ProbeType.Name(probe_type).lower()
    except ValueError:
        return str(probe_type)


def span_name(probe_type: int, kind: str) -> str:
    return " ".join(part for part in ("probe", type_name(probe_type), kind) if part)


def split_address(address: str) -> tuple[str, int] | None:
    """ "ip:port" or "[v6]:port" (Go's JoinHostPort) -> (ip, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def grpc_status_attributes(attempt: spec_pb.Attempt) -> dict[str, str | int]:
    """The gRPC call's code (OpenTelemetry's rpc.grpc.status_code: 0 when the service answered) and what the
    service answered, when it did."""
    if attempt.HasField("grpc_code"):
        return {"probe.grpc.status": code_name(attempt.grpc_code), "rpc.grpc.status_code": attempt.grpc_code}
    if not attempt.grpc_serving_status:
        return {}
    serving = serving_status_text(attempt.grpc_serving_status)
    return {"probe.grpc.status": serving, "rpc.grpc.status_code": 0, "probe.grpc.serving_status": serving}


def truncate(text: str, limit: int = MAX_OUTPUT_ATTRIBUTE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def attempt_attributes(attempt: spec_pb.Attempt, labels: ProbeLabels, *, kind: str) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "probe.id": labels.probe_id,
        "probe.type": type_name(labels.probe_type),
        "probe.result": _RESULT_NAMES.get(attempt.result, str(attempt.result)),
        "cri.pod_sandbox.id": labels.sandbox_id,
    }
    optional = {
        "probe.kind": kind,
        "k8s.pod.name": labels.pod_name,
        "k8s.namespace.name": labels.pod_namespace,
        "k8s.pod.uid": labels.pod_uid,
        "k8s.container.name": labels.container_name,
        "probe.output": truncate(attempt.output),
    }
    attributes.update({key: value for key, value in optional.items() if value})
    peer = split_address(attempt.address)
    if peer is not None:
        attributes["network.peer.address"], attributes["network.peer.port"] = peer
    if attempt.http_status_code:
        attributes["http.response.status_code"] = attempt.http_status_code
    attributes.update(grpc_status_attributes(attempt))
    return attributes
