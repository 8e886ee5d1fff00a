"""The kubelet bridge's marker command read (probe_api/bridge_command.py, read by the daemon through
shim/bridge/command.py: parse_command): the JSON and the flag form, roles and the timeout, named ports, what hooks
take. (Refusals, marker_exec and writing: test_bridge_command_refusals.py, test_bridge_marker_exec.py,
test_bridge_command_writing.py.) Pure: no sockets, no daemon.
"""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import HOOK_ROLES, PROBE_ROLES, ROLES
from tests.support.bridge_commands import http_get, parse, refusal, tcp

# ---------------------------------------------------------------- the two argument forms


@pytest.mark.parametrize("args, expected", [
    (['{"httpGet":{"path":"/healthz","port":8080}}'],
     spec_pb.ProbeSpec(http_get=http_get(8080, "/healthz"))),
    (['{"httpGet":{"port":8080}}'],  # SetDefaults_HTTPGetAction: the path defaults to "/"
     spec_pb.ProbeSpec(http_get=http_get(8080, "/"))),
    (['{"httpGet":{"path":"/a?b=c","port":8443,"scheme":"HTTPS",'
      '"httpHeaders":[{"name":"X-A","value":"1"},{"name":"Accept","value":""}]}}'],
     spec_pb.ProbeSpec(http_get=http_get(8443, "/a?b=c", scheme=spec_pb.HTTPS, http_headers=[
         spec_pb.HTTPHeader(name="X-A", value="1"), spec_pb.HTTPHeader(name="Accept", value="")]))),
    (['{"tcpSocket":{"port":5432}}'], spec_pb.ProbeSpec(tcp_socket=tcp(5432))),
    (['{"grpc":{"port":9000}}'], spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9000))),
    (['{"grpc":{"port":9000,"service":"db"}}'], spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9000, service="db"))),
    (['  {"tcpSocket":{"port":1}}'], spec_pb.ProbeSpec(tcp_socket=tcp(1))),  # leading blanks still read as JSON
], ids=["http", "http-default-path", "http-everything", "tcp", "grpc", "grpc-service", "leading-blank"])
def test_the_mechanical_json_form(args, expected):
    call = parse("readiness", *args, timeout_ms=3000)
    expected.timeout_ms = 3000
    assert call.spec == expected


@pytest.mark.parametrize("args, expected", [
    (["--http-get", ":8080/healthz"], spec_pb.ProbeSpec(http_get=http_get(8080, "/healthz"))),
    (["--http-get=:8080/healthz"], spec_pb.ProbeSpec(http_get=http_get(8080, "/healthz"))),
    (["--http-get", "https://:8443"], spec_pb.ProbeSpec(http_get=http_get(8443, "/", scheme=spec_pb.HTTPS))),
    (["--http-get", ":8080/", "--header", "X-A: 1", "--header=X-B: two words", "--header", "Accept:"],
     spec_pb.ProbeSpec(http_get=http_get(8080, "/", http_headers=[
         spec_pb.HTTPHeader(name="X-A", value="1"), spec_pb.HTTPHeader(name="X-B", value="two words"),
         spec_pb.HTTPHeader(name="Accept", value="")]))),
    (["--tcp", "5432"], spec_pb.ProbeSpec(tcp_socket=tcp(5432))),
    (["--tcp=5432"], spec_pb.ProbeSpec(tcp_socket=tcp(5432))),
    (["--grpc", "9000"], spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9000))),
    (["--grpc", "9000", "--service", "db"], spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9000, service="db"))),
    (["--service=", "--grpc=9000"], spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9000, service=""))),
], ids=["http", "http-equals", "https", "headers-repeated", "tcp", "tcp-equals", "grpc", "grpc-service",
        "flags-in-any-order"])
def test_the_hand_written_flag_form(args, expected):
    call = parse("liveness", *args, timeout_ms=2000)
    expected.timeout_ms = 2000
    assert call.spec == expected


@pytest.mark.parametrize("handler", [['{"tcpSocket":{"port":80}}'], ["--tcp", "80"]], ids=["json", "flags"])
@pytest.mark.parametrize("placement, target, family", [
    ([], spec_pb.POD_IP, spec_pb.PRIMARY),
    (["--target", "loopback"], spec_pb.LOOPBACK, spec_pb.PRIMARY),
    (["--target=pod-ip"], spec_pb.POD_IP, spec_pb.PRIMARY),
    (["--ip-family", "ipv6"], spec_pb.POD_IP, spec_pb.IPV6),
    (["--ip-family=any", "--target", "loopback"], spec_pb.LOOPBACK, spec_pb.ANY),
    (["--ip-family", "primary"], spec_pb.POD_IP, spec_pb.PRIMARY),
    (["--ip-family", "ipv4"], spec_pb.POD_IP, spec_pb.IPV4),
])
def test_target_and_ip_family_follow_either_form(handler, placement, target, family):
    call = parse("readiness", *handler, *placement)
    assert (call.spec.target, call.spec.ip_family) == (target, family)
    assert call.spec.tcp_socket.port.number == 80


@pytest.mark.parametrize("flag, value, supported", [
    ("--target", "node", '"pod-ip", "loopback"'),
    ("--ip-family", "IPv4", '"primary", "ipv4", "ipv6", "any"'),
])
def test_an_unknown_target_or_family_names_the_flag_and_the_choices(flag, value, supported):
    assert refusal("readiness", '{"tcpSocket":{"port":80}}', flag, value) == [
        f'{flag}: Unsupported value: "{value}": supported values: {supported}']
    assert refusal("readiness", "--tcp", "80", f"{flag}={value}") == [
        f'{flag}: Unsupported value: "{value}": supported values: {supported}']


# ---------------------------------------------------------------- roles and timeout


@pytest.mark.parametrize("role, is_hook, probe_type", [
    ("liveness", False, spec_pb.LIVENESS), ("readiness", False, spec_pb.READINESS),
    ("startup", False, spec_pb.STARTUP),
    # Hooks validate as readiness: no threshold rule applies to them.
    ("postStart", True, spec_pb.READINESS), ("preStop", True, spec_pb.READINESS),
])
def test_every_role_is_read_with_its_semantics(role, is_hook, probe_type):
    for args in (['{"httpGet":{"port":8080}}'], ["--http-get", ":8080"]):
        call = parse(role, *args)
        assert (call.role, call.is_hook, call.probe_type) == (role, is_hook, probe_type)
    assert ROLES == ("liveness", "readiness", "startup", "postStart", "preStop")


@pytest.mark.parametrize("role", ["Liveness", "readinessProbe", "poststart", "exec", ""])
def test_an_unknown_role_is_refused_with_the_supported_ones(role):
    assert refusal(role, "--tcp", "80") == [
        f'role: Unsupported value: "{role}": supported values: '
        '"liveness", "readiness", "startup", "postStart", "preStop"']


@pytest.mark.parametrize("timeout_ms", [1000, 5000, 0])
def test_the_execsync_timeout_is_the_specs(timeout_ms):
    # 0 is "not set": validation then applies the Kubernetes default (SetDefaults_Probe: 1 s).
    assert parse("readiness", "--tcp", "80", timeout_ms=timeout_ms).spec.timeout_ms == timeout_ms
    assert parse("preStop", '{"tcpSocket":{"port":80}}', timeout_ms=timeout_ms).spec.timeout_ms == timeout_ms


def test_a_negative_timeout_is_refused_in_seconds_as_timeout_seconds():
    assert refusal("readiness", "--tcp", "80", timeout_ms=-2000) == [
        "timeoutSeconds: Invalid value: -2: must be greater than or equal to 0"]


# ---------------------------------------------------------------- named ports


@pytest.mark.parametrize("args", [['{"httpGet":{"path":"/","port":"web"}}'], ["--http-get", ":web/"]],
                         ids=["json", "flags"])
def test_a_named_port_the_container_declares_is_kept_as_a_name(args):
    # The worker resolves it from the same container ports, as the kubelet's findPortByName does.
    assert parse("readiness", *args).spec.http_get.port == spec_pb.PortRef(name="web")


def test_a_named_tcp_port_the_container_declares_is_kept_as_a_name():
    assert parse("liveness", "--tcp", "metrics").spec.tcp_socket.port == spec_pb.PortRef(name="metrics")
    assert parse("liveness", '{"tcpSocket":{"port":"metrics"}}').spec.tcp_socket.port == spec_pb.PortRef(
        name="metrics")


def test_an_unknown_named_port_is_refused_naming_it():
    # JSON: as the manifest reader words it (the e2e test reads this very text through containerd).
    assert refusal("readiness", '{"tcpSocket":{"port":"nope"}}') == ['tcpSocket.port: unknown named port "nope"']
    assert refusal("readiness", '{"httpGet":{"port":"nope"}}') == ['httpGet.port: unknown named port "nope"']
    # Flags: the container's declared names are listed, so that a typo is visible at once.
    assert refusal("readiness", "--tcp", "nope") == [
        'tcpSocket.port: unknown named port "nope": the container\'s named ports are "web", "metrics"']
    assert refusal("readiness", "--http-get", ":nope/") == [
        'httpGet.port: unknown named port "nope": the container\'s named ports are "web", "metrics"']


def test_a_named_port_of_a_container_without_ports_is_refused():
    assert refusal("readiness", "--tcp", "web", ports=()) == [
        'tcpSocket.port: unknown named port "web": the container declares no named port']
    assert refusal("readiness", '{"tcpSocket":{"port":"web"}}', ports=()) == [
        'tcpSocket.port: unknown named port "web"']


# ---------------------------------------------------------------- hooks


@pytest.mark.parametrize("role", HOOK_ROLES)
def test_grpc_is_refused_for_hooks_in_both_forms(role):
    # core/v1 LifecycleHandler has exec, httpGet, tcpSocket and sleep: no grpc.
    assert refusal(role, '{"grpc":{"port":9000}}') == [
        'handler: unknown field "grpc": a lifecycle hook handler is one of httpGet, tcpSocket']
    assert refusal(role, "--grpc", "9000") == ["--grpc: Forbidden: a lifecycle hook handler is httpGet or tcpSocket"]


@pytest.mark.parametrize("role", PROBE_ROLES)
def test_grpc_is_a_probe_handler(role):
    assert parse(role, '{"grpc":{"port":9000}}').spec.grpc.port == 9000
    assert parse(role, "--grpc", "9000").spec.grpc.port == 9000


def test_http_protocol_in_both_forms():
    assert parse("readiness", '{"httpGet":{"port":8080,"protocol":"HTTP2"}}').spec.http_get.protocol == spec_pb.HTTP2
    assert parse("readiness", "--http-get", ":8080", "--http-protocol", "HTTP2").spec.http_get.protocol == \
        spec_pb.HTTP2
    assert parse("readiness", "--http-get", ":8080").spec.http_get.protocol == spec_pb.HTTP1
    # validateHTTPGetAction (1.37): an unknown protocol is NotSupported, with the supported values.
    assert refusal("readiness", '{"httpGet":{"port":8080,"protocol":"h2c"}}') == [
        'httpGet.protocol: Unsupported value: "h2c": supported values: "HTTP1", "HTTP2"']
    assert refusal("readiness", "--tcp", "9000", "--http-protocol", "HTTP2") == [
        "--http-protocol: Forbidden: only with --http-get"]
    assert refusal("readiness", '{"httpGet":{"port":8080}}', "--http-protocol", "HTTP2")[0].startswith(
        "--http-protocol: Forbidden: the JSON argument gives the handler whole")


def test_grpc_mode_in_both_forms():
    assert parse("readiness", '{"grpc":{"port":9000,"mode":"TLS"}}').spec.grpc.mode == spec_pb.TLS
    assert parse("readiness", "--grpc", "9000", "--grpc-mode", "TLS").spec.grpc.mode == spec_pb.TLS
    assert parse("readiness", "--grpc", "9000").spec.grpc.mode == spec_pb.PLAINTEXT
    # validateGRPCAction (1.37): an unknown mode is NotSupported, with the supported values.
    assert refusal("readiness", '{"grpc":{"port":9000,"mode":"Verify"}}') == [
        'grpc.mode: Unsupported value: "Verify": supported values: "Plaintext", "TLS"']
    assert refusal("readiness", "--tcp", "9000", "--grpc-mode", "TLS") == ["--grpc-mode: Forbidden: only with --grpc"]
    assert refusal("readiness", '{"grpc":{"port":9000}}', "--grpc-mode", "TLS")[0].startswith(
        "--grpc-mode: Forbidden: the JSON argument gives the handler whole")


@pytest.mark.parametrize("role", HOOK_ROLES)
def test_hooks_take_http_and_tcp(role):
    assert parse(role, '{"httpGet":{"path":"/stop","port":8080}}').spec.http_get == http_get(8080, "/stop")
    assert parse(role, "--tcp", "8080").spec.tcp_socket == tcp(8080)
