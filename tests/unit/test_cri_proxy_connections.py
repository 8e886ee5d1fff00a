"""The CRI proxy's connections (shim/cri/proxy.py) through real sockets: the upstream channel (an unavailable runtime,
the endpoint forms it dials, TCP loopback), the kubelet's message size limit both ways, and the server it shares
(paths that are not CRI are left to the other services)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2

from shim.cri.proxy import cri_proxy_handler, forwarding_channel
from tests.support.cri_proxy_rig import IMAGE, RUNTIME, bounded, proxied, rpc_error, run
from tests.support.cri_proxy_rig import sockdir  # noqa: F401  (a fixture)
from tests.support.fake_cri import FakeCri, Respond


def test_upstream_unavailable_is_unavailable_to_the_client(sockdir):
    async def scenario():
        async with proxied(sockdir, upstream_endpoint=f"unix://{sockdir / 'nobody-listens.sock'}") as rig:
            error = await rpc_error(rig.unary(f"{RUNTIME}/Version")(b""))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            error = await rpc_error(rig.stream(f"{RUNTIME}/GetContainerEvents")(b"").read())
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert rig.fake.received == []

    run(scenario())


@pytest.mark.parametrize("form", ["unix:///", "unix:/", "/"])
def test_forwarding_channel_endpoint_forms_connect(sockdir, form):
    async def scenario():
        async with proxied(sockdir, upstream_endpoint=form + str(sockdir / "cri.sock").lstrip("/")) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/Version")(b"v")) == b"v"

    run(scenario())


def test_forwarding_channel_over_tcp_loopback(sockdir):
    async def scenario():
        async with FakeCri("127.0.0.1:0") as fake:
            upstream = forwarding_channel(f"tcp://{fake.target}")
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((cri_proxy_handler(upstream),))
            server.add_insecure_port(f"unix:{sockdir / 'proxy.sock'}")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"unix:{sockdir / 'proxy.sock'}") as client:
                    assert await bounded(client.unary_unary(f"{RUNTIME}/Version")(b"tcp")) == b"tcp"
            finally:
                await server.stop(None)
                await upstream.close()
            assert [r.method for r in fake.received] == [f"{RUNTIME}/Version"]

    run(scenario())


def test_messages_up_to_the_kubelet_limit_pass(sockdir):
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)  # 10 MiB: above grpc's 4 MiB default, below 16 MiB
    kubelet_limits = (("grpc.max_receive_message_length", 16 * 1024 * 1024),
                      ("grpc.max_send_message_length", 16 * 1024 * 1024))

    async def scenario():
        async with proxied(sockdir, client_options=kubelet_limits) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/ListContainers")(big)) == big
            assert rig.fake.received[-1].request == big

    run(scenario())


def test_messages_above_the_limit_are_resource_exhausted_both_ways(sockdir):
    # containerd and the kubelet cap messages at 16 MiB too: the caller sees the same code as without the proxy.
    too_big = b"\x00" * (16 * 1024 * 1024 + 1)

    async def scenario():
        async with proxied(sockdir, client_options=(("grpc.max_receive_message_length", 64 * 1024 * 1024),)) as rig:
            error = await rpc_error(rig.unary(f"{RUNTIME}/CreateContainer")(too_big))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert rig.fake.received == []
            rig.fake.on("ListImages", Respond(too_big))
            error = await rpc_error(rig.unary(f"{IMAGE}/ListImages")(b""))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    run(scenario())


@dataclass(frozen=True)
class CallDetails(grpc.HandlerCallDetails):
    method: str
    invocation_metadata: tuple = ()


@pytest.mark.parametrize("path", [
    "/runtime.probe.v1alpha1.ProbeService/RunProbe", "/grpc.health.v1.Health/Check",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "/runtime.v1alpha2.RuntimeService/Version",
    f"{RUNTIME}/",
])
def test_non_cri_paths_are_not_handled(sockdir, path):
    async def scenario():
        async with proxied(sockdir) as rig:
            assert rig.handler.service(CallDetails(path)) is None

    run(scenario())


def test_other_services_share_the_server(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            check = rig.client.unary_unary("/grpc.health.v1.Health/Check",
                                           request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                           response_deserializer=health_pb2.HealthCheckResponse.FromString)
            answer = await bounded(check(health_pb2.HealthCheckRequest()))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

            for path in ("/runtime.v1alpha2.RuntimeService/Version", "/runtime.probe.v1alpha1.ProbeService/X"):
                error = await rpc_error(rig.unary(path)(b""))
                assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            assert rig.fake.received == []

    run(scenario())
