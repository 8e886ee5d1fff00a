"""One worker group's worker, life after life: spawn (or adoption), serving, death, restart with backoff.

A life is: spawn through the zygote (or, for a worker an earlier daemon left running, a new socket to it through
its broker), wait for Ready (or Fatal), then forward the worker's events and watch it until it dies, hangs (no
frame, heartbeats included, for heartbeat_timeout_s) or is stopped. A crash or a hang is followed by a restart
after an exponential backoff (BACKOFF; a worker that cannot start is FAILED with the worker's message, and is
retried the same way). Only this group pauses: its sandboxes wait, every other group runs on.

`WorkerLife` owns the process (shim/workers/process.py), the connection (shim/workers/connection.py), the
backoff and the worker's status; it knows nothing of sandboxes or probes. Those are its host's
(shim/workers/sandbox_group.py), which it calls at each step of a life (`LifeHost`: six calls). The supervisor only
starts it, stops it, lets go of it (a handover) or discards an adopted worker nobody needs, as the kubelet's
prober manager (prober_manager.go) does its workers (worker.go). Whoever asks something of the worker (its host
and the supervisor) does so through `running` (running_worker.py), the door a life opens while its worker runs:
the connection and the zygote stay the life's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass
from typing import Protocol

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from shim.workers.backoff import Backoff
from shim.workers.connection import WorkerConnection, WorkerUnavailable
from shim.workers.process import EXIT_GRACE_S, WorkerProcess
from shim.workers.running_worker import RunningWorker
from shim.workers.settings import WorkerSettings
from shim.workers.zygote_handle import SpawnedWorker, Zygote, ZygoteError
from shim.workers.zygote_pool import Adoption, ZygotePool

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 5.0


class LifeHost(Protocol):
    """The group's side of a life, called in this order within one life (each at most once but the first two)."""

    def worker_changed(self) -> None:
        """The worker's status (`life.status`) changed: every sandbox is reported."""

    def worker_event(self, event: worker_pb.WorkerEvent) -> None:
        """An attempt or a state change, in the order the worker sent them."""

    def worker_reattached(self, sandboxes: dict[str, int]) -> None:
        """An adopted worker serves these sandboxes (id -> netns inode) already: the events it queued while no
        daemon listened, which come first, are theirs."""

    async def take_over(self, worker: RunningWorker) -> None:
        """An adopted worker is Ready: what it runs is made what the registrations say (before it counts as
        running, so `worker` is not `life.running` yet). WorkerUnavailable or TimeoutError: it cannot be adopted."""

    def worker_running(self) -> None:
        """The worker is RUNNING (`life.running`): the sandboxes are attached to it."""

    def worker_ended(self) -> None:
        """The worker is gone, or let go: no sandbox is attached to it any more."""


@dataclass
class LifeEnd:
    reason: str
    fatal: bool = False  # the worker said it cannot start (FAILED rather than BACKOFF)


class WorkerLife:
    """A group's worker, restarted until stopped. `status` is the worker's; `running` is the door to it while it
    is RUNNING (None otherwise)."""

    def __init__(self, name: str, tenancy: str, settings: WorkerSettings, zygotes: ZygotePool, host: LifeHost,
                 adoption: Adoption | None = None) -> None:
        self.name, self.tenancy = name, tenancy
        self._settings = settings
        self._zygotes = zygotes
        self._host = host
        self._adoption = adoption  # an earlier daemon's worker, taken over by the first life
        self._backoff = Backoff(settings.backoff)
        self._stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._let_go = False
        self.taken_over: asyncio.Future[None] | None = None  # adopted: done once taken over, or the life ended
        self.running: RunningWorker | None = None
        if adoption is None:
            self.status = service_pb.WorkerStatus(state=service_pb.WORKER_STARTING)
        else:  # shown as it runs (as the last daemon showed it): taking it over changes nothing a watcher sees
            self.status = service_pb.WorkerStatus(
                state=service_pb.WORKER_RUNNING, pid=adoption.worker.pid, group=name,
                restarts=adoption.worker.config.restarts, started_at=adoption.worker.started_at_ns)

    @property
    def adoption(self) -> Adoption | None:
        """The running worker the first life takes over, until it starts."""
        return self._adoption

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def stopping(self) -> bool:
        return self._stopping.done()

    def start(self) -> None:
        if self._adoption is not None:
            self.taken_over = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._supervise(), name=f"worker {self.name}")

    async def stop(self) -> None:
        """Stops the worker (Shutdown, then a kill) and ends the lives; returns once it is gone."""
        if not self._stopping.done():
            self._stopping.set_result(None)
        if self._task is not None:
            await asyncio.shield(self._task)

    async def let_go(self) -> None:
        """Ends the lives without stopping the worker (a handover): only a death or a hang kills it."""
        self._let_go = True  # the zygote an adopted worker came from is the next daemon's too
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def discard(self) -> None:
        """An adopted worker no sandbox needs (never started): killed (its broker forgets it when it is reaped)."""
        adoption, self._adoption = self._adoption, None
        proc = WorkerProcess(SpawnedWorker(pid=adoption.worker.pid, sock=None, pidfd=adoption.worker.pidfd,
                                           exited=adoption.worker.exited))
        proc.kill()
        await asyncio.wait([proc.gone], timeout=KILL_TIMEOUT_S)
        proc.close()
        self._zygotes.release(adoption.zygote)

    # --- lives -----------------------------------------------------------------------------------

    def _set(self, state: int, **fields) -> None:
        self.status.state = state
        for name, value in fields.items():
            setattr(self.status, name, value)
        self._host.worker_changed()

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                end = await self._live()
            except Exception as exc:  # a bug here must not leave the sandboxes unsupervised
                log.exception("supervising the worker failed", extra={"group": self.name})
                end = LifeEnd(f"internal error: {exc!r}")
            if self._stopping.done():
                return
            delay = self._backoff.next_delay(loop.time() - began)
            state = service_pb.WORKER_FAILED if end.fatal else service_pb.WORKER_BACKOFF
            self._set(state, pid=0, last_error=end.reason, restarts=self.status.restarts + 1)
            log.warning("worker ended: %s; restarting in %.3gs", end.reason, delay,
                        extra={"group": self.name, "restarts": self.status.restarts})
            await asyncio.wait([self._stopping], timeout=delay)
            if self._stopping.done():
                return

    async def _live(self) -> LifeEnd:
        """One worker, from spawn (or adoption) to death; returns why it ended (stopping: returns at once)."""
        adoption, self._adoption = self._adoption, None
        if adoption is not None:  # shown RUNNING already: it is
            zygote = adoption.zygote
            worker = SpawnedWorker(pid=adoption.worker.pid, sock=None, pidfd=adoption.worker.pidfd,
                                   exited=adoption.worker.exited, started_at_ns=adoption.worker.started_at_ns)
        else:
            self._set(service_pb.WORKER_STARTING, pid=0)
            config = self._settings.worker_config(group=self.name, tenancy=self.tenancy,
                                                  restarts=self.status.restarts)
            try:
                zygote = await self._zygotes.get()
                worker = await zygote.spawn(config, self._settings.start_timeout_s)
            except (ZygoteError, TimeoutError) as exc:
                return LifeEnd(f"cannot spawn a worker: {exc or 'the zygote did not answer in time'}")
        proc = WorkerProcess(worker)
        conn = WorkerConnection(self._host.worker_event)
        try:
            if adoption is not None:
                try:
                    worker.sock = await self._reattach(adoption)
                except (ZygoteError, TimeoutError) as exc:
                    return await self._bury(proc, conn, f"cannot adopt the running worker: {exc or 'no answer'}")
            try:
                await asyncio.get_running_loop().create_unix_connection(lambda: conn, sock=worker.sock)
            except OSError as exc:
                worker.sock.close()
                return await self._bury(proc, conn, f"cannot watch the worker's socket: {exc}")
            return await self._serve(zygote, proc, conn, adopted=adoption is not None)
        finally:
            if self.taken_over is not None and not self.taken_over.done():
                self.taken_over.set_result(None)  # it ended instead: the daemon need not wait for it
            self.running = None
            self._host.worker_ended()
            conn.fail("stopped")
            proc.close()
            if adoption is not None and not self._let_go:
                self._zygotes.release(adoption.zygote)

    async def _reattach(self, adoption: Adoption) -> socket.socket:
        """A new socket to the adopted worker, passed on by its broker."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await adoption.zygote.reattach(adoption.worker.pid, theirs)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._host.worker_reattached(adoption.worker.sandboxes)
        return ours

    async def _serve(self, zygote: Zygote, proc: WorkerProcess, conn: WorkerConnection,
                     adopted: bool = False) -> LifeEnd:
        settings = self._settings
        ended = {conn.lost, proc.gone, self._stopping}
        done, _ = await asyncio.wait(ended | {conn.first}, timeout=settings.start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if self._stopping.done():
            return await self._shutdown(proc, conn)
        if not conn.first.done():
            reason = f"no Ready from the worker within {settings.start_timeout_s:g}s" if not done else None
            return await self._bury(proc, conn, reason)
        first = conn.first.result()
        if first.WhichOneof("msg") == "fatal":
            await self._bury(proc, conn, first.fatal.message)
            return LifeEnd(first.fatal.message, fatal=True)

        ready = first.ready
        if conn.lost.done():  # Ready, then gone at once
            return await self._bury(proc, conn, None)
        worker = RunningWorker(ready.pid, conn, zygote)
        if adopted:
            if ready.protocol_version != WORKER_PROTOCOL_VERSION:
                return await self._bury(proc, conn, f"the running worker speaks worker protocol "
                                                    f"{ready.protocol_version}, not {WORKER_PROTOCOL_VERSION}")
            try:
                await self._host.take_over(worker)
            except (WorkerUnavailable, TimeoutError) as exc:
                return await self._bury(proc, conn, f"cannot adopt the running worker: {exc or 'no snapshot'}")
        self.running = worker
        if self.taken_over is not None and not self.taken_over.done():
            self.taken_over.set_result(None)
        # last_error stays: why the previous life ended is what an operator looking at restarts wants to know.
        self._set(service_pb.WORKER_RUNNING, pid=ready.pid, started_at=proc.worker.started_at_ns or time.time_ns())
        self._host.worker_running()

        loop = asyncio.get_running_loop()
        interval_s, timeout_s = settings.heartbeat_interval_ms / 1000, settings.heartbeat_timeout_s
        tick = min(interval_s, timeout_s / 4)
        while True:
            await asyncio.wait(ended, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
            if self._stopping.done():
                return await self._shutdown(proc, conn)
            if conn.lost.done() or proc.gone.done():
                return await self._bury(proc, conn, None)
            idle = loop.time() - conn.last_frame
            if idle >= timeout_s:
                return await self._bury(proc, conn, f"missed heartbeats for {timeout_s:g}s")
            if idle >= interval_s:
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
                await conn.request(self._settings.stop_timeout_s, shutdown=worker_pb.Shutdown())
            except (WorkerUnavailable, TimeoutError):
                pass
            await asyncio.wait([proc.gone], timeout=self._settings.stop_timeout_s)
        return await self._bury(proc, conn, "stopped")
