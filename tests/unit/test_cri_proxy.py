"""The transparent CRI proxy (shim/cri/proxy.py).

The pure rules (which paths, which metadata, which endpoint forms) are tested alone. Everything else goes through
real sockets: a client -> a grpc.aio server carrying the proxy handler (and a health servicer, as the daemon's
server does) on a unix socket -> the fake runtime of tests/support/fake_cri.py on another unix socket. All in one event
loop; synchronisation is by events the fake sets, never by sleeping.
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
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.endpoints import upstream_target
from shim.cri import proxy as cri_proxy
from shim.bridge.answer import FORWARD, Answer, StatusAnswer
from shim.bridge.command import MARKER, command_for, marker_exec
from shim.cri.proxy import cri_proxy_handler, upstream_channel
from tests.support.fake_cri import Block, Echo, Fail, FakeCri, Respond, Stream

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
        upstream = upstream_channel(upstream_endpoint or f"unix://{sockdir / 'cri.sock'}")
        handler = cri_proxy_handler(upstream, record if record_events else None, **handler_kwargs)
        server = grpc.aio.server(options=cri_proxy.SERVER_OPTIONS)
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


# ---------------------------------------------------------------- pure rules


def test_method_lists_match_the_cri_wire_facts():
    assert list(cri_proxy.RUNTIME_METHODS) == FACTS_RUNTIME
    assert list(cri_proxy.IMAGE_METHODS) == FACTS_IMAGE
    assert set(cri_proxy.STREAMING_METHODS) == FACTS_STREAMING
    assert list(cri_proxy.KNOWN_PATHS) == ALL_PATHS


@pytest.mark.parametrize("path, method", [
    (f"{RUNTIME}/Version", "Version"),
    (f"{IMAGE}/PullImage", "PullImage"),
    (f"{RUNTIME}/SomeFutureMethod", "SomeFutureMethod"),
    (f"{RUNTIME}/", None),
    (f"{RUNTIME}/a/b", None),
    ("/runtime.v1alpha2.RuntimeService/Version", None),  # kubelet 1.32 speaks v1 only
    ("/runtime.v1.RuntimeServiceX/Version", None),
    ("/runtime.probe.v1alpha1.ProbeService/RunProbe", None),
    ("/grpc.health.v1.Health/Check", None),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None),
    ("", None),
])
def test_cri_method(path, method):
    assert cri_proxy.cri_method(path) == method


def test_unknown_methods_are_relayed_as_streams():
    assert cri_proxy.forwards_as_stream("GetContainerEvents")
    assert not cri_proxy.forwards_as_stream("ListContainers")
    # A method newer than the list: the stream relay carries both a unary and a streaming answer.
    assert cri_proxy.forwards_as_stream("SomeFutureMethod")


def test_forwardable_metadata_drops_transport_keys_only():
    incoming = (
        ("user-agent", "grpc-go/1.68.0"), (":authority", "localhost"), ("te", "trailers"),
        ("content-type", "application/grpc"), ("grpc-timeout", "2S"), ("grpc-accept-encoding", "gzip"),
        ("x-a", "1"), ("x-a", "2"), ("x-b-bin", b"\x00\x01"), ("traceparent", "00-ab-cd-01"),
        ("grpc-trace-bin", b"\x00"),
    )
    assert cri_proxy.forwardable_metadata(incoming) == (
        ("x-a", "1"), ("x-a", "2"), ("x-b-bin", b"\x00\x01"), ("traceparent", "00-ab-cd-01"),
        ("grpc-trace-bin", b"\x00"),
    )
    assert cri_proxy.forwardable_metadata(None) == ()


def test_sandbox_event_reads_only_stop_and_remove():
    stop = cri_pb.StopPodSandboxRequest(pod_sandbox_id="sb-1").SerializeToString()
    remove = cri_pb.RemovePodSandboxRequest(pod_sandbox_id="sb-2").SerializeToString()
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", stop) == ("stop", "sb-1")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/RemovePodSandbox", remove) == ("remove", "sb-2")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", stop + unknown_fields()) == ("stop", "sb-1")
    assert cri_proxy.sandbox_event(f"{RUNTIME}/PodSandboxStatus", stop) is None
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", b"") is None      # no id: nothing to stop
    assert cri_proxy.sandbox_event(f"{RUNTIME}/StopPodSandbox", b"\xff\xff") is None  # undecodable


@pytest.mark.parametrize("endpoint, target", [
    ("unix:///run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("unix:/run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("/run/containerd/containerd.sock", "unix:/run/containerd/containerd.sock"),
    ("127.0.0.1:10010", "127.0.0.1:10010"),
    ("tcp://127.0.0.1:10010", "127.0.0.1:10010"),
    ("localhost:10010", "localhost:10010"),
    ("[::1]:10010", "[::1]:10010"),
    (" unix:///run/x.sock\n", "unix:/run/x.sock"),
])
def test_upstream_target(endpoint, target):
    assert upstream_target(endpoint) == target


@pytest.mark.parametrize("endpoint", ["", "none", "unix://", "unix:", "unix://run/x.sock", "npipe:////./pipe/x",
                                      "http://127.0.0.1:80", "containerd.sock"])
def test_upstream_target_rejects(endpoint):
    with pytest.raises(ValueError, match="runtime endpoint"):
        upstream_target(endpoint)


def test_channel_options_are_kubelets():
    options = dict(cri_proxy.channel_options("cri-probe-shim/9"))
    assert options["grpc.max_receive_message_length"] == options["grpc.max_send_message_length"] == 16 * 1024 * 1024
    assert options["grpc.enable_http_proxy"] == 0
    assert options["grpc.max_reconnect_backoff_ms"] == 3000
    assert options["grpc.primary_user_agent"] == "cri-probe-shim/9"


# ---------------------------------------------------------------- through real sockets


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


@pytest.mark.parametrize("method, event, message", [
    ("StopPodSandbox", "stop", cri_pb.StopPodSandboxRequest),
    ("RemovePodSandbox", "remove", cri_pb.RemovePodSandboxRequest),
])
def test_sandbox_events_reach_the_daemon_before_the_runtime(sockdir, method, event, message):
    request = message(pod_sandbox_id="0123abcd").SerializeToString()

    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on(method, Respond(b""))
            assert await bounded(rig.unary(f"{RUNTIME}/{method}")(request)) == b""
            assert rig.events == [(event, "0123abcd", 0)]  # the runtime had not received it yet
            assert [(r.method, r.request) for r in rig.fake.received] == [(f"{RUNTIME}/{method}", request)]

    run(scenario())


def test_sandbox_event_is_sent_even_when_the_runtime_fails_the_call(sockdir):
    request = cri_pb.StopPodSandboxRequest(pod_sandbox_id="sb-x").SerializeToString()

    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("StopPodSandbox", Fail(grpc.StatusCode.UNKNOWN, "failed to stop sandbox"))
            error = await rpc_error(rig.unary(f"{RUNTIME}/StopPodSandbox")(request))
            assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN, "failed to stop sandbox")
            assert rig.events == [("stop", "sb-x", 0)]

    run(scenario())


def test_a_failing_callback_does_not_break_the_call(sockdir):
    async def explode(event: str, sandbox_id: str) -> None:
        raise RuntimeError("daemon bookkeeping broke")

    request = cri_pb.RemovePodSandboxRequest(pod_sandbox_id="sb-y").SerializeToString()

    async def scenario():
        async with proxied(sockdir, on_event=explode) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/RemovePodSandbox")(request)) == request
            assert rig.events == [("remove", "sb-y", 0)]
            assert rig.fake.received[-1].request == request

    run(scenario())


def test_a_slow_callback_delays_the_call_at_most_its_budget_and_still_completes(sockdir):
    release = asyncio.Event()
    finished = asyncio.Event()

    async def slow(event: str, sandbox_id: str) -> None:
        await release.wait()
        finished.set()

    request = cri_pb.StopPodSandboxRequest(pod_sandbox_id="sb-z").SerializeToString()

    async def scenario():
        async with proxied(sockdir, on_event=slow, event_budget_s=0.05) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/StopPodSandbox")(request)) == request
            assert not finished.is_set()  # the call did not wait for it...
            release.set()
            await bounded(finished.wait())  # ...and it still runs to completion in the background
            assert rig.events == [("stop", "sb-z", 0)]

    run(scenario())


@pytest.mark.parametrize("request_bytes", [b"", b"\xff\xff\xff", cri_pb.StopPodSandboxRequest().SerializeToString()])
def test_stop_without_a_readable_id_is_forwarded_without_event(sockdir, request_bytes):
    async def scenario():
        async with proxied(sockdir) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/StopPodSandbox")(request_bytes)) == request_bytes
            assert rig.events == []
            assert rig.fake.received[-1].request == request_bytes

    run(scenario())


def test_stop_without_a_callback(sockdir):
    request = cri_pb.StopPodSandboxRequest(pod_sandbox_id="sb").SerializeToString()

    async def scenario():
        async with proxied(sockdir, record_events=False) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/StopPodSandbox")(request)) == request

    run(scenario())


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
def test_upstream_channel_endpoint_forms_connect(sockdir, form):
    async def scenario():
        async with proxied(sockdir, upstream_endpoint=form + str(sockdir / "cri.sock").lstrip("/")) as rig:
            assert await bounded(rig.unary(f"{RUNTIME}/Version")(b"v")) == b"v"

    run(scenario())


def test_upstream_channel_over_tcp_loopback(sockdir):
    async def scenario():
        async with FakeCri("127.0.0.1:0") as fake:
            upstream = upstream_channel(f"tcp://{fake.target}")
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


# ---------------------------------------------------------------- the kubelet bridge's ExecSync
#
# With an `exec_bridge`, an ExecSync whose cmd[0] is the marker is answered by the bridge and never reaches the
# runtime; every other ExecSync is forwarded as bytes. The bridge here claims exactly what the daemon's does
# (shim.bridge.command.marker_exec) and answers as the test scripts it.

EXEC_SYNC = f"{RUNTIME}/ExecSync"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def exec_sync_request(cmd: list[str], container_id: str = "c0ffee", timeout: int = 1) -> bytes:
    return cri_pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout).SerializeToString()


MARKER_REQUEST = exec_sync_request(command_for("readiness", {"tcpSocket": {"port": 8080}}))


class ScriptedBridge:
    """An ExecBridge: claims the marker's requests, records each call, answers `answer` (or raises it)."""

    def __init__(self, answer: Answer | Exception) -> None:
        self.answer = answer
        self.asked: list[bytes] = []
        self.calls: list[tuple[cri_pb.ExecSyncRequest, str | None]] = []

    def claim(self, request: bytes) -> cri_pb.ExecSyncRequest | None:
        self.asked.append(request)
        return marker_exec(request)

    async def exec_sync(self, request: cri_pb.ExecSyncRequest, traceparent: str | None) -> Answer:
        self.calls.append((request, traceparent))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_marker_exec_sync_is_answered_by_the_bridge_and_never_reaches_the_runtime(sockdir):
    response = cri_pb.ExecSyncResponse(stdout=b"ok 1234\n", stderr=b"", exit_code=0)
    bridge = ScriptedBridge(response)

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            answered = await bounded(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            assert answered == response.SerializeToString()
            assert bridge.calls == [(cri_pb.ExecSyncRequest.FromString(MARKER_REQUEST), None)]
            assert rig.fake.received == []

    run(scenario())


@pytest.mark.parametrize("response", [
    cri_pb.ExecSyncResponse(stdout=b"HTTP probe failed with statuscode: 500", exit_code=1),
    cri_pb.ExecSyncResponse(stderr=b"cri-probe-shim: bad arguments: httpGet.port: ...", exit_code=2),
    cri_pb.ExecSyncResponse(),  # exit 0, no output: zero bytes on the wire
], ids=["failure", "bad-arguments", "empty"])
def test_the_bridges_response_is_sent_as_its_bytes(sockdir, response):
    async def scenario():
        async with proxied(sockdir, exec_bridge=ScriptedBridge(response)) as rig:
            answered = await bounded(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            assert answered == response.SerializeToString()
            assert cri_pb.ExecSyncResponse.FromString(answered) == response
            assert rig.fake.received == []

    run(scenario())


@pytest.mark.parametrize("code, details", [
    (grpc.StatusCode.NOT_FOUND, 'an error occurred when try to find container "c0ffee": not found'),
    (grpc.StatusCode.UNKNOWN, "dial tcp: lookup nowhere: no such host"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "cri-probe-shim: no answer within 3s"),
    (grpc.StatusCode.UNAVAILABLE, "ListContainers(c0ffee): UNAVAILABLE: connection refused"),
])
def test_a_status_answer_ends_the_call_with_that_status(sockdir, code, details):
    async def scenario():
        async with proxied(sockdir, exec_bridge=ScriptedBridge(StatusAnswer(code, details))) as rig:
            error = await rpc_error(rig.unary(EXEC_SYNC)(MARKER_REQUEST, timeout=BOUND))
            assert (error.code(), error.details()) == (code, details)
            assert rig.fake.received == []

    run(scenario())


def test_the_callers_traceparent_reaches_the_bridge(sockdir):
    bridge = ScriptedBridge(cri_pb.ExecSyncResponse())

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            await bounded(rig.unary(EXEC_SYNC)(MARKER_REQUEST, metadata=(("x-a", "1"), ("traceparent", TRACEPARENT))))
            await bounded(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            assert [traceparent for _, traceparent in bridge.calls] == [TRACEPARENT, None]

    run(scenario())


def test_a_bridge_that_raises_gives_internal_naming_the_bridge(sockdir):
    bridge = ScriptedBridge(RuntimeError("board is gone"))

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            error = await rpc_error(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            assert error.code() == grpc.StatusCode.INTERNAL
            assert error.details() == "cri-probe-shim: kubelet bridge failed: RuntimeError('board is gone')"
            assert rig.fake.received == []
            # The proxy itself is unharmed: the next call is served.
            bridge.answer = cri_pb.ExecSyncResponse(exit_code=1)
            assert await bounded(rig.unary(EXEC_SYNC)(MARKER_REQUEST)) == bridge.answer.SerializeToString()

    run(scenario())


ORDINARY_EXEC_SYNCS = {
    "ordinary": exec_sync_request(["cat", "/tmp/healthy"]),
    "marker-as-a-later-argument": exec_sync_request(["/bin/busybox", "echo", "hello", MARKER]),
    "marker-inside-an-argument": exec_sync_request(["sh", "-c", f"{MARKER} readiness --tcp 80"]),
    "marker-as-container-id": exec_sync_request(["true"], container_id=MARKER),
    "undecodable-with-the-marker": MARKER.encode() + b"\xff\xff" + unknown_fields(),
    "with-unknown-fields": exec_sync_request(["cat", "/tmp/healthy"]) + unknown_fields(),
}


@pytest.mark.parametrize("request_bytes", ORDINARY_EXEC_SYNCS.values(), ids=ORDINARY_EXEC_SYNCS.keys())
def test_an_ordinary_exec_sync_is_forwarded_byte_for_byte(sockdir, request_bytes):
    bridge = ScriptedBridge(AssertionError("the bridge must not answer an ordinary exec"))
    runtime_answer = cri_pb.ExecSyncResponse(stdout=b"hello\n", exit_code=0).SerializeToString() + unknown_fields()

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            rig.fake.on("ExecSync", Respond(runtime_answer, trailing_metadata=(("x-runtime", "containerd"),)))
            call = rig.unary(EXEC_SYNC)(request_bytes, timeout=BOUND)
            assert await call == runtime_answer
            assert tuple(await call.trailing_metadata()) == (("x-runtime", "containerd"),)
            assert [(r.method, r.request) for r in rig.fake.received] == [(EXEC_SYNC, request_bytes)]
            assert bridge.asked == [request_bytes] and bridge.calls == []

    run(scenario())


def test_an_ordinary_exec_sync_keeps_the_runtimes_error(sockdir):
    bridge = ScriptedBridge(AssertionError("the bridge must not answer an ordinary exec"))

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            rig.fake.on("ExecSync", Fail(grpc.StatusCode.UNKNOWN, "failed to exec in container: exec: not found"))
            error = await rpc_error(rig.unary(EXEC_SYNC)(ORDINARY_EXEC_SYNCS["ordinary"]))
            assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN,
                                                       "failed to exec in container: exec: not found")
            assert bridge.calls == []

    run(scenario())


def test_a_marker_exec_sync_the_bridge_hands_back_goes_to_the_runtime_as_it_came(sockdir):
    """An unknown container: the runtime's own NOT_FOUND reaches the kubelet, word for word."""
    bridge = ScriptedBridge(FORWARD)

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            rig.fake.on("ExecSync", Fail(grpc.StatusCode.NOT_FOUND, 'failed to find container "c0ffee": not found'))
            error = await rpc_error(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND,
                                                       'failed to find container "c0ffee": not found')
            assert [(r.method, r.request) for r in rig.fake.received] == [(EXEC_SYNC, MARKER_REQUEST)]
            assert len(bridge.calls) == 1

    run(scenario())


def test_without_a_bridge_a_marker_exec_sync_is_forwarded_as_before(sockdir):
    async def scenario():
        async with proxied(sockdir) as rig:
            rig.fake.on("ExecSync", Fail(grpc.StatusCode.UNKNOWN, 'exec: "cri-probe-shim": executable file not found'))
            error = await rpc_error(rig.unary(EXEC_SYNC)(MARKER_REQUEST))
            # The runtime's own error: the kubelet discards the result (the bridge's fail-closed default).
            assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN,
                                                       'exec: "cri-probe-shim": executable file not found')
            assert [(r.method, r.request) for r in rig.fake.received] == [(EXEC_SYNC, MARKER_REQUEST)]

    run(scenario())


@pytest.mark.parametrize("path", [f"{RUNTIME}/Exec", f"{RUNTIME}/ContainerStatus", f"{IMAGE}/ImageStatus"])
def test_the_bridge_is_asked_about_exec_sync_only(sockdir, path):
    bridge = ScriptedBridge(AssertionError("only ExecSync is the bridge's"))

    async def scenario():
        async with proxied(sockdir, exec_bridge=bridge) as rig:
            assert await bounded(rig.unary(path)(MARKER_REQUEST)) == MARKER_REQUEST  # the fake echoes
            assert [(r.method, r.request) for r in rig.fake.received] == [(path, MARKER_REQUEST)]
            assert bridge.asked == [] and bridge.calls == []

    run(scenario())
