"""Probe workers, each serving a group of sandboxes: spawned through the zygote, watched, restarted, stopped.

Which sandboxes share a worker is worker_groups.py's rule (one Kubernetes namespace per worker, at most
`sandboxes_per_worker` of them; a group of one in the strict mode). The supervisor owns the groups and, per
sandbox, the registrations its worker must run, so that a restarted worker gets every probe back, each with its
progress (where it stood: no state change without an attempt). A sandbox joins its group's running worker by an
assignment of its netns at the broker, AddSandbox and its registrations; one that cannot be attached (its netns is
gone) is FAILED alone and retried with its own backoff, its group runs on. A worker's lives (spawn, watch,
restart with backoff, adoption) are worker_lives.py's. Every state change is reported per sandbox through
`on_worker`; attempts and state changes of probes go to `on_event`, with their sandbox, in the order the worker
sent them.

The zygote is also the netns broker: a worker whose zygote died loses its probe sockets and ends, and is
restarted through the new zygote. The daemon is a child subreaper, so such a worker becomes the daemon's own
child; its death is read from its pidfd (not from the zygote) and its exit status then from waitid.

Handover (with a handover_dir): workers outlive the daemon. `hand_over()` detaches every worker and leaves the
zygotes running; a crashed daemon leaves them running too. The next daemon's `start()` finds them (zygote_pool.py),
makes a group per running worker that claims the worker's sandboxes, and once the registrations are back
(`finish_adoption()`) takes each worker over: a new socket through its broker, the events it queued, a Snapshot of
what it runs (whose progress goes to `on_event`), and only the changes the registrations need (adoption.py). A
worker that cannot be adopted, or is not needed, is stopped; a needed one is then replaced, its probes resumed
from `progress_of` (the daemon's board, itself restored from the store). Without a handover_dir a worker ends
with the daemon: the zygote kills its children when the daemon's end of its socket closes.

Nothing here is unbounded: frames are read by one protocol per worker and handed to
`on_event` synchronously (no queue), requests wait with timeouts, and a worker that
stops reading its requests is treated as hung. That connection is worker_connection.py's;
the process (pidfd, exit status) is worker_process.py's, the zygotes zygote_pool.py's; this
module is the supervision: groups, sandboxes, registrations, handover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION, WORKER_GID, WORKER_UID
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION, validate_registration, validate_run_once
from shim.workers.backoff import Backoff
from shim.workers.records import Group, Member, SandboxTarget, WorkerRejected
from shim.workers.connection import REQUEST_TIMEOUT_S, WorkerUnavailable
from shim.workers.lives import WorkerLives
from shim.workers.groups import (
    DEFAULT_SANDBOXES_PER_WORKER,
    POOLED,
    STRICT,
    GroupView,
    choose_group,
    new_group_name,
    worker_open_files,
)
from shim.workers.zygote_handle import Zygote, ZygoteError
from shim.workers.zygote_pool import ZygoteFactory, ZygotePool

__all__ = ["Backoff", "SandboxTarget", "WorkerRejected", "WorkerSupervisor", "WorkerUnavailable"]

log = logging.getLogger(__name__)

# Worker states in which run_once stops waiting: it has a connection to use, or never will.
_RUN_ONCE_READY = frozenset({service_pb.WORKER_RUNNING, service_pb.WORKER_FAILED, service_pb.WORKER_NONE})

OnEvent = Callable[[str, worker_pb.WorkerEvent], None]
OnWorker = Callable[[str, service_pb.WorkerStatus], None]
ProgressOf = Callable[[str], "service_pb.ProbeStatus | None"]
ADOPT_TIMEOUT_S = 10.0


class WorkerSupervisor(WorkerLives):
    def __init__(
        self,
        zygote_factory: ZygoteFactory,
        on_event: OnEvent,
        on_worker: OnWorker,
        *,
        isolation: str = POOLED,
        sandboxes_per_worker: int = DEFAULT_SANDBOXES_PER_WORKER,
        heartbeat_interval_ms: int = 1000,
        heartbeat_timeout_s: float = 5.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
        backoff_reset_after_s: float = 60.0,
        start_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        user_agent_version: str = KUBELET_VERSION,
        run_as_uid: int = WORKER_UID,
        run_as_gid: int = WORKER_GID,
        max_memory_bytes: int = 0,
        max_open_files: int = 0,
        handover_dir: str = "",
        progress_of: ProgressOf | None = None,
    ) -> None:
        """handover_dir: where zygotes wait for the next daemon (their workers outlive this one); "" for none.
        progress_of: where a probe stands (the daemon's board), for a worker that starts it again."""
        self._on_event = on_event
        self._on_worker = on_worker
        self._isolation = isolation
        self._capacity = 1 if isolation == STRICT else max(1, sandboxes_per_worker)
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s, backoff_reset_after_s)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._request_timeout_s = request_timeout_s
        self._config = worker_pb.WorkerConfig(
            user_agent_version=user_agent_version, run_as_uid=run_as_uid, run_as_gid=run_as_gid,
            max_memory_bytes=max_memory_bytes, max_open_files=max_open_files or worker_open_files(self._capacity),
            heartbeat_interval_ms=heartbeat_interval_ms, outlives_daemon=bool(handover_dir),
            protocol_version=WORKER_PROTOCOL_VERSION,
        )
        self._progress_of = progress_of or (lambda probe_id: None)
        self._members: dict[str, Member] = {}
        self._groups: dict[str, Group] = {}
        self._zygotes = ZygotePool(zygote_factory, self._backoff, handover_dir)
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
            # Shown as it runs (as the last daemon showed it): taking it over changes nothing a watcher sees.
            status = service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=adoption.worker.pid, group=name,
                                             restarts=config.restarts, started_at=adoption.worker.started_at_ns)
            group = Group(name=name, tenancy=config.tenancy, stopping=asyncio.get_running_loop().create_future(),
                          status=status, adoption=adoption, closed=adoption.zygote is not self._zygotes.spawner)
            self._groups[name] = group
        return len(adoptions)

    async def finish_adoption(self, timeout_s: float = ADOPT_TIMEOUT_S) -> int:
        """The registrations are back: every adopted worker some sandbox needs is taken over (returns once each is,
        or has failed, within timeout_s), and the others are stopped. Returns how many were taken over."""
        adopted = [g for g in self._groups.values() if g.adoption is not None]
        for group in adopted:
            if group.members:
                group.taken_over = asyncio.get_running_loop().create_future()
                group.task = asyncio.create_task(self._supervise(group), name=f"worker {group.name}")
            else:
                del self._groups[group.name]
                log.info("stopping a running worker no registration needs", extra={"group": group.name})
                group.task = asyncio.create_task(self._stop_unneeded(group), name=f"stop {group.name}")
        waits = [g.taken_over for g in adopted if g.taken_over is not None]
        waits += [g.task for g in adopted if not g.members and g.task is not None]
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)
        return sum(1 for g in adopted if g.taken_over is not None and g.taken_over.done() and g.conn is not None)

    @property
    def zygote(self) -> Zygote | None:
        return self._zygotes.spawner

    async def ensure(self, target: SandboxTarget) -> service_pb.WorkerStatus:
        """Has the sandbox served by a worker; returns once it is RUNNING, or FAILED / BACKOFF (its probes are
        kept and replayed when a worker serves it)."""
        member = self._member(target)
        member.pinned = True
        if member.group.adoption is not None and member.group.task is None:
            return self.status(target.sandbox_id)  # its running worker is taken over by finish_adoption()
        await self._wait_until(member, lambda: member.status.state != service_pb.WORKER_STARTING, None)
        return self.status(target.sandbox_id)

    async def add_probe(self, sandbox_id: str, reg: worker_pb.ProbeRegistration) -> None:
        """Adds or replaces a probe. Kept across restarts; refused with WorkerRejected."""
        errors = validate_registration(reg)  # the worker's own rules: refused even with no worker up
        if errors:
            raise WorkerRejected(errors)
        member = self._members.get(sandbox_id)
        if member is None:
            raise WorkerUnavailable(f"no worker for sandbox {sandbox_id}: ensure() it first")
        stored = worker_pb.ProbeRegistration()
        stored.CopyFrom(reg)
        stored.sandbox_id = sandbox_id
        if not stored.container.started_at_unix_ns and not member.reconciling:
            # Pinned now, so that a restarted worker counts the initial delay from the same instant. Not for a
            # worker being adopted: the one it runs is kept (and pinned already), or it is pinned when sent.
            stored.container.started_at_unix_ns = time.time_ns()
        previous = member.regs.get(reg.probe_id)
        member.regs[reg.probe_id] = stored
        conn = member.group.conn
        if conn is None or not member.attached or member.reconciling:
            return  # replayed when the sandbox is attached (or, adopted, if the worker does not run it already)
        try:
            # With its progress: a worker that does not run it yet (a restart) goes on from there.
            reply = await conn.request(self._request_timeout_s, add_probe=worker_pb.AddProbe(
                probe=self._with_progress(stored)))
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
        conn = member.group.conn
        if conn is not None and member.attached and not member.reconciling:
            try:
                await conn.request(self._request_timeout_s, remove_probe=worker_pb.RemoveProbe(
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
        run = worker_pb.RunOnce(probe=reg, max_tries=max_tries, lifecycle_hook=lifecycle_hook)
        errors = validate_run_once(run)  # the worker's own rules: refused here without a round trip
        if errors:
            raise WorkerRejected(errors)
        run.probe.sandbox_id = target.sandbox_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        member = self._member(target)
        member.kept_warm = member.kept_warm or keep_warm
        member.inflight += 1
        try:
            if member.status.state not in _RUN_ONCE_READY:  # a warm worker needs no wait, nor a task to wait in
                await self._wait_until(member, lambda: member.status.state in _RUN_ONCE_READY, deadline - loop.time())
            conn = member.group.conn
            if conn is None or not member.attached:
                raise WorkerUnavailable(self._unavailable(member))
            reply = await conn.request(max(0.0, deadline - loop.time()), run_once=run)
            if reply.WhichOneof("msg") == "rejected":
                raise WorkerRejected(list(reply.rejected.errors))
            return reply.attempt.attempt
        finally:
            member.inflight -= 1
            await self._stop_if_idle(member)

    async def stop_sandbox(self, sandbox_id: str) -> None:
        """Takes the sandbox out of its worker and forgets its probes; the worker stops with its last sandbox."""
        member = self._members.pop(sandbox_id, None)
        if member is None:
            return
        group = member.group
        if member.attaching is not None:
            member.attaching.cancel()
            await asyncio.gather(member.attaching, return_exceptions=True)
        group.members.pop(sandbox_id, None)
        if group.members:
            await self._detach(member)
        else:
            if self._groups.get(group.name) is group:
                del self._groups[group.name]  # now, before any wait: a new sandbox must not join a stopping worker
            if member.attached and group.zygote is not None:
                # Released before the runtime tears the netns down, not when the broker reaps the worker.
                await group.zygote.unassign(group.status.pid, sandbox_id)
            await self._stop_group(group)
        member.attached = False
        self._report(member, service_pb.WorkerStatus(state=service_pb.WORKER_NONE, netns_path=member.target.netns_path))

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

    def keep_warm(self, target: SandboxTarget) -> None:
        """Keeps the sandbox in a worker with no probe registered, until it stops (the kubelet bridge's)."""
        self._member(target).kept_warm = True

    def sandbox_ids(self) -> list[str]:
        return list(self._members)

    async def close(self) -> None:
        """Stops every worker, then the zygote."""
        self._closing = True
        for member in self._members.values():
            if member.attaching is not None:
                member.attaching.cancel()
        await asyncio.gather(*(self._stop_group(group) for group in list(self._groups.values())))
        for member in list(self._members.values()):
            self._report(member, service_pb.WorkerStatus(state=service_pb.WORKER_NONE,
                                                         netns_path=member.target.netns_path))
        self._members.clear()
        await self._zygotes.close()

    async def hand_over(self) -> None:
        """Leaves every worker running for the next daemon: each is told to keep its events from now on (Detach,
        so none is lost in between), then this daemon lets go of it and of the zygotes. Statuses are not
        reported: the probes go on. Without a handover_dir this is close()."""
        if not self._config.outlives_daemon:
            await self.close()
            return
        self._closing = True
        for member in self._members.values():
            if member.attaching is not None:
                member.attaching.cancel()
        running = [g for g in self._groups.values() if g.conn is not None]
        replies = await asyncio.gather(*(g.conn.request(self._stop_timeout_s, detach=worker_pb.Detach())
                                         for g in running), return_exceptions=True)
        for group, reply in zip(running, replies):
            if isinstance(reply, BaseException):
                log.warning("worker not detached (%s); it queues its events from the daemon's end on",
                            reply or "no answer", extra={"group": group.name})
        tasks = [g.task for g in self._groups.values() if g.task is not None]
        for task in tasks:
            task.cancel()  # a life's end lets go of its worker without a kill: only _bury kills
        await asyncio.gather(*tasks, return_exceptions=True)
        self._members.clear()
        self._groups.clear()
        await self._zygotes.hand_over()

    # --- sandboxes ----------------------------------------------------------------------------

    def _member(self, target: SandboxTarget) -> Member:
        member = self._members.get(target.sandbox_id)
        if member is not None:
            member.target = target  # used from the next attachment on
            return member
        if self._closing:
            raise WorkerUnavailable("the supervisor is closing")
        group = self._group_for(target)
        member = Member(target=target, group=group, backoff=Backoff(*self._backoff),
                        changed=asyncio.get_running_loop().create_future())
        if group.adoption is not None and target.sandbox_id in group.adoption.worker.sandboxes:
            # Its worker serves it already: attached as it is; its probes are reconciled when it is taken over.
            member.attached, member.reconciling = True, True
            member.netns_inode = group.adoption.worker.sandboxes[target.sandbox_id]
        self._members[target.sandbox_id] = member
        group.members[target.sandbox_id] = member
        self._report(member)
        if group.conn is not None:  # a running worker takes it now; otherwise at the worker's next start
            self._start_attaching(member)
        return member

    def _group_for(self, target: SandboxTarget) -> Group:
        for group in self._groups.values():
            if group.adoption is not None and target.sandbox_id in group.adoption.worker.sandboxes:
                return group  # the running worker that serves it already
        views = [GroupView(g.name, g.tenancy, len(g.members), open=not g.stopping.done() and not g.closed)
                 for g in self._groups.values()]
        name = choose_group(views, tenancy=target.tenancy, isolation=self._isolation, capacity=self._capacity)
        if name is not None:
            return self._groups[name]
        name = new_group_name(sandbox_id=target.sandbox_id, tenancy=target.tenancy, isolation=self._isolation,
                              taken=self._groups)
        loop = asyncio.get_running_loop()
        group = Group(name=name, tenancy=target.tenancy, stopping=loop.create_future(),
                       status=service_pb.WorkerStatus(state=service_pb.WORKER_STARTING))
        self._groups[name] = group
        group.task = asyncio.create_task(self._supervise(group), name=f"worker {name}")
        return group

    async def _stop_if_idle(self, member: Member) -> None:
        if not (member.pinned or member.kept_warm or member.regs or member.inflight) \
                and self._members.get(member.target.sandbox_id) is member:
            await self.stop_sandbox(member.target.sandbox_id)

    def _member_status(self, member: Member) -> service_pb.WorkerStatus:
        """The sandbox's view of its worker: the worker's state, narrowed by the sandbox's own attachment."""
        group = member.group
        status = service_pb.WorkerStatus()
        status.CopyFrom(group.status)
        status.netns_path, status.group = member.target.netns_path, group.name
        if group.status.state == service_pb.WORKER_RUNNING:
            if member.error:
                status.state, status.last_error = service_pb.WORKER_FAILED, member.error
            elif not member.attached:
                status.state = service_pb.WORKER_STARTING
            else:
                status.netns_inode = member.netns_inode
        return status

    def _report(self, member: Member, status: service_pb.WorkerStatus | None = None) -> None:
        status = status if status is not None else self._member_status(member)
        if status == member.status:
            return
        member.status = status
        if member.changed is not None:
            changed, member.changed = member.changed, asyncio.get_running_loop().create_future()
            changed.set_result(None)
        copy = service_pb.WorkerStatus()
        copy.CopyFrom(status)
        try:
            self._on_worker(member.target.sandbox_id, copy)
        except Exception:  # a broken callback must not take the supervision down
            log.exception("on_worker callback failed", extra={"sandbox": member.target.sandbox_id})

    def _set(self, group: Group, state: int, **fields) -> None:
        group.status.state = state
        for name, value in fields.items():
            setattr(group.status, name, value)
        for member in list(group.members.values()):
            self._report(member)

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

    def _with_progress(self, reg: worker_pb.ProbeRegistration) -> worker_pb.ProbeRegistration:
        """The registration for a worker that does not run it yet, with where the probe stands (if it ran before:
        a restarted worker or daemon must not make it start over from the type's initial state)."""
        progress = self._progress_of(reg.probe_id)
        if progress is None:
            return reg
        out = worker_pb.ProbeRegistration()
        out.CopyFrom(reg)
        out.status.CopyFrom(progress)
        return out

    def _forward(self, group: Group, event: worker_pb.WorkerEvent) -> None:
        kind = event.WhichOneof("msg")
        sandbox_id = event.attempt.sandbox_id if kind == "attempt" else event.state_change.sandbox_id
        member = group.members.get(sandbox_id)
        if member is None or not member.attached:
            return  # a sandbox that left the worker: its last events are stale
        try:
            self._on_event(sandbox_id, event)
        except Exception:
            log.exception("on_event callback failed", extra={"sandbox": sandbox_id})

    # --- a sandbox in its worker ----------------------------------------------------------------

    def _start_attaching(self, member: Member, delay_s: float = 0.0) -> None:
        if member.attaching is None or member.attaching.done():
            member.attaching = asyncio.create_task(self._attach(member, delay_s),
                                                   name=f"attach {member.target.sandbox_id}")

    async def _attach(self, member: Member, delay_s: float = 0.0) -> None:
        """Assigns the sandbox's netns to the running worker at the broker, then AddSandbox and its probes."""
        if delay_s:
            await asyncio.sleep(delay_s)
        group = member.group
        conn, zygote, pid = group.conn, group.zygote, group.status.pid
        if conn is None or zygote is None or self._members.get(member.target.sandbox_id) is not member:
            return
        target = member.target
        began = asyncio.get_running_loop().time()
        try:
            assigned = await zygote.assign(pid, target.sandbox_id, target.netns_path,
                                           find_pod_ips=not target.pod_ips, timeout_s=self._request_timeout_s)
        except (ZygoteError, TimeoutError) as exc:
            if group.conn is not conn:
                return  # the worker ended meanwhile: its next life attaches again
            member.error = str(exc) or "the broker did not answer"
            delay = member.backoff.next_delay(asyncio.get_running_loop().time() - began)
            log.warning("sandbox cannot be attached to its worker: %s; retrying in %.3gs", member.error, delay,
                        extra={"sandbox": target.sandbox_id, "group": group.name})
            self._report(member)
            member.attaching = None
            self._start_attaching(member, delay)
            return
        pod_ips = list(target.pod_ips) or list(assigned.pod_ips)
        try:
            await conn.request(self._request_timeout_s, add_sandbox=worker_pb.AddSandbox(
                sandbox_id=target.sandbox_id, pod_ips=pod_ips))
        except (WorkerUnavailable, TimeoutError):
            return  # the watch of the worker sees why
        # Replayed synchronously with the switch to attached: an add_probe arriving meanwhile
        # either is in this snapshot or finds the sandbox attached and sends itself.
        replays = [(probe_id, conn.submit(add_probe=worker_pb.AddProbe(probe=self._with_progress(reg))))
                   for probe_id, reg in member.regs.items()]
        member.attached, member.error, member.netns_inode = True, "", assigned.netns_inode
        self._report(member)
        for probe_id, reply in replays:
            try:
                answer = await conn.reply(reply, self._request_timeout_s)
            except (WorkerUnavailable, TimeoutError):
                break  # the watch of the worker sees why
            if answer.WhichOneof("msg") == "rejected":
                log.error("worker rejected probe %s: %s", probe_id, "; ".join(answer.rejected.errors),
                          extra={"sandbox": target.sandbox_id})

    async def _detach(self, member: Member) -> None:
        """Out of a worker that serves others: RemoveSandbox (its probes stop), then the broker takes its netns back."""
        group = member.group
        conn, zygote, pid = group.conn, group.zygote, group.status.pid
        if not member.attached or conn is None:
            return
        member.attached = False
        try:
            await conn.request(self._request_timeout_s, remove_sandbox=worker_pb.RemoveSandbox(
                sandbox_id=member.target.sandbox_id))
        except (WorkerUnavailable, TimeoutError):
            pass  # dead or hung: the broker forgets it with the worker
        if zygote is not None:
            await zygote.unassign(pid, member.target.sandbox_id)
