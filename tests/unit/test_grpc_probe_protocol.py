"""The gRPC health probe against scripted HTTP/2 servers (h2, server side): the request grpc-go sends, and the
protocol corner cases a real server never produces (statuses, resets, GOAWAY, flow control, oversized frames)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

from cri_proto import grpc_health_pb2 as health_pb
from probe_api.grpc_wire_rules import frame_message
from probe_worker.probes.grpc import rules, unary_call
from tests.support.grpc_probe_harness import run_probe

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
    message = frame_message(health_pb.HealthCheckResponse(status=health_pb.HealthCheckResponse.SERVING).SerializeToString())
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
    assert request[b"user-agent"] == b"kube-probe/1.37 grpc-go/1.82.1"  # grpc-go of kubelet 1.37.2's go.mod
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
