"""probectl's client over its own connections (probectl/client.py, probectl/shim_socket.py): a unix socket served by
h2's server in a thread. A connection is reused while the shim keeps it, replaced once the shim closed it, as grpc's
channel connects again (GOAWAY: tests/unit/test_probectl_unary_h2.py, and a restarted daemon:
tests/system/test_client.py); what fails is said in the client's exceptions."""

from __future__ import annotations

import contextlib
import socket
import threading

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from cri_proto import probe_service_pb2 as service_pb
from probe_api.grpc_wire_rules import frame_message
from probectl.client import NotFoundError, ProbeShimClient, ShimError, ShimUnavailable


class Shim:
    """Answers ShimVersion with the connection's number, or every call with the error `status`. `drop()` closes its
    side of every connection, as a restarted shim has."""

    def __init__(self, path: str, status: tuple[int, str] | None = None) -> None:
        self.status, self.connections, self.sockets = status, 0, []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.sockets.append(conn)
            threading.Thread(target=self._answer, args=(conn, self.connections), daemon=True).start()

    def _answer(self, conn: socket.socket, number: int) -> None:
        peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        peer.initiate_connection()
        # A client that went away; frames after GOAWAY, which h2 refuses (the socket stays open for the test).
        with conn, contextlib.suppress(OSError, h2.exceptions.ProtocolError):
            conn.sendall(peer.data_to_send())
            while data := conn.recv(65536):
                for event in peer.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        self._respond(peer, event.stream_id, number)
                conn.sendall(peer.data_to_send())

    def _respond(self, peer, stream_id: int, number: int) -> None:
        peer.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        if self.status is None:
            answer = service_pb.ShimVersionResponse(instance_id=str(number)).SerializeToString()
            peer.send_data(stream_id, frame_message(answer))
            peer.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)
        else:
            peer.send_headers(stream_id, [("grpc-status", str(self.status[0])), ("grpc-message", self.status[1])],
                              end_stream=True)

    def drop(self) -> None:
        for conn in self.sockets:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "shim.sock")


@pytest.mark.parametrize(("drop", "connections"), [(False, ["1", "1", "1"]), (True, ["1", "2", "3"])])
def test_a_connection_serves_calls_until_the_shim_closes_it(path, drop, connections):
    shim = Shim(path)
    seen = []
    try:
        with ProbeShimClient(f"unix://{path}", timeout_s=5) as client:
            for _ in range(3):
                seen.append(client.version().instance_id)
                if drop:
                    shim.drop()
    finally:
        shim.close()
    assert seen == connections


def test_the_shims_errors_are_its_code_and_details(path):
    shim = Shim(path, (5, "no probe with id %22x%22"))
    try:
        with ProbeShimClient(f"unix://{path}", timeout_s=5) as client, pytest.raises(NotFoundError) as err:
            client.version()
    finally:
        shim.close()
    assert err.value.code == grpc.StatusCode.NOT_FOUND and str(err.value) == 'NOT_FOUND: no probe with id "x"'


def test_an_unavailable_shim_answer_is_the_shims_error_not_an_unreachable_shim(path):
    shim = Shim(path, (14, "worker for sandbox p not answering"))
    try:
        with ProbeShimClient(f"unix://{path}", timeout_s=5) as client, pytest.raises(ShimError) as err:
            client.version()
    finally:
        shim.close()
    assert not isinstance(err.value, ShimUnavailable) and err.value.code == grpc.StatusCode.UNAVAILABLE


def test_a_socket_nobody_serves_and_a_silent_one(path, tmp_path):
    with pytest.raises(ShimUnavailable):
        ProbeShimClient(f"unix://{path}", timeout_s=1).version()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen()
    try:
        with pytest.raises(ShimError) as err:
            ProbeShimClient(f"unix://{tmp_path / 'silent.sock'}", timeout_s=0.2).version()
    finally:
        silent.close()
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "in time (see -t/--timeout)" in str(err.value)
