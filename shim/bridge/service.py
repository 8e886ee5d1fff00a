"""One marker ExecSync, from the kubelet's request to its answer: the kubelet bridge's I/O.

For `ExecSync(container_id, cmd, timeout)` whose cmd[0] is the marker (command.py), in this order:
1. the container -> its sandbox, name, pod identity and ports (containers.py; a container the runtime does not
   know is forwarded, so the kubelet gets the runtime's own NOT_FOUND, exactly as without the shim);
2. the command -> a validated probe spec, with RunProbe's rules and `host` gate (bad arguments: exit 2);
3. the sandbox -> its netns and IPs (the daemon's sandbox directory, remembered as for ExecProbe; a sandbox that
   cannot be probed: exit 3);
4. one attempt in the sandbox's worker (ExecProbe's path), bounded by the ExecSync timeout (hooks: the config's
   `hook_timeout_s`), one try (the kubelet asks again after an error status, up to three times a period:
   prober.go runProbeWithRetries), hook semantics for postStart/preStop; the worker stays up between calls,
   since the kubelet calls again every period;
5. the attempt -> span, metrics with the pod's labels, a row on the status board (probectl ps / inspect / watch),
   and the ExecSync answer (answer.py).
What steps 2-4 derive from the request alone (the call, the checked RunOnce, the worker target, the row's fixed
fields) is kept per handler between the kubelet's calls, in memory (call_cache.py). Nothing of this is stored: the
kubelet owns the handler and calls again; after a restart rows come back with the first call.
"""

from __future__ import annotations

import hashlib
import logging
import time

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.bridge_command import HOOK_ROLES, ROLES, BadArguments
from shim.bridge import answer
from shim.bridge.call_cache import CallCache, Handler, handler_key
from shim.bridge.command import MarkerExecs, parse_command
from shim.bridge.containers import ContainerInfo, ContainerNotFound, CriContainers
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import (
    HostNetworkSandbox, RuntimeUnavailable, SandboxInfo, SandboxNotFound, SandboxNotReady,
)
from shim.state.results import ResultsManager
from shim.workers.supervisor import SandboxTarget, WorkerRejected, WorkerUnavailable, run_once_request

log = logging.getLogger(__name__)

# Past the probe's own timeout, how long the worker may take to answer (spawning it included) before the kubelet
# is told the command timed out. The engine ends a probe at its timeout with the kubelet's own text. The kubelet
# itself waits runtimeRequestTimeout (2 min by default) past the timeout (cri-client ExecSync), and none for a hook.
ANSWER_GRACE_S = 2.0
DEFAULT_PROBE_TIMEOUT_S = 1  # what the kubelet sends when timeoutSeconds is left out (SetDefaults_Probe)


def row_id(sandbox_id: str, container_id: str, role: str) -> str:
    """The status board id of a bridged handler: stable for its container, apart from registered probes' ids."""
    digest = hashlib.sha256(f"bridged\0{sandbox_id}\0{container_id}\0{role}".encode()).hexdigest()
    return f"bridged-{role.lower()}-{digest[:12]}"


class KubeletBridge:
    def __init__(self, *, containers: CriContainers, sandboxes: SandboxDirectory, supervisor,
                 results: ResultsManager, metrics, allow_host_field: bool, hook_timeout_s: float) -> None:
        self._containers = containers
        self._sandboxes = sandboxes  # the daemon's one directory (the registry forgets a stopped sandbox in it)
        self._supervisor = supervisor
        self._results = results
        self._metrics = metrics  # the bridge's own counter; attempts go to the results manager
        self._allow_host = allow_host_field
        self._hook_timeout_ms = int(hook_timeout_s * 1000)
        self._handlers = CallCache()  # what each handler's command gives, kept between the kubelet's calls
        self._marker_execs = MarkerExecs()

    def claim(self, request: bytes) -> cri_pb.ExecSyncRequest | None:
        """For the CRI proxy: the ExecSync requests this bridge answers (the marker's), decoded."""
        return self._marker_execs.claim(request)

    async def exec_sync(self, request: cri_pb.ExecSyncRequest, traceparent: str | None = None) -> answer.Answer:
        role = request.cmd[1] if len(request.cmd) > 1 else ""
        result = await self._answer(request, traceparent)
        # An unknown role is a caller's typo, not a new series per typo.
        self._metrics.observe_bridged(role if role in ROLES else "invalid", answer.exit_code_of(result))
        return result

    def forget_sandbox(self, sandbox_id: str) -> None:
        """From the CRI proxy, before StopPodSandbox / RemovePodSandbox reach the runtime (the sandbox directory
        hears of it from the registry's `sandbox_event`)."""
        self._containers.forget_sandbox(sandbox_id)
        self._handlers.forget_sandbox(sandbox_id)

    # --- one call ----------------------------------------------------------------------------------------------

    async def _answer(self, request: cri_pb.ExecSyncRequest, traceparent: str | None) -> answer.Answer:
        try:
            container = await self._containers.resolve(request.container_id)
        except ContainerNotFound:
            return answer.FORWARD
        except RuntimeUnavailable as exc:
            return answer.StatusAnswer(grpc.StatusCode.UNAVAILABLE, str(exc))
        key = handler_key(request.container_id, request.cmd, request.timeout)
        handler = self._handlers.get(key, container)
        if handler is None:
            handler = self._derive(request, container)
            self._handlers.keep(key, handler)
        if handler.call is None:
            log.warning("bridged exec refused: %s", handler.refusal, extra=_log_fields(container))
            return answer.bad_arguments(handler.refusal)
        call = handler.call
        try:
            sandbox = await self._sandboxes.resolve_cached(container.sandbox_id)
        except HostNetworkSandbox as exc:
            return answer.host_network(str(exc))
        except (SandboxNotFound, SandboxNotReady, RuntimeUnavailable) as exc:
            return answer.cannot_probe(str(exc))
        if not handler.for_sandbox(sandbox):
            _derive_for_sandbox(handler, sandbox)
        budget_s = call.spec.timeout_ms / 1000 + ANSWER_GRACE_S
        try:
            if handler.run is None:  # made once, kept with the handler
                handler.run = run_once_request(handler.registration, max_tries=1, lifecycle_hook=call.is_hook)
            attempt = await self._supervisor.run_checked(handler.target, handler.run, budget_s, keep_warm=True)
        except TimeoutError:
            return answer.timed_out(budget_s)
        except WorkerUnavailable as exc:
            return answer.cannot_probe(str(exc))
        except WorkerRejected as exc:  # the worker's own rules: a sandbox it no longer serves
            return answer.bad_arguments(str(exc))
        self._record(handler, sandbox, attempt, traceparent)
        return answer.attempt_answer(attempt, hook=call.is_hook)

    def _derive(self, request: cri_pb.ExecSyncRequest, container: ContainerInfo) -> Handler:
        """What the command gives for this container: its call and registration, or its refusal."""
        try:
            call = parse_command(request.cmd, ports=container.ports, timeout_ms=self._timeout_ms(request),
                                 allow_host=self._allow_host)
        except BadArguments as exc:
            return Handler(container, None, refusal=str(exc))
        registration = worker_pb.ProbeRegistration(
            type=call.probe_type, spec=call.spec,
            container=worker_pb.ContainerRef(id=container.id, name=container.name, ports=container.ports),
        )
        return Handler(container, call, registration=registration)

    def _timeout_ms(self, request: cri_pb.ExecSyncRequest) -> int:
        """The kubelet sends the probe's timeoutSeconds, and 0 for hooks (pkg/kubelet/lifecycle passes no timeout)."""
        if len(request.cmd) > 1 and request.cmd[1] in HOOK_ROLES:
            return int(request.timeout) * 1000 if request.timeout > 0 else self._hook_timeout_ms
        return int(request.timeout or DEFAULT_PROBE_TIMEOUT_S) * 1000

    # --- visibility --------------------------------------------------------------------------------------------

    def _record(self, handler: Handler, sandbox: SandboxInfo, attempt: spec_pb.Attempt,
                traceparent: str | None) -> None:
        self._sandboxes.note(sandbox)
        row = handler.row  # the handler's own: the results manager copies what it keeps
        row.created_at = row.bridged.last_exec_at = time.time_ns()
        is_hook = handler.call.is_hook
        # prober_probe_total counts probes; hooks are counted by the bridge's own counter.
        self._results.bridged_attempt(row, attempt, traceparent, counts_as_probe=not is_hook,
                                      worker=self._supervisor.reported_status(sandbox.id))


def _derive_for_sandbox(handler: Handler, sandbox: SandboxInfo) -> None:
    """The worker target and the board row's fixed fields, for the handler in this sandbox."""
    call, container = handler.call, handler.container
    handler.sandbox = sandbox
    handler.target = SandboxTarget.of(sandbox)
    handler.row = service_pb.Probe(
        probe_id=row_id(sandbox.id, container.id, call.role), pod_sandbox_id=sandbox.id, container_id=container.id,
        container_name=container.name, type=spec_pb.PROBE_TYPE_UNSPECIFIED if call.is_hook else call.probe_type,
        spec=call.spec, labels=dict(container.labels), container_ports=container.ports,
        bridged=service_pb.BridgedHandler(role=call.role),
    )


def _log_fields(container: ContainerInfo) -> dict[str, str]:
    return {"container": container.id, "sandbox": container.sandbox_id, "pod": container.pod_name,
            "namespace": container.pod_namespace}
