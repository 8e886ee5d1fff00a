"""ProbeService request checks and ids, without a daemon."""

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import request_rules as rules
from probe_api import validation as v


def answer_of_run_probe(req: service_pb.RunProbeRequest, allow_host: bool) -> list[str]:
    """The errors a RunProbe answer shows (bounded texts), as the registry answers them."""
    return rules.bounded(v.texts(rules.run_probe_errors(req, allow_host)))


def answer_of_exec_probe(req: service_pb.ExecProbeRequest, allow_host: bool) -> list[str]:
    return rules.bounded(v.texts(rules.exec_probe_errors(req, allow_host)))


def answer_of_stop_probe(req: service_pb.StopProbeRequest) -> list[str]:
    return v.texts(rules.stop_probe_errors(req))


def http_spec(**kw):
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(port=spec_pb.PortRef(number=8080), **kw))


def run_request(**kw):
    base = dict(pod_sandbox_id="sb", container_name="app", type=spec_pb.READINESS, spec=http_spec())
    base.update(kw)
    return service_pb.RunProbeRequest(**base)


def test_a_valid_request_has_no_errors():
    assert answer_of_run_probe(run_request(), allow_host=False) == []


def test_missing_identity_fields_are_named():
    errors = answer_of_run_probe(run_request(pod_sandbox_id="", container_name=""), allow_host=False)
    assert errors[0] == "pod_sandbox_id: Required value"
    assert errors[1].startswith("container_name: Required value")


def test_spec_errors_carry_the_spec_path():
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=70000)))
    errors = answer_of_run_probe(run_request(spec=spec), allow_host=False)
    assert errors == ["spec.tcp_socket.port: Invalid value: 70000: must be between 1 and 65535, inclusive"]


@pytest.mark.parametrize("spec, path", [
    (http_spec(host="10.0.0.1"), "spec.http_get.host"),
    (spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=1), host="db")), "spec.tcp_socket.host"),
])
def test_host_field_is_gated_with_an_explanation(spec, path):
    (error,) = answer_of_run_probe(run_request(spec=spec), allow_host=False)
    assert error.startswith(f"{path}: Forbidden:") and "SSRF" in error and "allow_host_field" in error
    assert answer_of_run_probe(run_request(spec=spec), allow_host=True) == []
    assert rules.uses_host_field(spec)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
@pytest.mark.parametrize("action", ["http_get", "tcp_socket"])
def test_the_pods_own_loopback_passes_the_gate(host, action):
    handler = {"http_get": spec_pb.HTTPGetAction, "tcp_socket": spec_pb.TCPSocketAction}[action]
    spec = spec_pb.ProbeSpec(**{action: handler(port=spec_pb.PortRef(number=8080), host=host)})
    assert answer_of_run_probe(run_request(spec=spec), allow_host=False) == []
    exec_req = service_pb.ExecProbeRequest(pod_sandbox_id="sb", spec=spec)
    assert answer_of_exec_probe(exec_req, allow_host=False) == []
    assert not rules.uses_host_field(spec)  # nothing outside the pod: no warning either


@pytest.mark.parametrize("host", ["127.0.0.2", "[::1]", "LOCALHOST", "0.0.0.0"])
def test_other_loopback_like_hosts_keep_the_gate(host):
    (error,) = answer_of_run_probe(run_request(spec=http_spec(host=host)), allow_host=False)
    assert error == f"spec.http_get.host: {rules.HOST_GATE}"


def test_the_gate_names_the_pods_loopback_as_the_way_out():
    assert "use 127.0.0.1, ::1 or localhost for the pod's own loopback" in rules.HOST_GATE


def test_exec_defaults_to_readiness_rules():
    req = service_pb.ExecProbeRequest(pod_sandbox_id="sb", spec=http_spec())
    assert answer_of_exec_probe(req, allow_host=False) == []
    liveness = service_pb.ExecProbeRequest(pod_sandbox_id="sb", type=spec_pb.LIVENESS,
                                           spec=spec_pb.ProbeSpec(http_get=http_spec().http_get, success_threshold=2))
    assert answer_of_exec_probe(liveness, allow_host=False) == ["spec.success_threshold: Invalid value: 2: must be 1"]


def test_a_lifecycle_hook_takes_an_http_get_handler_only():
    hook = service_pb.ExecProbeRequest(pod_sandbox_id="sb", spec=http_spec(), lifecycle_hook=True)
    assert answer_of_exec_probe(hook, allow_host=False) == []
    tcp = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=8080)))
    not_http = service_pb.ExecProbeRequest(pod_sandbox_id="sb", spec=tcp, lifecycle_hook=True)
    assert answer_of_exec_probe(not_http, allow_host=False) == [
        "spec: Forbidden: lifecycle_hook takes an http_get handler"]


@pytest.mark.parametrize("req, error", [
    (service_pb.StopProbeRequest(), "probe_id: Required value"),
    (service_pb.StopProbeRequest(container_id="c"), "pod_sandbox_id: Required value"),
    (service_pb.StopProbeRequest(probe_id="p", pod_sandbox_id="sb"), "probe_id: Forbidden"),
])
def test_stop_needs_exactly_one_selector(req, error):
    (got,) = answer_of_stop_probe(req)
    assert got.startswith(error)


def test_stop_selectors_that_are_fine():
    for req in (service_pb.StopProbeRequest(probe_id="p"), service_pb.StopProbeRequest(pod_sandbox_id="sb"),
                service_pb.StopProbeRequest(pod_sandbox_id="sb", container_id="c")):
        assert answer_of_stop_probe(req) == []


def test_probe_ids_are_stable_and_distinct():
    a = rules.probe_id_for("sb", "app", spec_pb.READINESS)
    assert a == rules.probe_id_for("sb", "app", spec_pb.READINESS)
    assert a.startswith("readiness-")
    others = {rules.probe_id_for("sb", "app", spec_pb.LIVENESS), rules.probe_id_for("sb2", "app", spec_pb.READINESS),
              rules.probe_id_for("sb", "app2", spec_pb.READINESS)}
    assert a not in others and len(others) == 3


# --- size limits of the request's own fields ---------------------------------------------------------

@pytest.mark.parametrize("fields, expected", [
    (dict(pod_sandbox_id="s" * 256), []),
    (dict(pod_sandbox_id="s" * 257), ["pod_sandbox_id: Too long: may not be more than 256 bytes"]),
    (dict(container_id="c" * 257), ["container_id: Too long: may not be more than 256 bytes"]),
    (dict(container_name="c" * 63), []),
    (dict(container_name="c" * 64), ["container_name: Too long: may not be more than 63 bytes"]),
    (dict(labels={f"k{i}": "v" for i in range(64)}), []),
    (dict(labels={f"k{i}": "v" for i in range(65)}), ["labels: Too many: 65: must have at most 64 items"]),
    (dict(labels={"team": "v" * 64}), ["labels[team]: Too long: may not be more than 63 bytes"]),
    (dict(labels={"k" * 318: "v"}),
     [f'labels: Invalid value: "{"k" * 256}"...: a key must be no more than 317 bytes']),
    (dict(container_ports=[spec_pb.ContainerPort(name="http", container_port=80, protocol="TCP")] * 256), []),
    (dict(container_ports=[spec_pb.ContainerPort()] * 257),
     ["container_ports: Too many: 257: must have at most 256 items"]),
    (dict(container_ports=[spec_pb.ContainerPort(name="p" * 16, protocol="T" * 9)]),
     ["container_ports[0].name: Too long: may not be more than 15 bytes",
      "container_ports[0].protocol: Too long: may not be more than 8 bytes"]),
])
def test_request_fields_are_bounded(fields, expected):
    assert answer_of_run_probe(run_request(**fields), allow_host=False) == expected


def test_exec_checks_sandbox_and_ports_too():
    req = service_pb.ExecProbeRequest(pod_sandbox_id="s" * 300, spec=http_spec(),
                                      container_ports=[spec_pb.ContainerPort(name="p" * 16)])
    assert answer_of_exec_probe(req, allow_host=False) == [
        "pod_sandbox_id: Too long: may not be more than 256 bytes",
        "container_ports[0].name: Too long: may not be more than 15 bytes"]


def test_the_largest_valid_request_stays_small():
    """What one registration may cost in memory, in the store and on every watch stream."""
    header_value = "v" * (v.MAX_HEADERS_TOTAL_BYTES // 4 - 3)
    spec = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(
        path="/" + "p" * (v.MAX_PATH_BYTES - 1), host="h" * v.MAX_HOST_BYTES, port=spec_pb.PortRef(name="p" * 15),
        http_headers=[spec_pb.HTTPHeader(name="X-A", value=header_value)] * 4))
    req = run_request(
        pod_sandbox_id="s" * rules.MAX_ID_BYTES, container_id="c" * rules.MAX_ID_BYTES,
        container_name="n" * rules.MAX_CONTAINER_NAME_BYTES, spec=spec,
        labels={f"{i:03d}" + "k" * (rules.MAX_LABEL_KEY_BYTES - 3): "v" * rules.MAX_LABEL_VALUE_BYTES
                for i in range(rules.MAX_LABELS)},
        container_ports=[spec_pb.ContainerPort(name="p" * 15, container_port=65535, protocol="SCTP")]
        * rules.MAX_CONTAINER_PORTS)
    assert answer_of_run_probe(req, allow_host=True) == []
    assert req.ByteSize() < 64 << 10


def test_errors_are_bounded_and_the_rest_counted():
    errors = [f"spec.x[{i}]: " + "e" * 100 for i in range(100)]
    kept = rules.bounded(errors)
    assert len("; ".join(kept).encode()) <= rules.MAX_ERRORS_BYTES + 32
    assert kept[:-1] == errors[:len(kept) - 1] and kept[-1] == f"and {100 - len(kept) + 1} more errors"
    assert rules.bounded(errors[:3]) == errors[:3]
    assert rules.bounded(["x" * 10_000]) == ["x" * 10_000]  # the first error is always kept


def test_no_error_text_contains_the_separator():
    """Errors are joined with "; ": a message that contains it would read as two errors."""
    assert "; " not in rules.HOST_GATE
    assert "kubernetes#99425" in rules.HOST_GATE


def test_the_message_and_its_field_violations_fit_grpcs_metadata_limit_together():
    # 64 headers with 256-byte invalid names: far more errors than an answer carries.
    spec = http_spec(path="x" * 2000, http_headers=[spec_pb.HTTPHeader(name="\r" * 256, value="\n")] * 64)
    errors = rules.run_probe_errors(run_request(spec=spec, labels={"k" * 300: "v"}), allow_host=False)
    message = "; ".join(rules.bounded(rules.texts(errors)))
    data = rules.field_violations(errors)
    wire = len(message.encode()) + 4 * -(-data.ByteSize() // 3)  # the -bin trailer goes base64-encoded
    assert wire < 8192 - 512  # grpc's soft limit, with room for the other headers
    assert data.violations and data.omitted == len(errors) - len(data.violations)
    shown = [f"{v.field}: {v.type}: {v.value}: {v.detail}" if v.value else f"{v.field}: {v.type}: {v.detail}"
             for v in data.violations]
    assert shown == rules.texts(errors)[:len(shown)]  # the first of the errors the message shows, in order
