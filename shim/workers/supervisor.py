"""Probe workers, each serving a group of sandboxes: spawned through the zygote, watched, restarted, stopped.

Which sandboxes share a worker is grouping.py's rule (one Kubernetes namespace per worker, at most
`sandboxes_per_worker` of them; a group of one in the strict mode). The supervisor owns the groups and, per
sandbox, the registrations its worker must run, so that a restarted worker gets every probe back, each with its
progress (where it stood: no state change without an attempt). A group (sandbox_group.py) attaches its sandboxes to its
worker and reports each one's status through `on_worker`; the worker's lives (spawn, watch, restart with backoff,
adoption) are life.py's, its process process.py's, its connection connection.py's, the zygotes zygote_pool.py's.

The zygote is also the netns broker: a worker whose zygote died loses its probe sockets and ends, and is
restarted through the new zygote. The daemon is a child subreaper, so such a worker becomes the daemon's own
child; its death is read from its pidfd (not from the zygote) and its exit status then from waitid.

Handover (settings.handover_dir): workers outlive the daemon. `hand_over()` detaches every worker and leaves the
zygotes running; a crashed daemon leaves them running too. The next daemon's `start()` finds them (zygote_pool.py),
makes a group per running worker that claims the worker's sandboxes, and once the registrations are back
(`finish_adoption()`) takes each worker over (sandbox_group.py). A worker that cannot be adopted, or is not needed, is
stopped; a needed one is then replaced, its probes resumed from `progress_of` (the daemon's board, itself restored
from the store). Without a handover_dir a worker ends with the daemon: the zygote kills its children when the
daemon's end of its socket closes.

Nothing here is unbounded: frames are read by one protocol per worker and handed to `on_event` synchronously (no
queue), requests wait with timeouts, and a worker that stops reading its requests is treated as hung.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from shim.workers.backoff import Backoff
from shim.workers.connection import WorkerUnavailable
from shim.workers.grouping import GroupView, choose_group, new_group_name
from shim.workers.records import Attachment, Member, SandboxTarget, WorkerRejected
from shim.workers.sandbox_group import OnEvent, OnWorker, Outlets, ProgressOf, SandboxGroup
from shim.workers.settings import WorkerSettings
from shim.workers.zygote_handle import Zygote
from shim.workers.zygote_pool import Adoption, ZygoteFactory, ZygotePool

__all__ = ["SandboxTarget", "WorkerRejected", "WorkerSettings", "WorkerSupervisor", "WorkerUnavailable",
           "run_once_request"]

log = logging.getLogger(__name__)

# Worker states in which run_once stops waiting: it has a connection to use, or never will.
_RUN_ONCE_READY = frozenset({service_pb.WORKER_RUNNING, service_pb.WORKER_FAILED, service_pb.WORKER_NONE})
ADOPT_TIMEOUT_S = 10.0
_NO_WORKER = service_pb.WorkerStatus()  # read-only


def run_once_request(reg: worker_pb.ProbeRegistration, *, max_tries: int = 0,
                     lifecycle_hook: bool = False) -> worker_pb.RunOnce:
    """The worker's RunOnce for one attempt of a spec validated at the API edge (probe_api/worker_protocol.py)."""
    return worker_pb.RunOnce(probe=reg, max_tries=max_tries, lifecycle_hook=lifecycle_hook)


class WorkerSupervisor:
    def __init__(self, zygote_factory: ZygoteFactory, on_event: OnEvent, on_worker: OnWorker,
                 settings: WorkerSettings = WorkerSettings(), *, progress_of: ProgressOf | None = None) -> None:
        """progress_of: where a probe stands (the daemon's board), for a worker that starts it again."""
        self._settings = settings
        self._outlets = Outlets(on_event, on_worker, progress_of or (lambda probe_id: None))
        self._members: dict[str, Member] = {}
        self._groups: dict[str, SandboxGroup] = {}
        self._zygotes = ZygotePool(zygote_factory, settings.backoff, settings.handover_dir)
        self._closing = False

    # --- API ------------------------------------------------------------------------------

    async def start(self, adopt: bool = True) -> int:
        """Starts (or finds) the zygote now, and with `adopt` finds the workers an earlier daemon left running:
        each becomes a group that claims its sandboxes, taken over by finish_adoption(). Returns how many.
        The daemon calls this before it creates any grpc object."""
        adoptions = await self._zygotes.start(adopt)
        for adoption in adoptions:
            config = adoption.worker.config
            name = config.group or f"adopted#{adoption.worker.pid}"
            self._groups[name] = self._new_group(name, config.tenancy, adoption)
        return len(adoptions)

    async def finish_adoption(self, timeout_s: float = ADOPT_TIMEOUT_S) -> int:
        """The registrations are back: every adopted worker some sandbox needs is taken over (returns once each is,
        or has failed, within timeout_s), and the others are stopped. Returns how many were taken over."""
        adopted = [g for g in self._groups.values() if g.life.adoption is not None and not g.life.started]
        waits: list[asyncio.Future] = []
        for group in adopted:
            if group.members:
                group.life.start()
                waits.append(group.life.taken_over)
            else:
                del self._groups[group.name]
                log.info("stopping a running worker no registration needs", extra={"group": group.name})
                waits.append(asyncio.create_task(group.life.discard(), name=f"stop {group.name}"))
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)
        return sum(1 for g in adopted if g.life.taken_over is not None and g.life.taken_over.done()
                   and g.life.running is not None)

    @property
    def zygote(self) -> Zygote | None:
        return self._zygotes.spawner

    async def ensure(self, target: SandboxTarget) -> service_pb.WorkerStatus:
        """Has the sandbox served by a worker; returns once it is RUNNING, or FAILED / BACKOFF (its probes are
        kept and replayed when a worker serves it)."""
        member = self._member(target)
        member.pinned = True
        if not member.group.life.started:
            return self.status(target.sandbox_id)  # its running worker is taken over by finish_adoption()
        await self._wait_until(member, lambda: member.status.state != service_pb.WORKER_STARTING, None)
        return self.status(target.sandbox_id)

    async def add_probe(self, sandbox_id: str, reg: worker_pb.ProbeRegistration) -> None:
        """Adds or replaces a probe whose spec was validated at the API edge. Kept across restarts; WorkerRejected
        if the worker refuses it (its own rules: the sandbox, the probe's id)."""
        member = self._members.get(sandbox_id)
        if member is None:
            raise WorkerUnavailable(f"no worker for sandbox {sandbox_id}: ensure() it first")
        stored = worker_pb.ProbeRegistration()
        stored.CopyFrom(reg)
        stored.sandbox_id = sandbox_id
        if not stored.container.started_at_unix_ns and member.attachment is not Attachment.RECONCILING:
            # Pinned now, so that a restarted worker counts the initial delay from the same instant. Not for a
            # worker being adopted: the one it runs is kept (and pinned already), or it is pinned when sent.
            stored.container.started_at_unix_ns = time.time_ns()
        previous = member.regs.get(reg.probe_id)
        member.regs[reg.probe_id] = stored
        worker = member.group.life.running
        if worker is None or member.attachment is not Attachment.ATTACHED:
            return  # replayed when the sandbox is attached (or, adopted, if the worker does not run it already)
        try:
            # With its progress: a worker that does not run it yet (a restart) goes on from there.
            reply = await worker.request(self._settings.request_timeout_s, add_probe=worker_pb.AddProbe(
                probe=member.group.with_progress(stored)))
        except (WorkerUnavailable, TimeoutError) as exc:
            # Dead, or hung (the watchdog will replace it): either way the next worker replays it.
            log.warning("probe %s kept for the next worker: %s", reg.probe_id, exc or "no answer",
                        extra={"sandbox": sandbox_id})
            return
        if reply.WhichOneof("msg") == "rejected":
            if previous is None:
                member.regs.pop(reg.probe_id, None)
            else:
                member.regs[reg.probe_id] = previous
            raise WorkerRejected(list(reply.rejected.errors))

    async def remove_probe(self, sandbox_id: str, probe_id: str) -> None:
        """Removes a probe; the sandbox leaves its worker when it was the last one (and no run_once runs)."""
        member = self._members.get(sandbox_id)
        if member is None or member.regs.pop(probe_id, None) is None:
            return
        member.pinned = bool(member.regs)
        worker = member.group.life.running
        if worker is not None and member.attachment is Attachment.ATTACHED:
            try:
                await worker.request(self._settings.request_timeout_s, remove_probe=worker_pb.RemoveProbe(
                    probe_id=probe_id, sandbox_id=sandbox_id))
            except (WorkerUnavailable, TimeoutError):
                pass  # dead or hung: the next worker will not get it back
        await self._stop_if_idle(member)

    async def run_once(self, target: SandboxTarget, reg: worker_pb.ProbeRegistration, timeout_s: float, *,
                       keep_warm: bool = False, max_tries: int = 0, lifecycle_hook: bool = False) -> spec_pb.Attempt:
        """One attempt now in the sandbox (having a worker serve it if none does).

        keep_warm keeps the sandbox in its worker after the attempt, even with no probe registered, until the
        sandbox stops: the kubelet bridge calls again every period, and attaching per call would cost more than
        the attempt. max_tries and lifecycle_hook go to the worker's RunOnce as they are."""
        run = run_once_request(reg, max_tries=max_tries, lifecycle_hook=lifecycle_hook)
        return await self.run_checked(target, run, timeout_s, keep_warm=keep_warm)

    async def run_checked(self, target: SandboxTarget, run: worker_pb.RunOnce, timeout_s: float, *,
                          keep_warm: bool = False) -> spec_pb.Attempt:
        """run_once for a RunOnce that `run_once_request` made: a caller that sends the same request every period
        (the kubelet bridge) makes it once and keeps it. `run` is sent as it is (its sandbox_id set here)."""
        run.probe.sandbox_id = target.sandbox_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        member = self._member(target)
        member.kept_warm = member.kept_warm or keep_warm
        member.inflight += 1
        try:
            if member.status.state not in _RUN_ONCE_READY:  # a warm worker needs no wait, nor a task to wait in
                await self._wait_until(member, lambda: member.status.state in _RUN_ONCE_READY, deadline - loop.time())
            worker = member.group.life.running
            if worker is None or not member.attached:
                raise WorkerUnavailable(self._unavailable(member))
            reply = await worker.request(max(0.0, deadline - loop.time()), run_once=run)
            if reply.WhichOneof("msg") == "rejected":
                raise WorkerRejected(list(reply.rejected.errors))
            return reply.attempt.status.last_attempt
        finally:
            member.inflight -= 1
            if self._idle(member):  # not awaited otherwise: a kept-warm sandbox's calls never stop it
                await self.stop_sandbox(member.target.sandbox_id)

    async def stop_sandbox(self, sandbox_id: str) -> None:
        """Takes the sandbox out of its worker and forgets its probes; the worker stops with its last sandbox."""
        member = self._members.pop(sandbox_id, None)
        if member is None:
            return
        group, life = member.group, member.group.life
        if member.task is not None:
            member.task.cancel()
            await asyncio.gather(member.task, return_exceptions=True)
        group.members.pop(sandbox_id, None)
        if group.members:
            await group.detach(member)
        else:
            if self._groups.get(group.name) is group:
                del self._groups[group.name]  # now, before any wait: a new sandbox must not join a stopping worker
            if member.attached and life.running is not None:
                # Released before the runtime tears the netns down, not when the broker reaps the worker.
                await life.running.unassign(sandbox_id)
            await life.stop()
        member.move(Attachment.DETACHED)
        group.report(member, service_pb.WorkerStatus(state=service_pb.WORKER_NONE,
                                                     netns_path=member.target.netns_path))

    def status(self, sandbox_id: str, *, as_reported: bool = False) -> service_pb.WorkerStatus:
        """The sandbox's worker status; as_reported: exactly as `on_worker` last reported it (what a status row
        holds), without the group's current size, which changes with every sandbox that joins or leaves."""
        member = self._members.get(sandbox_id)
        status = service_pb.WorkerStatus()
        if member is not None:
            status.CopyFrom(member.status)
            if not as_reported:
                status.group_sandboxes = len(member.group.members)
        return status

    def reported_status(self, sandbox_id: str) -> service_pb.WorkerStatus:
        """`status(sandbox_id, as_reported=True)` without the copy, for a caller that copies it anyway (a bridged
        row). Read-only: a member's status is replaced at each report, never changed in place."""
        member = self._members.get(sandbox_id)
        return member.status if member is not None else _NO_WORKER

    def keep_warm(self, target: SandboxTarget) -> None:
        """Keeps the sandbox in a worker with no probe registered, until it stops (the kubelet bridge's)."""
        self._member(target).kept_warm = True

    def sandbox_ids(self) -> list[str]:
        return list(self._members)

    async def close(self) -> None:
        """Stops every worker, then the zygote."""
        self._closing = True
        self._stop_attaching()
        await asyncio.gather(*(self._stop_group(group) for group in list(self._groups.values())))
        for member in list(self._members.values()):
            member.group.report(member, service_pb.WorkerStatus(state=service_pb.WORKER_NONE,
                                                                netns_path=member.target.netns_path))
        self._members.clear()
        await self._zygotes.close()

    async def hand_over(self) -> None:
        """Leaves every worker running for the next daemon: each is told to keep its events from now on (Detach,
        so none is lost in between), then this daemon lets go of it and of the zygotes. Statuses are not
        reported: the probes go on. Without a handover_dir this is close()."""
        if not self._settings.outlives_daemon:
            await self.close()
            return
        self._closing = True
        self._stop_attaching()
        running = [g for g in self._groups.values() if g.life.running is not None]
        replies = await asyncio.gather(*(g.life.running.request(self._settings.stop_timeout_s,
                                                                detach=worker_pb.Detach())
                                         for g in running), return_exceptions=True)
        for group, reply in zip(running, replies):
            if isinstance(reply, BaseException):
                log.warning("worker not detached (%s); it queues its events from the daemon's end on",
                            reply or "no answer", extra={"group": group.name})
        await asyncio.gather(*(g.life.let_go() for g in self._groups.values()))
        self._members.clear()
        self._groups.clear()
        await self._zygotes.hand_over()

    # --- groups and their sandboxes ----------------------------------------------------------------

    def _new_group(self, name: str, tenancy: str, adoption: Adoption | None = None) -> SandboxGroup:
        return SandboxGroup(name, tenancy, self._settings, self._zygotes, self._outlets, adoption)

    def _member(self, target: SandboxTarget) -> Member:
        member = self._members.get(target.sandbox_id)
        if member is not None:
            member.target = target  # used from the next attachment on
            return member
        if self._closing:
            raise WorkerUnavailable("the supervisor is closing")
        group = self._group_for(target)
        member = Member(target=target, group=group, backoff=Backoff(self._settings.backoff),
                        changed=asyncio.get_running_loop().create_future())
        adoption = group.life.adoption
        if adoption is not None and target.sandbox_id in adoption.worker.sandboxes:
            # Its worker serves it already: attached as it is; its probes are reconciled when it is taken over.
            member.move(Attachment.RECONCILING, netns_inode=adoption.worker.sandboxes[target.sandbox_id])
        self._members[target.sandbox_id] = member
        group.members[target.sandbox_id] = member
        group.report(member)
        if group.life.running is not None:  # a running worker takes it now; otherwise at the worker's next start
            group.start_attaching(member)
        return member

    def _group_for(self, target: SandboxTarget) -> SandboxGroup:
        for group in self._groups.values():
            adoption = group.life.adoption
            if adoption is not None and target.sandbox_id in adoption.worker.sandboxes:
                return group  # the running worker that serves it already
        views = [GroupView(g.name, g.tenancy, len(g.members), open=g.open) for g in self._groups.values()]
        settings = self._settings
        name = choose_group(views, tenancy=target.tenancy, isolation=settings.isolation, capacity=settings.capacity)
        if name is not None:
            return self._groups[name]
        name = new_group_name(sandbox_id=target.sandbox_id, tenancy=target.tenancy, isolation=settings.isolation,
                              taken=self._groups)
        group = self._groups[name] = self._new_group(name, target.tenancy)
        group.life.start()
        return group

    async def _stop_group(self, group: SandboxGroup) -> None:
        if self._groups.get(group.name) is group:
            del self._groups[group.name]
        await group.life.stop()

    def _stop_attaching(self) -> None:
        for member in self._members.values():
            if member.task is not None:
                member.task.cancel()

    def _idle(self, member: Member) -> bool:
        """Nothing keeps the sandbox in a worker any more (and it is still this member's)."""
        return not (member.pinned or member.kept_warm or member.regs or member.inflight) \
            and self._members.get(member.target.sandbox_id) is member

    async def _stop_if_idle(self, member: Member) -> None:
        if self._idle(member):
            await self.stop_sandbox(member.target.sandbox_id)

    async def _wait_until(self, member: Member, predicate: Callable[[], bool], timeout_s: float | None) -> None:
        async def wait() -> None:
            while not predicate():
                await asyncio.shield(member.changed)

        await asyncio.wait_for(wait(), timeout_s)

    @staticmethod
    def _unavailable(member: Member) -> str:
        state = service_pb.WorkerState.Name(member.status.state)
        detail = f": {member.status.last_error}" if member.status.last_error else ""
        return f"no running worker for sandbox {member.target.sandbox_id} ({state}{detail})"
