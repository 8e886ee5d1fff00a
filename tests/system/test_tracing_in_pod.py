"""shim/observe/tracing.py on a real attempt: a worker in a pod netns follows a redirect, the tracer makes its span tree
(the tracer on built attempts: tests/unit/test_tracing.py)."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.attempt_spans import by_name, make_tracer, record


@pytest.mark.netns
def test_a_real_attempt_through_a_worker_becomes_a_span_tree(pod_netns, worker):
    server = pod_netns.spawn_python("http_server.py", "--host", "::", "--port", "0")
    try:
        spec = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(
            path="/redirect?to=/ok", port=spec_pb.PortRef(number=server.port)))
        attempt = worker.run_once(spec)
    finally:
        server.stop()
    assert attempt.result == spec_pb.RESULT_SUCCESS, attempt.output
    tracer, memory = make_tracer()
    trace_id, span_id = record(tracer, attempt, spec=spec)
    spans = memory.get_finished_spans()
    (root,) = by_name(spans, "probe readiness http")
    assert format(root.context.span_id, "016x") == span_id
    assert root.attributes["network.peer.address"] == pod_netns.ipv4
    (redirect,) = by_name(spans, "redirect")
    assert redirect.parent.span_id == root.context.span_id
    assert "connect" in {s.name for s in spans if s.parent and s.parent.span_id == redirect.context.span_id}
    for span in spans:  # every phase lies within the attempt
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time
