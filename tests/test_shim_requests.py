"""ProbeService request checks and ids, without a daemon."""

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim import requests


def http_spec(**kw):
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(port=spec_pb.PortRef(number=8080), **kw))


def run_request(**kw):
    base = dict(pod_sandbox_id="sb", container_name="app", type=spec_pb.READINESS, spec=http_spec())
    base.update(kw)
    return service_pb.RunProbeRequest(**base)


def test_a_valid_request_has_no_errors():
    assert requests.validate_run_probe(run_request(), allow_host=False) == []


def test_missing_identity_fields_are_named():
    errors = requests.validate_run_probe(run_request(pod_sandbox_id="", container_name=""), allow_host=False)
    assert errors[0] == "pod_sandbox_id: Required value"
    assert errors[1].startswith("container_name: Required value")


def test_spec_errors_carry_the_spec_path():
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=70000)))
    errors = requests.validate_run_probe(run_request(spec=spec), allow_host=False)
    assert errors == ["spec.tcp_socket.port: Invalid value: 70000: must be between 1 and 65535, inclusive"]


@pytest.mark.parametrize("spec, path", [
    (http_spec(host="10.0.0.1"), "spec.http_get.host"),
    (spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=1), host="db")), "spec.tcp_socket.host"),
])
def test_host_field_is_gated_with_an_explanation(spec, path):
    (error,) = requests.validate_run_probe(run_request(spec=spec), allow_host=False)
    assert error.startswith(f"{path}: Forbidden:") and "SSRF" in error and "allow_host_field" in error
    assert requests.validate_run_probe(run_request(spec=spec), allow_host=True) == []
    assert requests.uses_host_field(spec)


def test_exec_defaults_to_readiness_rules():
    req = service_pb.ExecProbeRequest(pod_sandbox_id="sb", spec=http_spec())
    assert requests.validate_exec_probe(req, allow_host=False) == []
    liveness = service_pb.ExecProbeRequest(pod_sandbox_id="sb", type=spec_pb.LIVENESS,
                                           spec=spec_pb.ProbeSpec(http_get=http_spec().http_get, success_threshold=2))
    assert requests.validate_exec_probe(liveness, allow_host=False) == ["spec.success_threshold: Invalid value: 2: must be 1"]


@pytest.mark.parametrize("req, error", [
    (service_pb.StopProbeRequest(), "probe_id: Required value"),
    (service_pb.StopProbeRequest(container_id="c"), "pod_sandbox_id: Required value"),
    (service_pb.StopProbeRequest(probe_id="p", pod_sandbox_id="sb"), "probe_id: Forbidden"),
])
def test_stop_needs_exactly_one_selector(req, error):
    (got,) = requests.validate_stop_probe(req)
    assert got.startswith(error)


def test_stop_selectors_that_are_fine():
    for req in (service_pb.StopProbeRequest(probe_id="p"), service_pb.StopProbeRequest(pod_sandbox_id="sb"),
                service_pb.StopProbeRequest(pod_sandbox_id="sb", container_id="c")):
        assert requests.validate_stop_probe(req) == []


def test_probe_ids_are_stable_and_distinct():
    a = requests.probe_id_for("sb", "app", spec_pb.READINESS)
    assert a == requests.probe_id_for("sb", "app", spec_pb.READINESS)
    assert a.startswith("readiness-")
    others = {requests.probe_id_for("sb", "app", spec_pb.LIVENESS), requests.probe_id_for("sb2", "app", spec_pb.READINESS),
              requests.probe_id_for("sb", "app2", spec_pb.READINESS)}
    assert a not in others and len(others) == 3
