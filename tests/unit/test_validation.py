"""Probe spec validation: Kubernetes 1.32 rules and error texts, plus our millisecond additions."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as pb
from probe_api import validation as V
from probe_api.field_errors import FieldError
from probe_api.gostrings import go_quote
from probe_api.validation import Timing, effective_timing, port_name_errors, validate_probe

LIVENESS, READINESS, STARTUP = pb.LIVENESS, pb.READINESS, pb.STARTUP


def tcp(port: int | str = 8080, **fields) -> pb.ProbeSpec:
    ref = pb.PortRef(name=port) if isinstance(port, str) else pb.PortRef(number=port)
    return pb.ProbeSpec(tcp_socket=pb.TCPSocketAction(port=ref), **fields)


def http(port: int | str = 8080, **action_fields) -> pb.ProbeSpec:
    ref = pb.PortRef(name=port) if isinstance(port, str) else pb.PortRef(number=port)
    return pb.ProbeSpec(http_get=pb.HTTPGetAction(port=ref, **action_fields))


def headers(*pairs: tuple[str, str]) -> list[pb.HTTPHeader]:
    return [pb.HTTPHeader(name=name, value=value) for name, value in pairs]


# --- effective timing ----------------------------------------------------------------

@pytest.mark.parametrize("fields, expected", [
    ({}, Timing(0, 10_000, 1_000, 1, 3)),
    ({"initial_delay_ms": 1500, "period_ms": 250, "timeout_ms": 100,
      "success_threshold": 2, "failure_threshold": 5}, Timing(1500, 250, 100, 2, 5)),
    ({"period_ms": 10}, Timing(0, 10, 1_000, 1, 3)),
])
def test_effective_timing_applies_kubernetes_defaults_for_zero(fields, expected):
    assert effective_timing(tcp(**fields)) == expected


# --- valid specs ---------------------------------------------------------------------

@pytest.mark.parametrize("probe_type, spec", [
    (READINESS, tcp()),
    (LIVENESS, tcp(1)),
    (STARTUP, tcp(65535)),
    (READINESS, tcp("http")),
    (READINESS, tcp("a")),
    (READINESS, tcp("web-8080")),
    (READINESS, tcp("abcdefghijklmno")),                  # exactly 15 characters
    (READINESS, http(path="")),                           # "" is defaulted to "/"
    (READINESS, http(path="/healthz", scheme=pb.HTTPS,
                     http_headers=headers(("X-Custom-1", "v a\tlue"), ("Authorization", "Bearer x")))),
    (READINESS, pb.ProbeSpec(grpc=pb.GRPCAction(port=9090))),
    (READINESS, pb.ProbeSpec(grpc=pb.GRPCAction(port=9090, service="svc"))),
    (READINESS, tcp(success_threshold=3, failure_threshold=1, period_ms=10, timeout_ms=1)),
    (LIVENESS, tcp(success_threshold=1)),
    (LIVENESS, tcp(termination_grace_period_ms=5000)),
    (STARTUP, tcp(termination_grace_period_ms=1)),
    (READINESS, tcp(target=pb.LOOPBACK, ip_family=pb.ANY)),
])
def test_valid_specs_have_no_errors(probe_type, spec):
    assert validate_probe(probe_type, spec) == []


# --- handler -------------------------------------------------------------------------

@pytest.mark.parametrize("spec, expected", [
    (pb.ProbeSpec(), ["spec: Required value: must specify a handler type"]),
    (pb.ProbeSpec(http_get=pb.HTTPGetAction(port=pb.PortRef(number=80)),
                  tcp_socket=pb.TCPSocketAction(port=pb.PortRef(number=80))),
     ["spec.tcp_socket: Forbidden: may not specify more than 1 handler type"]),
    (pb.ProbeSpec(http_get=pb.HTTPGetAction(port=pb.PortRef(number=80)),
                  tcp_socket=pb.TCPSocketAction(), grpc=pb.GRPCAction()),
     ["spec.tcp_socket: Forbidden: may not specify more than 1 handler type",
      "spec.grpc: Forbidden: may not specify more than 1 handler type"]),
    # Only the first handler (in Kubernetes' order) is validated further.
    (pb.ProbeSpec(tcp_socket=pb.TCPSocketAction(), grpc=pb.GRPCAction(port=0)),
     ["spec.tcp_socket.port: Required value",
      "spec.grpc: Forbidden: may not specify more than 1 handler type"]),
    (pb.ProbeSpec(exec=pb.ExecAction(command=["true"])),
     ['spec.exec: Unsupported value: "exec": '
      "exec probes are run by the container runtime, not by cri-probe-shim"]),
    # exec counts as the handler: a second one is Forbidden, exactly as in Kubernetes.
    (pb.ProbeSpec(exec=pb.ExecAction(), http_get=pb.HTTPGetAction(port=pb.PortRef(number=0))),
     ['spec.exec: Unsupported value: "exec": '
      "exec probes are run by the container runtime, not by cri-probe-shim",
      "spec.http_get: Forbidden: may not specify more than 1 handler type"]),
])
def test_handler_rules(spec, expected):
    assert validate_probe(READINESS, spec) == expected


# --- ports ---------------------------------------------------------------------------

PORT_RANGE = "must be between 1 and 65535, inclusive"
CHARSET = "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
LETTER = "must contain at least one letter (a-z)"
TOO_LONG = "must be no more than 15 characters"
DOUBLE_HYPHEN = "must not contain consecutive hyphens"
EDGE_HYPHEN = "must not begin or end with a hyphen"


@pytest.mark.parametrize("name, expected", [
    ("http", []),
    ("8080", [LETTER]),
    ("", [CHARSET, LETTER]),
    ("HTTP", [CHARSET, LETTER]),
    ("web_port", [CHARSET]),
    ("abcdefghijklmnop", [TOO_LONG]),
    ("a--b", [DOUBLE_HYPHEN]),
    ("-http", [EDGE_HYPHEN]),
    ("http-", [EDGE_HYPHEN]),
    ("--", [LETTER, DOUBLE_HYPHEN, EDGE_HYPHEN]),
    ("Web--Port_Name-Too-", [TOO_LONG, CHARSET, DOUBLE_HYPHEN, EDGE_HYPHEN]),
    ("http\n", [CHARSET]),          # Go's ^...$ does not match before a final newline
])
def test_port_name_rules_in_kubernetes_order(name, expected):
    assert port_name_errors(name) == expected


@pytest.mark.parametrize("spec, expected", [
    (tcp(0), [f"spec.tcp_socket.port: Invalid value: 0: {PORT_RANGE}"]),
    (tcp(-1), [f"spec.tcp_socket.port: Invalid value: -1: {PORT_RANGE}"]),
    (tcp(65536), [f"spec.tcp_socket.port: Invalid value: 65536: {PORT_RANGE}"]),
    (http(0), [f"spec.http_get.port: Invalid value: 0: {PORT_RANGE}"]),
    (http("8080"), [f'spec.http_get.port: Invalid value: "8080": {LETTER}']),
    (tcp("Web--"), [f'spec.tcp_socket.port: Invalid value: "Web--": {CHARSET}',
                    f'spec.tcp_socket.port: Invalid value: "Web--": {DOUBLE_HYPHEN}',
                    f'spec.tcp_socket.port: Invalid value: "Web--": {EDGE_HYPHEN}']),
    (pb.ProbeSpec(tcp_socket=pb.TCPSocketAction()), ["spec.tcp_socket.port: Required value"]),
    (pb.ProbeSpec(http_get=pb.HTTPGetAction(path="/")), ["spec.http_get.port: Required value"]),
    (pb.ProbeSpec(grpc=pb.GRPCAction()), [f"spec.grpc.port: Invalid value: 0: {PORT_RANGE}"]),
    (pb.ProbeSpec(grpc=pb.GRPCAction(port=70000)),
     [f"spec.grpc.port: Invalid value: 70000: {PORT_RANGE}"]),
])
def test_port_errors(spec, expected):
    assert validate_probe(READINESS, spec) == expected


# --- HTTP action ---------------------------------------------------------------------

HEADER_MSG = ("a valid HTTP header must consist of alphanumeric characters or '-' "
              "(e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')")
HEADER_VALUE_MSG = "Invalid value: must not contain CR, LF or NUL characters"


@pytest.mark.parametrize("spec, expected", [
    (http(scheme=7), ['spec.http_get.scheme: Unsupported value: 7: supported values: "HTTP", "HTTPS"']),
    # validateHTTPGetAction (1.37, KEP-5999, pkg/apis/core/validation/validation.go): one protocol error at most.
    (http(protocol=7), ['spec.http_get.protocol: Unsupported value: 7: supported values: "HTTP1", "HTTP2"']),
    (http(protocol=pb.HTTP2, scheme=pb.HTTPS),
     ['spec.http_get.protocol: Invalid value: "HTTP2": is only supported with HTTP (H2C)']),
    (http(protocol=pb.HTTP2, host="10.0.0.1"),
     ['spec.http_get.host: Invalid value: "10.0.0.1": must be empty when `protocol` is "HTTP2"']),
    # ...after the headers' errors, as Go checks them
    (http(protocol=pb.HTTP2, scheme=pb.HTTPS, http_headers=headers(("bad name", "v"))),
     [f'spec.http_get.http_headers: Invalid value: "bad name": {HEADER_MSG}',
      'spec.http_get.protocol: Invalid value: "HTTP2": is only supported with HTTP (H2C)']),
    # validateGRPCAction (1.37, KEP-4939): a mode this version does not know is NotSupported.
    (pb.ProbeSpec(grpc=pb.GRPCAction(port=9090, mode=7)),
     ['spec.grpc.mode: Unsupported value: 7: supported values: "Plaintext", "TLS"']),
    (http(http_headers=headers(("bad name", "v"))),
     [f'spec.http_get.http_headers: Invalid value: "bad name": {HEADER_MSG}']),
    (http(http_headers=headers(("", "v"))),
     [f'spec.http_get.http_headers: Invalid value: "": {HEADER_MSG}']),
    (http(http_headers=headers(("X-Ok", "a"), ("X:Colon", "b"), ("Über", "c"))),
     [f'spec.http_get.http_headers: Invalid value: "X:Colon": {HEADER_MSG}',
      f'spec.http_get.http_headers: Invalid value: "Über": {HEADER_MSG}']),
    # addition: CR/LF/NUL in values; the value itself (maybe a credential) is not echoed.
    (http(http_headers=headers(("X-A", "ok"), ("Authorization", "Bearer s3cret\r\nX-Evil: 1")))
     , [f"spec.http_get.http_headers[1].value: {HEADER_VALUE_MSG}"]),
    (http(http_headers=headers(("X-A", "a\nb"))),
     [f"spec.http_get.http_headers[0].value: {HEADER_VALUE_MSG}"]),
    (http(http_headers=headers(("X-A", "a\0b"))),
     [f"spec.http_get.http_headers[0].value: {HEADER_VALUE_MSG}"]),
    (http(http_headers=headers(("bad\n", "a\rb"))),
     [f'spec.http_get.http_headers: Invalid value: "bad\\n": {HEADER_MSG}',
      f"spec.http_get.http_headers[0].value: {HEADER_VALUE_MSG}"]),
    # Kubernetes order inside the action: port, scheme, headers.
    (http(0, scheme=5, http_headers=headers(("a b", ""))),
     [f"spec.http_get.port: Invalid value: 0: {PORT_RANGE}",
      'spec.http_get.scheme: Unsupported value: 5: supported values: "HTTP", "HTTPS"',
      f'spec.http_get.http_headers: Invalid value: "a b": {HEADER_MSG}']),
])
def test_http_action_errors(spec, expected):
    assert validate_probe(READINESS, spec) == expected


# --- numeric fields and probe-type rules ---------------------------------------------

NEG = "must be greater than or equal to 0"


@pytest.mark.parametrize("probe_type, fields, expected", [
    (READINESS, {"initial_delay_ms": -1}, [f"spec.initial_delay_ms: Invalid value: -1: {NEG}"]),
    (READINESS, {"timeout_ms": -5}, [f"spec.timeout_ms: Invalid value: -5: {NEG}"]),
    (READINESS, {"period_ms": -10}, [f"spec.period_ms: Invalid value: -10: {NEG}"]),
    (READINESS, {"success_threshold": -2}, [f"spec.success_threshold: Invalid value: -2: {NEG}"]),
    (READINESS, {"failure_threshold": -3}, [f"spec.failure_threshold: Invalid value: -3: {NEG}"]),
    # Declaration order of validateProbe: initialDelay, timeout, period, success, failure.
    (READINESS, {"failure_threshold": -1, "period_ms": -1, "initial_delay_ms": -1,
                 "success_threshold": -1, "timeout_ms": -1},
     [f"spec.initial_delay_ms: Invalid value: -1: {NEG}",
      f"spec.timeout_ms: Invalid value: -1: {NEG}",
      f"spec.period_ms: Invalid value: -1: {NEG}",
      f"spec.success_threshold: Invalid value: -1: {NEG}",
      f"spec.failure_threshold: Invalid value: -1: {NEG}"]),
    (READINESS, {"success_threshold": 2}, []),
    (LIVENESS, {"success_threshold": 2}, ["spec.success_threshold: Invalid value: 2: must be 1"]),
    (STARTUP, {"success_threshold": 3}, ["spec.success_threshold: Invalid value: 3: must be 1"]),
    (LIVENESS, {"success_threshold": 0}, []),          # defaulted to 1 before the check
    (LIVENESS, {"success_threshold": -1},
     [f"spec.success_threshold: Invalid value: -1: {NEG}",
      "spec.success_threshold: Invalid value: -1: must be 1"]),
    (READINESS, {"termination_grace_period_ms": 5000},
     ["spec.termination_grace_period_ms: Invalid value: 5000: must not be set for readinessProbes"]),
    (LIVENESS, {"termination_grace_period_ms": 0},
     ["spec.termination_grace_period_ms: Invalid value: 0: must be greater than 0"]),
    (STARTUP, {"termination_grace_period_ms": -7},
     ["spec.termination_grace_period_ms: Invalid value: -7: must be greater than 0"]),
    (READINESS, {"termination_grace_period_ms": 0},
     ["spec.termination_grace_period_ms: Invalid value: 0: must be greater than 0",
      "spec.termination_grace_period_ms: Invalid value: 0: must not be set for readinessProbes"]),
    # addition: the millisecond floor on the period; 0 means the 10 s default.
    (READINESS, {"period_ms": 9}, ["spec.period_ms: Invalid value: 9: must be at least 10ms"]),
    (READINESS, {"period_ms": 1}, ["spec.period_ms: Invalid value: 1: must be at least 10ms"]),
    (READINESS, {"period_ms": 0}, []),
    (READINESS, {"timeout_ms": 0}, []),                # defaulted to 1 s
    (READINESS, {"timeout_ms": 1}, []),
])
def test_numeric_and_type_rules(probe_type, fields, expected):
    assert validate_probe(probe_type, tcp(**fields)) == expected


@pytest.mark.parametrize("fields, expected", [
    ({"target": 9}, ['spec.target: Unsupported value: 9: supported values: "POD_IP", "LOOPBACK"']),
    ({"ip_family": 4},
     ['spec.ip_family: Unsupported value: 4: supported values: "PRIMARY", "IPV4", "IPV6", "ANY"']),
])
def test_unknown_enum_numbers_are_unsupported(fields, expected):
    assert validate_probe(READINESS, tcp(**fields)) == expected


def test_probe_type_unspecified_is_required_outside_root():
    assert validate_probe(pb.PROBE_TYPE_UNSPECIFIED, tcp()) == ["type: Required value"]


def test_unknown_probe_type_is_unsupported():
    assert validate_probe(9, tcp()) == [
        'type: Unsupported value: 9: supported values: "LIVENESS", "READINESS", "STARTUP"']


def test_errors_come_handler_first_then_numeric_fields_then_type_rules():
    spec = pb.ProbeSpec(
        tcp_socket=pb.TCPSocketAction(port=pb.PortRef(number=0)),
        grpc=pb.GRPCAction(port=1),
        timeout_ms=-1,
        success_threshold=2,
        termination_grace_period_ms=0,
        period_ms=5,
        target=3,
    )
    assert validate_probe(pb.PROBE_TYPE_UNSPECIFIED, spec) == [
        "type: Required value",
        f"spec.tcp_socket.port: Invalid value: 0: {PORT_RANGE}",
        "spec.grpc: Forbidden: may not specify more than 1 handler type",
        f"spec.timeout_ms: Invalid value: -1: {NEG}",
        "spec.termination_grace_period_ms: Invalid value: 0: must be greater than 0",
        "spec.period_ms: Invalid value: 5: must be at least 10ms",
        'spec.target: Unsupported value: 3: supported values: "POD_IP", "LOOPBACK"',
    ]
    assert validate_probe(LIVENESS, spec)[-4:] == [
        "spec.termination_grace_period_ms: Invalid value: 0: must be greater than 0",
        "spec.success_threshold: Invalid value: 2: must be 1",
        "spec.period_ms: Invalid value: 5: must be at least 10ms",
        'spec.target: Unsupported value: 3: supported values: "POD_IP", "LOOPBACK"',
    ]


def test_root_prefixes_every_path():
    errors = validate_probe(READINESS, tcp(0, period_ms=-1), root="probes[2].spec")
    assert errors == [
        f"probes[2].spec.tcp_socket.port: Invalid value: 0: {PORT_RANGE}",
        f"probes[2].spec.period_ms: Invalid value: -1: {NEG}",
    ]
    assert validate_probe(READINESS, pb.ProbeSpec(), root="x") == [
        "x: Required value: must specify a handler type"]


# --- Go formatting -------------------------------------------------------------------

@pytest.mark.parametrize("text, quoted", [
    ("", '""'),
    ("plain", '"plain"'),
    ('say "hi"\\', '"say \\"hi\\"\\\\"'),
    ("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
    ("\x00\x1b\x7f", '"\\x00\\x1b\\x7f"'),
    ("é日本", '"é日本"'),                      # printable runes stay as they are
    ("\u00a0\u200b\u2028", '"\\u00a0\\u200b\\u2028"'),
    ("\U000e0001", '"\\U000e0001"'),
])
def test_go_quote_matches_strconv_quote(text, quoted):
    assert go_quote(text) == quoted


@pytest.mark.parametrize("error, text", [
    (FieldError.required("a.b"), "a.b: Required value"),
    (FieldError.required("a", "why"), "a: Required value: why"),
    (FieldError.forbidden("a", "no"), "a: Forbidden: no"),
    (FieldError.invalid("a", 3, "bad"), "a: Invalid value: 3: bad"),
    (FieldError.invalid("a", "x\ty", "bad"), 'a: Invalid value: "x\\ty": bad'),
    (FieldError.invalid("a", None, "bad"), "a: Invalid value: null: bad"),
    (FieldError.invalid("a", True, "bad"), "a: Invalid value: true: bad"),
    (FieldError.not_supported("a", "z", ["x", "y"]), 'a: Unsupported value: "z": supported values: "x", "y"'),
    (FieldError.not_supported("a", "z", []), 'a: Unsupported value: "z"'),
])
def test_field_error_prints_like_go(error, text):
    assert str(error) == text


# --- limits (additions: Kubernetes leaves these unbounded) --------------------------------


@pytest.mark.parametrize("spec, expected", [
    (http(path="healthz"),
     ["spec.http_get.path: Invalid value: \"healthz\": must be an absolute path: start with '/'"]),
    (http(path="?x"), ["spec.http_get.path: Invalid value: \"?x\": must be an absolute path: start with '/'"]),
    (http(path="/a\r\nHost: x"),
     ['spec.http_get.path: Invalid value: "/a\\r\\nHost: x": must not contain control characters']),
    (http(path="/a\x7fb"), ['spec.http_get.path: Invalid value: "/a\\x7fb": must not contain control characters']),
    (http(path="/" + "p" * (V.MAX_PATH_BYTES - 1)), []),
    (http(path="/" + "p" * V.MAX_PATH_BYTES), ["spec.http_get.path: Too long: may not be more than 2048 bytes"]),
    (http(path="/" + "é" * 1024), ["spec.http_get.path: Too long: may not be more than 2048 bytes"]),  # bytes count
    (http(host="h" * 253), []),
    (http(host="h" * 254), ["spec.http_get.host: Too long: may not be more than 253 bytes"]),
    (pb.ProbeSpec(tcp_socket=pb.TCPSocketAction(port=pb.PortRef(number=1), host="db\n")),
     ['spec.tcp_socket.host: Invalid value: "db\\n": must not contain control characters']),
    (pb.ProbeSpec(grpc=pb.GRPCAction(port=1, service="s" * 1024)), []),
    (pb.ProbeSpec(grpc=pb.GRPCAction(port=1, service="s" * 1025)),
     ["spec.grpc.service: Too long: may not be more than 1024 bytes"]),
])
def test_path_host_and_service_limits(spec, expected):
    assert validate_probe(READINESS, spec) == expected


def test_header_limits():
    assert validate_probe(READINESS, http(http_headers=headers(*[("X", "v")] * 64))) == []
    assert validate_probe(READINESS, http(http_headers=headers(*[("X", "v")] * 65))) == [
        "spec.http_get.http_headers: Too many: 65: must have at most 64 items"]
    assert validate_probe(READINESS, http(http_headers=headers(("X" * 257, "v"), ("X-B", "v" * 4097)))) == [
        "spec.http_get.http_headers[0].name: Too long: may not be more than 256 bytes",
        "spec.http_get.http_headers[1].value: Too long: may not be more than 4096 bytes"]
    four_full = headers(*[("X-A", "v" * 4093)] * 4)   # 4 x 4096 bytes: exactly the total limit
    assert validate_probe(READINESS, http(http_headers=four_full)) == []
    assert validate_probe(READINESS, http(http_headers=four_full + headers(("X", "")))) == [
        "spec.http_get.http_headers: Too long: may not be more than 16384 bytes"]


@pytest.mark.parametrize("name", ["initial_delay_ms", "timeout_ms", "period_ms"])
def test_durations_are_bounded_by_what_kubernetes_can_hold(name):
    assert V.MAX_DURATION_MS == 2147483647 * 1000
    assert validate_probe(READINESS, tcp(**{name: V.MAX_DURATION_MS})) == []
    assert validate_probe(READINESS, tcp(**{name: V.MAX_DURATION_MS + 1})) == [
        f"spec.{name}: Invalid value: {V.MAX_DURATION_MS + 1}: must be no more than {V.MAX_DURATION_MS} "
        "(2147483647 s, the most a Kubernetes probe can hold)"]


def test_grace_period_is_bounded_too():
    assert validate_probe(LIVENESS, tcp(termination_grace_period_ms=V.MAX_DURATION_MS)) == []
    (error,) = validate_probe(LIVENESS, tcp(termination_grace_period_ms=2**63 - 1))
    assert error.startswith(f"spec.termination_grace_period_ms: Invalid value: {2**63 - 1}: must be no more than")


def test_echoed_values_are_cut():
    (error,) = validate_probe(READINESS, http(path="x" * 2000))
    assert error == f'spec.http_get.path: Invalid value: "{"x" * 256}"...: must be an absolute path: start with \'/\''
    # Cut on a character boundary: no half of a multi-byte character.
    assert str(FieldError.invalid("a", "é" * 200, "bad")) == f'a: Invalid value: "{"é" * 128}"...: bad'


@pytest.mark.parametrize("error, text", [
    (FieldError.too_long("a.b", 7), "a.b: Too long: may not be more than 7 bytes"),
    (FieldError.too_many("a", 9, 8), "a: Too many: 9: must have at most 8 items"),
])
def test_limit_errors_print_like_go(error, text):
    assert str(error) == text
