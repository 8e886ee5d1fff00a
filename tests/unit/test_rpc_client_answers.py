"""What the daemon's gRPC client (shim/rpc/client.py) makes of answers a grpcio server never sends: a runtime
written on python-hyper's h2 (server side) plays a script per method over a unix socket, and grpcio's client calls
the same method in the same test. Where the two differ, on purpose, the test says why.

Each case uses fresh connections: grpc core stops following the HPACK table of a connection once it failed to parse
a header, which would spoil the cases after it.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile
import zlib

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from shim.rpc.client import CallError, Channel
from tests.unit.test_rpc_client_channel import bounded, run

OK = [(b":status", b"200"), (b"content-type", b"application/grpc")]
STATUS_0 = [(b"grpc-status", b"0")]


def message(payload: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BL", compressed, len(payload)) + payload


def answer(*frames) -> list:
    """("headers", headers, end_stream) | ("data", bytes) | ("reset", code), played when the request ended."""
    return list(frames)


class ScriptedRuntime(asyncio.Protocol):
    """An HTTP/2 server that answers every request with `script` (h2 checks nothing it sends: odd is the point)."""

    def __init__(self, script: list, max_streams: int | None = None) -> None:
        self._script = script
        config = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                           validate_outbound_headers=False, normalize_outbound_headers=False)
        self._h2 = h2.connection.H2Connection(config)
        if max_streams is not None:  # h2 raises TooManyStreamsError for a stream over it: the connection breaks
            self._h2.local_settings = h2.settings.Settings(
                client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams})
        self.most_open = 0

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._h2.initiate_connection()
        transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self._h2.receive_data(data):
            self.most_open = max(self.most_open, self._h2.open_inbound_streams)
            if isinstance(event, h2.events.DataReceived):
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                for kind, *args in self._script:
                    if kind == "headers":
                        self._h2.send_headers(event.stream_id, args[0], end_stream=args[1])
                    elif kind == "data":
                        self._h2.send_data(event.stream_id, args[0])
                    else:
                        self._h2.reset_stream(event.stream_id, args[0])
        self._transport.write(self._h2.data_to_send())


async def both_clients(script: list) -> tuple[tuple, tuple]:
    """(code name, details, initial metadata, trailing metadata) or ("OK", response, ...) from each client."""
    directory = tempfile.mkdtemp(prefix="grpccli-")
    server = await asyncio.get_running_loop().create_unix_server(lambda: ScriptedRuntime(script),
                                                                 f"{directory}/raw.sock")
    target = f"unix:{directory}/raw.sock"
    channel = Channel(target)
    try:
        try:
            initial, response, trailing = await bounded(channel.unary("/t.T/M", b"q", timeout_s=5))
            ours = ("OK", response, initial, trailing)
        except CallError as error:
            ours = (error.code.name, error.details, error.initial_metadata, error.trailing_metadata)
        async with grpc.aio.insecure_channel(target) as reference:
            call = reference.unary_unary("/t.T/M")(b"q", timeout=5)
            try:
                response = await bounded(call)
                theirs = ("OK", response, tuple(await call.initial_metadata()),
                          tuple(await call.trailing_metadata()))
            except grpc.aio.AioRpcError as error:
                theirs = (error.code().name, error.details(), tuple(error.initial_metadata() or ()),
                          tuple(error.trailing_metadata() or ()))
        return ours, theirs
    finally:
        await channel.close()
        server.close()
        shutil.rmtree(directory, ignore_errors=True)


def stream_removed(details: str) -> str:
    """grpc core prefixes transport failures with "Stream removed (...)"; the failure itself is the same."""
    return details.removeprefix("Stream removed (").removesuffix(")")


SAME = {
    "ok-with-a-grpc-message": answer(("headers", OK, False), ("data", message(b"r")),
                                     ("headers", [(b"grpc-status", b"0"), (b"grpc-message", b"fine")], True)),
    "no-content-type": answer(("headers", [(b":status", b"200")], False), ("data", message(b"x")),
                              ("headers", STATUS_0, True)),
    "deflate": answer(("headers", OK + [(b"grpc-encoding", b"deflate")], False),
                      ("data", message(zlib.compress(b"deflated"), 1)), ("headers", STATUS_0, True)),
    "status-with-space": answer(("headers", OK, False), ("data", message(b"r")),
                                ("headers", [(b"grpc-status", b" 0")], True)),
    "http-503": answer(("headers", [(b":status", b"503")], True)),
    "informational-status": answer(("headers", [(b":status", b"100")], False), ("headers", OK, False),
                                   ("data", message(b"r")), ("headers", STATUS_0, True)),
    "no-grpc-status": answer(("headers", OK, False), ("data", message(b"x")), ("headers", [(b"x-a", b"b")], True)),
    "unknown-status-number": answer(("headers", OK + [(b"grpc-status", b"99"), (b"grpc-message", b"odd")], True)),
    "status-not-a-number": answer(("headers", OK + [(b"grpc-status", b"abc")], True)),
    "invalid-percent-and-utf8": answer(("headers", OK + [(b"grpc-status", b"3"),
                                                         (b"grpc-message", b"a%zz%4%41%e2%9c%93%ff")], True)),
    "valid-percent-utf8": answer(("headers", OK + [(b"grpc-status", b"3"),
                                                   (b"grpc-message", b"100%25 %E2%9C%93 n%C3%B6n")], True)),
    "compressed-without-encoding": answer(("headers", OK, False), ("data", message(b"x", 1)),
                                          ("headers", STATUS_0, True)),
    "rst-cancel": answer(("headers", OK, False), ("reset", 8)),
    "rst-internal-error": answer(("headers", OK, False), ("reset", 2)),
    "rst-no-error-before-trailers": answer(("headers", OK, False), ("reset", 0)),
    "rst-refused": answer(("reset", 7)),
}


@pytest.mark.parametrize("case", SAME)
def test_the_status_is_what_grpcio_gives(case):
    async def scenario():
        ours, theirs = await both_clients(SAME[case])
        assert ours[0] == theirs[0]
        if ours[0] == "OK":
            assert ours == theirs
        else:
            # The runtime's own details exactly; a transport failure's in grpc core's words (but one).
            if case != "compressed-without-encoding":
                assert ours[1] == stream_removed(theirs[1]) or ours[1] in theirs[1]
            assert ours[2:] == theirs[2:]
    run(scenario())


def test_binary_metadata_that_is_not_base64_fails_the_call_internal_as_grpcio_does():
    async def scenario():
        ours, theirs = await both_clients(answer(("headers", OK + [
            (b"grpc-status", b"3"), (b"x-a-bin", b"!!!not base64"), (b"x-b-bin", b"AQID")], True)))
        assert ours[:2] == (theirs[0], stream_removed(theirs[1])) == (
            "INTERNAL", "Error parsing 'x-a-bin' metadata: illegal base64 encoding")
    run(scenario())


@pytest.mark.parametrize("case", ["no-message", "two-messages", "trailers-only-ok"])
def test_a_unary_answer_without_exactly_one_message_is_unimplemented(case):
    # grpc's doc/statuscodes.md: a response cardinality violation is UNIMPLEMENTED. grpc core's Python client gives
    # OK with no response for none, and waits for the deadline after two: neither can be relayed to the kubelet.
    script = {"no-message": answer(("headers", OK, False), ("headers", STATUS_0, True)),
              "two-messages": answer(("headers", OK, False), ("data", message(b"a") + message(b"b")),
                                     ("headers", STATUS_0, True)),
              "trailers-only-ok": answer(("headers", OK + STATUS_0, True))}[case]

    async def scenario():
        ours, _ = await both_clients(script)
        assert ours[0] == "UNIMPLEMENTED"
    run(scenario())


def test_an_answer_cut_inside_a_message_is_internal():
    # grpc core's Python client gives OK with no response; grpc-go (the kubelet's) INTERNAL, as here.
    async def scenario():
        ours, _ = await both_clients(answer(("headers", OK, False), ("data", message(b"hello")[:6]),
                                            ("headers", STATUS_0, True)))
        assert ours[0] == "INTERNAL"
    run(scenario())


def test_an_answer_that_is_not_grpc_is_unknown():
    # An HTTP/2 server that is not gRPC: grpc core's Python client gives OK with no response; grpc-go UNKNOWN.
    async def scenario():
        ours, _ = await both_clients(answer(("headers", [(b":status", b"200"), (b"content-type", b"text/html")],
                                             False), ("data", b"<html>"), ("headers", STATUS_0, True)))
        assert ours[0] == "UNKNOWN" and "text/html" in ours[1]
    run(scenario())


def test_an_http_error_status_wins_over_a_grpc_status():
    # grpc-go's rule (the kubelet's client): the HTTP status decides. grpc core prefers the grpc-status.
    async def scenario():
        ours, theirs = await both_clients(answer(("headers", [
            (b":status", b"404"), (b"content-type", b"application/grpc"), (b"grpc-status", b"7")], True)))
        assert ours[:2] == ("UNIMPLEMENTED", "Received http2 header with status: 404")
        assert theirs[0] == "PERMISSION_DENIED"
    run(scenario())


@pytest.mark.parametrize("timeout_s", [None, 9.0], ids=["no-deadline", "deadline"])
def test_calls_over_the_runtime_max_concurrent_streams_wait_for_a_stream_to_end(timeout_s):
    async def scenario():
        directory = tempfile.mkdtemp(prefix="grpccli-")
        runtimes: list[ScriptedRuntime] = []

        def limited() -> ScriptedRuntime:
            runtimes.append(ScriptedRuntime(answer(("headers", OK, False), ("data", message(b"r")),
                                                   ("headers", STATUS_0, True)), max_streams=10))
            return runtimes[-1]
        server = await asyncio.get_running_loop().create_unix_server(limited, f"{directory}/raw.sock")
        channel = Channel(f"unix:{directory}/raw.sock")
        try:
            assert (await bounded(channel.unary("/t.T/M", b"first")))[1] == b"r"  # the server's SETTINGS are in
            calls = (channel.unary("/t.T/M", b"%d" % n, timeout_s=timeout_s) for n in range(100))
            answers = await bounded(asyncio.gather(*calls))
            assert [response for _, response, _ in answers] == [b"r"] * 100
            assert len(runtimes) == 1 and runtimes[0].most_open == 10
        finally:
            await channel.close()
            server.close()
            shutil.rmtree(directory, ignore_errors=True)
    run(scenario())


def test_data_before_the_response_headers_is_read_as_grpcio_reads_it():
    async def scenario():
        ours, theirs = await both_clients(answer(("data", message(b"early")), ("headers", OK, False),
                                                 ("headers", STATUS_0, True)))
        assert ours == theirs == ("OK", b"early", (), ())
    run(scenario())
