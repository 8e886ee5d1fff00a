"""One attempt, from a probe spec to an Attempt message (the kubelet's prober.go).

Everything that can go wrong before a connection (no handler, a named port the
container does not have, no address of the wanted family) is an UNKNOWN result,
which the thresholds ignore, exactly as the kubelet discards prober errors.

An attempt that ended UNKNOWN is tried again at once, up to 3 tries (the kubelet's
runProbeWithRetries), or `max_tries` when the caller says so: the kubelet bridge asks
for one, since the kubelet retries its ExecSync itself. A lifecycle hook (the kubelet's
handlers.go semantics, User-Agent kube-lifecycle/V) is never tried twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import MAX_TRIES
from probe_api.gostrings import go_duration
from probe_api.validation import effective_timing
from probe_worker.addresses import AddressError, choose_endpoint
from probe_worker.attempt import FAILURE, UNKNOWN, AttemptContext, Endpoint, Outcome
from probe_worker.deadline import AttemptDeadline
from probe_worker.ports import PortError, resolve_port
from probe_worker.probes import Handler, handler_for
from probe_worker.socket_source import OpenSocket
from probe_worker.trace import Trace

log = logging.getLogger(__name__)

# Each kind enforces the probe timeout itself, with the kubelet's own messages.
# This margin is only a safety net against a bug in a kind that forgets to.
SAFETY_MARGIN_S = 0.25


def user_agent(version: str, purpose: str = "probe") -> str:
    """pkg/probe/http userAgent(purpose): "kube-probe/1.37", "kube-lifecycle/1.37"."""
    return f"kube-{purpose}/{version}"


def tries(max_tries: int, lifecycle_hook: bool) -> int:
    """How many times an attempt that ends UNKNOWN is run: 0 means the kubelet's 3; a hook runs once."""
    if lifecycle_hook:
        return 1
    return max_tries if max_tries > 0 else MAX_TRIES


# Distinct (spec, container ports) pairs a worker keeps plans for; a worker has a handful of probes,
# and a full cache is simply emptied (a plan costs tens of microseconds to rebuild).
PLAN_CACHE_SIZE = 64


@dataclass(frozen=True)
class Plan:
    """What every attempt of one spec does before connecting, worked out once.

    It depends only on the spec, the container's ports and the pod IPs, none of which
    change between attempts, while working it out (port lookup, address family choice)
    costs as much as a TCP probe's own Python work.
    """

    handler: Handler | None = None
    endpoint: Endpoint | None = None
    timeout_ms: int = 0
    unknown: str = ""       # why every attempt is UNKNOWN without connecting, if it is


def plan_attempt(spec: spec_pb.ProbeSpec, container_ports: Sequence[spec_pb.ContainerPort],
                 pod_ips: Sequence[str]) -> Plan:
    handler = handler_for(spec)
    if handler is None:
        return Plan(unknown="the probe has no http_get, tcp_socket or grpc handler")
    try:
        port = resolve_port(handler.port, container_ports)
        endpoint = choose_endpoint(handler.host, spec.target, spec.ip_family, port, pod_ips)
    except (PortError, AddressError) as exc:
        return Plan(handler=handler, unknown=str(exc))
    return Plan(handler=handler, endpoint=endpoint, timeout_ms=effective_timing(spec).timeout_ms)


class Prober:
    """One sandbox's attempts: its pod IPs, and where its sockets come from (None: made here, in this netns)."""

    def __init__(self, pod_ips: Sequence[str], user_agent_version: str, open_socket: OpenSocket | None = None) -> None:
        self.pod_ips = list(pod_ips)
        self._open_socket = open_socket
        self.user_agent = user_agent(user_agent_version)
        self.hook_user_agent = user_agent(user_agent_version, "lifecycle")
        self._plans: dict[tuple[bytes, tuple[bytes, ...]], Plan] = {}

    def set_pod_ips(self, pod_ips: Sequence[str]) -> None:
        self.pod_ips = list(pod_ips)
        self._plans.clear()  # a plan holds the addresses it chose

    async def run(
        self, spec: spec_pb.ProbeSpec, container_ports: Sequence[spec_pb.ContainerPort], *,
        max_tries: int = 0, lifecycle_hook: bool = False,
    ) -> spec_pb.Attempt:
        """One attempt; max_tries and lifecycle_hook are RunOnce's (the schedule uses the defaults)."""
        started_wall = time.time_ns()
        trace = Trace()
        plan = self._plan(spec, container_ports)
        outcome = await self._outcome(spec, plan, trace, tries(max_tries, lifecycle_hook), lifecycle_hook)
        attempt = spec_pb.Attempt(
            result=outcome.result,
            output=outcome.output,
            started_at_unix_ns=started_wall,
            duration_ns=time.monotonic_ns() - trace.origin_ns,
            address=outcome.address,
            phases=trace.to_proto(),
            http_status_code=outcome.http_status_code,
            grpc_serving_status=outcome.grpc_serving,
        )
        if outcome.grpc_code is not None:
            attempt.grpc_code = outcome.grpc_code
        return attempt

    def _plan(self, spec: spec_pb.ProbeSpec, container_ports: Sequence[spec_pb.ContainerPort]) -> Plan:
        # Keyed by content, not identity: a caller may reuse or change a message in place.
        key = (spec.SerializeToString(deterministic=True),
               tuple(p.SerializeToString(deterministic=True) for p in container_ports))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            plan = self._plans[key] = plan_attempt(spec, container_ports, self.pod_ips)
        return plan

    async def _outcome(
        self, spec: spec_pb.ProbeSpec, plan: Plan, trace: Trace, max_tries: int, lifecycle_hook: bool
    ) -> Outcome:
        if plan.unknown:
            return Outcome(UNKNOWN, plan.unknown)
        assert plan.handler is not None and plan.endpoint is not None
        # The kubelet runs a probe that ended in an error (UNKNOWN here) again at once,
        # up to 3 tries (prober.runProbeWithRetries); the server sees every try.
        for _ in range(max_tries):
            outcome = await self._try(plan.handler, spec, plan.endpoint, plan.timeout_ms, trace, lifecycle_hook)
            if outcome.result != UNKNOWN:
                break
        return outcome

    async def _try(
        self, handler: Handler, spec: spec_pb.ProbeSpec, endpoint: Endpoint, timeout_ms: int, trace: Trace,
        lifecycle_hook: bool,
    ) -> Outcome:
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        timer = AttemptDeadline(deadline)
        ctx = AttemptContext(
            deadline=deadline,
            timeout_ns=timeout_ms * 1_000_000,
            user_agent=self.hook_user_agent if lifecycle_hook else self.user_agent,
            trace=trace,
            lifecycle_hook=lifecycle_hook,
            open_socket=self._open_socket,
            timer=timer,
        )
        try:
            async with asyncio.timeout_at(deadline + SAFETY_MARGIN_S):
                return (await handler.probe(spec, endpoint, ctx)).bounded()
        except TimeoutError:
            log.error("%s probe overran its timeout; the safety net ended it", handler.kind)
            return Outcome(FAILURE, f"probe did not complete within {go_duration(ctx.timeout_ns)}")
        except Exception as exc:  # a bug in one kind must not take the worker down
            log.exception("%s probe raised", handler.kind)
            return Outcome(UNKNOWN, f"internal error in {handler.kind} probe: {exc!r}").bounded()
        finally:
            timer.close()
