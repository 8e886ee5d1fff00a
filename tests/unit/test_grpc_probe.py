"""The gRPC health probe executor against real servers on loopback, in-process: a real grpcio health server
(subprocess), grpc.mode TLS, the dial's WithBlock semantics against misbehaving TCP servers, and what the probe
imports. Protocol corner cases a real server never produces are tests/unit/test_grpc_probe_protocol.py's (scripted
HTTP/2 servers); the same probes through a real worker in a pod netns are tests/system/test_grpc_probe_in_pod.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE, SUCCESS
from probe_worker.probes.grpc import executor as grpc_probe
from probe_worker.probes.grpc import rules
from tests.support.grpc_probe_harness import REPO_ROOT, LocalServer, phase_names, probe_once, refused_port
from tests.support.servers.http_server import make_self_signed


@pytest.fixture
def local_server():
    servers: list[LocalServer] = []

    def start(script: str, *args: str) -> LocalServer:
        servers.append(LocalServer(script, *args))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def health_server():
    server = LocalServer("grpc_health_server.py", "--status", "SERVING", "--status", "db=NOT_SERVING")
    yield server
    server.stop()


# ---------------------------------------------------------------- real grpcio server


def test_serving(health_server):
    outcome, _, phases = probe_once(health_server.port)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (SUCCESS, "service healthy", "SERVING")
    assert outcome.address == f"127.0.0.1:{health_server.port}"
    assert phase_names(phases) == ["connect", "handshake", "check"]
    assert phases[2].detail == "SERVING" and not phases[2].error


# ---------------------------------------------------------------- grpc.mode TLS (KEP-4939, kubelet 1.37 alpha)


@pytest.fixture(scope="module")
def tls_health_server(tmp_path_factory):
    made = make_self_signed(str(tmp_path_factory.mktemp("grpc-tls")))
    if made is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    server = LocalServer("grpc_health_server.py", "--status", "SERVING", "--status", "db=NOT_SERVING",
                         "--tls", *made)
    yield server
    server.stop()


def test_tls_mode_probes_a_tls_server_without_verifying_it(tls_health_server):
    """pkg/probe/grpc with GRPCProbeModeTLS: credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) (a
    self-signed certificate passes), the same outputs as in plaintext."""
    outcome, _, phases = probe_once(tls_health_server.port, mode=spec_pb.TLS)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (SUCCESS, "service healthy", "SERVING")
    assert phase_names(phases) == ["connect", "tls", "handshake", "check"]
    assert phases[1].detail.startswith("TLSv1.")
    unhealthy, _, _ = probe_once(tls_health_server.port, service="db", mode=spec_pb.TLS)
    assert (unhealthy.result, unhealthy.output) == (FAILURE, 'service unhealthy (responded with "NOT_SERVING")')


def test_plaintext_against_a_tls_server_and_tls_against_a_plaintext_one_time_out(tls_health_server, health_server):
    """Neither transport can be made (the TLS server reads our preface as a bad handshake; the plaintext one
    answers our ClientHello with HTTP/2 bytes): grpc-go's dial retries until the probe's deadline."""
    for port, mode in ((tls_health_server.port, spec_pb.PLAINTEXT), (health_server.port, spec_pb.TLS)):
        outcome, took, phases = probe_once(port, timeout=0.5, mode=mode)
        assert (outcome.result, outcome.output) == (
            FAILURE, rules.dial_timeout_output(f"127.0.0.1:{port}", 500_000_000))
        assert any(p.error for p in phases) and took < 0.5 + 0.5


def test_not_serving_named_service(health_server):
    outcome, _, _ = probe_once(health_server.port, service="db")
    assert (outcome.result, outcome.output) == (FAILURE, 'service unhealthy (responded with "NOT_SERVING")')
    assert outcome.grpc_status == "NOT_SERVING"


def test_unknown_service_is_not_found(health_server):
    # grpcio-health-checking sets NOT_FOUND without a message (grpc-go servers say "unknown service").
    outcome, _, phases = probe_once(health_server.port, service="nope")
    assert (outcome.result, outcome.output) == (FAILURE, "error: health rpc probe failed: rpc error: code = NotFound desc = ")
    assert outcome.grpc_status == "NotFound"
    assert phases[-1].error == "rpc error: code = NotFound desc = "


def test_server_without_health_service_is_unimplemented(local_server):
    server = local_server("grpc_health_server.py", "--no-health")
    outcome, _, _ = probe_once(server.port)
    assert outcome.result == FAILURE
    assert outcome.output == (
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): Method not found!"
    )
    assert outcome.grpc_status == "Unimplemented"


def test_slow_health_service_times_out_within_the_probe_timeout(local_server):
    server = local_server("grpc_health_server.py", "--slow-ms", "5000")
    outcome, elapsed, _ = probe_once(server.port, timeout=1.0)
    assert (outcome.result, outcome.output) == (FAILURE, "timeout: health rpc did not complete within 1s")
    assert outcome.grpc_status == "DeadlineExceeded"
    assert elapsed < 2.0


# ---------------------------------------------------------------- dial (WithBlock) semantics


def test_refused_port_waits_for_the_deadline_like_withblock():
    blocker = refused_port()
    port = blocker.getsockname()[1]
    try:
        outcome, elapsed, phases = probe_once(port, timeout=1.0)
    finally:
        blocker.close()
    assert outcome.result == FAILURE
    assert outcome.output == f'timeout: failed to connect service "127.0.0.1:{port}" within 1s: context deadline exceeded'
    assert outcome.address == "" and outcome.grpc_status == ""
    # grpc-go keeps retrying a refused port until the deadline instead of failing fast.
    assert 0.9 < elapsed < 2.0
    assert phases[0].name == "connect" and phases[0].error


def test_refused_port_is_retried_with_grpc_backoff(monkeypatch):
    class MidJitter:
        @staticmethod
        def random() -> float:
            return 0.5  # no jitter: retries at 1s, then 1s + 1.6s

    monkeypatch.setattr(grpc_probe, "jitter", MidJitter)
    blocker = refused_port()
    try:
        outcome, elapsed, phases = probe_once(blocker.getsockname()[1], timeout=3.0)
    finally:
        blocker.close()
    assert outcome.output.startswith("timeout: failed to connect service") and "within 3s" in outcome.output
    assert phase_names(phases) == ["connect", "backoff", "connect", "backoff", "connect", "backoff"]
    assert [p.detail for p in phases if p.name == "backoff"] == ["1s", "1.6s", "2.56s"]
    assert elapsed < 4.0


def test_server_that_never_speaks_http2_is_a_connect_timeout(local_server):
    server = local_server("tcp_server.py", "--mode", "silent")
    outcome, elapsed, phases = probe_once(server.port)
    assert outcome.output == f'timeout: failed to connect service "127.0.0.1:{server.port}" within 1s: context deadline exceeded'
    assert outcome.address == f"127.0.0.1:{server.port}"  # TCP got through; HTTP/2 never did
    assert phase_names(phases) == ["connect", "handshake"]
    assert phases[1].error == "timed out waiting for server handshake"
    assert elapsed < 2.0


def test_http1_server_is_a_connect_timeout(local_server):
    server = local_server("tcp_server.py", "--mode", "http1")
    outcome, elapsed, phases = probe_once(server.port)
    assert outcome.output == f'timeout: failed to connect service "127.0.0.1:{server.port}" within 1s: context deadline exceeded'
    # The HTTP/1.1 error response is no SETTINGS frame: the connection attempt fails and is retried.
    assert phase_names(phases)[:3] == ["connect", "handshake", "backoff"]
    assert phases[1].error.startswith("error reading from server")
    assert elapsed < 2.0


def test_grpc_is_not_imported_by_the_worker_side():
    code = (
        "import sys, probe_worker.probes.grpc.executor, probe_worker.probes.tcp\n"
        "loaded = sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'grpc_', '_grpc')))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


NO_LATE_IMPORTS = r"""
import asyncio, socket, sys
from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import AttemptContext, Endpoint
from probe_worker.probes.grpc import rules, unary_call
from probe_worker.probes import tcp as tcp_probe
from probe_worker.probes.grpc import executor as grpc_probe

class NoImports:
    def find_spec(self, name, path=None, target=None):
        raise ImportError(f"late import of {name}")

async def attempt(probe, port, service=None, timeout=1.0):
    ctx = AttemptContext(deadline=asyncio.get_running_loop().time() + timeout, timeout_ns=int(timeout * 1e9), user_agent="kube-probe/1.37")
    spec = spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=port, service=service))
    return (await probe(spec, Endpoint("127.0.0.1", ("127.0.0.1",), port), ctx)).output

async def main(port):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    sys.meta_path.insert(0, NoImports())  # the worker drops privileges here: nothing new may load
    print(await attempt(grpc_probe.probe, port))
    print(await attempt(grpc_probe.probe, port, service="nope"))
    print(await attempt(grpc_probe.probe, blocker.getsockname()[1], timeout=0.2))
    print(await attempt(tcp_probe.probe, port))
    print(await attempt(tcp_probe.probe, blocker.getsockname()[1]))
    # Error paths of the pure rules: odd bytes, undecodable messages, non-gRPC answers.
    call = unary_call.UnaryCall()
    call.on_headers([(b":status", b"404"), (b"content-type", b"text/\xff")], False)
    print(rules.check_outcome(call.result, 10**9).output)
    print(rules.check_outcome(b"\xff\xff", 10**9).output)
    call = unary_call.UnaryCall()
    call.on_headers([(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"2"),
                     (b"grpc-message", b"%ff%zz")], True)
    print(call.result.message)

asyncio.run(main(int(sys.argv[1])))
"""


def test_probes_need_no_imports_once_running(health_server):
    """The worker drops privileges after start-up; a lazy import then fails (PermissionError)."""
    result = subprocess.run(
        [sys.executable, "-c", NO_LATE_IMPORTS, str(health_server.port)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "service healthy"
    assert lines[1].startswith("error: health rpc probe failed: rpc error: code = NotFound")
    assert lines[2].startswith("timeout: failed to connect service")
    assert lines[3] == "" and lines[4].endswith("connect: connection refused")
    assert lines[5].endswith('transport: received unexpected content-type "text/\\xff"')
    assert "failed to unmarshal" in lines[6]
    assert lines[7] == "\ufffd%zz"
