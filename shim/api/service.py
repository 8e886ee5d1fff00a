"""ProbeService over grpc.aio: request in, registry call, response or a precise status out.

Error mapping (one place): invalid request -> INVALID_ARGUMENT with every field error;
unknown sandbox -> NOT_FOUND; sandbox not ready -> FAILED_PRECONDITION; limits ->
RESOURCE_EXHAUSTED; runtime or worker not answering, or a state dir that cannot be written -> UNAVAILABLE;
anything else is a bug of ours -> INTERNAL naming it (logged), never grpc's bare UNKNOWN.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import grpc

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from probe_api.defaults import FIELD_VIOLATIONS_KEY, SHIM_VERSION
from probe_api.request_rules import field_violations
from shim.observe.tracing import traceparent_of
from shim.sandboxes.resolver import RuntimeUnavailable, SandboxNotFound, SandboxNotReady
from shim.state.registry import InvalidRequest, LimitExceeded, ProbeRegistry
from shim.state.store import StoreUnavailable
from shim.workers.supervisor import WorkerRejected, WorkerUnavailable

log = logging.getLogger(__name__)

API_VERSION = "v1alpha1"

_CODES = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (WorkerRejected, grpc.StatusCode.INVALID_ARGUMENT),
    (SandboxNotFound, grpc.StatusCode.NOT_FOUND),
    (SandboxNotReady, grpc.StatusCode.FAILED_PRECONDITION),
    (LimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RuntimeUnavailable, grpc.StatusCode.UNAVAILABLE),
    (WorkerUnavailable, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),  # state dir full or read-only: nothing was stored, retry later
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def _status_errors(method):
    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except tuple(exc for exc, _ in _CODES) as exc:
            code = next(code for kind, code in _CODES if isinstance(exc, kind))
            trailing = ()
            if isinstance(exc, InvalidRequest):  # the same errors as data, for clients that map field paths
                trailing = ((FIELD_VIOLATIONS_KEY, field_violations(exc.errors).SerializeToString()),)
            # asyncio's TimeoutError carries no text; the caller still deserves a sentence.
            await context.abort(code, str(exc) or f"{method.__name__}: the worker did not answer in time", trailing)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug, not the caller's fault: INTERNAL with what it was, never a bare UNKNOWN
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {exc!r}")

    return wrapper


class ProbeServicer(service_grpc.ProbeServiceServicer):
    def __init__(self, registry: ProbeRegistry, board, *, instance_id: str, runtime_endpoint: str) -> None:
        self._registry = registry
        self._board = board
        self._instance_id = instance_id
        self._runtime_endpoint = runtime_endpoint

    @_status_errors
    async def RunProbe(self, request, context):
        return service_pb.RunProbeResponse(probe_id=await self._registry.run_probe(request, traceparent_of(context.invocation_metadata())))

    @_status_errors
    async def StopProbe(self, request, context):
        return service_pb.StopProbeResponse(stopped_probe_ids=await self._registry.stop_probe(request))

    @_status_errors
    async def ProbeStatus(self, request, context):
        return service_pb.ProbeStatusResponse(
            probes=self._board.list(request.filter), instance_id=self._board.instance_id, revision=self._board.revision
        )

    async def WatchProbeStatus(self, request, context):
        # aclosing: when the client goes away the watcher is unregistered at once, not at GC.
        async with contextlib.aclosing(self._board.watch(request)) as events:
            async for event in events:
                yield event

    @_status_errors
    async def ExecProbe(self, request, context):
        return await self._registry.exec_probe(request, traceparent_of(context.invocation_metadata()))

    @_status_errors
    async def ListProbeSandboxes(self, request, context):
        return service_pb.ListProbeSandboxesResponse(sandboxes=await self._registry.list_sandboxes())

    @_status_errors
    async def ShimVersion(self, request, context):
        return service_pb.ShimVersionResponse(
            version=SHIM_VERSION, api_version=API_VERSION, instance_id=self._instance_id,
            runtime_endpoint=self._runtime_endpoint,
        )
