"""The daemon's registrations: the one place that decides which probe runs where.

RunProbe and StopProbe land here from the API; the registry writes the store
first (an acknowledged probe survives a crash), then the status board, then tells
the supervisor. What the workers report goes to the results manager (results.py),
the supervisor's sink, never back here. Sandbox life comes from the CRI proxy
(`sandbox_event`) and from the periodic `reconcile`; what is known of a sandbox (its
resolution, identity, and whether the kubelet stopped it) is the daemon's one sandbox
directory (shim/sandboxes/directory.py), which the bridge and the results manager share.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.attempts import longest_attempt_ms
from probe_api.field_errors import FieldError
from probe_api.status import copy_status
from probe_api.validation import texts
from probe_api import request_rules as rules
from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import RuntimeUnavailable, SandboxInfo, SandboxNotFound, SandboxNotReady
from shim.state.results import ProbeLabels, ResultsManager
from shim.state.store import StoreUnavailable
from shim.workers.supervisor import SandboxTarget, WorkerRejected

log = logging.getLogger(__name__)

EXEC_GRACE_S = 5.0


class InvalidRequest(Exception):
    """str() is the errors as the answer's message shows them; `errors` are the same as data."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(rules.bounded(texts(errors))))
        self.errors = errors


class LimitExceeded(Exception):
    pass


def is_registered(probe: service_pb.Probe) -> bool:
    """A probe RunProbe registered, as opposed to a kubelet bridge row (shim/bridge/service.py): only these are
    stored, scheduled by a worker and counted against the limits."""
    return not probe.HasField("bridged")


def _registration(req: service_pb.RunProbeRequest, probe_id: str, created_at: int) -> service_pb.Probe:
    """The durable part of a probe: what RunProbe said, nothing observed."""
    return service_pb.Probe(
        probe_id=probe_id,
        pod_sandbox_id=req.pod_sandbox_id,
        container_id=req.container_id,
        container_name=req.container_name,
        type=req.type,
        spec=req.spec,
        labels=req.labels,
        container_started_at=req.container_started_at,
        container_ports=req.container_ports,
        created_at=created_at,
    )


def _with_observed(registration: service_pb.Probe, previous: service_pb.Probe | None,
                   with_revision: bool = False) -> service_pb.Probe:
    """A replaced probe of the same container keeps its status so far; a new container starts clean."""
    row = service_pb.Probe()
    row.CopyFrom(registration)
    if previous is not None:
        if with_revision:
            row.revision = previous.revision
        copy_status(previous.status, row.status)
    return row


def _with_stored_observations(registration: service_pb.Probe, observed: service_pb.Probe | None) -> service_pb.Probe:
    """The registration (the store's authority) with what was observed of it, if that is of the same container."""
    if observed is None or observed.container_id != registration.container_id:
        return registration
    return _with_observed(registration, observed, with_revision=True)


def _worker_registration(probe: service_pb.Probe, start_now: bool) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id=probe.probe_id,
        type=probe.type,
        spec=probe.spec,
        start_now=start_now,
        container=worker_pb.ContainerRef(
            id=probe.container_id or probe.container_name,
            name=probe.container_name,
            started_at_unix_ns=probe.container_started_at,
            ports=probe.container_ports,
        ),
    )


def _target(sandbox: SandboxInfo) -> SandboxTarget:
    return SandboxTarget.of(sandbox)


class ProbeRegistry:
    def __init__(self, *, config, sandboxes: SandboxDirectory, store, board, supervisor,
                 results: ResultsManager) -> None:
        self._config = config
        self._sandboxes = sandboxes  # shared with the bridge and the results manager
        self._store = store
        self._board = board
        self._supervisor = supervisor
        self._results = results
        self._lock = asyncio.Lock()  # registrations change one at a time

    # --- API -----------------------------------------------------------------------

    async def run_probe(self, req: service_pb.RunProbeRequest, traceparent: str | None = None) -> str:
        errors = rules.run_probe_errors(req, self._config.allow_host_field)
        if errors:
            raise InvalidRequest(errors)
        if rules.uses_host_field(req.spec):
            log.warning("probe uses the host field (allowed by config)",
                        extra={"sandbox": req.pod_sandbox_id, "container": rules.container_key(req)})
        sandbox = await self._sandboxes.resolve(req.pod_sandbox_id)
        async with self._lock:
            probe_id = rules.probe_id_for(sandbox.id, rules.container_key(req), req.type)
            existing = self._board.get(probe_id)
            if existing is None:
                self._check_limits(sandbox.id)
            probe = _registration(req, probe_id, existing.created_at if existing else time.time_ns())
            await self._store.run(self._store.save, probe)
            same_container = existing is not None and existing.container_id == probe.container_id
            self._board.put(_with_observed(probe, existing if same_container else None))
            self._sandboxes.note(sandbox)
            self._results.set_traceparent(probe_id, traceparent)
            await self._start(sandbox, [probe], start_now=True)
            self._results.show_worker(probe_id, self._supervisor.status(sandbox.id, as_reported=True),
                                      unchanged_too=True)
        log.info("probe registered", extra={"probe_id": probe_id, "sandbox": sandbox.id,
                                            "type": spec_pb.ProbeType.Name(req.type)})
        return probe_id

    async def stop_probe(self, req: service_pb.StopProbeRequest) -> list[str]:
        errors = rules.stop_probe_errors(req)
        if errors:
            raise InvalidRequest(errors)
        async with self._lock:
            if req.probe_id:
                ids = [req.probe_id] if self._board.get(req.probe_id) else []
            else:
                ids = [
                    p.probe_id for p in self._board.list(service_pb.ProbeFilter(pod_sandbox_id=req.pod_sandbox_id))
                    if not req.container_id or req.container_id in (p.container_id, p.container_name)
                ]
            await self._remove(ids)
        return ids

    async def exec_probe(self, req: service_pb.ExecProbeRequest, traceparent: str | None) -> service_pb.ExecProbeResponse:
        errors = rules.exec_probe_errors(req, self._config.allow_host_field)
        if errors:
            raise InvalidRequest(errors)
        sandbox = await self._sandboxes.resolve_cached(req.pod_sandbox_id)
        reg = worker_pb.ProbeRegistration(
            type=req.type or spec_pb.READINESS, spec=req.spec,
            container=worker_pb.ContainerRef(ports=req.container_ports),
        )
        if req.lifecycle_hook and not reg.spec.timeout_ms:
            reg.spec.timeout_ms = int(self._config.hook_timeout_s * 1000)  # the kubelet gives a hook none
        timeout_s = longest_attempt_ms(reg.spec) / 1000 + EXEC_GRACE_S
        attempt = await self._supervisor.run_once(_target(sandbox), reg, timeout_s, lifecycle_hook=req.lifecycle_hook)
        labels = ProbeLabels(probe_id="exec", probe_type=reg.type, sandbox_id=sandbox.id, pod_name=sandbox.name,
                             pod_namespace=sandbox.namespace, pod_uid=sandbox.uid)
        trace_id, span_id = self._results.exec_attempt(attempt, labels, req.spec, traceparent)
        return service_pb.ExecProbeResponse(
            attempt=attempt, trace_id=trace_id, span_id=span_id, worker=self._supervisor.status(sandbox.id)
        )

    async def list_sandboxes(self) -> list[service_pb.ProbeSandbox]:
        counts: dict[str, int] = {}
        for probe in self._board.list(service_pb.ProbeFilter()):
            counts[probe.pod_sandbox_id] = counts.get(probe.pod_sandbox_id, 0) + 1
        known = self._sandboxes.known()
        for info in await self._sandboxes.list():
            known.setdefault(info.id, info)
        for sid in self._sandboxes.host_network():
            known.setdefault(sid, SandboxInfo(id=sid, netns_path="", ready=False, host_network=True))
        out = []
        for sid in sorted(set(known) | set(counts)):
            info = known.get(sid, SandboxInfo(id=sid, netns_path="", ready=False))
            out.append(service_pb.ProbeSandbox(
                id=sid, name=info.name, namespace=info.namespace, uid=info.uid, netns_path=info.netns_path,
                pod_ips=info.pod_ips, probes=counts.get(sid, 0), worker=self._supervisor.status(sid),
                ready=info.ready, created_at=info.created_at, host_network=info.host_network,
            ))
        return out

    # --- sandbox life ----------------------------------------------------------------

    async def sandbox_event(self, kind: str, sandbox_id: str) -> None:
        """From the CRI proxy: StopPodSandbox stops the worker, RemovePodSandbox drops the probes."""
        log.info("sandbox %s seen on the CRI", kind, extra={"sandbox": sandbox_id})
        self._sandboxes.sandbox_stopping(sandbox_id, removed=kind == "remove")
        if kind == "remove":
            async with self._lock:
                await self._remove([p.probe_id for p in self._probes_of(sandbox_id)])
            self._sandboxes.forget(sandbox_id)
        else:
            await self._supervisor.stop_sandbox(sandbox_id)

    async def reconcile(self) -> None:
        """Drops probes of sandboxes that are gone; starts workers for restored ones still pending.

        A runtime that does not answer changes nothing: workers keep probing, no sandbox is dropped. A worker
        whose sandbox is gone is stopped at once (in embedded mode it may still hold the deleted netns and
        would probe on in it); its probes' last UPDATED says why before they are REMOVED. In embedded mode a
        netns deleted and added again under the same name is a new sandbox: the old one is gone."""
        sandbox_ids = {p.pod_sandbox_id for p in self._board.list(service_pb.ProbeFilter())}
        if not sandbox_ids:
            return
        try:
            gone = await self._sandboxes.gone({sid: self._worker_netns(sid) for sid in sandbox_ids})
        except RuntimeUnavailable as exc:
            log.warning("reconcile skipped: %s", exc)
            return
        running = set(self._supervisor.sandbox_ids())
        for sid in sorted(sandbox_ids):
            if sid in gone:
                await self._drop_gone_sandbox(sid, gone[sid])
            elif sid not in running and not self._sandboxes.is_stopped(sid) and self._registered_of(sid):
                await self._resume_sandbox(sid)

    def _worker_netns(self, sandbox_id: str) -> int:
        """The inode of the netns the sandbox's running worker is in; 0 when no worker runs."""
        worker = self._supervisor.status(sandbox_id)
        return worker.netns_inode if worker.state == service_pb.WORKER_RUNNING else 0

    def _say_why(self, sandbox_id: str, reason: str) -> None:
        """Shows on the sandbox's probes that no worker runs for them, and why."""
        for probe in self._probes_of(sandbox_id):
            worker = probe.status.worker
            worker.state, worker.pid, worker.last_error = service_pb.WORKER_NONE, 0, reason
            self._results.show_worker(probe.probe_id, worker, unchanged_too=True)

    async def _drop_gone_sandbox(self, sandbox_id: str, why: str) -> None:
        log.info("sandbox is gone; dropping its probes: %s", why, extra={"sandbox": sandbox_id})
        await self._supervisor.stop_sandbox(sandbox_id)
        async with self._lock:
            self._say_why(sandbox_id, f"sandbox gone: {why}")
            probe_ids = [p.probe_id for p in self._probes_of(sandbox_id)]
            try:
                await self._remove(probe_ids)
            except StoreUnavailable as exc:  # kept (stored and listed, worker stopped); retried next pass
                log.warning("cannot drop the probes of a gone sandbox yet: %s", exc, extra={"sandbox": sandbox_id})
                return
        self._sandboxes.forget(sandbox_id)

    async def restore(self) -> None:
        """After a (re)start: every acknowledged probe back on the board as the last daemon saw it (its status:
        no change without an attempt), and its worker started or adopted; the
        kubelet bridge's rows too, their sandboxes kept warm."""
        probes = await self._store.run(self._store.load_all)
        observed = await self._store.run(self._store.load_observed)
        for row in self._store.corrupt_rows:
            log.error("a stored probe cannot be read and is not restored: %s", row.reason, extra={"probe_id": row.probe_id})
        rows = [_with_stored_observations(p, observed.pop(p.probe_id, None)) for p in probes]
        bridged = [p for p in observed.values() if not is_registered(p)]
        self._board.restore(rows + bridged)
        for sid in sorted({p.pod_sandbox_id for p in probes}):
            await self._resume_sandbox(sid)
        for sid in sorted({p.pod_sandbox_id for p in bridged} - {p.pod_sandbox_id for p in probes}):
            await self._keep_bridge_warm(sid)
        log.info("restored %d probes and %d kubelet bridge rows", len(probes), len(bridged))

    async def _keep_bridge_warm(self, sandbox_id: str) -> None:
        """A sandbox the kubelet bridge probed: its worker stays (adopted if it runs), for the next ExecSync."""
        try:
            sandbox = await self._sandboxes.resolve(sandbox_id)
        except (SandboxNotFound, SandboxNotReady) as exc:
            await self._drop_gone_sandbox(sandbox_id, str(exc))
            return
        except RuntimeUnavailable:
            return  # the next ExecSync brings it back
        self._sandboxes.note(sandbox)
        self._supervisor.keep_warm(_target(sandbox))

    async def _resume_sandbox(self, sandbox_id: str) -> None:
        try:
            sandbox = await self._sandboxes.resolve(sandbox_id)
        except (SandboxNotFound, SandboxNotReady) as exc:
            await self._drop_gone_sandbox(sandbox_id, str(exc))
            return
        except RuntimeUnavailable as exc:
            # Not a verdict on the sandbox: kept, and resumed by the first reconcile pass the runtime answers.
            log.warning("cannot resume sandbox yet: %s", exc, extra={"sandbox": sandbox_id})
            self._say_why(sandbox_id, f"waiting for the runtime: {exc}")
            return
        if self._sandboxes.is_stopped(sandbox_id):
            return  # stopped while we asked the runtime: the runtime's READY was stale
        self._sandboxes.note(sandbox)
        # Jittered start, as the kubelet does after its own restart: no thundering herd.
        await self._start(sandbox, self._registered_of(sandbox_id), start_now=False)

    # --- internals ------------------------------------------------------------------------

    def _probes_of(self, sandbox_id: str) -> list[service_pb.Probe]:
        """Every row of the sandbox: registered probes and the kubelet bridge's handlers."""
        return self._board.list(service_pb.ProbeFilter(pod_sandbox_id=sandbox_id))

    def _registered_of(self, sandbox_id: str) -> list[service_pb.Probe]:
        """The sandbox's registered probes: the ones its worker runs on a schedule and the limits count."""
        return [p for p in self._probes_of(sandbox_id) if is_registered(p)]

    def _check_limits(self, sandbox_id: str) -> None:
        total = self._board.count(is_registered)
        if total >= self._config.max_probes_total:
            raise LimitExceeded(f"the daemon already runs {total} probes (max_probes_total)")
        in_sandbox = len(self._registered_of(sandbox_id))
        if in_sandbox >= self._config.max_probes_per_sandbox:
            raise LimitExceeded(f"sandbox {sandbox_id} already has {in_sandbox} probes (max_probes_per_sandbox)")

    async def _start(self, sandbox: SandboxInfo, probes: Iterable[service_pb.Probe], start_now: bool) -> None:
        await self._supervisor.ensure(_target(sandbox))
        for probe in probes:
            try:
                await self._supervisor.add_probe(sandbox.id, _worker_registration(probe, start_now))
            except WorkerRejected as exc:  # validated already: a worker of another version?
                log.error("worker rejected probe %s: %s", probe.probe_id, exc)

    async def _remove(self, probe_ids: list[str]) -> None:
        if not probe_ids:
            return
        await self._store.run(self._store.delete, probe_ids)
        for probe_id in probe_ids:
            probe = self._board.get(probe_id)
            if probe is None:
                continue
            self._board.remove(probe_id)
            self._results.probe_removed(probe)
            await self._supervisor.remove_probe(probe.pod_sandbox_id, probe_id)
        for sid in sorted(self._sandboxes.remembered()):
            if not self._probes_of(sid):  # nothing left to remember about a sandbox without probes
                self._sandboxes.forget(sid)
