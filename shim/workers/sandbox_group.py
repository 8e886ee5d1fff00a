"""One worker group: its sandboxes (members) and its worker's life, and each sandbox's place in that worker.

The group is its life's host (shim/workers/life.py `LifeHost`): when the worker runs, each sandbox is attached to
it (its netns assigned at the broker, AddSandbox, then its registrations replayed, each with its progress); when
the worker ends, none is. A sandbox that cannot be attached (its netns is gone) is FAILED alone and retried with
its own backoff; the group runs on. An adopted worker is taken over here: the events it queued come first, then
its Snapshot goes to the results, and then only what the registrations need is changed in it (adoption.py).

Each sandbox's view of the worker (`member_status`) is reported through `on_worker` whenever it changes; the
worker's events go to `on_event`, with their sandbox, in the order the worker sent them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from shim.workers.adoption import probe_plan
from shim.workers.connection import WorkerUnavailable
from shim.workers.life import WorkerLife
from shim.workers.records import Attachment, Member
from shim.workers.running_worker import RunningWorker
from shim.workers.settings import WorkerSettings
from shim.workers.zygote_handle import ZygoteError
from shim.workers.zygote_pool import Adoption, ZygotePool

log = logging.getLogger(__name__)

OnEvent = Callable[[str, worker_pb.WorkerEvent], None]
OnWorker = Callable[[str, service_pb.WorkerStatus], None]
ProgressOf = Callable[[str], "service_pb.ProbeStatus | None"]


@dataclass(frozen=True)
class Outlets:
    """Where the supervisor's reports go, and where a probe stands (the daemon's board)."""

    on_event: OnEvent
    on_worker: OnWorker
    progress_of: ProgressOf


class SandboxGroup:
    def __init__(self, name: str, tenancy: str, settings: WorkerSettings, zygotes: ZygotePool, outlets: Outlets,
                 adoption: Adoption | None = None) -> None:
        self.name, self.tenancy = name, tenancy
        self.members: dict[str, Member] = {}
        self._settings = settings
        self._outlets = outlets
        self.life = WorkerLife(name, tenancy, settings, zygotes, self, adoption)
        # Adopted from a zygote of another version (an upgrade): it keeps its sandboxes, takes no new one (those get
        # workers of the new code), and its next life, if any, is a worker of the new code.
        self.closed = adoption is not None and adoption.zygote is not zygotes.spawner

    @property
    def open(self) -> bool:
        """Whether a new sandbox may join it."""
        return not self.life.stopping and not self.closed

    # --- LifeHost ---------------------------------------------------------------------------------

    def worker_changed(self) -> None:
        for member in list(self.members.values()):
            self.report(member)

    def worker_event(self, event: worker_pb.WorkerEvent) -> None:
        kind = event.WhichOneof("msg")
        sandbox_id = event.attempt.sandbox_id if kind == "attempt" else event.state_change.sandbox_id
        member = self.members.get(sandbox_id)
        if member is None or not member.attached:
            return  # a sandbox that left the worker: its last events are stale
        try:
            self._outlets.on_event(sandbox_id, event)
        except Exception:
            log.exception("on_event callback failed", extra={"sandbox": sandbox_id})

    def worker_reattached(self, sandboxes: dict[str, int]) -> None:
        for sandbox_id, inode in sandboxes.items():
            member = self.members.get(sandbox_id)
            if member is not None:
                member.move(Attachment.RECONCILING, netns_inode=inode)

    async def take_over(self, worker: RunningWorker) -> None:
        """What the adopted worker runs (Snapshot) reaches the results first, then it is changed to run exactly
        the registrations, touching nothing else: sandboxes nobody needs leave, probes nobody registered stop,
        probes that differ (or are missing) are sent with their progress."""
        timeout_s = self._settings.request_timeout_s

        def take(reply: worker_pb.WorkerEvent) -> None:
            # At the reply's place among the worker's events: an attempt the worker made after the Snapshot
            # counts on top of its totals, not under them (it may be in the same read as the reply).
            ours = worker_pb.Snapshot(dropped_events=reply.snapshot.dropped_events)
            ours.probes.extend(p for p in reply.snapshot.probes if p.registration.sandbox_id in self.members)
            if ours.probes:
                self._outlets.on_event("", worker_pb.WorkerEvent(snapshot=ours))

        reply = await worker.request(timeout_s, on_reply=take, resume=worker_pb.Resume())
        snapshot = reply.snapshot
        if snapshot.dropped_events:
            log.warning("the worker dropped %d events while no daemon listened", snapshot.dropped_events,
                        extra={"group": self.name})
        for sandbox in snapshot.sandboxes:
            if sandbox.sandbox_id not in self.members:
                await worker.request(timeout_s, remove_sandbox=worker_pb.RemoveSandbox(sandbox_id=sandbox.sandbox_id))
                await worker.unassign(sandbox.sandbox_id)
        running: dict[str, dict[str, worker_pb.ProbeRegistration]] = {}
        for probe in snapshot.probes:
            running.setdefault(probe.registration.sandbox_id, {})[probe.registration.probe_id] = probe.registration
        for member in self.members.values():
            if member.attachment is not Attachment.RECONCILING:
                continue
            member.move(Attachment.ATTACHED, netns_inode=member.netns_inode)
            now = running.get(member.target.sandbox_id, {})
            plan = probe_plan(member.regs, now)
            for probe_id in plan.remove:
                worker.submit(expect_reply=False, remove_probe=worker_pb.RemoveProbe(
                    probe_id=probe_id, sandbox_id=member.target.sandbox_id))
            for probe_id, reg in member.regs.items():
                if not reg.container.started_at_unix_ns:  # the runtime's start unknown: the pin it runs with
                    reg.container.started_at_unix_ns = (now[probe_id].container.started_at_unix_ns
                                                        if probe_id in now else time.time_ns())
            for probe_id in plan.add:
                worker.submit(add_probe=worker_pb.AddProbe(probe=self.with_progress(member.regs[probe_id])))

    def worker_running(self) -> None:
        log.info("worker running", extra={"group": self.name, "pid": self.life.status.pid,
                                          "sandboxes": len(self.members), "restarts": self.life.status.restarts})
        for member in list(self.members.values()):
            if not member.attached:  # adopted ones are attached already
                self.start_attaching(member)

    def worker_ended(self) -> None:
        for member in self.members.values():
            member.move(Attachment.DETACHED)

    # --- the sandboxes ------------------------------------------------------------------------------

    def member_status(self, member: Member) -> service_pb.WorkerStatus:
        """The sandbox's view of its worker: the worker's state, narrowed by the sandbox's own attachment."""
        worker = self.life.status
        status = service_pb.WorkerStatus()
        status.CopyFrom(worker)
        status.netns_path, status.group = member.target.netns_path, self.name
        if worker.state == service_pb.WORKER_RUNNING:
            if member.attachment is Attachment.FAILED:
                status.state, status.last_error = service_pb.WORKER_FAILED, member.error
            elif not member.attached:
                status.state = service_pb.WORKER_STARTING
            else:
                status.netns_inode = member.netns_inode
        return status

    def report(self, member: Member, status: service_pb.WorkerStatus | None = None) -> None:
        status = status if status is not None else self.member_status(member)
        if status == member.status:
            return
        member.status = status
        if member.changed is not None:
            changed, member.changed = member.changed, asyncio.get_running_loop().create_future()
            changed.set_result(None)
        copy = service_pb.WorkerStatus()
        copy.CopyFrom(status)
        try:
            self._outlets.on_worker(member.target.sandbox_id, copy)
        except Exception:  # a broken callback must not take the supervision down
            log.exception("on_worker callback failed", extra={"sandbox": member.target.sandbox_id})

    def with_progress(self, reg: worker_pb.ProbeRegistration) -> worker_pb.ProbeRegistration:
        """The registration for a worker that does not run it yet, with where the probe stands (if it ran before:
        a restarted worker or daemon must not make it start over from the type's initial state)."""
        progress = self._outlets.progress_of(reg.probe_id)
        if progress is None:
            return reg
        out = worker_pb.ProbeRegistration()
        out.CopyFrom(reg)
        out.status.CopyFrom(progress)
        return out

    def start_attaching(self, member: Member, delay_s: float = 0.0, error: str = "") -> None:
        """Attaches the sandbox to the running worker (after delay_s; FAILED meanwhile, with `error`)."""
        if member.task is None or member.task.done() or member.task is asyncio.current_task():
            task = asyncio.create_task(self._attach(member, delay_s), name=f"attach {member.target.sandbox_id}")
            member.move(Attachment.FAILED if error else Attachment.ATTACHING, task=task, error=error)

    async def _attach(self, member: Member, delay_s: float = 0.0) -> None:
        """Assigns the sandbox's netns to the running worker at the broker, then AddSandbox and its probes."""
        if delay_s:
            await asyncio.sleep(delay_s)
        worker = self.life.running
        if worker is None or self.members.get(member.target.sandbox_id) is not member:
            return
        target = member.target
        timeout_s = self._settings.request_timeout_s
        began = asyncio.get_running_loop().time()
        try:
            assigned = await worker.assign(target.sandbox_id, target.netns_path, find_pod_ips=not target.pod_ips,
                                           timeout_s=timeout_s)
        except (ZygoteError, TimeoutError) as exc:
            if self.life.running is not worker:
                return  # the worker ended meanwhile: its next life attaches again
            error = str(exc) or "the broker did not answer"
            delay = member.backoff.next_delay(asyncio.get_running_loop().time() - began)
            log.warning("sandbox cannot be attached to its worker: %s; retrying in %.3gs", error, delay,
                        extra={"sandbox": target.sandbox_id, "group": self.name})
            self.start_attaching(member, delay, error)
            self.report(member)
            return
        pod_ips = list(target.pod_ips) or list(assigned.pod_ips)
        try:
            await worker.request(timeout_s, add_sandbox=worker_pb.AddSandbox(sandbox_id=target.sandbox_id,
                                                                           pod_ips=pod_ips))
        except (WorkerUnavailable, TimeoutError):
            return  # the watch of the worker sees why
        # Replayed synchronously with the switch to attached: an add_probe arriving meanwhile
        # either is in this snapshot or finds the sandbox attached and sends itself.
        replays = [(probe_id, worker.submit(add_probe=worker_pb.AddProbe(probe=self.with_progress(reg))))
                   for probe_id, reg in member.regs.items()]
        member.move(Attachment.ATTACHED, netns_inode=assigned.netns_inode)
        self.report(member)
        for probe_id, reply in replays:
            try:
                answer = await worker.reply(reply, timeout_s)
            except (WorkerUnavailable, TimeoutError):
                break  # the watch of the worker sees why
            if answer.WhichOneof("msg") == "rejected":
                log.error("worker rejected probe %s: %s", probe_id, "; ".join(answer.rejected.errors),
                          extra={"sandbox": target.sandbox_id})

    async def detach(self, member: Member) -> None:
        """Out of a worker that serves others: RemoveSandbox (its probes stop), then the broker takes its netns back."""
        worker = self.life.running
        if not member.attached or worker is None:
            return
        member.move(Attachment.DETACHED)
        try:
            await worker.request(self._settings.request_timeout_s, remove_sandbox=worker_pb.RemoveSandbox(
                sandbox_id=member.target.sandbox_id))
        except (WorkerUnavailable, TimeoutError):
            pass  # dead or hung: the broker forgets it with the worker
        await worker.unassign(member.target.sandbox_id)
