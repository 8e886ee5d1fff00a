"""The kubelet bridge's marker command refused (probe_api/bridge_command.py, read by the daemon through
shim/bridge/command.py): expected error texts are the Kubernetes API validation's words as probe_api/validation.py
prints them (field.Error: `<path>: <type>: <value>: <detail>`), with Kubernetes' field names, plus the `host` gate of
probe_api/request_rules.py; shapes neither form reads are refused with the usage. Pure: no sockets, no daemon."""

from __future__ import annotations

import json

import pytest

from probe_api.bridge_command import BadArguments
from probe_api.request_rules import HOST_GATE
from shim.bridge.command import parse_command
from tests.support.bridge_commands import M, parse, refusal

JSON_WHOLE = ("Forbidden: the JSON argument gives the handler whole (headers in httpGet.httpHeaders, "
              "the protocol in httpGet.protocol, the service in grpc.service, the mode in grpc.mode)")
USAGE = (f"use {M} ROLE '{{\"httpGet\":{{...}}}}' or {M} ROLE --http-get|--tcp|--grpc ...; "
         "ROLE is one of liveness, readiness, startup, postStart, preStop")
PORT_RANGE = "must be between 1 and 65535, inclusive"


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
    assert len("; ".join(shown).encode()) <= 4096  # probe_api.request_rules.MAX_ERRORS_BYTES
    assert rest.startswith("and ") and rest.endswith(" more errors")
