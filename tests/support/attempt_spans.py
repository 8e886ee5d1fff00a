"""An AttemptTracer (shim/observe/tracing.py) that records into memory, and the reads its tests make of the spans:
shared by the unit tests on built attempts and the system test on a real worker's attempt."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cri_proto import probe_spec_pb2 as spec_pb
from shim.observe.tracing import AttemptTracer
from shim.state.results import ProbeLabels


def make_tracer(**kwargs) -> tuple[AttemptTracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    return AttemptTracer(span_processor=SimpleSpanProcessor(memory), **kwargs), memory


def record(tracer: AttemptTracer, attempt: spec_pb.Attempt, **overrides) -> tuple[str, str]:
    identity = dict(probe_id="p-1", probe_type=spec_pb.READINESS, sandbox_id="sb-1", container_name="web",
                    pod_name="web-0", pod_namespace="shop", pod_uid="uid-1")
    args = dict(spec=spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/a")))
    for key, value in overrides.items():
        (identity if key in identity else args)[key] = value
    return tracer.record(attempt, ProbeLabels(**identity), **args)


def by_name(spans, name):
    return [s for s in spans if s.name == name]
