"""The gRPC health probe through a real worker process inside a pod netns."""

from __future__ import annotations

import os

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.grpc_codes import attempt_grpc_status
from probe_worker.attempt import FAILURE, SUCCESS
from probe_worker.probes.grpc import rules
from tests.support.grpc_probe_harness import grpc_spec
from tests.support.servers.http_server import make_self_signed

# ---------------------------------------------------------------- through a real worker in a pod netns


@pytest.mark.netns
def test_worker_grpc_serving_on_pod_ipv4(pod_netns, worker):
    server = pod_netns.spawn_python("grpc_health_server.py", "--status", "db=NOT_SERVING")
    attempt = worker.run_once(grpc_spec(server.port))
    assert (attempt.result, attempt.output, attempt_grpc_status(attempt)) == (SUCCESS, "service healthy", "SERVING")
    assert attempt.address == f"{pod_netns.ipv4}:{server.port}"
    assert [p.name for p in attempt.phases][-3:] == ["connect", "handshake", "check"]

    attempt = worker.run_once(grpc_spec(server.port, service="db"))
    assert (attempt.result, attempt.output) == (FAILURE, 'service unhealthy (responded with "NOT_SERVING")')


@pytest.mark.netns
def test_worker_grpc_tls_mode_in_the_pod(pod_netns, worker, tmp_path):
    """A TLS gRPC health server in the pod (self-signed): grpc.mode TLS probes it as the kubelet 1.37 does, through
    the worker's broker sockets in the pod's netns; plaintext cannot, and times out as grpc-go's dial does."""
    made = make_self_signed(str(tmp_path))
    if made is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    os.chmod(tmp_path, 0o755)
    for path in made:
        os.chmod(path, 0o644)
    server = pod_netns.spawn_python("grpc_health_server.py", "--status", "db=NOT_SERVING", "--tls", *made)
    attempt = worker.run_once(grpc_spec(server.port, mode=spec_pb.TLS))
    assert (attempt.result, attempt.output, attempt_grpc_status(attempt)) == (SUCCESS, "service healthy", "SERVING")
    assert [p.name for p in attempt.phases][-4:] == ["connect", "tls", "handshake", "check"]
    attempt = worker.run_once(grpc_spec(server.port, service="db", mode=spec_pb.TLS))
    assert (attempt.result, attempt.output) == (FAILURE, 'service unhealthy (responded with "NOT_SERVING")')
    attempt = worker.run_once(grpc_spec(server.port, timeout_ms=500))
    assert (attempt.result, attempt.output) == (
        FAILURE, rules.dial_timeout_output(f"{pod_netns.ipv4}:{server.port}", 500_000_000))


@pytest.mark.netns
def test_worker_grpc_unknown_service_and_no_health_service(pod_netns, worker):
    server = pod_netns.spawn_python("grpc_health_server.py")
    attempt = worker.run_once(grpc_spec(server.port, service="nope"))
    # grpcio-health-checking answers NOT_FOUND with an empty message.
    assert (attempt.result, attempt.output) == (FAILURE, "error: health rpc probe failed: rpc error: code = NotFound desc = ")
    assert attempt_grpc_status(attempt) == "NotFound"

    bare = pod_netns.spawn_python("grpc_health_server.py", "--no-health")
    attempt = worker.run_once(grpc_spec(bare.port))
    assert attempt.result == FAILURE
    assert attempt.output.startswith(
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ")
    assert attempt_grpc_status(attempt) == "Unimplemented"

@pytest.mark.netns
def test_worker_grpc_over_ipv6(pod_netns, worker):
    server = pod_netns.spawn_python("grpc_health_server.py")
    spec = grpc_spec(server.port)
    spec.ip_family = spec_pb.IPV6
    attempt = worker.run_once(spec)
    assert attempt.output == "service healthy"
    assert attempt.address == f"[{pod_netns.ipv6}]:{server.port}"


@pytest.mark.netns
def test_worker_grpc_refused_port_is_a_timeout_on_the_pod_ip(pod_netns, worker):
    attempt = worker.run_once(grpc_spec(1, timeout_ms=500))
    assert attempt.result == FAILURE
    assert attempt.output == f'timeout: failed to connect service "{pod_netns.ipv4}:1" within 500ms: context deadline exceeded'
    assert attempt.duration_ns < 1_500_000_000


@pytest.mark.netns
def test_worker_grpc_slow_service(pod_netns, worker):
    server = pod_netns.spawn_python("grpc_health_server.py", "--slow-ms", "3000")
    attempt = worker.run_once(grpc_spec(server.port, timeout_ms=500))
    assert (attempt.result, attempt.output) == (FAILURE, "timeout: health rpc did not complete within 500ms")
    assert attempt_grpc_status(attempt) == "DeadlineExceeded"
    assert attempt.duration_ns < 1_500_000_000
