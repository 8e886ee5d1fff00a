"""shim/observe/tracing.py: attempts become span trees with the attempt's own timestamps."""

from __future__ import annotations

import io
import json
import sys

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from cri_proto import probe_spec_pb2 as spec_pb
from shim.config import ConfigError
from shim.observe.tracing import MAX_PHASE_SPANS, AttemptTracer, grpc_status_attributes, split_address
from tests.support.attempt_spans import by_name, make_tracer, record

T0 = 1_700_000_000_123_456_789  # attempt start, ns since the epoch
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def http_attempt_with_redirect() -> spec_pb.Attempt:
    """An HTTP attempt that followed one redirect: connect, request, then a nested hop."""
    return spec_pb.Attempt(
        result=spec_pb.RESULT_SUCCESS,
        output="ok",
        started_at_unix_ns=T0,
        duration_ns=9_000_000,
        address="198.18.0.2:8080",
        http_status_code=200,
        phases=[
            spec_pb.Phase(name="connect", start_offset_ns=100_000, duration_ns=400_000, detail="198.18.0.2:8080"),
            spec_pb.Phase(name="request", start_offset_ns=500_000, duration_ns=1_000_000, detail="GET /a HTTP/1.1"),
            spec_pb.Phase(
                name="redirect", start_offset_ns=2_000_000, duration_ns=6_000_000, detail="http://198.18.0.2:8080/ok",
                children=[
                    spec_pb.Phase(name="connect", start_offset_ns=2_100_000, duration_ns=300_000),
                    spec_pb.Phase(name="request", start_offset_ns=2_500_000, duration_ns=1_000_000),
                ],
            ),
        ],
    )


def test_one_span_per_attempt_with_a_child_per_phase_and_nested_redirect_hops():
    tracer, memory = make_tracer()
    record(tracer, http_attempt_with_redirect())
    spans = memory.get_finished_spans()
    (root,) = by_name(spans, "probe readiness http")
    assert root.parent is None and root.kind == SpanKind.CLIENT
    children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert [s.name for s in sorted(children, key=lambda s: s.start_time)] == ["connect", "request", "redirect"]
    (redirect,) = by_name(spans, "redirect")
    hop = sorted((s for s in spans if s.parent is not None and s.parent.span_id == redirect.context.span_id),
                 key=lambda s: s.start_time)
    assert [s.name for s in hop] == ["connect", "request"]
    assert len(spans) == 6
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}


def test_span_times_are_the_attempts_not_the_recording_moment():
    tracer, memory = make_tracer()
    record(tracer, http_attempt_with_redirect())
    spans = memory.get_finished_spans()
    (root,) = by_name(spans, "probe readiness http")
    assert (root.start_time, root.end_time) == (T0, T0 + 9_000_000)
    (redirect,) = by_name(spans, "redirect")
    assert (redirect.start_time, redirect.end_time) == (T0 + 2_000_000, T0 + 8_000_000)
    # Nested offsets are from the attempt's start too, not from the parent phase.
    hop_connect = [s for s in by_name(spans, "connect") if s.parent.span_id == redirect.context.span_id][0]
    assert (hop_connect.start_time, hop_connect.end_time) == (T0 + 2_100_000, T0 + 2_400_000)
    first_connect = [s for s in by_name(spans, "connect") if s.parent.span_id == root.context.span_id][0]
    assert first_connect.attributes["probe.phase.detail"] == "198.18.0.2:8080"


def test_attempt_attributes():
    tracer, memory = make_tracer()
    record(tracer, http_attempt_with_redirect())
    (root,) = by_name(memory.get_finished_spans(), "probe readiness http")
    assert dict(root.attributes) == {
        "probe.id": "p-1",
        "probe.type": "readiness",
        "probe.kind": "http",
        "probe.result": "success",
        "probe.output": "ok",
        "cri.pod_sandbox.id": "sb-1",
        "k8s.pod.name": "web-0",
        "k8s.namespace.name": "shop",
        "k8s.pod.uid": "uid-1",
        "k8s.container.name": "web",
        "network.peer.address": "198.18.0.2",
        "network.peer.port": 8080,
        "http.response.status_code": 200,
    }
    assert root.status.status_code == StatusCode.UNSET
    assert root.resource.attributes["service.name"] == "cri-probe-shim"


def test_failure_is_an_error_span_with_the_output_and_a_failed_phase_too():
    attempt = spec_pb.Attempt(
        result=spec_pb.RESULT_FAILURE, started_at_unix_ns=T0, duration_ns=1_000_000, address="[fd00:5a::2]:9000",
        output='Get "http://[fd00:5a::2]:9000/": dial tcp [fd00:5a::2]:9000: connect: connection refused',
        phases=[spec_pb.Phase(name="connect", duration_ns=50_000, error="connection refused")],
    )
    tracer, memory = make_tracer()
    record(tracer, attempt, probe_type=spec_pb.LIVENESS)
    (root,) = by_name(memory.get_finished_spans(), "probe liveness http")
    assert root.status.status_code == StatusCode.ERROR
    assert root.status.description == attempt.output
    assert root.attributes["probe.result"] == "failure"
    assert (root.attributes["network.peer.address"], root.attributes["network.peer.port"]) == ("fd00:5a::2", 9000)
    (connect,) = by_name(memory.get_finished_spans(), "connect")
    assert connect.status.status_code == StatusCode.ERROR and connect.status.description == "connection refused"


def test_unknown_is_an_error_and_long_output_is_truncated():
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_UNKNOWN, started_at_unix_ns=T0, output="x" * 5000)
    tracer, memory = make_tracer()
    record(tracer, attempt, spec=None, probe_type=spec_pb.STARTUP)
    (root,) = memory.get_finished_spans()
    assert root.name == "probe startup"
    assert root.status.status_code == StatusCode.ERROR
    assert root.attributes["probe.result"] == "unknown"
    assert len(root.attributes["probe.output"]) == 1024 and root.attributes["probe.output"].endswith("...")
    assert "network.peer.address" not in root.attributes and "http.response.status_code" not in root.attributes


def test_warning_is_not_an_error():
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_WARNING, started_at_unix_ns=T0, http_status_code=302,
                              output="Probe terminated redirects, Response body: ")
    tracer, memory = make_tracer()
    record(tracer, attempt)
    (root,) = memory.get_finished_spans()
    assert root.status.status_code == StatusCode.UNSET
    assert root.attributes["probe.result"] == "warning" and root.attributes["http.response.status_code"] == 302


def test_phase_spans_per_attempt_are_bounded():
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=T0, duration_ns=1000,
                              phases=[spec_pb.Phase(name="connect") for _ in range(MAX_PHASE_SPANS + 50)])
    tracer, memory = make_tracer()
    record(tracer, attempt)
    assert len(memory.get_finished_spans()) == 1 + MAX_PHASE_SPANS


def test_grpc_status_attributes_tell_codes_from_serving_statuses():
    def attributes(**fields):
        return grpc_status_attributes(spec_pb.Attempt(**fields))

    assert attributes() == {}
    assert attributes(grpc_serving_status=spec_pb.GRPC_SERVING) == {
        "probe.grpc.status": "SERVING", "rpc.grpc.status_code": 0, "probe.grpc.serving_status": "SERVING"}
    assert attributes(grpc_serving_status=spec_pb.GRPC_NOT_SERVING)["probe.grpc.serving_status"] == "NOT_SERVING"
    assert attributes(grpc_code=14) == {"probe.grpc.status": "Unavailable", "rpc.grpc.status_code": 14}
    assert attributes(grpc_code=2)["rpc.grpc.status_code"] == 2
    assert attributes(grpc_serving_status=spec_pb.GRPC_UNKNOWN)["rpc.grpc.status_code"] == 0  # answered UNKNOWN
    assert attributes(grpc_code=0) == {"probe.grpc.status": "OK", "rpc.grpc.status_code": 0}
    assert attributes(grpc_code=17) == {"probe.grpc.status": "Code(17)", "rpc.grpc.status_code": 17}


def test_grpc_attempt_span():
    attempt = spec_pb.Attempt(result=spec_pb.RESULT_FAILURE, started_at_unix_ns=T0,
                              grpc_serving_status=spec_pb.GRPC_NOT_SERVING,
                              output='service unhealthy (responded with "NOT_SERVING")', address="198.18.0.2:50051")
    tracer, memory = make_tracer()
    record(tracer, attempt, spec=spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=50051)))
    (root,) = memory.get_finished_spans()
    assert root.name == "probe readiness grpc"
    assert root.attributes["probe.grpc.status"] == "NOT_SERVING" and root.attributes["rpc.grpc.status_code"] == 0


def test_split_address():
    assert split_address("10.0.0.1:80") == ("10.0.0.1", 80)
    assert split_address("[::1]:443") == ("::1", 443)
    assert split_address("") is None
    assert split_address("10.0.0.1") is None


def test_returned_ids_are_the_exported_attempt_span():
    tracer, memory = make_tracer()
    trace_id, span_id = record(tracer, http_attempt_with_redirect())
    (root,) = by_name(memory.get_finished_spans(), "probe readiness http")
    assert trace_id == format(root.context.trace_id, "032x") and len(trace_id) == 32
    assert span_id == format(root.context.span_id, "016x") and len(span_id) == 16
    # Two attempts are two traces.
    other_trace, other_span = record(tracer, http_attempt_with_redirect())
    assert other_trace != trace_id and other_span != span_id


def test_traceparent_makes_the_attempt_a_child_of_the_callers_span():
    tracer, memory = make_tracer()
    trace_id, _ = record(tracer, http_attempt_with_redirect(), traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                         tracestate="vendor=x")
    (root,) = by_name(memory.get_finished_spans(), "probe readiness http")
    assert trace_id == CALLER_TRACE
    assert format(root.context.trace_id, "032x") == CALLER_TRACE
    assert root.parent is not None and root.parent.is_remote
    assert format(root.parent.span_id, "016x") == CALLER_SPAN
    assert root.context.trace_state.get("vendor") == "x"
    assert {format(s.context.trace_id, "032x") for s in memory.get_finished_spans()} == {CALLER_TRACE}


def test_unsampled_traceparent_is_honoured_but_ids_still_returned():
    tracer, memory = make_tracer()
    trace_id, span_id = record(tracer, http_attempt_with_redirect(), traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-00")
    assert memory.get_finished_spans() == ()
    assert trace_id == CALLER_TRACE and span_id not in ("", "0" * 16, CALLER_SPAN)


def test_malformed_traceparent_starts_a_new_trace():
    tracer, memory = make_tracer()
    trace_id, _ = record(tracer, http_attempt_with_redirect(), traceparent="not-a-traceparent")
    (root,) = by_name(memory.get_finished_spans(), "probe readiness http")
    assert root.parent is None and trace_id != CALLER_TRACE and int(trace_id, 16) != 0


def test_none_exporter_still_gives_real_ids():
    tracer = AttemptTracer()
    trace_id, span_id = record(tracer, http_attempt_with_redirect())
    assert int(trace_id, 16) != 0 and int(span_id, 16) != 0
    assert tracer.shutdown() is True


def test_none_exporter_ids_follow_the_callers_trace_like_real_spans():
    tracer = AttemptTracer()
    trace_id, span_id = record(tracer, http_attempt_with_redirect(), traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    assert trace_id == CALLER_TRACE and span_id not in ("0" * 16, CALLER_SPAN)
    other_trace, other_span = record(tracer, http_attempt_with_redirect(), traceparent="not-a-traceparent")
    assert other_trace not in (CALLER_TRACE, "0" * 32) and other_span != span_id
    # New ids for every attempt, never a constant.
    assert len({record(tracer, http_attempt_with_redirect())[0] for _ in range(20)}) == 20


def test_console_exporter_writes_one_json_line_per_span():
    stream = io.StringIO()
    tracer = AttemptTracer("console", console_stream=stream, service_name="shim-test")
    trace_id, span_id = record(tracer, http_attempt_with_redirect())
    assert tracer.shutdown() is True  # flushes the batch
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6
    spans = [json.loads(line) for line in lines]
    root = [s for s in spans if s["name"] == "probe readiness http"][0]
    assert root["context"]["trace_id"] == "0x" + trace_id and root["context"]["span_id"] == "0x" + span_id
    assert root["resource"]["attributes"]["service.name"] == "shim-test"


def test_unknown_exporter_is_a_config_error():
    with pytest.raises(ConfigError, match="none, console, otlp"):
        AttemptTracer("jaeger")


def test_otlp_without_the_package_names_the_extra(monkeypatch):
    # A None entry in sys.modules makes the import fail as if the package were absent,
    # whatever is installed on this machine.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(ConfigError, match=r"pip install 'cri-probe-shim\[otlp\]'"):
        AttemptTracer("otlp", otlp_endpoint="http://127.0.0.1:4317")


def test_otlp_exporter_delivers_the_spans_to_a_collector():
    # The real exporter (OTLP/gRPC, the [otlp] extra: `make test` installs it) against a collector on loopback. The
    # collector needs the extra too: imported here, so that without it this test fails and the others still run.
    from tests.support.otlp_collector import OtlpCollector

    with OtlpCollector() as collector:
        tracer = AttemptTracer("otlp", otlp_endpoint=collector.endpoint, service_name="shim-test")
        trace_id, span_id = record(tracer, http_attempt_with_redirect())
        assert tracer.shutdown(timeout_s=10) is True  # flushed: the batch went out and the collector answered
        spans = collector.wait_for(6)
    assert len(spans) == 6
    assert sorted(s.name for s in spans) == ["connect", "connect", "probe readiness http", "redirect", "request",
                                             "request"]
    assert {s.trace_id for s in spans} == {trace_id}
    (root,) = [s for s in spans if s.name == "probe readiness http"]
    assert (root.span_id, root.parent_span_id) == (span_id, "")
    assert root.resource["service.name"] == "shim-test"
    assert root.attributes == {
        "probe.id": "p-1", "probe.type": "readiness", "probe.result": "success", "cri.pod_sandbox.id": "sb-1",
        "probe.kind": "http", "k8s.pod.name": "web-0", "k8s.namespace.name": "shop", "k8s.pod.uid": "uid-1",
        "k8s.container.name": "web", "probe.output": "ok", "network.peer.address": "198.18.0.2",
        "network.peer.port": 8080, "http.response.status_code": 200,
    }
    (redirect,) = [s for s in spans if s.name == "redirect"]
    assert redirect.parent_span_id == span_id
    assert redirect.attributes["probe.phase.detail"] == "http://198.18.0.2:8080/ok"
    assert sorted(s.name for s in spans if s.parent_span_id == redirect.span_id) == ["connect", "request"]
