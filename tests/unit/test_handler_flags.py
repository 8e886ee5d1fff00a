"""probectl's handler syntax (probe_api/handler_flags.py: --http-get, --tcp, --grpc, headers, the API's enum names),
table-driven, no I/O. (Durations: tests/unit/test_probectl_specs.py.)"""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.handler_flags import (IP_FAMILIES, PROBE_TYPES, TARGETS, grpc_action, http_get_action,
                                     parse_header, tcp_socket_action)


def port(number=None, name=None):
    return spec_pb.PortRef(number=number) if number is not None else spec_pb.PortRef(name=name)


@pytest.mark.parametrize("target, expected", [
    ("8080", spec_pb.HTTPGetAction(path="/", port=port(8080))),
    ("8080/healthz", spec_pb.HTTPGetAction(path="/healthz", port=port(8080))),
    ("http://8080/ready?full=1&x=%20", spec_pb.HTTPGetAction(path="/ready?full=1&x=%20", port=port(8080))),
    ("HTTPS://8443", spec_pb.HTTPGetAction(path="/", port=port(8443), scheme=spec_pb.HTTPS)),
    ("https://web/", spec_pb.HTTPGetAction(path="/", port=port(name="web"), scheme=spec_pb.HTTPS)),
    ("localhost:8080/x", spec_pb.HTTPGetAction(path="/x", port=port(8080), host="localhost")),
    ("http://[fd00::1]:80/x", spec_pb.HTTPGetAction(path="/x", port=port(80), host="fd00::1")),
    ("10.0.0.1:metrics", spec_pb.HTTPGetAction(path="/", port=port(name="metrics"), host="10.0.0.1")),
    ("8080?probe=1", spec_pb.HTTPGetAction(path="/?probe=1", port=port(8080))),
])
def test_http_get_syntax(target, expected):
    assert http_get_action(target) == expected


@pytest.mark.parametrize("target, message", [
    ("ftp://x:21", '--http-get "ftp://x:21": unsupported scheme "ftp": use http or https'),
    ("::1:80", '--http-get "::1:80": put an IPv6 host in brackets, e.g. [::1]:8080'),
    ("[::1]80", '--http-get "[::1]80": use [IPV6]:PORT for an IPv6 host'),
    ("host:", '--http-get "host:": missing port'),
    ("/healthz", '--http-get "/healthz": missing port'),
    ("0", '--http-get "0": port 0 is out of range 1-65535'),
    ("65536", '--http-get "65536": port 65536 is out of range 1-65535'),
    ("Web", '--http-get "Web": port "Web" is neither a number nor a valid port name: must contain only '
            'alpha-numeric characters (a-z, 0-9), and hyphens (-)'),
    ("a-very-long-port-name", '--http-get "a-very-long-port-name": port "a-very-long-port-name" is neither a '
                              'number nor a valid port name: must be no more than 15 characters'),
])
def test_bad_http_get_syntax(target, message):
    with pytest.raises(ValueError) as err:
        http_get_action(target)
    assert str(err.value) == message


@pytest.mark.parametrize("header, expected", [
    ("X-Token: abc", ("X-Token", "abc")),
    ("Accept:application/json", ("Accept", "application/json")),
    ("User-Agent:", ("User-Agent", "")),            # an empty value removes the header, as in Kubernetes
    ("X-Url: http://a:b/c", ("X-Url", "http://a:b/c")),  # split at the first colon only
])
def test_headers(header, expected):
    assert parse_header(header) == expected


@pytest.mark.parametrize("header, message", [
    ("X-Token", "--header \"X-Token\": use 'Name: value'"),
    (": v", "--header \": v\": empty header name; use 'Name: value'"),
])
def test_bad_headers(header, message):
    with pytest.raises(ValueError) as err:
        parse_header(header)
    assert str(err.value) == message


def test_headers_are_kept_in_order():
    action = http_get_action("8080", ["X-B: 2", "X-A: 1", "Accept:"])
    assert [(h.name, h.value) for h in action.http_headers] == [("X-B", "2"), ("X-A", "1"), ("Accept", "")]


@pytest.mark.parametrize("target, expected", [
    ("5432", spec_pb.TCPSocketAction(port=port(5432))),
    ("postgres", spec_pb.TCPSocketAction(port=port(name="postgres"))),
    ("127.0.0.1:5432", spec_pb.TCPSocketAction(port=port(5432), host="127.0.0.1")),
    ("[::1]:db", spec_pb.TCPSocketAction(port=port(name="db"), host="::1")),
])
def test_tcp_syntax(target, expected):
    assert tcp_socket_action(target) == expected


@pytest.mark.parametrize("target, message", [
    ("", '--tcp "": missing port'),
    ("x:99999", '--tcp "x:99999": port 99999 is out of range 1-65535'),
    ("::1", '--tcp "::1": put an IPv6 host in brackets, e.g. [::1]:8080'),
])
def test_bad_tcp_syntax(target, message):
    with pytest.raises(ValueError) as err:
        tcp_socket_action(target)
    assert str(err.value) == message


def test_grpc():
    assert grpc_action("9090") == spec_pb.GRPCAction(port=9090)
    assert not grpc_action("9090").HasField("service")  # unset: the server's overall health
    with_service = grpc_action("9090", "")
    assert with_service.HasField("service") and with_service.service == ""
    assert grpc_action("9090", "liveness").service == "liveness"
    for bad, message in (("grpc", '--grpc "grpc": the port must be a number (gRPC probes take no named ports)'),
                         ("0", '--grpc "0": port 0 is out of range 1-65535'),
                         ("²", '--grpc "²": the port must be a number (gRPC probes take no named ports)')):
        with pytest.raises(ValueError) as err:
            grpc_action(bad)
        assert str(err.value) == message


def test_http_protocol_as_the_api_spells_it():
    # core/v1 HTTPProtocol (KEP-5999): "HTTP1" (the default) and "HTTP2", case as written.
    assert http_get_action(":8080/healthz", protocol="HTTP2").protocol == spec_pb.HTTP2
    assert http_get_action(":8080", protocol="HTTP1").protocol == spec_pb.HTTP1 == http_get_action(":8080").protocol
    with pytest.raises(ValueError) as err:
        http_get_action(":8080", protocol="h2c")
    assert str(err.value) == '--http-protocol "h2c": supported values: "HTTP1", "HTTP2"'


def test_grpc_mode_as_the_api_spells_it():
    # core/v1 GRPCProbeMode (KEP-4939): "Plaintext" (the default) and "TLS", case as written.
    assert grpc_action("9090", mode="TLS").mode == spec_pb.TLS
    assert grpc_action("9090", mode="Plaintext").mode == spec_pb.PLAINTEXT == grpc_action("9090").mode
    with pytest.raises(ValueError) as err:
        grpc_action("9090", mode="tls")
    assert str(err.value) == '--grpc-mode "tls": supported values: "Plaintext", "TLS"'


def test_enum_names():
    assert PROBE_TYPES == {"liveness": spec_pb.LIVENESS, "readiness": spec_pb.READINESS,
                           "startup": spec_pb.STARTUP}
    assert TARGETS == {"pod-ip": spec_pb.POD_IP, "loopback": spec_pb.LOOPBACK}
    assert IP_FAMILIES == {"primary": spec_pb.PRIMARY, "ipv4": spec_pb.IPV4, "ipv6": spec_pb.IPV6,
                           "any": spec_pb.ANY}
