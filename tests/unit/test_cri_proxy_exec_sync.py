"""The kubelet bridge's ExecSync in the CRI proxy (shim/cri/proxy.py) through real sockets. With an `exec_bridge`, an
ExecSync whose cmd[0] is the marker is answered by the bridge and never reaches the runtime; every other ExecSync is
forwarded as bytes. The bridge here claims exactly what the daemon's does (shim.bridge.command.marker_exec) and
answers as the test scripts it."""

from __future__ import annotations

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.bridge_command import MARKER, command_for
from shim.bridge.answer import FORWARD, Answer, StatusAnswer
from shim.bridge.command import marker_exec
from tests.support.cri_proxy_rig import BOUND, IMAGE, RUNTIME, bounded, proxied, rpc_error, run, unknown_fields
from tests.support.cri_proxy_rig import sockdir  # noqa: F401  (a fixture)
from tests.support.fake_cri import Fail, Respond


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
