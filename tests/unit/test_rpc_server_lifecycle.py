"""The daemon's gRPC server (shim/rpc/server.py) as a whole: stop(grace), many calls on one connection, the
stock servicers the daemon registers on it (grpc health, server reflection), and grpc-go's client (crictl)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess

import grpc
import grpc.aio
import pytest
import hpack
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from shim.rpc import grpc_wire
from shim.rpc import h2_server as hc
from tests.support.h2_pair import parse_frames
from tests.support.kubelet_env import crictl_binary
from tests.unit.test_rpc_server_calls import Parked, bounded, rpc_error, run, serving

# --- stop(grace) --------------------------------------------------------------------------------------------------


def test_stop_lets_a_call_in_flight_finish_within_grace():
    release, started = asyncio.Event(), asyncio.Event()

    async def handler(request, context):
        started.set()
        await release.wait()
        for index in range(3):
            yield bytes((index,)) * 1000

    async def scenario():
        async with serving({"/t.T/S": grpc.unary_stream_rpc_method_handler(handler)}) as served:
            call = served.channel.unary_stream("/t.T/S")(b"")
            await bounded(started.wait())
            loop = asyncio.get_running_loop()
            began = loop.time()
            stopping = asyncio.create_task(served.server.stop(30))
            release.set()  # the handler resumes after stop() sent its GOAWAYs (the loop runs tasks in order)
            received = [message async for message in call]
            await bounded(stopping)
            assert loop.time() - began < 10  # well under the grace: stop() returns once the last call ended
            assert received == [bytes((index,)) * 1000 for index in range(3)]
            assert await call.code() == grpc.StatusCode.OK

    run(scenario())


async def call_acknowledging_data(path: str, method: str) -> tuple[bytes, list | None]:
    """A unary call by hand (h2's client accepts no frame after a GOAWAY), giving back every window it receives
    data on: the DATA payload and the trailers, None if the connection ended first. On a bare socket: what the
    server sent is read to the end even when a WINDOW_UPDATE finds the server gone (a stream transport would drop
    it)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, path)
    request = [(":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    await loop.sock_sendall(sock, hc.PREFACE + hc.frame(hc.SETTINGS, 0, 0)
                            + hc.frame(hc.HEADERS, hc.END_HEADERS, 1, hpack.Encoder().encode(request))
                            + hc.frame(hc.DATA, hc.END_STREAM, 1, grpc_wire.message(b"")))
    decoder, buffer, body = hpack.Decoder(), b"", bytearray()
    try:
        while data := await bounded(loop.sock_recv(sock, 65536)):
            buffer += data
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
                payload, buffer = buffer[9:9 + length], buffer[9 + length:]
                answer = b""
                if kind == hc.SETTINGS and not flags & hc.ACK:
                    answer = hc.frame(hc.SETTINGS, hc.ACK, 0)
                elif kind == hc.DATA and payload:
                    body += payload
                    increment = len(payload).to_bytes(4, "big")
                    answer = hc.frame(hc.WINDOW_UPDATE, 0, 0, increment) + hc.frame(hc.WINDOW_UPDATE, 0, 1, increment)
                elif kind == hc.HEADERS:
                    headers = decoder.decode(payload, raw=True)
                    if flags & hc.END_STREAM:
                        return bytes(body), headers
                if answer:
                    with contextlib.suppress(ConnectionError):
                        await loop.sock_sendall(sock, answer)
        return bytes(body), None
    finally:
        sock.close()


def test_stop_lets_a_call_finish_whose_answer_waits_for_the_client_windows():
    release, started = asyncio.Event(), asyncio.Event()
    answer = b"a" * 200_000  # over the client's default window of 64 KiB

    async def handler(request, context):
        started.set()
        await release.wait()
        return answer

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            client = asyncio.create_task(call_acknowledging_data(served.path, "/t.T/U"))
            await bounded(started.wait())
            stopping = asyncio.create_task(served.server.stop(30))
            release.set()  # after the GOAWAY: the handler ends with its answer queued for windows
            body, trailers = await bounded(client)
            await bounded(stopping)
        assert body == grpc_wire.message(answer)
        assert trailers is not None and (b"grpc-status", b"0") in trailers

    run(scenario())


def test_a_call_after_stop_is_unavailable():
    async def echo(request, context):
        return request

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(echo)}) as served:
            assert await bounded(served.channel.unary_unary("/t.T/U")(b"before")) == b"before"
            await bounded(served.server.stop(5))
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b"after"))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            async with grpc.aio.insecure_channel(f"unix:{served.path}") as fresh:
                error = await rpc_error(fresh.unary_unary("/t.T/U")(b"after"))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert await bounded(served.server.wait_for_termination(1))

    run(scenario())


def test_a_call_that_outlives_grace_is_cancelled():
    parked = Parked()

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(parked)}) as served:
            call = served.channel.unary_unary("/t.T/U")(b"")
            await bounded(parked.started.wait())
            await bounded(served.server.stop(0.2))
            assert parked.cancelled.is_set()
            error = await rpc_error(call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # as grpcio's server: the connection is closed

    run(scenario())


def test_a_protocol_error_closes_the_connection_and_cancels_its_calls():
    parked = Parked()
    request = [(":method", "POST"), (":scheme", "http"), (":path", "/t.T/U"), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers")]

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(parked)}) as served:
            reader, writer = await asyncio.open_unix_connection(served.path)
            writer.write(hc.PREFACE + hc.frame(hc.SETTINGS, 0, 0)
                         + hc.frame(hc.HEADERS, hc.END_HEADERS, 1, hpack.Encoder().encode(request))
                         + hc.frame(hc.DATA, hc.END_STREAM, 1, grpc_wire.message(b"")))
            await bounded(parked.started.wait())
            writer.write(hc.frame(hc.DATA, 0, 0, b"x"))  # DATA on stream 0: a connection error
            received = await asyncio.wait_for(reader.read(), 3)  # to the end: the server closes
            writer.close()
            assert parked.cancelled.is_set()
        (goaway,) = [payload for kind, _, _, payload in parse_frames(received) if kind == hc.GOAWAY]
        assert int.from_bytes(goaway[4:8], "big") == hc.PROTOCOL_ERROR

    run(scenario())


# --- many calls ---------------------------------------------------------------------------------------------------


def test_50_concurrent_calls_on_one_channel_are_all_in_their_handlers_at_once():
    inside, everyone = [], asyncio.Event()

    async def handler(request, context):
        inside.append(request)
        if len(inside) == 50:
            everyone.set()
        await everyone.wait()  # no call answers before all 50 are running
        return request * 2

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            method = served.channel.unary_unary("/t.T/U")
            answers = await bounded(asyncio.gather(*(method(str(n).encode()) for n in range(50))))
        assert answers == [str(n).encode() * 2 for n in range(50)]

    run(scenario())


# --- the stock servicers ------------------------------------------------------------------------------------------


def test_grpc_health_check_and_watch():
    async def scenario():
        async with serving({}) as served:
            health = health_aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health, served.server)
            await health.set("svc", health_pb2.HealthCheckResponse.NOT_SERVING)
            stub = health_pb2_grpc.HealthStub(served.channel)
            response = await bounded(stub.Check(health_pb2.HealthCheckRequest(service="svc")))
            assert response.status == health_pb2.HealthCheckResponse.NOT_SERVING
            error = await rpc_error(stub.Check(health_pb2.HealthCheckRequest(service="unknown")))
            assert error.code() == grpc.StatusCode.NOT_FOUND

            watch = stub.Watch(health_pb2.HealthCheckRequest(service="svc"))
            assert (await bounded(watch.read())).status == health_pb2.HealthCheckResponse.NOT_SERVING
            await health.set("svc", health_pb2.HealthCheckResponse.SERVING)
            assert (await bounded(watch.read())).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()

    run(scenario())


def test_server_reflection_lists_services_and_serves_their_files():
    async def scenario():
        async with serving({}) as served:
            health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), served.server)
            health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
            reflection.enable_server_reflection([health_name, reflection.SERVICE_NAME], served.server)
            call = reflection_pb2_grpc.ServerReflectionStub(served.channel).ServerReflectionInfo()
            await bounded(call.write(reflection_pb2.ServerReflectionRequest(list_services="")))
            listed = await bounded(call.read())
            assert {s.name for s in listed.list_services_response.service} == {health_name, reflection.SERVICE_NAME}
            await bounded(call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=health_name)))
            files = (await bounded(call.read())).file_descriptor_response.file_descriptor_proto
            assert files and b"HealthCheckRequest" in files[0]
            await call.done_writing()
            assert await bounded(call.read()) is grpc.aio.EOF

    run(scenario())


# --- grpc-go's client ---------------------------------------------------------------------------------------------


def test_crictl_version_against_the_server():
    crictl = crictl_binary()
    if not crictl.is_file():
        pytest.skip(f"needs crictl: none at {crictl}; set CRICTL_BIN")

    async def version(request, context):
        return cri_pb.VersionResponse(version="0.1.0", runtime_name="lean-test", runtime_version="1.2.3",
                                      runtime_api_version="v1")

    handlers = {"/runtime.v1.RuntimeService/Version": grpc.unary_unary_rpc_method_handler(
        version, request_deserializer=cri_pb.VersionRequest.FromString,
        response_serializer=cri_pb.VersionResponse.SerializeToString)}

    async def scenario():
        async with serving(handlers) as served:
            process = await asyncio.create_subprocess_exec(
                str(crictl), "--runtime-endpoint", f"unix://{served.path}", "--timeout", "5s", "version",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await bounded(process.communicate())
        assert process.returncode == 0, err.decode()
        assert "RuntimeName:  lean-test" in out.decode() and "RuntimeVersion:  1.2.3" in out.decode()

    run(scenario())
