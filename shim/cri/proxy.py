"""Transparent CRI proxy: runtime.v1 RuntimeService and ImageService calls forwarded to the runtime as bytes.

The daemon listens on the socket the kubelet and crictl talk to; this module owns everything that makes that
socket look like the runtime's own for every CRI method:
- a generic handler (`cri_proxy_handler`) that forwards each `/runtime.v1.RuntimeService/*` and
  `/runtime.v1.ImageService/*` call to the upstream channel without decoding it (identity serializers), with the
  caller's metadata, its deadline and its cancellation, and relays the runtime's initial metadata, messages,
  status code, details and trailing metadata unchanged;
- two exceptions to "never decode": StopPodSandbox and RemovePodSandbox requests are read (and still forwarded
  byte for byte) so the daemon can stop that sandbox's worker at once; and an ExecSync whose command starts with
  the kubelet bridge's marker is answered by the daemon (`exec_bridge`, which claims it) instead of being
  forwarded. Every other ExecSync is forwarded as bytes, after a substring test that costs well under a
  microsecond;
- the channel to the runtime (`forwarding_channel`: the daemon's own gRPC client, shim/rpc/client.py, one HTTP/2
  connection, built from a kubelet/crictl style endpoint, probe_api.endpoints), which also carries the daemon's own
  typed calls (sandboxes, containers: `Channel.unary_unary`).

Any other path (ProbeService, health, reflection) is left to the other handlers of the same server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.endpoints import upstream_target
from shim.bridge.answer import Answer, Forward, StatusAnswer
from shim.observe.tracing import traceparent_of
from shim.rpc.client import CallError, Channel

log = logging.getLogger(__name__)

RUNTIME_SERVICE = "runtime.v1.RuntimeService"
IMAGE_SERVICE = "runtime.v1.ImageService"

# The CRI methods known at the time of writing (cri-api runtime.v1). Unknown methods of these two services are
# forwarded too, so a newer kubelet keeps working: see `forwards_as_stream`.
RUNTIME_METHODS: tuple[str, ...] = (
    "Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus", "ListPodSandbox",
    "StreamPodSandboxes", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "ListContainers",
    "StreamContainers", "ContainerStatus", "UpdateContainerResources", "ReopenContainerLog", "ExecSync", "Exec",
    "Attach", "PortForward", "ContainerStats", "ListContainerStats", "StreamContainerStats", "PodSandboxStats",
    "ListPodSandboxStats", "StreamPodSandboxStats", "UpdateRuntimeConfig", "Status", "CheckpointContainer",
    "CheckpointPod", "RestorePod", "GetContainerEvents", "ListMetricDescriptors", "ListPodSandboxMetrics",
    "StreamPodSandboxMetrics", "RuntimeConfig", "UpdatePodSandboxResources",
)
IMAGE_METHODS: tuple[str, ...] = (
    "ListImages", "StreamImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo",
)
STREAMING_METHODS: frozenset[str] = frozenset({
    "StreamPodSandboxes", "StreamContainers", "StreamContainerStats", "StreamPodSandboxStats", "GetContainerEvents",
    "StreamPodSandboxMetrics", "StreamImages",
})
KNOWN_METHODS: frozenset[str] = frozenset(RUNTIME_METHODS + IMAGE_METHODS)
KNOWN_PATHS: tuple[str, ...] = tuple(
    [f"/{RUNTIME_SERVICE}/{m}" for m in RUNTIME_METHODS] + [f"/{IMAGE_SERVICE}/{m}" for m in IMAGE_METHODS]
)

# The requests the proxy reads: method -> (event name for the daemon, request message type).
SANDBOX_EVENT_METHODS: dict[str, tuple[str, type]] = {
    f"/{RUNTIME_SERVICE}/StopPodSandbox": ("stop", cri_pb.StopPodSandboxRequest),
    f"/{RUNTIME_SERVICE}/RemovePodSandbox": ("remove", cri_pb.RemovePodSandboxRequest),
}

# How long a StopPodSandbox/RemovePodSandbox waits for the daemon's callback before forwarding anyway.
DEFAULT_EVENT_BUDGET_S = 1.0

# Request metadata that belongs to the HTTP/2 or gRPC transport of the incoming call, not to the application.
# The server hands a handler only `user-agent` of these (as grpc core does); the rest are dropped defensively
# because handing them to the upstream call would change it (`grpc-timeout` would set a second deadline,
# `grpc-encoding` would lie about compression). `user-agent` is dropped because the channel sends its own
# (shim/rpc/client.py USER_AGENT), which is the truth: the runtime's peer is the shim.
TRANSPORT_METADATA_KEYS: frozenset[str] = frozenset({
    "user-agent", "te", "content-type", "content-length", "host", "connection", "keep-alive", "proxy-connection",
    "transfer-encoding", "upgrade", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
    "grpc-internal-encoding-request", "grpc-status", "grpc-message",
})

EXEC_SYNC_PATH = f"/{RUNTIME_SERVICE}/ExecSync"

SandboxEventCallback = Callable[[str, str], Awaitable[None]]


class ExecBridge(Protocol):
    """The kubelet bridge as the proxy sees it (shim/bridge/service.py)."""

    def claim(self, request: bytes) -> cri_pb.ExecSyncRequest | None:
        """The decoded request if this ExecSync is the bridge's to answer, else None (forwarded)."""

    async def exec_sync(self, request: cri_pb.ExecSyncRequest, traceparent: str | None) -> Answer: ...
Metadata = tuple[tuple[str, str | bytes], ...]


# ---------------------------------------------------------------- pure rules


def cri_method(path: str) -> str | None:
    """The method name if `path` belongs to a proxied CRI service, else None."""
    for service in (RUNTIME_SERVICE, IMAGE_SERVICE):
        prefix = f"/{service}/"
        if path.startswith(prefix):
            method = path[len(prefix):]
            return method if method and "/" not in method else None
    return None


def forwards_as_stream(method: str) -> bool:
    """Whether `method` is relayed message by message (server-streaming) rather than as one unary exchange.

    Known unary methods take the cheaper unary path. A method this list does not know is relayed as a stream:
    on the wire a unary answer is a stream of exactly one message, so the stream relay is byte-identical for a
    new unary method and also carries a new streaming one, which a unary relay would break.
    """
    return method in STREAMING_METHODS or method not in KNOWN_METHODS


def forwardable_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Metadata:
    """The caller's metadata minus transport keys, order and repeated keys preserved."""
    if not metadata:
        return ()
    return tuple(
        (key, value) for key, value in metadata
        if not key.startswith(":") and key.lower() not in TRANSPORT_METADATA_KEYS
    )


def sandbox_event(path: str, request: bytes) -> tuple[str, str] | None:
    """("stop"|"remove", pod_sandbox_id) for StopPodSandbox/RemovePodSandbox, else None.

    An undecodable request or an empty id yields None: the runtime will answer it with its own error, and there
    is no sandbox to act on.
    """
    entry = SANDBOX_EVENT_METHODS.get(path)
    if entry is None:
        return None
    event, message_type = entry
    try:
        sandbox_id = message_type.FromString(request).pod_sandbox_id
    except DecodeError:
        return None
    return (event, sandbox_id) if sandbox_id else None


# ---------------------------------------------------------------- I/O


def forwarding_channel(endpoint: str) -> Channel:
    """The daemon's channel to the runtime: the proxy forwards calls on it as bytes, the daemon makes its own typed
    calls on it (one HTTP/2 connection; the kubelet's reconnect backoff and message limit; no HTTP proxy, ever)."""
    return Channel(upstream_target(endpoint))


def cri_proxy_handler(
    upstream: Channel,
    on_sandbox_event: SandboxEventCallback | None = None,
    *,
    exec_bridge: ExecBridge | None = None,
    event_budget_s: float = DEFAULT_EVENT_BUDGET_S,
) -> grpc.GenericRpcHandler:
    """A generic handler for a grpc.aio server that forwards the CRI services to `upstream`.

    `on_sandbox_event(event, pod_sandbox_id)` is awaited with "stop" or "remove" BEFORE the StopPodSandbox or
    RemovePodSandbox call is forwarded: the kubelet has already decided the pod goes away (it stops its own
    probes first), the runtime is about to kill the containers and tear down the network, so probing on would
    only report false failures and keep the worker inside a namespace being destroyed. If the runtime then
    fails the call, the kubelet retries it; the worker stays stopped, which is what the kubelet wants.
    The call waits at most `event_budget_s` for the callback (which then keeps running in the background) and
    ignores its exceptions (logged): the daemon's bookkeeping must never break or stall a CRI call.

    `exec_bridge` answers the ExecSync calls it claims (the kubelet bridge's marker) in place of the runtime.
    """
    return _CriProxyHandler(upstream, on_sandbox_event, exec_bridge, event_budget_s)


class _CriProxyHandler(grpc.GenericRpcHandler):
    def __init__(self, upstream: Channel, on_sandbox_event: SandboxEventCallback | None,
                 exec_bridge: ExecBridge | None, event_budget_s: float) -> None:
        self._upstream = upstream
        self._on_sandbox_event = on_sandbox_event
        self._exec_bridge = exec_bridge
        self._event_budget_s = event_budget_s
        self._event_tasks: set[asyncio.Task[None]] = set()  # callbacks still running past their budget
        # Built once for the known methods (the hot path); unknown ones are built per call so that arbitrary
        # method names cannot grow this table.
        self._handlers = {path: self._build(path) for path in KNOWN_PATHS}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is not None:
            return handler
        return self._build(path) if cri_method(path) is not None else None

    def _build(self, path: str) -> grpc.RpcMethodHandler:
        method = cri_method(path)
        assert method is not None, path
        if forwards_as_stream(method):
            return grpc.unary_stream_rpc_method_handler(self._stream_forwarder(path))
        return grpc.unary_unary_rpc_method_handler(self._unary_forwarder(path))

    def _unary_forwarder(self, path: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        upstream = self._upstream
        observe = path in SANDBOX_EVENT_METHODS and self._on_sandbox_event is not None
        bridge = self._exec_bridge if path == EXEC_SYNC_PATH else None

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if observe:
                await self._notify(path, request)
            if bridge is not None and (claimed := bridge.claim(request)) is not None:
                answered = await _answer_bridged(bridge, claimed, context)
                if answered is not None:
                    return answered
            try:
                # A cancelled caller (or its deadline) cancels this handler, and unary() the upstream call with it.
                initial, response, trailing = await upstream.unary(
                    path, request, forwardable_metadata(context.invocation_metadata()), context.time_remaining())
            except CallError as error:
                await _relay_error(context, error)
            except Exception as error:  # noqa: BLE001 - must become a status, not a crash
                await _relay_local_failure(context, path, error)
            if initial:
                await context.send_initial_metadata(initial)
            context.set_trailing_metadata(trailing)
            return response

        return forward

    def _stream_forwarder(self, path: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[None]]:
        upstream = self._upstream

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> None:
            call = None
            initial_sent = False
            try:
                call = await upstream.stream(
                    path, request, forwardable_metadata(context.invocation_metadata()), context.time_remaining())
                # Headers precede the first message upstream; relaying them first keeps that order for the caller.
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(initial)
                    initial_sent = True
                while (message := await call.read()) is not None:
                    await context.write(message)
                trailing = await call.trailing_metadata()
            except CallError as error:
                await _relay_error(context, error, initial_sent=initial_sent)
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
                raise
            except Exception as error:  # noqa: BLE001
                if call is not None:
                    call.cancel()
                await _relay_local_failure(context, path, error)
            context.set_trailing_metadata(trailing)

        return forward

    async def _notify(self, path: str, request: bytes) -> None:
        event = sandbox_event(path, request)
        if event is None or self._on_sandbox_event is None:
            return
        task = asyncio.create_task(_run_callback(self._on_sandbox_event, *event))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
        # asyncio.wait never cancels the callback: if the budget runs out, or this call is cancelled, the daemon
        # still finishes stopping the worker.
        done, _ = await asyncio.wait({task}, timeout=self._event_budget_s)
        if not done:
            log.warning("sandbox %s callback for %s still running after %.1fs; forwarding the CRI call now",
                        event[0], event[1], self._event_budget_s)


async def _answer_bridged(bridge: ExecBridge, request: cri_pb.ExecSyncRequest,
                          context: grpc.aio.ServicerContext) -> bytes | None:
    """The bridge's answer as bytes, or None when the bridge hands the call to the runtime."""
    try:
        result = await bridge.exec_sync(request, traceparent_of(context.invocation_metadata()))
    except Exception as error:  # noqa: BLE001 - a bug in the bridge is an error status, never a crash
        log.exception("kubelet bridge failed for container %s", request.container_id)
        await context.abort(grpc.StatusCode.INTERNAL, f"cri-probe-shim: kubelet bridge failed: {error!r}")
        raise AssertionError("unreachable: abort raises") from error
    if isinstance(result, Forward):
        return None
    if isinstance(result, StatusAnswer):
        await context.abort(result.code, result.details)
    return result.SerializeToString()


async def _run_callback(callback: SandboxEventCallback, event: str, sandbox_id: str) -> None:
    try:
        await callback(event, sandbox_id)
    except Exception:  # noqa: BLE001 - the CRI call goes on whatever the daemon's bookkeeping does
        log.exception("sandbox %s callback failed for %s", event, sandbox_id)


async def _relay_error(context: grpc.aio.ServicerContext, error: CallError, *,
                       initial_sent: bool = False) -> NoReturn:
    """Ends the call with the upstream's status, details and trailing metadata, exactly."""
    if not initial_sent and error.initial_metadata:
        await context.send_initial_metadata(error.initial_metadata)
    await context.abort(error.code, error.details, error.trailing_metadata)
    raise AssertionError("unreachable: abort raises")


async def _relay_local_failure(context: grpc.aio.ServicerContext, path: str, error: Exception) -> NoReturn:
    """A failure of the proxy itself (not a status from the runtime): INTERNAL, saying it was the proxy."""
    log.error("CRI proxy failed to forward %s: %r", path, error)
    await context.abort(grpc.StatusCode.INTERNAL, f"cri-probe-shim: forwarding {path} failed: {error!r}")
    raise AssertionError("unreachable: abort raises")
