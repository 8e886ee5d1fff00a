"""The rig the CRI proxy's tests (tests/unit/test_cri_proxy_*.py) run through: a client -> the daemon's gRPC server (shim/rpc) carrying
the proxy handler of shim/cri/proxy.py (and a health servicer, as the daemon's server does) on a unix socket -> the
fake runtime of tests/support/fake_cri.py on another unix socket, all in one event loop; and the CRI method list
written out from cri-wire-facts.md, so that the proxy's own list is checked against the source, not against itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from shim.cri.proxy import cri_proxy_handler, forwarding_channel
from shim.rpc.server import Server
from tests.support.fake_cri import FakeCri

RUNTIME = "/runtime.v1.RuntimeService"
IMAGE = "/runtime.v1.ImageService"
BOUND = 10.0  # upper bound for waiting on an event that must happen (a hang fails instead of blocking the suite)
# The method list of cri-wire-facts.md, written out again here so that the proxy's own list is checked against
# the source, not against itself.
FACTS_RUNTIME = """Version RunPodSandbox StopPodSandbox RemovePodSandbox PodSandboxStatus ListPodSandbox
StreamPodSandboxes CreateContainer StartContainer StopContainer RemoveContainer ListContainers StreamContainers
ContainerStatus UpdateContainerResources ReopenContainerLog ExecSync Exec Attach PortForward ContainerStats
ListContainerStats StreamContainerStats PodSandboxStats ListPodSandboxStats StreamPodSandboxStats
UpdateRuntimeConfig Status CheckpointContainer CheckpointPod RestorePod GetContainerEvents ListMetricDescriptors
ListPodSandboxMetrics StreamPodSandboxMetrics RuntimeConfig UpdatePodSandboxResources""".split()
FACTS_IMAGE = "ListImages StreamImages ImageStatus PullImage RemoveImage ImageFsInfo".split()
FACTS_STREAMING = {"StreamPodSandboxes", "StreamContainers", "StreamContainerStats", "StreamPodSandboxStats",
                   "GetContainerEvents", "StreamPodSandboxMetrics", "StreamImages"}
ALL_PATHS = [f"{RUNTIME}/{m}" for m in FACTS_RUNTIME] + [f"{IMAGE}/{m}" for m in FACTS_IMAGE]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def bounded(awaitable: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(awaitable, BOUND)


@pytest.fixture
def sockdir():
    # tmp_path can exceed the 108-byte limit of a unix socket path for long parametrized test names.
    path = Path(tempfile.mkdtemp(prefix="criproxy-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def unknown_fields() -> bytes:
    """Fields no runtime.v1 message of the subset declares: a varint (99) and a length-delimited one (4242)."""
    return varint(99 << 3 | 0) + varint(123456789) + varint(4242 << 3 | 2) + varint(5) + b"\x00new\xff"


@dataclass
class Rig:
    fake: FakeCri
    client: grpc.aio.Channel
    handler: grpc.GenericRpcHandler
    events: list[tuple[str, str, int]]  # (event, sandbox id, calls the runtime had received at that moment)

    def unary(self, path: str) -> grpc.aio.UnaryUnaryMultiCallable:
        return self.client.unary_unary(path)

    def stream(self, path: str) -> grpc.aio.UnaryStreamMultiCallable:
        return self.client.unary_stream(path)


@contextlib.asynccontextmanager
async def proxied(sockdir: Path, *, on_event: Callable[[str, str], Awaitable[None]] | None = None,
                  record_events: bool = True, upstream_endpoint: str | None = None,
                  client_options: tuple = (), **handler_kwargs: Any) -> AsyncIterator[Rig]:
    """client -> proxy server (proxy handler + health) -> fake runtime."""
    events: list[tuple[str, str, int]] = []
    fake = FakeCri(str(sockdir / "cri.sock"))

    async def record(event: str, sandbox_id: str) -> None:
        events.append((event, sandbox_id, len(fake.received)))
        if on_event is not None:
            await on_event(event, sandbox_id)

    async with fake:
        upstream = forwarding_channel(upstream_endpoint or f"unix://{sockdir / 'cri.sock'}")
        handler = cri_proxy_handler(upstream, record if record_events else None, **handler_kwargs)
        server = Server()
        server.add_generic_rpc_handlers((handler,))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        server.add_insecure_port(f"unix:{sockdir / 'proxy.sock'}")
        await server.start()
        client = grpc.aio.insecure_channel(f"unix:{sockdir / 'proxy.sock'}", options=client_options)
        try:
            yield Rig(fake, client, handler, events)
        finally:
            await client.close()
            await server.stop(None)
            await upstream.close()


async def rpc_error(awaitable: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bounded(awaitable)
    return caught.value
