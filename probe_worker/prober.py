"""One attempt, from a probe spec to an Attempt message (the kubelet's prober.go).

Everything that can go wrong before a connection (no handler, a named port the
container does not have, no address of the wanted family) is an UNKNOWN result,
which the thresholds ignore, exactly as the kubelet discards prober errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.addresses import AddressError, choose_endpoint
from probe_worker.attempt import FAILURE, UNKNOWN, AttemptContext, Endpoint, Outcome
from probe_worker.gostrings import go_duration
from probe_worker.ports import PortError, resolve_port
from probe_worker.probes import Handler, handler_for
from probe_worker.trace import Trace
from probe_worker.validation import effective_timing

log = logging.getLogger("probe_worker")

# Each kind enforces the probe timeout itself, with the kubelet's own messages.
# This margin is only a safety net against a bug in a kind that forgets to.
SAFETY_MARGIN_S = 0.25
MAX_TRIES = 3


def user_agent(version: str) -> str:
    return f"kube-probe/{version}"


class Prober:
    def __init__(self, pod_ips: Sequence[str], user_agent_version: str) -> None:
        self.pod_ips = list(pod_ips)
        self.user_agent = user_agent(user_agent_version)

    async def run(self, spec: spec_pb.ProbeSpec, container_ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.Attempt:
        started_wall = time.time_ns()
        trace = Trace()
        outcome = await self._outcome(spec, container_ports, trace)
        return spec_pb.Attempt(
            result=outcome.result,
            output=outcome.output,
            started_at_unix_ns=started_wall,
            duration_ns=time.monotonic_ns() - trace.origin_ns,
            address=outcome.address,
            phases=trace.to_proto(),
            http_status_code=outcome.http_status_code,
            grpc_status=outcome.grpc_status,
        )

    async def _outcome(
        self, spec: spec_pb.ProbeSpec, container_ports: Sequence[spec_pb.ContainerPort], trace: Trace
    ) -> Outcome:
        handler = handler_for(spec)
        if handler is None:
            return Outcome(UNKNOWN, "the probe has no http_get, tcp_socket or grpc handler")
        try:
            port = resolve_port(handler.port, container_ports)
            endpoint = choose_endpoint(handler.host, spec.target, spec.ip_family, port, self.pod_ips)
        except (PortError, AddressError) as exc:
            return Outcome(UNKNOWN, str(exc))
        timeout_ms = effective_timing(spec).timeout_ms
        # The kubelet runs a probe that ended in an error (UNKNOWN here) again at once,
        # up to 3 tries (prober.runProbeWithRetries); the server sees every try.
        for _ in range(MAX_TRIES):
            outcome = await self._try(handler, spec, endpoint, timeout_ms, trace)
            if outcome.result != UNKNOWN:
                break
        return outcome

    async def _try(
        self, handler: Handler, spec: spec_pb.ProbeSpec, endpoint: Endpoint, timeout_ms: int, trace: Trace
    ) -> Outcome:
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        ctx = AttemptContext(
            deadline=deadline,
            timeout_ns=timeout_ms * 1_000_000,
            user_agent=self.user_agent,
            trace=trace,
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
