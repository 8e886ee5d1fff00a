"""The kubelet bridge's marker command (probe_api/bridge_command.py, read by the daemon through
shim/bridge/command.py): reading it, refusing it, recognising it in an
ExecSync's bytes, and writing it so that the kubelet's own `$(VAR)` expansion leaves it as it was written.

Expected error texts are the Kubernetes API validation's words as probe_api/validation.py prints them
(field.Error: `<path>: <type>: <value>: <detail>`), with Kubernetes' field names, plus the `host` gate of
shim/api/request_rules.py. Pure: no sockets, no daemon.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import (
    HANDLER_KEYS, HOOK_ROLES, MARKER, PROBE_ROLES, ROLES, BadArguments, BridgedCall, command_for, handler_in,
    is_marker,
)
from shim.bridge.command import marker_exec, parse_command
from shim.api.request_rules import HOST_GATE

M = MARKER
PORTS = (spec_pb.ContainerPort(name="web", container_port=8080, protocol="TCP"),
         spec_pb.ContainerPort(name="metrics", container_port=9090, protocol="TCP"))
JSON_WHOLE = ("Forbidden: the JSON argument gives the handler whole (headers in httpGet.httpHeaders, "
              "the protocol in httpGet.protocol, the service in grpc.service, the mode in grpc.mode)")
USAGE = (f"use {M} ROLE '{{\"httpGet\":{{...}}}}' or {M} ROLE --http-get|--tcp|--grpc ...; "
         "ROLE is one of liveness, readiness, startup, postStart, preStop")
PORT_RANGE = "must be between 1 and 65535, inclusive"


def parse(*args: str, ports=PORTS, timeout_ms: int = 1000, allow_host: bool = False) -> BridgedCall:
    return parse_command([M, *args], ports=ports, timeout_ms=timeout_ms, allow_host=allow_host)


def refusal(*args: str, **kwargs) -> list[str]:
    with pytest.raises(BadArguments) as caught:
        parse(*args, **kwargs)
    assert str(caught.value) == "; ".join(caught.value.errors)
    return caught.value.errors


def http_get(port: int | str, path: str = "/", **fields) -> spec_pb.HTTPGetAction:
    ref = spec_pb.PortRef(name=port) if isinstance(port, str) else spec_pb.PortRef(number=port)
    return spec_pb.HTTPGetAction(path=path, port=ref, **fields)


def tcp(port: int | str) -> spec_pb.TCPSocketAction:
    ref = spec_pb.PortRef(name=port) if isinstance(port, str) else spec_pb.PortRef(number=port)
    return spec_pb.TCPSocketAction(port=ref)


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


# ---------------------------------------------------------------- validation in Kubernetes' words


@pytest.mark.parametrize("handler, errors", [
    ({"httpGet": {"path": "/", "port": 0}}, [f"httpGet.port: Invalid value: 0: {PORT_RANGE}"]),
    ({"httpGet": {"port": 65536}}, [f"httpGet.port: Invalid value: 65536: {PORT_RANGE}"]),
    ({"httpGet": {"port": -1}}, [f"httpGet.port: Invalid value: -1: {PORT_RANGE}"]),
    ({"tcpSocket": {"port": 0}}, [f"tcpSocket.port: Invalid value: 0: {PORT_RANGE}"]),
    ({"grpc": {"port": 0}}, [f"grpc.port: Invalid value: 0: {PORT_RANGE}"]),
    ({"grpc": {"port": 70000}}, [f"grpc.port: Invalid value: 70000: {PORT_RANGE}"]),
    ({"tcpSocket": {}}, ["tcpSocket.port: Required value"]),
    ({"httpGet": {"path": "/"}}, ["httpGet.port: Required value"]),
    ({"grpc": {}}, ["grpc.port: Required value"]),
    # ValidatePortNumOrName: a string port must be an IANA_SVC_NAME.
    ({"httpGet": {"port": "http", "scheme": "http"}},
     ['httpGet.scheme: Unsupported value: "http": supported values: "HTTP", "HTTPS"']),
    ({"httpGet": {"port": 80, "httpHeaders": [{"name": "bad name", "value": "v"}]}},
     ['httpGet.httpHeaders: Invalid value: "bad name": a valid HTTP header must consist of alphanumeric '
      "characters or '-' (e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')"]),
    ({"httpGet": {"port": 80, "path": "healthz"}},
     ['httpGet.path: Invalid value: "healthz": must be an absolute path: start with \'/\'']),
    ({"httpGet": {"port": "web", "path": 7}}, ["httpGet.path: Invalid value: 7: must be a string"]),
    ({"httpGet": {"port": 80, "bogus": 1}}, ['httpGet: unknown field "bogus"']),
    ({"tcpSocket": {"port": True}}, ["tcpSocket.port: Invalid value: true: must be a port number or a port name"]),
], ids=lambda value: json.dumps(value) if isinstance(value, dict) else "")
def test_bad_json_handlers_are_refused_naming_the_field(handler, errors):
    assert refusal("readiness", json.dumps(handler)) == errors


@pytest.mark.parametrize("port", ["8080", "Web"])
def test_an_invalid_port_name_is_reported_once_as_kubernetes_reports_it(port):
    # ValidatePortNumOrName: a string port must be an IANA_SVC_NAME, or it is an Invalid value, nothing more.
    errors = refusal("readiness", json.dumps({"httpGet": {"port": port}}))
    assert len(errors) == 1 and errors[0].startswith("httpGet.port: Invalid value: "), errors


def test_an_invalid_port_name_is_refused_as_an_invalid_value():
    errors = refusal("readiness", '{"httpGet":{"port":"8080"}}')
    assert errors[0] == 'httpGet.port: Invalid value: "8080": must contain at least one letter (a-z)'
    # The flag form refuses it before validation, naming the flag.
    assert refusal("readiness", "--http-get", ":Web/") == [
        '--http-get ":Web/": port "Web" is neither a number nor a valid port name: '
        "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]


def test_the_kubelets_own_example_error():
    # The exact text the e2e test reads from containerd: bad arguments name the field in Kubernetes' words.
    assert refusal("readiness", '{"httpGet":{"path":"/","port":0}}') == [
        "httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive"]


@pytest.mark.parametrize("args, field, host", [
    (["--tcp", "10.0.0.1:80"], "tcpSocket.host", "10.0.0.1"),
    (["--http-get", "169.254.169.254:80/latest/meta-data"], "httpGet.host", "169.254.169.254"),
    (['{"tcpSocket":{"port":80,"host":"10.0.0.1"}}'], "tcpSocket.host", "10.0.0.1"),
    (['{"httpGet":{"port":80,"host":"example.com"}}'], "httpGet.host", "example.com"),
])
def test_the_host_field_is_gated_as_runprobe_gates_it(args, field, host):
    assert refusal("readiness", *args) == [f"{field}: {HOST_GATE}"]
    assert HOST_GATE.startswith("Forbidden: the host field makes the runtime connect to any address")
    allowed = parse("readiness", *args, allow_host=True)  # allow_host_field = true in the daemon's config
    handler = allowed.spec.tcp_socket if field.startswith("tcp") else allowed.spec.http_get
    assert handler.host == host



@pytest.mark.parametrize("args, host", [
    (["--tcp", "127.0.0.1:9901"], "127.0.0.1"),
    (["--http-get", "[::1]:9901/health"], "::1"),
    (['{"httpGet":{"port":9901,"host":"localhost","path":"/health"}}'], "localhost"),
    (['{"tcpSocket":{"port":9901,"host":"::1"}}'], "::1"),
])
def test_the_pods_own_loopback_needs_no_allow_host(args, host):
    call = parse("readiness", *args)
    handler = call.spec.tcp_socket if call.spec.HasField("tcp_socket") else call.spec.http_get
    assert handler.host == host  # kept as written: the URL and the Host header read as the kubelet's would

@pytest.mark.parametrize("args, error", [
    (["--tcp", "0"], '--tcp "0": port 0 is out of range 1-65535'),
    (["--http-get", ":70000"], '--http-get ":70000": port 70000 is out of range 1-65535'),
    (["--grpc", "web"], '--grpc "web": the port must be a number (gRPC probes take no named ports)'),
    (["--http-get", "ftp://:21"], '--http-get "ftp://:21": unsupported scheme "ftp": use http or https'),
    (["--http-get", ":80", "--header", "no colon"], "--header \"no colon\": use 'Name: value'"),
    (["--tcp", ""], '--tcp "": missing port'),
    (["--tcp="], '--tcp "": missing port'),
])
def test_bad_flag_values_name_the_flag_and_the_input(args, error):
    assert refusal("readiness", *args) == [error]


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


# ---------------------------------------------------------------- refused shapes


@pytest.mark.parametrize("args, errors", [
    (["--tcp", "80", "--tcp", "81"], ["--tcp: Duplicate value: given more than once"]),
    (["--tcp", "80", "--target", "loopback", "--target=pod-ip"], ["--target: Duplicate value: given more than once"]),
    (['{"tcpSocket":{"port":80}}', "--ip-family", "ipv4", "--ip-family", "ipv6"],
     ["--ip-family: Duplicate value: given more than once"]),
    (["--grpc", "9000", "--service", "a", "--service", "b"], ["--service: Duplicate value: given more than once"]),
    (["--tcp"], ["--tcp: Required value: the flag needs a value"]),
    (["--tcp", "80", "--target"], ["--target: Required value: the flag needs a value"]),
    (["--bogus", "1"], [f'unknown argument "--bogus": {USAGE}']),
    (["--tcp", "80", "extra"], [f'unknown argument "extra": {USAGE}']),
    (["-t", "80"], [f'unknown argument "-t": {USAGE}']),
    ([""], [f'unknown argument "": {USAGE}']),
    (["--target", "loopback"], [f"handler: Required value: exactly one of --http-get, --tcp, --grpc ({USAGE})"]),
    (["--tcp", "80", "--grpc", "90"], [f"handler: Required value: exactly one of --http-get, --tcp, --grpc ({USAGE})"]),
    (["--tcp", "80", "--header", "X: y"], ["--header: Forbidden: only with --http-get"]),
    (["--http-get", ":80", "--service", "db"], ["--service: Forbidden: only with --grpc"]),
    (['{"grpc":{"port":80}}', "--http-get", ":80"], [f"--http-get: {JSON_WHOLE}"]),
    (['{"grpc":{"port":80}}', "--grpc=80"], [f"--grpc: {JSON_WHOLE}"]),
    (['{"grpc":{"port":80}}', "--bogus"], [f'unknown argument "--bogus": {USAGE}']),
], ids=["dup-handler", "dup-target", "dup-family-after-json", "dup-service", "no-value", "no-value-last",
        "unknown-flag", "stray-word", "short-flag", "empty-word", "no-handler", "two-handlers", "header-without-http",
        "service-without-grpc", "json-and-http-get", "json-and-grpc", "unknown-after-json"])
def test_duplicate_unknown_and_conflicting_flags_are_refused(args, errors):
    assert refusal("readiness", *args) == errors


@pytest.mark.parametrize("cmd", [[M], [M, "readiness"]])
def test_a_command_without_a_handler_shows_the_usage(cmd):
    with pytest.raises(BadArguments) as caught:
        parse_command(cmd, ports=(), timeout_ms=1000, allow_host=False)
    assert caught.value.errors == [f"command: Required value: {USAGE}"]


@pytest.mark.parametrize("cmd", [["sh", "-c", "true"], [], ["/usr/bin/cri-probe-shim", "readiness", "--tcp", "1"]])
def test_a_command_that_is_not_the_markers_is_refused(cmd):
    with pytest.raises(BadArguments) as caught:
        parse_command(cmd, ports=(), timeout_ms=1000, allow_host=False)
    assert caught.value.errors == [f"command: must start with {M}"]


def test_a_json_array_is_refused_as_not_an_object():
    assert refusal("readiness", '[{"tcpSocket":{"port":80}}]') == [
        "handler: Invalid value: must be an object with one of httpGet, tcpSocket, grpc"]


@pytest.mark.parametrize("text", ['"tcpSocket"', "80", "null"])
def test_a_word_that_is_neither_json_nor_a_flag_is_refused_naming_the_argument(text):
    assert refusal("readiness", text) == [f"unknown argument {json.dumps(text)}: {USAGE}"]


@pytest.mark.parametrize("text", ['{"tcpSocket":{"port":80}', '{tcpSocket: {port: 80}}', "{"])
def test_invalid_json_is_refused_as_such(text):
    (error,) = refusal("readiness", text)
    assert error.startswith("handler: not valid JSON: ")


@pytest.mark.parametrize("text, second", [('{"httpGet":{"port":80},"tcpSocket":{"port":80}}', "tcpSocket"),
                                          ('{"tcpSocket":{"port":80},"grpc":{"port":80}}', "grpc")])
def test_json_with_two_handlers_is_refused_as_the_api_server_words_it(text, second):
    # validateHandler: "may not specify more than 1 handler type", on the second handler's path.
    assert refusal("readiness", text) == [f"{second}: Forbidden: may not specify more than 1 handler type"]


def test_json_without_a_handler_is_refused_as_the_api_server_words_it():
    assert refusal("readiness", "{}") == refusal("preStop", "{}") == [
        "handler: Required value: must specify a handler type"]


def test_json_with_a_repeated_key_is_refused():
    (error,) = refusal("readiness", '{"tcpSocket":{"port":80,"port":81}}')
    assert error == 'handler: not valid JSON: duplicate key "port"'


@pytest.mark.parametrize("text, unknown", [
    ('{"exec":{"command":["true"]}}', "exec"),  # the runtime runs exec handlers; the marker is not one
    ('{"httpget":{"port":80}}', "httpget"),      # a typo must not leave the probe without a handler
    ('{"httpGet":{"port":80},"periodSeconds":5}', "periodSeconds"),  # timing belongs to the kubelet
    ('{"tcpSocket":{"port":80},"b":1,"a":2}', "a"),  # the first unknown key in sorted order
])
def test_json_with_unknown_keys_is_refused_naming_the_key(text, unknown):
    assert refusal("readiness", text) == [
        f'handler: unknown field "{unknown}": a probe handler is one of httpGet, tcpSocket, grpc']


def test_a_header_flag_after_the_json_form_is_not_silently_dropped():
    cmd = ('{"httpGet":{"path":"/","port":8080}}', "--header", "Authorization: Bearer t")
    try:
        call = parse("readiness", *cmd)
    except BadArguments as exc:
        assert "--header" in str(exc)
    else:
        assert [(h.name, h.value) for h in call.spec.http_get.http_headers] == [("Authorization", "Bearer t")]


def test_a_service_flag_after_the_json_form_is_not_silently_dropped():
    try:
        call = parse("readiness", '{"grpc":{"port":9000}}', "--service", "db")
    except BadArguments as exc:
        assert "--service" in str(exc)
    else:
        assert call.spec.grpc.service == "db"


def test_errors_are_bounded_like_runprobes():
    headers = [arg for i in range(60) for arg in ("--header", f"bad name {i}: v")]  # 60 errors of ~200 bytes
    (*shown, rest) = refusal("readiness", "--http-get", ":80", *headers)
    assert 1 <= len(shown) < 60
    assert len("; ".join(shown).encode()) <= 4096  # shim.api.request_rules.MAX_ERRORS_BYTES
    assert rest.startswith("and ") and rest.endswith(" more errors")


# ---------------------------------------------------------------- marker_exec: the bytes of an ExecSyncRequest


def exec_request(cmd: list[str], container_id: str = "c0ffee", timeout: int = 1) -> bytes:
    return cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout).SerializeToString()


def test_a_marker_exec_is_decoded():
    cmd = command_for("readiness", {"tcpSocket": {"port": 80}})
    decoded = marker_exec(exec_request(cmd, "abc", 3))
    assert decoded == cri_pb.ExecSyncRequest(container_id="abc", cmd=cmd, timeout=3)


@pytest.mark.parametrize("request_bytes", [
    exec_request(["cat", "/tmp/healthy"]),
    exec_request([]),
    b"",
    exec_request(["/bin/busybox", "echo", "hello", M]),                     # the marker only as a later argument
    exec_request(["sh", "-c", f"{M} readiness --tcp 80"]),                  # ... or inside one
    exec_request(["echo"], container_id=M),                                 # ... or as the container id
    exec_request([f"/usr/local/bin/{M}", "readiness", "--tcp", "80"]),      # a path is not the marker
    exec_request([M + "x", "readiness", "--tcp", "80"]),
    exec_request([" " + M, "readiness", "--tcp", "80"]),
    M.encode() + b"\xff\xff\xff",                                           # undecodable, yet holding the marker
    b"\x12" + bytes([len(M) + 2]) + M.encode() + b"\xff\xfe",               # cmd[0] with invalid UTF-8 after it
    exec_request([M])[:-3],                                                 # truncated mid-field
], ids=["ordinary", "no-cmd", "empty", "later-argument", "inside-argument", "container-id", "path", "suffix",
        "blank", "undecodable", "bad-utf8", "truncated"])
def test_anything_else_is_not_a_marker_exec(request_bytes):
    assert marker_exec(request_bytes) is None


def test_a_marker_exec_with_fields_the_subset_does_not_know_is_still_read():
    unknown = b"\xa8\x06\x01"  # field 101, varint 1: a newer ExecSyncRequest field
    cmd = [M, "readiness", "--tcp", "80"]
    assert marker_exec(exec_request(cmd) + unknown).cmd == cmd


@given(cmd=st.lists(st.sampled_from([M, "readiness", "--tcp", "80", "sh", "", M + " "]) | st.text(max_size=20),
                    max_size=5),
       container_id=st.sampled_from(["c", M, ""]), timeout=st.integers(-2**63, 2**63 - 1))
def test_marker_exec_answers_exactly_when_cmd0_is_the_marker(cmd, container_id, timeout):
    decoded = marker_exec(exec_request(cmd, container_id, timeout))
    if cmd and cmd[0] == M:
        assert decoded == cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout)
    else:
        assert decoded is None
    assert is_marker(cmd) == (decoded is not None)


# ---------------------------------------------------------------- writing: command_for and handler_in


def test_command_for_writes_compact_json_after_the_role():
    assert command_for("readiness", {"httpGet": {"path": "/healthz", "port": 8080}}) == [
        M, "readiness", '{"httpGet":{"path":"/healthz","port":8080}}']
    assert command_for("preStop", {"tcpSocket": {"port": "web"}}) == [M, "preStop", '{"tcpSocket":{"port":"web"}}']
    # Not ASCII-escaped: the command stays readable in `kubectl get pod -o yaml`.
    assert command_for("liveness", {"httpGet": {"path": "/é", "port": 1}})[2] == '{"httpGet":{"path":"/é","port":1}}'


@pytest.mark.parametrize("role", PROBE_ROLES)
def test_a_probes_dollars_are_doubled_for_the_kubelets_expansion(role):
    assert command_for(role, {"httpGet": {"path": "/$(HOME)/a$b$$c", "port": 80}})[2] == (
        '{"httpGet":{"path":"/$$(HOME)/a$$b$$$$c","port":80}}')


@pytest.mark.parametrize("role", HOOK_ROLES)
def test_a_hooks_dollars_are_left_alone_since_hooks_are_not_expanded(role):
    assert command_for(role, {"httpGet": {"path": "/$(HOME)/a$b", "port": 80}})[2] == (
        '{"httpGet":{"path":"/$(HOME)/a$b","port":80}}')


@pytest.mark.parametrize("command", [
    [M, "readiness"],
    [M, "readiness", '{"tcpSocket":{"port":80}}', "--target", "loopback"],  # hand-edited: not mechanical
    ["sh", "readiness", '{"tcpSocket":{"port":80}}'],
    [M, "Readiness", '{"tcpSocket":{"port":80}}'],
    [M, "readiness", "--tcp"],
    [M, "readiness", '{"tcpSocket":{"port":80}'],
    [M, "readiness", '[{"tcpSocket":{"port":80}}]'],
    [M, "readiness", "{}"],
    [M, "readiness", '{"tcpSocket":{"port":80},"grpc":{"port":80}}'],
    [M, "readiness", '{"exec":{"command":["true"]}}'],
])
def test_handler_in_reads_only_what_command_for_writes(command):
    assert handler_in(command) is None


def test_handler_in_undoes_the_escape_only_for_probes():
    assert handler_in([M, "startup", '{"httpGet":{"path":"/$$x","port":1}}']) == (
        "startup", {"httpGet": {"path": "/$x", "port": 1}})
    assert handler_in([M, "postStart", '{"httpGet":{"path":"/$$x","port":1}}']) == (
        "postStart", {"httpGet": {"path": "/$$x", "port": 1}})


json_scalars = st.text() | st.integers(min_value=-2**63, max_value=2**63 - 1)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)
handlers = st.builds(lambda key, body: {key: body}, st.sampled_from(HANDLER_KEYS),
                     st.dictionaries(st.text(), json_values, max_size=5))


@given(role=st.sampled_from(ROLES), handler=handlers)
@example(role="readiness", handler={"httpGet": {"path": "$", "port": "$$(X)"}})
@example(role="preStop", handler={"tcpSocket": {"$$": "$(", "port": 1}})
def test_handler_in_inverts_command_for(role, handler):
    assert handler_in(command_for(role, handler)) == (role, handler)


# ---------------------------------------------------------------- the kubelet's $(VAR) expansion
#
# A model of kubernetes third_party/forked/golang/expansion/expand.go (Expand, tryReadVariableName,
# MappingFuncFor), which the kubelet applies to every argument of an exec probe's command
# (prober.go: kubecontainer.ExpandContainerCommandOnlyStatic(p.Exec.Command, container.Env)) and not to an exec
# hook's (lifecycle/handlers.go: RunInContainer(ctx, containerID, handler.Exec.Command, 0)). Go walks bytes;
# '$', '(' and ')' are ASCII and the default case copies a whole rune, so walking characters is the same.


def mapping_func_for(*contexts: dict[str, str]) -> Callable[[str], str]:
    """MappingFuncFor: the first context holding the name, else the reference as written: `$(NAME)`."""
    def mapping(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return f"$({name})"
    return mapping


def try_read_variable_name(text: str) -> tuple[str, bool, int]:
    """tryReadVariableName: (what was read, whether it is a variable name, characters consumed)."""
    if text[0] == "$":  # escaped operator; return it
        return "$", False, 1
    if text[0] == "(":  # scan to the expression closer
        for index in range(1, len(text)):
            if text[index] == ")":
                return text[1:index], True, index + 1
        return "$(", False, 1  # incomplete reference; return it
    return "$" + text[0], False, 1  # not an expression: the operator and the first rune


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """Expand: `$$` -> `$`, `$(NAME)` -> mapping(NAME), any other `$` kept."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_var, advance = try_read_variable_name(text[cursor + 1:])
            out.append(mapping(read) if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


# expand_test.go doExpansionTest, every case, so that the model is the kubelet's and not a guess.
UPSTREAM_CASES = [
    ("$(VAR_A)", "A"), ("$(VAR_A)-$(VAR_A)", "A-A"), ("$(VAR_A)-1", "A-1"), ("___$(VAR_B)___", "___B___"),
    ("___$(VAR_C)", "___C"), ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"), ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
    ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"), ("f000-$$VAR_A", "f000-$VAR_A"),
    ("foo\\$(VAR_C)bar", "foo\\Cbar"), ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
    ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"), ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
    ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"), ("$(VAR_REF)", "$(VAR_A)"),
    ("%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"), ("foo$(VAR_EMPTY)bar", "foobar"),
    ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"), ("f00__(VAR_A)__", "f00__(VAR_A)__"), ("$?_boo_$!", "$?_boo_$!"),
    ("$VAR_A", "$VAR_A"), ("$(VAR_DNE)", "$(VAR_DNE)"), ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("$$$$$$(VAR_A)", "$$$(VAR_A)"), ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"), ("$$$$$$$(VAR_A)", "$$$A"),
    ("$VAR_A)", "$VAR_A)"), ("${VAR_A}", "${VAR_A}"), ("$(VAR_B)_______$(A", "B_______$(A"),
    ("$(VAR_C)_______$(", "C_______$("), ("$(VAR_A)foobarzab$", "Afoobarzab$"), ("foo-\\$(VAR_A", "foo-\\$(VAR_A"),
    ("--$($($($($--", "--$($($($($--"), ("$($($($($--foo$(", "$($($($($--foo$("),
    ("foo0--$($($($(", "foo0--$($($($("), ("$(foo$$var)", "$(foo$$var)"), ("\n", "\n"),
]


@pytest.mark.parametrize("contexts", [
    ({"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""},),  # TestMapping
    ({"VAR_A": "A", "VAR_EMPTY": ""}, {"VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)"}),  # TestMappingDual
], ids=["single", "dual"])
def test_the_expansion_model_passes_kubernetes_own_cases(contexts):
    mapping = mapping_func_for(*contexts)
    assert [(text, expand(text, mapping)) for text, _ in UPSTREAM_CASES] == UPSTREAM_CASES


env_names = st.sampled_from(["HOME", "X", "VAR_A", "PORT", ""]) | st.text(max_size=6)
envs = st.dictionaries(env_names, st.text(max_size=8), max_size=4)


@given(role=st.sampled_from(list(PROBE_ROLES)), handler=handlers, env=envs)
@example(role="liveness", handler={"httpGet": {"path": "/$(HOME)/$$/$", "port": "$(PORT)"}},
         env={"HOME": "/root", "PORT": "80"})
def test_a_probe_command_survives_the_kubelets_expansion(role, handler, env):
    sent = [expand(arg, mapping_func_for(env)) for arg in command_for(role, handler)]
    assert sent == [M, role, json.dumps(handler, separators=(",", ":"), ensure_ascii=False)]
    assert json.loads(sent[2]) == handler


@given(role=st.sampled_from(HOOK_ROLES), handler=handlers)
def test_a_hook_command_is_sent_as_written(role, handler):
    # The kubelet passes a hook's command to ExecSync untouched: no escape to undo.
    assert json.loads(command_for(role, handler)[2]) == handler


def test_a_path_with_dollars_reaches_the_spec_exactly_as_written():
    handler = {"httpGet": {"path": "/$(HOME)/price$5/$$", "port": 8080}}
    env = mapping_func_for({"HOME": "/root"})
    probe_cmd = [expand(arg, env) for arg in command_for("readiness", handler)]
    assert parse_command(probe_cmd, ports=(), timeout_ms=1000, allow_host=False).spec.http_get.path == (
        "/$(HOME)/price$5/$$")
    hook_cmd = command_for("preStop", handler)
    assert parse_command(hook_cmd, ports=(), timeout_ms=1000, allow_host=False).spec.http_get.path == (
        "/$(HOME)/price$5/$$")
    # Unescaped, the kubelet would have rewritten it: that is why command_for doubles every `$`.
    naive = json.dumps(handler, separators=(",", ":"))
    assert json.loads(expand(naive, env))["httpGet"]["path"] == "//root/price$5/$"
