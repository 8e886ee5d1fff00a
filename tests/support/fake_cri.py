"""A fake CRI runtime for the proxy's tests: a grpc.aio server (unix socket or loopback TCP) answering any method.

It never decodes a request: it records what arrived (method path, request bytes, metadata, remaining deadline)
and answers as the test scripted per method: echo the request, answer given bytes, fail with a status,
stream messages (then optionally fail or block), or block until the caller cancels. It knows nothing of the
proxy; on the wire a unary and a server-streaming answer of one message look the same, so the handler kind is
chosen by the scripted behaviour.

Run alone (the proxy benchmark does), it answers Version with a VersionResponse and echoes everything else:

    python -m tests.support.fake_cri --socket /tmp/x/cri.sock   # prints "READY /tmp/x/cri.sock"; SIGTERM stops it
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import dataclass, field
from typing import Union

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb

Metadata = tuple[tuple[str, Union[str, bytes]], ...]


@dataclass(frozen=True)
class Received:
    method: str                   # full path, e.g. "/runtime.v1.RuntimeService/Version"
    request: bytes
    metadata: Metadata            # as the server saw it (grpc adds user-agent)
    time_remaining: float | None  # seconds left of the caller's deadline when the call arrived


@dataclass(frozen=True)
class Echo:
    """Answer the request bytes themselves."""
    initial_metadata: Metadata = ()
    trailing_metadata: Metadata = ()


@dataclass(frozen=True)
class Respond:
    response: bytes
    initial_metadata: Metadata = ()
    trailing_metadata: Metadata = ()


@dataclass(frozen=True)
class Fail:
    code: grpc.StatusCode
    details: str = ""
    initial_metadata: Metadata = ()
    trailing_metadata: Metadata = ()


@dataclass(frozen=True)
class Stream:
    """Server-streaming answer: these messages, then OK, or `then` (a Fail), or block until cancelled."""
    messages: tuple[bytes, ...]
    then: Fail | None = None
    block_after: bool = False
    initial_metadata: Metadata = ()
    trailing_metadata: Metadata = ()


@dataclass(frozen=True)
class Block:
    """Never answer: wait until the caller cancels (or its deadline ends the call)."""


Behaviour = Union[Echo, Respond, Fail, Stream, Block]


@dataclass
class FakeCri:
    address: str  # a unix socket path ("/tmp/x/cri.sock") or "127.0.0.1:0" for TCP on a free port
    default: Behaviour = field(default_factory=Echo)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    cancelled_methods: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.arrived = asyncio.Event()    # a call was recorded
        self.blocking = asyncio.Event()   # a call reached a Block (or a blocking Stream)
        self.cancelled = asyncio.Event()  # a blocked call was cancelled by its caller
        self._server: grpc.aio.Server | None = None
        self.target = f"unix:{self.address}" if self.address.startswith("/") else self.address


    def on(self, method: str, behaviour: Behaviour) -> None:
        """Script a method, by full path or by bare method name."""
        self.behaviours[method] = behaviour

    def behaviour_for(self, path: str) -> Behaviour:
        return self.behaviours.get(path) or self.behaviours.get(path.rsplit("/", 1)[-1]) or self.default

    async def start(self) -> None:
        self._server = grpc.aio.server(options=(("grpc.max_receive_message_length", 64 * 1024 * 1024),))
        self._server.add_generic_rpc_handlers((_Handler(self),))
        port = self._server.add_insecure_port(self.target)
        if not self.address.startswith("/"):
            self.target = f"{self.address.rsplit(':', 1)[0]}:{port}"
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def __aenter__(self) -> FakeCri:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _record(self, path: str, request: bytes, context: grpc.aio.ServicerContext) -> None:
        metadata = tuple((m.key, m.value) for m in context.invocation_metadata() or ())
        self.received.append(Received(path, request, metadata, context.time_remaining()))
        self.arrived.set()

    async def _block(self, path: str) -> None:
        self.blocking.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled_methods.append(path)
            self.cancelled.set()
            raise


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeCri) -> None:
        self._fake = fake

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        fake, path = self._fake, details.method
        behaviour = fake.behaviour_for(path)

        if isinstance(behaviour, Stream):
            async def stream(request: bytes, context: grpc.aio.ServicerContext) -> None:
                fake._record(path, request, context)
                if behaviour.initial_metadata:
                    await context.send_initial_metadata(behaviour.initial_metadata)
                for message in behaviour.messages:
                    await context.write(message)
                if behaviour.block_after:
                    await fake._block(path)
                if behaviour.then is not None:
                    await context.abort(behaviour.then.code, behaviour.then.details,
                                        behaviour.then.trailing_metadata)
                context.set_trailing_metadata(behaviour.trailing_metadata)

            return grpc.unary_stream_rpc_method_handler(stream)

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            fake._record(path, request, context)
            if isinstance(behaviour, Block):
                await fake._block(path)
            if behaviour.initial_metadata:
                await context.send_initial_metadata(behaviour.initial_metadata)
            if isinstance(behaviour, Fail):
                await context.abort(behaviour.code, behaviour.details, behaviour.trailing_metadata)
            context.set_trailing_metadata(behaviour.trailing_metadata)
            return behaviour.response if isinstance(behaviour, Respond) else request

        return grpc.unary_unary_rpc_method_handler(unary)


VERSION_RESPONSE = cri_pb.VersionResponse(
    version="0.1.0", runtime_name="fake-cri", runtime_version="1.0.0", runtime_api_version="v1",
)


async def serve(socket_path: str) -> None:
    fake = FakeCri(socket_path)
    fake.on("/runtime.v1.RuntimeService/Version", Respond(VERSION_RESPONSE.SerializeToString()))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with fake:
        print(f"READY {socket_path}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.socket))
    return 0


if __name__ == "__main__":
    sys.exit(main())
