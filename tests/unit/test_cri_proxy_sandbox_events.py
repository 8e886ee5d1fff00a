"""The CRI proxy's sandbox events (shim/cri/proxy.py) through real sockets: a StopPodSandbox or RemovePodSandbox
reaches the daemon's callback before the runtime, whatever the runtime or the callback then does, within the
callback's budget."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.cri_proxy_rig import RUNTIME, bounded, proxied, rpc_error, run
from tests.support.cri_proxy_rig import sockdir  # noqa: F401  (a fixture)
from tests.support.fake_cri import Fail, Respond


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
