"""The transparent CRI proxy (shim/cri/proxy.py) relaying through real sockets: bytes both ways for every CRI method
and unknown ones, streams, errors and metadata as the runtime sent them, deadlines and cancellation passed upstream.
(The rig: tests/support/cri_proxy_rig.py; the pure rules, sandbox events, connections and the bridge's ExecSync: the
other tests/unit/test_cri_proxy_*.py.)"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.cri_proxy_rig import (
    ALL_PATHS, BOUND, FACTS_STREAMING, IMAGE, RUNTIME, bounded, proxied, rpc_error, run, unknown_fields,
)
from tests.support.cri_proxy_rig import sockdir  # noqa: F401  (a fixture)
from tests.support.fake_cri import Block, Echo, Fail, Respond, Stream


def test_unary_bytes_are_identical_both_ways(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            # Version: a real request and response of the subset.
            request = cri_pb.VersionRequest(version="v1").SerializeToString()
            response = cri_pb.VersionResponse(version="0.1.0", runtime_name="containerd", runtime_version="v1.7.24",
                                              runtime_api_version="v1").SerializeToString()
            rig.fake.on("Version", Respond(response))
            assert await bounded(rig.unary(f"{RUNTIME}/Version")(request)) == response
            assert rig.fake.received[-1].method == f"{RUNTIME}/Version"
            assert rig.fake.received[-1].request == request

            # ListPodSandbox with fields the subset does not know, both ways: passed untouched, not re-encoded.
            request = cri_pb.ListPodSandboxRequest(filter=cri_pb.PodSandboxFilter(
                id="abc", label_selector={"app": "web", "tier": "front"})).SerializeToString() + unknown_fields()
            response = cri_pb.ListPodSandboxResponse(items=[
                cri_pb.PodSandbox(id=f"sb-{i}", metadata=cri_pb.PodSandboxMetadata(name=f"pod-{i}", uid="u"),
                                  labels={"app": "web"}, created_at=1_700_000_000_000_000_000 + i)
                for i in range(3)]).SerializeToString() + unknown_fields()
            rig.fake.on("ListPodSandbox", Respond(response))
            assert await bounded(rig.unary(f"{RUNTIME}/ListPodSandbox")(request)) == response
            assert rig.fake.received[-1].request == request

            # Not protobuf at all: still forwarded, since the proxy never parses.
            garbage = b"\xff\xfe\x00not-protobuf"
            assert await bounded(rig.unary(f"{RUNTIME}/PodSandboxStatus")(garbage)) == garbage
            assert rig.fake.received[-1].request == garbage

            # Empty messages (StopContainerResponse and friends have no fields) are zero bytes.
            rig.fake.on("StartContainer", Respond(b""))
            assert await bounded(rig.unary(f"{RUNTIME}/StartContainer")(b"")) == b""
            assert rig.fake.received[-1].request == b""

    run(scenario())


@pytest.mark.parametrize("path", ALL_PATHS, ids=[p.rsplit("/", 1)[1] for p in ALL_PATHS])
def test_every_cri_method_is_forwarded(sockdir, path):
    method = path.rsplit("/", 1)[1]
    request = f"request of {method}".encode()

    async def scenario():
        async with proxied(sockdir, record_events=False) as rig:
            if method in FACTS_STREAMING:
                rig.fake.on(path, Stream((b"first " + request, b"second " + request)))
                answers = [m async for m in rig.stream(path)(request, timeout=BOUND)]
                assert answers == [b"first " + request, b"second " + request]
            else:
                rig.fake.on(path, Respond(b"response of " + request))
                assert await bounded(rig.unary(path)(request)) == b"response of " + request
            assert [(r.method, r.request) for r in rig.fake.received] == [(path, request)]

    run(scenario())


@pytest.mark.parametrize("path", [f"{RUNTIME}/SomeFutureMethod", f"{IMAGE}/SomeFutureMethod"])
def test_unknown_unary_method_of_a_cri_service_is_forwarded(sockdir, path):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on(path, Respond(b"future answer", trailing_metadata=(("x-t", "1"),)))
            call = rig.unary(path)(b"future", timeout=BOUND)
            assert await call == b"future answer"
            assert tuple(await call.trailing_metadata()) == (("x-t", "1"),)
            assert [(r.method, r.request) for r in rig.fake.received] == [(path, b"future")]
            # A unary caller still gets the runtime's own error when the runtime fails it.
            rig.fake.on(path, Fail(grpc.StatusCode.UNIMPLEMENTED, "unknown method SomeFutureMethod"))
            error = await rpc_error(rig.unary(path)(b"future"))
            assert (error.code(), error.details()) == (grpc.StatusCode.UNIMPLEMENTED, "unknown method SomeFutureMethod")

    run(scenario())


def test_unknown_streaming_method_of_a_cri_service_is_forwarded(sockdir):
    path = f"{RUNTIME}/StreamSomethingNew"

    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on(path, Stream((b"1", b"2", b"3")))
            assert [m async for m in rig.stream(path)(b"", timeout=BOUND)] == [b"1", b"2", b"3"]

    run(scenario())


def test_stream_relays_every_message_and_the_metadata(sockdir):
    events = tuple(f"event-{i}".encode() * (i + 1) for i in range(7))

    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("GetContainerEvents", Stream(events, initial_metadata=(("x-init", "i"),),
                                                     trailing_metadata=(("x-trail", "t"), ("x-trail-bin", b"\x01"))))
            call = rig.stream(f"{RUNTIME}/GetContainerEvents")(b"", timeout=BOUND)
            assert tuple([m async for m in call]) == events
            assert await call.code() == grpc.StatusCode.OK
            assert tuple(await call.initial_metadata()) == (("x-init", "i"),)
            assert tuple(await call.trailing_metadata()) == (("x-trail", "t"), ("x-trail-bin", b"\x01"))

    run(scenario())


def test_stream_error_after_messages_is_relayed(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("StreamContainers", Stream(
                (b"a", b"b"), then=Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many containers",
                                        trailing_metadata=(("x-why", "quota"),))))
            call = rig.stream(f"{RUNTIME}/StreamContainers")(b"", timeout=BOUND)
            assert await bounded(call.read()) == b"a"
            assert await bounded(call.read()) == b"b"
            error = await rpc_error(call.read())
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error.details() == "too many containers"
            assert tuple(error.trailing_metadata()) == (("x-why", "quota"),)

    run(scenario())


ERROR_CODES = [code for code in grpc.StatusCode if code is not grpc.StatusCode.OK]


@pytest.mark.parametrize("code", ERROR_CODES, ids=[c.name for c in ERROR_CODES])
def test_upstream_errors_come_back_identical(sockdir, code):
    details = f'rpc error: sandbox "sb-\u00fc" {code.name.lower()}: 50% done \U0001F600'
    trailing = (("x-trailer", "one"), ("x-trailer", "two"), ("x-blob-bin", b"\x00\xff\x10"),
                ("grpc-status-details-bin", b"\x08\x05\x12\x09not found"))

    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("ContainerStatus", Fail(code, details, trailing_metadata=trailing))
            error = await rpc_error(rig.unary(f"{RUNTIME}/ContainerStatus")(b"\x0a\x01c"))
            assert (error.code(), error.details()) == (code, details)
            assert tuple(error.trailing_metadata()) == trailing

    run(scenario())


def test_upstream_initial_and_trailing_metadata_are_relayed(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("ImageFsInfo", Echo(initial_metadata=(("x-init", "1"), ("x-init-bin", b"\x02")),
                                            trailing_metadata=(("x-trail", "2"),)))
            call = rig.unary(f"{IMAGE}/ImageFsInfo")(b"q")
            assert await bounded(call) == b"q"
            assert tuple(await call.initial_metadata()) == (("x-init", "1"), ("x-init-bin", b"\x02"))
            assert tuple(await call.trailing_metadata()) == (("x-trail", "2"),)

            rig.fake.on("PullImage", Fail(grpc.StatusCode.NOT_FOUND, "no such image",
                                          initial_metadata=(("x-init", "e"),)))
            error = await rpc_error(rig.unary(f"{IMAGE}/PullImage")(b""))
            assert error.code() == grpc.StatusCode.NOT_FOUND
            assert tuple(error.initial_metadata()) == (("x-init", "e"),)

    run(scenario())


def by_key(item: tuple[str, Any]) -> str:
    return item[0]


def test_metadata_is_forwarded_and_the_user_agent_is_the_proxys(sockdir):
    sent = (("x-a", "1"), ("x-a", "2"), ("x-bin", b"\x00\x01\xff"),
            ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))

    async def scenario():
        async with proxied(sockdir, client_options=(("grpc.primary_user_agent", "kubelet/v1.32.0"),)) as rig:
            await bounded(rig.unary(f"{RUNTIME}/Status")(b"", metadata=sent))
            rig.fake.on("GetContainerEvents", Stream((b"e",)))
            call = rig.stream(f"{RUNTIME}/GetContainerEvents")(b"", metadata=sent, timeout=BOUND)
            assert [m async for m in call] == [b"e"]
            for received in rig.fake.received:
                application = [(k, v) for k, v in received.metadata if k != "user-agent"]
                # grpc core itself puts headers it knows (traceparent) first, direct or proxied; what gRPC
                # guarantees, and the proxy keeps, is the order of the values of one key.
                assert sorted(application, key=by_key) == sorted(sent, key=by_key)
                user_agents = [v for k, v in received.metadata if k == "user-agent"]
                assert len(user_agents) == 1 and user_agents[0].startswith("cri-probe-shim ")
                assert "kubelet" not in user_agents[0]

    run(scenario())


def test_deadline_is_forwarded(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            await bounded(rig.unary(f"{RUNTIME}/ListContainers")(b"", timeout=7.5))
            rig.fake.on("GetContainerEvents", Stream((b"e",)))
            assert [m async for m in rig.stream(f"{RUNTIME}/GetContainerEvents")(b"", timeout=3.5)] == [b"e"]
            await bounded(rig.unary(f"{RUNTIME}/Version")(b""))  # no deadline
            unary, stream, none = rig.fake.received
            # grpc-timeout is sent rounded up to a coarser unit at each hop, so allow a few ms above.
            assert 6.5 < unary.time_remaining < 7.6
            assert 2.5 < stream.time_remaining < 3.6
            assert none.time_remaining is None

    run(scenario())


def test_client_cancel_of_a_unary_call_cancels_upstream(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("ExecSync", Block())
            call = rig.unary(f"{RUNTIME}/ExecSync")(b"sleep")
            await bounded(rig.fake.blocking.wait())
            assert call.cancel()
            await bounded(rig.fake.cancelled.wait())
            assert rig.fake.cancelled_methods == [f"{RUNTIME}/ExecSync"]

    run(scenario())


def test_client_cancel_of_a_stream_cancels_upstream(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("GetContainerEvents", Stream((b"first",), block_after=True))
            call = rig.stream(f"{RUNTIME}/GetContainerEvents")(b"")
            assert await bounded(call.read()) == b"first"
            await bounded(rig.fake.blocking.wait())
            assert call.cancel()
            await bounded(rig.fake.cancelled.wait())
            assert rig.fake.cancelled_methods == [f"{RUNTIME}/GetContainerEvents"]

    run(scenario())


def test_client_deadline_ends_the_upstream_call(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("PullImage", Block())
            error = await rpc_error(rig.unary(f"{IMAGE}/PullImage")(b"busybox", timeout=0.3))
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await bounded(rig.fake.cancelled.wait())

    run(scenario())


# ---------------------------------------------------------------- the kubelet bridge's ExecSync
#
# With an `exec_bridge`, an ExecSync whose cmd[0] is the marker is answered by the bridge and never reaches the
# runtime; every other ExecSync is forwarded as bytes. The bridge here claims exactly what the daemon's does
# (shim.bridge.command.marker_exec) and answers as the test scripts it.
