"""The gRPC probe's request, dial backoff and kubelet outputs (probe_worker.probes.grpc.rules), without sockets."""

import struct

import pytest

from cri_proto import grpc_health_pb2 as health_pb
from probe_api import grpc_codes as codes
from probe_api.grpc_wire_rules import frame_message
from probe_worker.attempt import FAILURE, SUCCESS
from probe_worker.probes.grpc import rules, unary_call

SECOND = 1_000_000_000


def _response(status: int) -> bytes:
    return frame_message(health_pb.HealthCheckResponse(status=status).SerializeToString())


# ---------------------------------------------------------------- the request


def test_request_headers_are_grpc_go_order_and_values():
    assert rules.request_headers("198.18.0.2:9000", "kube-probe/1.37", 999_876_000) == [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "198.18.0.2:9000"),
        ("content-type", "application/grpc"),
        ("user-agent", "kube-probe/1.37 grpc-go/1.82.1"),  # grpc-go of kubelet 1.37.2's go.mod
        ("te", "trailers"),
        ("grpc-timeout", "999876u"),
    ]


def test_check_request_is_length_prefixed_health_request():
    framed = rules.check_request("db")
    assert framed[:5] == struct.pack(">BI", 0, len(framed) - 5)
    assert health_pb.HealthCheckRequest.FromString(framed[5:]).service == "db"


# ---------------------------------------------------------------- backoff


def test_first_retry_waits_exactly_the_base_delay():
    assert rules.backoff_delay(0, lambda: 0.0) == 1.0
    assert rules.backoff_delay(0, lambda: 0.999) == 1.0


def test_backoff_grows_by_1_6_with_20_percent_jitter():
    assert rules.backoff_delay(1, lambda: 0.5) == pytest.approx(1.6)
    assert rules.backoff_delay(1, lambda: 0.0) == pytest.approx(1.6 * 0.8)
    assert rules.backoff_delay(2, lambda: 1.0) == pytest.approx(1.6 * 1.6 * 1.2)


def test_backoff_is_capped_at_120s_before_jitter():
    assert rules.backoff_delay(50, lambda: 0.5) == pytest.approx(120.0)
    assert rules.backoff_delay(50, lambda: 1.0) == pytest.approx(144.0)


def test_connect_window_is_at_least_min_connect_timeout():
    assert rules.connect_window(1.0) == 20.0
    assert rules.connect_window(75.0) == 75.0


# ---------------------------------------------------------------- kubelet outputs


def test_serving_is_success():
    outcome = rules.check_outcome(_response(1)[5:], SECOND)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (SUCCESS, "service healthy", "SERVING")


@pytest.mark.parametrize(("status", "name"), [(0, "UNKNOWN"), (2, "NOT_SERVING"), (3, "SERVICE_UNKNOWN"), (9, "9")])
def test_other_statuses_are_unhealthy(status, name):
    outcome = rules.check_outcome(_response(status)[5:], SECOND)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (FAILURE, f'service unhealthy (responded with "{name}")', name)


def test_unimplemented_output():
    outcome = rules.check_outcome(unary_call.RpcError(codes.UNIMPLEMENTED, "Method not found!"), SECOND)
    assert outcome.output == "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): Method not found!"
    assert outcome.grpc_status == "Unimplemented"


def test_deadline_output_uses_the_probe_timeout():
    outcome = rules.check_outcome(unary_call.DEADLINE, 1_500_000_000)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (FAILURE, "timeout: health rpc did not complete within 1.5s", "DeadlineExceeded")


def test_other_errors_output():
    outcome = rules.check_outcome(unary_call.RpcError(codes.NOT_FOUND, "unknown service"), SECOND)
    assert outcome.output == "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
    assert rules.check_outcome(unary_call.BARE_EOF, SECOND).output == "error: health rpc probe failed: EOF"


def test_undecodable_response():
    outcome = rules.check_outcome(b"\xff\xff", SECOND)
    assert outcome.output == (
        "error: health rpc probe failed: rpc error: code = Internal desc = "
        "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data"
    )


def test_dial_timeout_output():
    assert rules.dial_timeout_output("[fd00:5a::2]:9000", SECOND) == (
        'timeout: failed to connect service "[fd00:5a::2]:9000" within 1s: context deadline exceeded'
    )
