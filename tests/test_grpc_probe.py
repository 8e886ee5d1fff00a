"""The gRPC health probe executor against real servers.

In-process tests use loopback only: a real grpcio health server (subprocess),
misbehaving TCP servers, and scripted HTTP/2 servers (h2, server side) for the
protocol corner cases a real server never produces. The netns tests at the end
run the same probes through a real worker process inside a pod netns.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import pytest

from cri_proto import grpc_health_pb2 as health_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.grpc_codes import attempt_grpc_status
from probe_worker.probes.grpc import rules, unary_call
from probe_worker.attempt import FAILURE, SUCCESS, AttemptContext, Endpoint
from probe_worker.probes.grpc import executor as grpc_probe
from tests.servers.http_server import make_self_signed

SERVERS = Path(__file__).resolve().parent / "servers"
REPO_ROOT = SERVERS.parent.parent
UA = "kube-probe/1.32"


# ---------------------------------------------------------------- harness


class LocalServer:
    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVERS / script), "--host", "127.0.0.1", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"{script} {args} did not start: {line!r}")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def grpc_spec(port: int, service: str | None = None, timeout_ms: int = 1000, mode: int = spec_pb.PLAINTEXT):
    action = spec_pb.GRPCAction(port=port, mode=mode)
    if service is not None:
        action.service = service
    return spec_pb.ProbeSpec(grpc=action, timeout_ms=timeout_ms)


async def run_probe(port: int, service: str | None = None, timeout: float = 1.0, host: str = "127.0.0.1",
                    mode: int = spec_pb.PLAINTEXT):
    loop = asyncio.get_running_loop()
    ctx = AttemptContext(deadline=loop.time() + timeout, timeout_ns=int(timeout * 1e9), user_agent=UA)
    started = loop.time()
    outcome = await grpc_probe.probe(grpc_spec(port, service, mode=mode), Endpoint(host, (host,), port), ctx)
    return outcome, loop.time() - started, ctx.trace.phases


def probe_once(port: int, service: str | None = None, timeout: float = 1.0, mode: int = spec_pb.PLAINTEXT):
    return asyncio.run(run_probe(port, service, timeout, mode=mode))


def phase_names(phases) -> list[str]:
    return [p.name for p in phases]


def refused_port() -> socket.socket:
    """A bound, never-listening socket: its port refuses connections and cannot be reused meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


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
    ctx = AttemptContext(deadline=asyncio.get_running_loop().time() + timeout, timeout_ns=int(timeout * 1e9), user_agent="kube-probe/1.32")
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
    print(unary_call.decode_grpc_message(b"%ff%zz"))

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


# ---------------------------------------------------------------- scripted HTTP/2 servers

Respond = Callable[[h2.connection.H2Connection, int], "bytes | None"]
CLOSE = b"<close>"
RESET = b"<reset>"


class ScriptedH2Server:
    """An HTTP/2 server (h2, server side) whose answer to the request is a test's script.

    `respond(conn, stream_id)` runs when the request is complete; it may queue
    frames on conn and return raw bytes to write after them, or CLOSE.
    """

    def __init__(self, respond: Respond, first_bytes: bytes = b"", stream_window: int | None = None) -> None:
        self.respond = respond
        self.first_bytes = first_bytes
        self.stream_window = stream_window
        self.requests: list[dict[bytes, bytes]] = []
        self.bodies: list[bytes] = []

    async def __aenter__(self) -> "ScriptedH2Server":
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        if self.stream_window is not None:
            conn.local_settings = h2.settings.Settings(
                client=False, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.stream_window}
            )
        writer.write(self.first_bytes)
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        body = bytearray()
        try:
            while data := await reader.read(65536):
                extra = b""
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self.requests.append(dict(event.headers))
                    elif isinstance(event, h2.events.DataReceived):
                        body += event.data
                        if self.stream_window is not None and event.stream_ended is None:
                            conn.increment_flow_control_window(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self.bodies.append(bytes(body))
                        extra = self.respond(conn, event.stream_id) or b""
                writer.write(conn.data_to_send())
                if extra == CLOSE:
                    break
                if extra == RESET:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                writer.write(extra)
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()


def scripted(respond: Respond, timeout: float = 1.0, service: str = "svc", **server_options):
    async def go():
        async with ScriptedH2Server(respond, **server_options) as server:
            outcome, elapsed, phases = await run_probe(server.port, service=service, timeout=timeout)
        return outcome, elapsed, phases, server

    return asyncio.run(go())


def grpc_headers(status: str = "200", content_type: str = "application/grpc") -> list[tuple[str, str]]:
    return [(":status", status), ("content-type", content_type)]


def serving_response(conn, stream_id):
    message = rules.frame_message(health_pb.HealthCheckResponse(status=health_pb.HealthCheckResponse.SERVING).SerializeToString())
    conn.send_headers(stream_id, grpc_headers())
    conn.send_data(stream_id, message)
    conn.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)


def test_request_is_what_grpc_go_sends():
    outcome, _, _, server = scripted(serving_response)
    assert outcome.output == "service healthy"
    (request,) = server.requests
    assert request[b":method"] == b"POST" and request[b":scheme"] == b"http"
    assert request[b":path"] == b"/grpc.health.v1.Health/Check"
    assert request[b":authority"] == f"127.0.0.1:{server.port}".encode()
    assert request[b"content-type"] == b"application/grpc"
    assert request[b"user-agent"] == b"kube-probe/1.32 grpc-go/1.65.0"
    assert request[b"te"] == b"trailers"
    timeout = request[b"grpc-timeout"]
    assert timeout.endswith(b"u") and 0 < int(timeout[:-1]) <= 1_000_000  # the remaining deadline
    assert health_pb.HealthCheckRequest.FromString(server.bodies[0][5:]).service == "svc"


def test_http_404_page_is_unimplemented():
    def respond(conn, stream_id):
        conn.send_headers(stream_id, grpc_headers("404", "text/html"))
        conn.send_data(stream_id, b"<h1>not here</h1>", end_stream=True)

    outcome, _, _, _ = scripted(respond)
    assert outcome.output == (
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): "
        'unexpected HTTP status code received from server: 404 (Not Found); '
        'transport: received unexpected content-type "text/html"'
    )


def test_trailers_only_error_with_percent_encoded_message():
    def respond(conn, stream_id):
        conn.send_headers(stream_id, grpc_headers() + [("grpc-status", "5"), ("grpc-message", "unknown%20service")], end_stream=True)

    outcome, _, _, _ = scripted(respond)
    assert outcome.output == "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
    assert outcome.grpc_status == "NotFound"


def test_server_deadline_exceeded_status_is_the_timeout_text():
    def respond(conn, stream_id):
        conn.send_headers(stream_id, grpc_headers() + [("grpc-status", "4"), ("grpc-message", "too slow")], end_stream=True)

    outcome, elapsed, _, _ = scripted(respond, timeout=5.0)
    assert outcome.output == "timeout: health rpc did not complete within 5s"
    assert elapsed < 4.0  # the server's answer, not our deadline


def test_server_that_never_answers_the_call():
    outcome, elapsed, phases, _ = scripted(lambda conn, stream_id: None)
    assert outcome.output == "timeout: health rpc did not complete within 1s"
    assert phases[-1].name == "check" and phases[-1].error == "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    assert elapsed < 2.0


def test_reset_stream():
    outcome, _, _, _ = scripted(lambda conn, stream_id: conn.reset_stream(stream_id, error_code=7))
    assert outcome.output == (
        "error: health rpc probe failed: rpc error: code = Unavailable desc = "
        "stream terminated by RST_STREAM with error code: REFUSED_STREAM"
    )


def test_goaway_before_the_answer():
    outcome, _, _, _ = scripted(lambda conn, stream_id: conn.close_connection(last_stream_id=0))
    assert outcome.output == "error: health rpc probe failed: rpc error: code = Unavailable desc = the connection is draining"


def test_connection_closed_before_the_answer():
    outcome, _, _, _ = scripted(lambda conn, stream_id: CLOSE)
    assert outcome.output == "error: health rpc probe failed: rpc error: code = Unavailable desc = error reading from server: EOF"


def test_connection_reset_before_the_answer():
    outcome, _, _, server = scripted(lambda conn, stream_id: RESET)
    prefix = "error: health rpc probe failed: rpc error: code = Unavailable desc = error reading from server: read tcp 127.0.0.1:"
    assert outcome.output.startswith(prefix)
    assert outcome.output.endswith(f"->127.0.0.1:{server.port}: read: connection reset by peer")


def test_request_body_waits_for_flow_control_windows():
    service = "s" * 100  # the request body needs many 4-byte windows
    outcome, _, _, server = scripted(serving_response, stream_window=4, service=service)
    assert outcome.output == "service healthy"
    assert health_pb.HealthCheckRequest.FromString(server.bodies[0][5:]).service == service


def test_oversized_message_is_rejected_without_buffering_it():
    def respond(conn, stream_id):
        conn.send_headers(stream_id, grpc_headers())
        conn.send_data(stream_id, b"\x00\x7f\xff\xff\xff" + b"x" * 100)

    outcome, elapsed, _, _ = scripted(respond, timeout=5.0)
    assert outcome.output == (
        "error: health rpc probe failed: rpc error: code = ResourceExhausted desc = "
        f"grpc: received message larger than max ({0x7fffffff} vs. {unary_call.MAX_MESSAGE_BYTES})"
    )
    assert elapsed < 4.0  # decided from the length prefix, without waiting for the rest


def test_oversized_header_list_is_rejected():
    def respond(conn, stream_id):
        conn.send_headers(stream_id, grpc_headers() + [("x-filler", "a" * (rules.MAX_HEADER_LIST_BYTES + 1))])

    outcome, _, _, _ = scripted(respond)
    assert outcome.output == "error: health rpc probe failed: rpc error: code = Internal desc = peer header list size exceeded limit"


def test_ping_flood_hits_the_read_budget_not_memory():
    ping = hyperframe.frame.PingFrame(0)
    ping.opaque_data = b"\x00" * 8
    flood = ping.serialize() * (2 * rules.MAX_READ_BYTES // len(ping.serialize()))

    outcome, elapsed, _, _ = scripted(lambda conn, stream_id: flood, timeout=5.0)
    assert outcome.output == (
        "error: health rpc probe failed: rpc error: code = ResourceExhausted desc = "
        f"probe read limit: the server sent more than {rules.MAX_READ_BYTES} bytes"
    )
    assert elapsed < 4.0


def test_first_frame_other_than_settings_fails_the_handshake():
    ping = hyperframe.frame.PingFrame(0)
    ping.opaque_data = b"\x00" * 8
    outcome, _, phases, _ = scripted(serving_response, first_bytes=ping.serialize())
    assert outcome.output.startswith("timeout: failed to connect service")
    assert phases[1].name == "handshake"
    assert phases[1].error == "initial http2 frame from server is not a settings frame: *http2.PingFrame"  # Go's %T


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
