"""A worker's lives: spawn (or adoption), serving, death, restart with backoff (a mixin of WorkerSupervisor).

A life is: spawn through the zygote (or, for a worker an earlier daemon left running, a new socket to it through
its broker), wait for Ready (or Fatal), attach every sandbox of the group, then forward the worker's events and
watch it until it dies, hangs (no frame, heartbeats included, for heartbeat_timeout_s) or is stopped. A crash or a
hang is followed by a restart after an exponential backoff (BACKOFF; a worker that cannot start is FAILED with the
worker's message, and is retried the same way).

Taking over a running worker (`_take_over`): the events it queued while no daemon listened come first, then its
Snapshot goes to the results, and then only what the registrations need is changed in it (shim/workers/adoption.py).

The host class provides the groups, the zygote pool, the settings, `_set` (a group's status), `_forward` (an event
to the results), `_start_attaching` and `_with_progress` (shim/workers/supervisor.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from shim.workers.adoption import probe_plan
from shim.workers.backoff import Backoff
from shim.workers.records import Group
from shim.workers.connection import WorkerConnection, WorkerUnavailable
from shim.workers.process import EXIT_GRACE_S, WorkerProcess
from shim.workers.zygote_handle import SpawnedWorker, Zygote, ZygoteError
from shim.workers.zygote_pool import Adoption

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 5.0


@dataclass
class LifeEnd:
    reason: str
    fatal: bool = False  # the worker said it cannot start (FAILED rather than BACKOFF)


class WorkerLives:
    async def _stop_group(self, group: Group) -> None:
        if self._groups.get(group.name) is group:
            del self._groups[group.name]
        if not group.stopping.done():
            group.stopping.set_result(None)
        if group.task is not None:
            await asyncio.shield(group.task)

    async def _supervise(self, group: Group) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(*self._backoff)
        while True:
            began = loop.time()
            try:
                end = await self._live(group)
            except Exception as exc:  # a bug here must not leave the sandboxes unsupervised
                log.exception("supervising the worker failed", extra={"group": group.name})
                end = LifeEnd(f"internal error: {exc!r}")
            if group.stopping.done():
                return
            delay = backoff.next_delay(loop.time() - began)
            state = service_pb.WORKER_FAILED if end.fatal else service_pb.WORKER_BACKOFF
            self._set(group, state, pid=0, last_error=end.reason, restarts=group.status.restarts + 1)
            log.warning("worker ended: %s; restarting in %.3gs", end.reason, delay,
                        extra={"group": group.name, "restarts": group.status.restarts})
            await asyncio.wait([group.stopping], timeout=delay)
            if group.stopping.done():
                return

    async def _live(self, group: Group) -> LifeEnd:
        """One worker, from spawn (or adoption) to death; returns why it ended (stopping: returns at once)."""
        adoption, group.adoption = group.adoption, None
        if adoption is not None:  # shown RUNNING already: it is
            zygote = adoption.zygote
            worker = SpawnedWorker(pid=adoption.worker.pid, sock=None, pidfd=adoption.worker.pidfd,
                                   exited=adoption.worker.exited, started_at_ns=adoption.worker.started_at_ns)
        else:
            self._set(group, service_pb.WORKER_STARTING, pid=0)
            config = worker_pb.WorkerConfig()
            config.CopyFrom(self._config)
            config.group, config.tenancy, config.restarts = group.name, group.tenancy, group.status.restarts
            try:
                zygote = await self._zygotes.get()
                worker = await zygote.spawn(config, self._start_timeout_s)
            except (ZygoteError, TimeoutError) as exc:
                return LifeEnd(f"cannot spawn a worker: {exc or 'the zygote did not answer in time'}")
        proc = WorkerProcess(worker)
        conn = WorkerConnection(lambda event: self._forward(group, event))
        try:
            if adoption is not None:
                try:
                    worker.sock = await self._reattach(group, adoption)
                except (ZygoteError, TimeoutError) as exc:
                    return await self._bury(proc, conn, f"cannot adopt the running worker: {exc or 'no answer'}")
            try:
                await asyncio.get_running_loop().create_unix_connection(lambda: conn, sock=worker.sock)
            except OSError as exc:
                worker.sock.close()
                return await self._bury(proc, conn, f"cannot watch the worker's socket: {exc}")
            return await self._serve(group, zygote, proc, conn, adopted=adoption is not None)
        finally:
            if group.taken_over is not None and not group.taken_over.done():
                group.taken_over.set_result(None)  # it ended instead: the daemon need not wait for it
            group.conn = group.zygote = None
            for member in group.members.values():
                member.attached = member.reconciling = False
                if member.attaching is not None:
                    member.attaching.cancel()
            conn.fail("stopped")
            proc.close()
            self._zygotes.release(zygote, {g.zygote for g in self._groups.values()})

    async def _reattach(self, group: Group, adoption: Adoption) -> socket.socket:
        """A new socket to the adopted worker, passed on by its broker. Its sandboxes count as attached from now
        on: the events it queued while no daemon listened are theirs, and come first."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await adoption.zygote.reattach(adoption.worker.pid, theirs)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        for sandbox_id, inode in adoption.worker.sandboxes.items():
            member = group.members.get(sandbox_id)
            if member is not None:
                member.attached, member.reconciling, member.netns_inode = True, True, inode
        return ours

    async def _take_over(self, group: Group, zygote: Zygote, pid: int, conn: WorkerConnection) -> None:
        """An adopted worker: what it runs (Snapshot) reaches the results first, then it is changed to run
        exactly the registrations, touching nothing else: sandboxes nobody needs leave, probes nobody registered
        stop, probes that differ (or are missing) are sent with their progress."""
        def take(reply: worker_pb.WorkerEvent) -> None:
            # At the reply's place among the worker's events: an attempt the worker made after the Snapshot
            # counts on top of its totals, not under them (it may be in the same read as the reply).
            ours = worker_pb.Snapshot(dropped_events=reply.snapshot.dropped_events)
            ours.probes.extend(p for p in reply.snapshot.probes if p.registration.sandbox_id in group.members)
            if ours.probes:
                self._on_event("", worker_pb.WorkerEvent(snapshot=ours))

        reply = await conn.request(self._request_timeout_s, on_reply=take, resume=worker_pb.Resume())
        snapshot = reply.snapshot
        if snapshot.dropped_events:
            log.warning("the worker dropped %d events while no daemon listened", snapshot.dropped_events,
                        extra={"group": group.name})
        for sandbox in snapshot.sandboxes:
            if sandbox.sandbox_id not in group.members:
                await conn.request(self._request_timeout_s, remove_sandbox=worker_pb.RemoveSandbox(
                    sandbox_id=sandbox.sandbox_id))
                await zygote.unassign(pid, sandbox.sandbox_id)
        running: dict[str, dict[str, worker_pb.ProbeRegistration]] = {}
        for probe in snapshot.probes:
            running.setdefault(probe.registration.sandbox_id, {})[probe.registration.probe_id] = probe.registration
        for member in group.members.values():
            if not member.reconciling:
                continue
            member.reconciling = False
            now = running.get(member.target.sandbox_id, {})
            plan = probe_plan(member.regs, now)
            for probe_id in plan.remove:
                conn.submit(expect_reply=False, remove_probe=worker_pb.RemoveProbe(
                    probe_id=probe_id, sandbox_id=member.target.sandbox_id))
            for probe_id, reg in member.regs.items():
                if not reg.container.started_at_unix_ns:  # the runtime's start unknown: the pin it runs with
                    reg.container.started_at_unix_ns = (now[probe_id].container.started_at_unix_ns
                                                        if probe_id in now else time.time_ns())
            for probe_id in plan.add:
                conn.submit(add_probe=worker_pb.AddProbe(probe=self._with_progress(member.regs[probe_id])))

    async def _serve(self, group: Group, zygote: Zygote, proc: WorkerProcess, conn: WorkerConnection,
                     adopted: bool = False) -> LifeEnd:
        ended = {conn.lost, proc.gone, group.stopping}
        done, _ = await asyncio.wait(ended | {conn.first}, timeout=self._start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if group.stopping.done():
            return await self._shutdown(proc, conn)
        if not conn.first.done():
            reason = f"no Ready from the worker within {self._start_timeout_s:g}s" if not done else None
            return await self._bury(proc, conn, reason)
        first = conn.first.result()
        if first.WhichOneof("msg") == "fatal":
            await self._bury(proc, conn, first.fatal.message)
            return LifeEnd(first.fatal.message, fatal=True)

        ready = first.ready
        if conn.lost.done():  # Ready, then gone at once
            return await self._bury(proc, conn, None)
        if adopted:
            if ready.protocol_version != WORKER_PROTOCOL_VERSION:
                return await self._bury(proc, conn, f"the running worker speaks worker protocol "
                                                    f"{ready.protocol_version}, not {WORKER_PROTOCOL_VERSION}")
            try:
                await self._take_over(group, zygote, ready.pid, conn)
            except (WorkerUnavailable, TimeoutError) as exc:
                return await self._bury(proc, conn, f"cannot adopt the running worker: {exc or 'no snapshot'}")
        group.conn, group.zygote = conn, zygote
        if group.taken_over is not None and not group.taken_over.done():
            group.taken_over.set_result(None)
        # last_error stays: why the previous life ended is what an operator looking at restarts wants to know.
        self._set(group, service_pb.WORKER_RUNNING, pid=ready.pid,
                  started_at=proc.worker.started_at_ns or time.time_ns())
        log.info("worker running", extra={"group": group.name, "pid": ready.pid, "sandboxes": len(group.members),
                                          "restarts": group.status.restarts})
        for member in list(group.members.values()):
            member.error = ""
            if not member.attached:  # adopted ones are attached already
                self._start_attaching(member)

        loop = asyncio.get_running_loop()
        tick = min(self._heartbeat_interval_s, self._heartbeat_timeout_s / 4)
        while True:
            await asyncio.wait(ended, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
            if group.stopping.done():
                return await self._shutdown(proc, conn)
            if conn.lost.done() or proc.gone.done():
                return await self._bury(proc, conn, None)
            idle = loop.time() - conn.last_frame
            if idle >= self._heartbeat_timeout_s:
                return await self._bury(proc, conn, f"missed heartbeats for {self._heartbeat_timeout_s:g}s")
            if idle >= self._heartbeat_interval_s:
                try:  # only when quiet: the worker's own heartbeats usually make this unnecessary
                    conn.submit(expect_reply=False, heartbeat=worker_pb.Heartbeat(unix_ns=time.time_ns()))
                except WorkerUnavailable:
                    pass

    async def _bury(self, proc: WorkerProcess, conn: WorkerConnection, reason: str | None) -> LifeEnd:
        """Makes sure the worker is dead (and reaped); the reason is ours (a hang) or its exit status."""
        eof = conn.lost.done()  # the worker closed its end (or died) before we gave up on it
        conn.fail(reason or "worker died")
        if reason is None and eof and not proc.gone.done():
            # EOF usually means it is exiting: give it a moment to report the real status.
            await asyncio.wait([proc.gone], timeout=EXIT_GRACE_S)
        proc.kill()
        await asyncio.wait([proc.gone], timeout=KILL_TIMEOUT_S)
        status = await proc.exit_reason() if proc.gone.done() else None
        if reason is not None:
            return LifeEnd(reason)
        return LifeEnd(status or conn.lost.result())

    async def _shutdown(self, proc: WorkerProcess, conn: WorkerConnection) -> LifeEnd:
        if conn.first.done() and not conn.lost.done():
            try:
                await conn.request(self._stop_timeout_s, shutdown=worker_pb.Shutdown())
            except (WorkerUnavailable, TimeoutError):
                pass
            await asyncio.wait([proc.gone], timeout=self._stop_timeout_s)
        return await self._bury(proc, conn, "stopped")

    async def _stop_unneeded(self, group: Group) -> None:
        """An adopted worker no sandbox needs any more: killed (its broker forgets it when it is reaped)."""
        adoption = group.adoption
        proc = WorkerProcess(SpawnedWorker(pid=adoption.worker.pid, sock=None, pidfd=adoption.worker.pidfd,
                                           exited=adoption.worker.exited))
        proc.kill()
        await asyncio.wait([proc.gone], timeout=KILL_TIMEOUT_S)
        proc.close()
        self._zygotes.release(adoption.zygote, {g.zygote for g in self._groups.values()})
