"""The benchmark's target servers and floor client, without sockets: the answers of
bench/target_protocols.py, and bench/targets.py's protocol objects driven over an in-memory
transport by the same kind of client the worker is (h2 for gRPC)."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest

from bench import target_protocols as proto
from bench.floor import http_request
from bench.targets import Counters, GrpcTarget, HttpTarget, Site, TcpTarget
from cri_proto import grpc_health_pb2 as health_pb


class MemoryTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data, self.written = self.written, b""
        return data


def test_request_path_waits_for_a_complete_head():
    assert proto.request_path(b"GET /healthz HTTP/1.1\r\nHost: x\r\n") is None
    assert proto.request_path(b"GET /healthz?x=1 HTTP/1.1\r\nHost: x\r\n\r\n") == "/healthz"
    with pytest.raises(proto.BadRequest):
        proto.request_path(b"\x16\x03\x01 hello\r\n\r\n")
    with pytest.raises(proto.BadRequest):
        proto.request_path(b"x" * (proto.MAX_REQUEST_HEAD + 1))


def test_http_answers():
    assert proto.http_answer("/healthz", True).startswith(b"HTTP/1.1 200 OK\r\n")
    assert proto.http_answer("/healthz", True).endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\nok\n")
    assert proto.http_answer("/healthz", False).startswith(b"HTTP/1.1 500 ")
    assert proto.http_answer("/other", True).startswith(b"HTTP/1.1 404 ")


def test_a_flapping_sandbox_alternates_healthy_and_unhealthy():
    assert [proto.healthy_at(t, 3.0) for t in (0, 2.9, 3.0, 5.9, 6.0)] == [True, True, False, False, True]
    assert proto.healthy_at(0.5, 3.0, phase_s=2.6) is False
    assert all(proto.healthy_at(t, 0) for t in (0, 1e6))


def test_grpc_health_check_answers():
    request = proto.grpc_frame(health_pb.HealthCheckRequest().SerializeToString())
    status, message = proto.health_check(proto.CHECK_PATH, request)
    assert status == proto.GRPC_OK
    assert health_pb.HealthCheckResponse.FromString(proto.grpc_messages(message)[0]).status == \
        health_pb.HealthCheckResponse.SERVING
    named = proto.grpc_frame(health_pb.HealthCheckRequest(service="db").SerializeToString())
    assert proto.health_check(proto.CHECK_PATH, named) == (proto.GRPC_NOT_FOUND, None)
    assert proto.health_check("/other.Service/Call", request) == (proto.GRPC_UNIMPLEMENTED, None)
    assert proto.health_check(proto.CHECK_PATH, request[:-1]) == (proto.GRPC_INTERNAL, None)  # truncated
    assert proto.health_check(proto.CHECK_PATH, b"\x00\x00\x00\x00\x09ab") == (proto.GRPC_INTERNAL, None)


def test_http_target_answers_the_probe_request_and_closes():
    counters = Counters()
    target, transport = HttpTarget(Site("ns", flip_s=0, phase_s=0), counters), MemoryTransport()
    target.connection_made(transport)
    request = http_request("198.18.0.2:8080", "/healthz")
    target.data_received(request[:10])
    assert transport.written == b"" and not transport.closed
    target.data_received(request[10:])
    assert transport.written.startswith(b"HTTP/1.1 200 OK") and transport.closed and counters.http == 1


def test_tcp_target_accepts_and_closes():
    counters, transport = Counters(), MemoryTransport()
    TcpTarget(counters).connection_made(transport)
    assert transport.closed and counters.tcp == 1


def test_grpc_target_serves_a_health_check_to_an_h2_client():
    counters, transport = Counters(), MemoryTransport()
    target = GrpcTarget(counters)
    target.connection_made(transport)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    first = client.receive_data(transport.take())
    assert isinstance(first[0], h2.events.RemoteSettingsChanged)  # what the worker waits for before calling
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", proto.CHECK_PATH),
                            (":authority", "198.18.0.2:9090"), ("content-type", "application/grpc"),
                            ("te", "trailers")])
    client.send_data(1, proto.grpc_frame(b""), end_stream=True)
    target.data_received(client.data_to_send())
    events = client.receive_data(transport.take())
    headers = [e for e in events if isinstance(e, h2.events.ResponseReceived)][0].headers
    body = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    trailers = [e for e in events if isinstance(e, h2.events.TrailersReceived)][0].headers
    assert dict(headers) == {":status": "200", "content-type": "application/grpc"}
    assert health_pb.HealthCheckResponse.FromString(proto.grpc_messages(body)[0]).status == \
        health_pb.HealthCheckResponse.SERVING
    assert dict(trailers) == {"grpc-status": "0"} and counters.grpc == 1
    client.close_connection()
    target.data_received(client.data_to_send())
    assert transport.closed


def test_floor_sends_the_kubelets_request():
    assert http_request("198.18.0.2:8080", "/healthz") == (
        b"GET /healthz HTTP/1.1\r\nHost: 198.18.0.2:8080\r\nUser-Agent: kube-probe/1.37\r\n"
        b"Accept: */*\r\nConnection: close\r\n\r\n")
