"""The one signature every probe kind shares, and the types it speaks.

Each module in probe_worker/probes/ exports

    async def probe(spec: ProbeSpec, endpoint: Endpoint, ctx: AttemptContext) -> Outcome

like blackbox_exporter's ProbeFn: the kind reads its own action from the spec,
connects through probe_worker.connect, records phases on ctx.trace, and maps
everything (timeouts included) to an Outcome with the kubelet's exact output.
With ctx.lifecycle_hook the kind runs the spec's handler as the kubelet runs a
lifecycle hook's (pkg/kubelet/lifecycle/handlers.go) instead of a probe's.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.grpc_codes import code_name, serving_status_text
from probe_worker.deadline import AttemptDeadline
from probe_worker.trace import Trace

Result = spec_pb.AttemptResult
SUCCESS = spec_pb.RESULT_SUCCESS
WARNING = spec_pb.RESULT_WARNING
FAILURE = spec_pb.RESULT_FAILURE
UNKNOWN = spec_pb.RESULT_UNKNOWN

# Outputs are stored, streamed and logged: no attempt may carry more than this.
MAX_OUTPUT_CHARS = 10240 + 256


@dataclass(frozen=True)
class Endpoint:
    """Where to connect. `host` is what URLs and messages show."""

    host: str                     # an IP literal, or an explicit hostname from the spec
    addresses: tuple[str, ...]    # candidate IPs, preferred first; empty means resolve `host`
    port: int
    family_filter: int = 0        # socket.AF_INET / AF_INET6 when resolving a hostname; 0 = any


@dataclass
class AttemptContext:
    deadline: float                       # event-loop time by which the attempt must be over
    timeout_ns: int                       # the probe timeout, for messages such as "within 1s"
    user_agent: str                       # "kube-probe/1.37", "kube-lifecycle/1.37" for a hook
    trace: Trace = field(default_factory=Trace)
    lifecycle_hook: bool = False          # a lifecycle hook's semantics, not a probe's
    tls: ssl.SSLContext | None = None     # shared per worker: building one costs milliseconds
    happy_eyeballs_delay: float = 0.25    # RFC 8305 "Connection Attempt Delay"
    # A socket of the family in the sandbox's netns (probe_worker.socket_source); None: made here, in this netns.
    open_socket: Callable[[int], Awaitable[socket.socket]] | None = None
    # The attempt's one timer for its timeout scopes (probe_worker/deadline.py); None: a timer per scope.
    timer: AttemptDeadline | None = None

    def timeout(self) -> "AbstractAsyncContextManager[object]":
        """`async with ctx.timeout():` is asyncio.timeout_at(ctx.deadline), on the attempt's timer when it has one
        for this deadline (a kind may narrow the deadline in a copy of the context)."""
        timer = self.timer
        if timer is not None and timer.when == self.deadline:
            return timer.scope()
        return asyncio.timeout_at(self.deadline)


@dataclass
class Outcome:
    result: int
    output: str = ""
    address: str = ""          # "ip:port" actually connected (last hop for redirects)
    http_status_code: int = 0
    grpc_code: int | None = None   # a gRPC probe whose Check call failed: grpc-go's status code
    grpc_serving: int = 0          # a gRPC probe answered: Attempt.grpc_serving_status

    @property
    def grpc_status(self) -> str:
        """For traces and tests: the code's Go name or the serving status's name, "" for neither."""
        if self.grpc_code is not None:
            return code_name(self.grpc_code)
        return serving_status_text(self.grpc_serving)

    def bounded(self) -> "Outcome":
        if len(self.output) > MAX_OUTPUT_CHARS:
            self.output = self.output[:MAX_OUTPUT_CHARS]
        return self


ProbeFn = Callable[[spec_pb.ProbeSpec, Endpoint, AttemptContext], Awaitable[Outcome]]
