"""probe_worker/prober.py: the per-spec plan (handler, endpoint, timeout), worked out once and reused. Pure."""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.prober import Prober, plan_attempt, tries, user_agent

POD_IPS = ["198.18.0.2", "fd00:5a::2"]


def http_spec(port: spec_pb.PortRef, **kw) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/ok", port=port), **kw)


def test_a_plan_names_the_handler_endpoint_and_timeout():
    plan = plan_attempt(http_spec(spec_pb.PortRef(number=8080), timeout_ms=2500), [], POD_IPS)
    assert plan.unknown == "" and plan.handler.kind == "http" and plan.timeout_ms == 2500
    assert (plan.endpoint.host, plan.endpoint.addresses, plan.endpoint.port) == ("198.18.0.2", ("198.18.0.2",), 8080)


def test_a_plan_that_cannot_connect_says_why_once():
    no_handler = plan_attempt(spec_pb.ProbeSpec(), [], POD_IPS)
    assert no_handler.unknown == "the probe has no http_get, tcp_socket or grpc handler"
    named = plan_attempt(http_spec(spec_pb.PortRef(name="web")), [], POD_IPS)
    assert named.unknown == 'port "web" not found' and named.endpoint is None
    no_v6 = plan_attempt(http_spec(spec_pb.PortRef(number=80), ip_family=spec_pb.IPV6), [], ["198.18.0.2"])
    assert no_v6.unknown.startswith("the pod has no IPv6 address")


def test_the_prober_reuses_a_plan_for_the_same_content_and_not_for_changed_content():
    prober = Prober(POD_IPS, "1.37")
    ports = [spec_pb.ContainerPort(name="web", container_port=8080)]
    spec = http_spec(spec_pb.PortRef(name="web"))
    first = prober._plan(spec, ports)
    assert prober._plan(http_spec(spec_pb.PortRef(name="web")), list(ports)) is first  # equal copies
    assert first.endpoint.port == 8080
    # The same message changed in place, or other container ports: planned again.
    spec.http_get.port.name = "admin"
    assert prober._plan(spec, ports).unknown == 'port "admin" not found'
    moved = prober._plan(http_spec(spec_pb.PortRef(name="web")), [spec_pb.ContainerPort(name="web", container_port=9090)])
    assert moved.endpoint.port == 9090


def test_tries_are_the_kubelets_three_unless_asked_and_a_hook_runs_once():
    assert [tries(n, lifecycle_hook=False) for n in (0, 1, 2, 3)] == [3, 1, 2, 3]
    assert [tries(n, lifecycle_hook=True) for n in (0, 1, 3)] == [1, 1, 1]


def test_user_agent_names_the_purpose():
    # pkg/probe/http/request.go userAgent(purpose): "kube-%s/%s.%s"
    assert user_agent("1.37") == "kube-probe/1.37"
    assert user_agent("1.37", "lifecycle") == "kube-lifecycle/1.37"
