"""A stand-in for an OpenTelemetry collector: an OTLP/gRPC trace receiver on loopback that keeps what it is sent.

Owns: the receiving end the daemon's "otlp" exporter (shim/observe/tracing.py) talks to in tests, so the exporter's
real path runs (protobuf encoding, gRPC export, the batch processor's flush) and the spans can be read back as the
collector got them. The service and messages are opentelemetry-proto's (installed with cri-probe-shim[otlp]), the
ones the exporter is built against: a request it could not encode or a collector could not parse fails here too.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str           # hex, as the tracer returns it
    span_id: str
    parent_span_id: str     # "" for a root span
    attributes: dict
    resource: dict          # the resource attributes of the span's batch


def _value(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: OtlpCollector) -> None:
        self._collector = collector

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        self._collector._add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpCollector:
    """Listens on 127.0.0.1 (a free port) until closed; `endpoint` is what the exporter is given."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._arrived = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"  # the scheme tells the exporter: no TLS
        self._server.start()

    def _add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = [
            ReceivedSpan(name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                         parent_span_id=span.parent_span_id.hex(), attributes=_attributes(span.attributes),
                         resource=_attributes(batch.resource.attributes))
            for batch in request.resource_spans for scope in batch.scope_spans for span in scope.spans
        ]
        with self._arrived:
            self._spans += spans
            self._arrived.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """The spans received, once there are at least `count` (AssertionError after timeout_s)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._spans) >= count, timeout_s):
                raise AssertionError(f"the collector got {len(self._spans)} spans in {timeout_s:g} s, not {count}")
            return list(self._spans)

    def close(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> OtlpCollector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
