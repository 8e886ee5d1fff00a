"""One probe worker per sandbox: spawned through the zygote, watched, restarted, stopped.

The supervisor owns, per sandbox, the worker's life and the registrations it must
run, so that a restarted worker gets every probe back. A life is: spawn through the
zygote, wait for Ready (or Fatal), replay AddProbe for every registration, then
serve requests and forward events until the worker dies, hangs (no frame, heartbeats
included, for heartbeat_timeout_s) or is stopped. A crash or a hang is followed by a
restart after an exponential backoff (state BACKOFF; a worker that cannot start is
FAILED with the worker's message, and is retried the same way). Every state change
is reported through `on_worker`; attempts and state changes of probes go to
`on_event`, in the order the worker sent them.

A worker outlives its zygote: the zygote only forks. The daemon is a child
subreaper, so a worker whose zygote died becomes the daemon's own child; its death
is read from its pidfd (not from the zygote) and its exit status then from waitid.
A worker still dies with the daemon: the zygote kills its children when the
daemon's end of its socket closes, and every worker exits at EOF of its own socket.

Nothing here is unbounded: frames are read by one protocol per worker and handed to
`on_event` synchronously (no queue), requests wait with timeouts, and a worker that
stops reading its requests is treated as hung. That connection is worker_connection.py's;
the process (pidfd, exit status, adoption) is worker_process.py's; this module is the
supervision: lives, restarts, backoff, registrations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION, WORKER_GID, WORKER_UID
from probe_api.worker_protocol import validate_registration, validate_run_once
from shim.worker_connection import REQUEST_TIMEOUT_S, WorkerConnection, WorkerUnavailable
from shim.worker_process import EXIT_GRACE_S, WorkerProcess, set_child_subreaper
from shim.zygote import Zygote, ZygoteError

log = logging.getLogger("probe_shim.supervisor")

KILL_TIMEOUT_S = 5.0

# Worker states in which run_once stops waiting: it has a connection to use, or never will.
_RUN_ONCE_READY = frozenset({service_pb.WORKER_RUNNING, service_pb.WORKER_FAILED, service_pb.WORKER_NONE})

OnEvent = Callable[[str, worker_pb.WorkerEvent], None]
OnWorker = Callable[[str, service_pb.WorkerStatus], None]
ZygoteFactory = Callable[[], Awaitable[Zygote]]


@dataclass
class SandboxTarget:
    sandbox_id: str
    netns_path: str
    pod_ips: list[str] = field(default_factory=list)


class WorkerRejected(Exception):
    """The worker (or the same validation, run here first) refused a probe."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


class Backoff:
    """Exponential restart delays, back to the initial one after a life long enough."""

    def __init__(self, initial_s: float, max_s: float, reset_after_s: float) -> None:
        self.initial_s, self.max_s, self.reset_after_s = initial_s, max_s, reset_after_s
        self._next = initial_s

    def next_delay(self, lived_s: float) -> float:
        if lived_s >= self.reset_after_s:
            self._next = self.initial_s
        delay = self._next
        self._next = min(self.max_s, self._next * 2)
        return delay


# --- one sandbox ------------------------------------------------------------------------------

@dataclass
class _Sandbox:
    target: SandboxTarget
    status: service_pb.WorkerStatus
    stopping: asyncio.Future[None]
    changed: asyncio.Future[None]  # resolved (and replaced) at every status change
    regs: dict[str, worker_pb.ProbeRegistration] = field(default_factory=dict)
    conn: WorkerConnection | None = None  # set while RUNNING
    task: asyncio.Task[None] | None = None
    inflight: int = 0  # run_once calls: the worker must outlive them even with no probe
    pinned: bool = False  # ensure()d: kept with no probe until its last probe is removed
    kept_warm: bool = False  # the kubelet bridge probes here: kept until the sandbox stops


@dataclass
class _LifeEnd:
    reason: str
    fatal: bool = False  # the worker said it cannot start (FAILED rather than BACKOFF)


class WorkerSupervisor:
    def __init__(
        self,
        zygote_factory: ZygoteFactory,
        on_event: OnEvent,
        on_worker: OnWorker,
        *,
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
    ) -> None:
        self._zygote_factory = zygote_factory
        self._on_event = on_event
        self._on_worker = on_worker
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s, backoff_reset_after_s)
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._request_timeout_s = request_timeout_s
        self._config = worker_pb.WorkerConfig(
            user_agent_version=user_agent_version, run_as_uid=run_as_uid, run_as_gid=run_as_gid,
            max_memory_bytes=max_memory_bytes, max_open_files=max_open_files,
            heartbeat_interval_ms=heartbeat_interval_ms,
        )
        self._sandboxes: dict[str, _Sandbox] = {}
        self._zygote: Zygote | None = None
        self._zygote_lock = asyncio.Lock()
        self._zygote_backoff = Backoff(*self._backoff)
        self._zygote_started_at = 0.0
        self._zygote_restart: asyncio.Task[None] | None = None
        self._closing = False
        self._was_subreaper: int | None = None  # set while this supervisor adopts orphaned workers

    # --- API ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts the zygote now. The daemon calls this before it creates any grpc object."""
        await self._get_zygote()

    @property
    def zygote(self) -> Zygote | None:
        return self._zygote

    async def ensure(self, target: SandboxTarget) -> service_pb.WorkerStatus:
        """Starts the sandbox's worker if it has none; returns once it is RUNNING, or FAILED /
        BACKOFF (its probes are kept and replayed when a worker comes up)."""
        sb = self._sandbox(target)
        sb.pinned = True
        await self._wait_until(sb, lambda: sb.status.state != service_pb.WORKER_STARTING, None)
        return self.status(target.sandbox_id)

    async def add_probe(self, sandbox_id: str, reg: worker_pb.ProbeRegistration) -> None:
        """Adds or replaces a probe. Kept across restarts; refused with WorkerRejected."""
        errors = validate_registration(reg)  # the worker's own rules: refused even with no worker up
        if errors:
            raise WorkerRejected(errors)
        sb = self._sandboxes.get(sandbox_id)
        if sb is None:
            raise WorkerUnavailable(f"no worker for sandbox {sandbox_id}: ensure() it first")
        stored = worker_pb.ProbeRegistration()
        stored.CopyFrom(reg)
        if not stored.container.started_at_unix_ns:
            # Pinned now, so that a restarted worker counts the initial delay from the same instant.
            stored.container.started_at_unix_ns = time.time_ns()
        previous = sb.regs.get(reg.probe_id)
        sb.regs[reg.probe_id] = stored
        if sb.conn is None:
            return  # replayed when the worker is up
        try:
            reply = await sb.conn.request(self._request_timeout_s, add_probe=worker_pb.AddProbe(probe=stored))
        except (WorkerUnavailable, TimeoutError) as exc:
            # Dead, or hung (the watchdog will replace it): either way the next worker replays it.
            log.warning("probe %s kept for the next worker: %s", reg.probe_id, exc or "no answer",
                        extra={"sandbox": sandbox_id})
            return
        if reply.WhichOneof("msg") == "rejected":
            if previous is None:
                sb.regs.pop(reg.probe_id, None)
            else:
                sb.regs[reg.probe_id] = previous
            raise WorkerRejected(list(reply.rejected.errors))

    async def remove_probe(self, sandbox_id: str, probe_id: str) -> None:
        """Removes a probe; the worker is stopped when it was the last one (and no run_once runs)."""
        sb = self._sandboxes.get(sandbox_id)
        if sb is None or sb.regs.pop(probe_id, None) is None:
            return
        sb.pinned = bool(sb.regs)
        if sb.conn is not None:
            try:
                await sb.conn.request(self._request_timeout_s, remove_probe=worker_pb.RemoveProbe(probe_id=probe_id))
            except (WorkerUnavailable, TimeoutError):
                pass  # dead or hung: the next worker will not get it back
        await self._stop_if_idle(sb)

    async def run_once(self, target: SandboxTarget, reg: worker_pb.ProbeRegistration, timeout_s: float, *,
                       keep_warm: bool = False, max_tries: int = 0, lifecycle_hook: bool = False) -> spec_pb.Attempt:
        """One attempt now in the sandbox (spawning a worker for it if needed).

        keep_warm keeps the worker up after the attempt, even with no probe registered, until the sandbox stops:
        the kubelet bridge calls again every period, and a worker spawned per call would cost more than the
        attempt. max_tries and lifecycle_hook go to the worker's RunOnce as they are."""
        run = worker_pb.RunOnce(probe=reg, max_tries=max_tries, lifecycle_hook=lifecycle_hook)
        errors = validate_run_once(run)  # the worker's own rules: refused here without a round trip
        if errors:
            raise WorkerRejected(errors)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        sb = self._sandbox(target)
        sb.kept_warm = sb.kept_warm or keep_warm
        sb.inflight += 1
        try:
            if sb.status.state not in _RUN_ONCE_READY:  # a warm worker needs no wait, nor a task to wait in
                await self._wait_until(sb, lambda: sb.status.state in _RUN_ONCE_READY, deadline - loop.time())
            if sb.conn is None:
                raise WorkerUnavailable(self._unavailable(sb))
            reply = await sb.conn.request(max(0.0, deadline - loop.time()), run_once=run)
            if reply.WhichOneof("msg") == "rejected":
                raise WorkerRejected(list(reply.rejected.errors))
            return reply.attempt.attempt
        finally:
            sb.inflight -= 1
            await self._stop_if_idle(sb)

    async def stop_sandbox(self, sandbox_id: str) -> None:
        """Stops the worker (Shutdown, then a kill if it does not exit) and forgets its probes."""
        sb = self._sandboxes.pop(sandbox_id, None)
        if sb is None:
            return
        if not sb.stopping.done():
            sb.stopping.set_result(None)
        if sb.task is not None:
            await asyncio.shield(sb.task)
        self._set(sb, service_pb.WORKER_NONE, pid=0, started_at=0)

    def status(self, sandbox_id: str) -> service_pb.WorkerStatus:
        sb = self._sandboxes.get(sandbox_id)
        status = service_pb.WorkerStatus()
        if sb is not None:
            status.CopyFrom(sb.status)
        return status

    def sandbox_ids(self) -> list[str]:
        return list(self._sandboxes)

    async def close(self) -> None:
        """Stops every worker, then the zygote."""
        self._closing = True
        await asyncio.gather(*(self.stop_sandbox(sid) for sid in list(self._sandboxes)))
        if self._zygote_restart is not None:
            self._zygote_restart.cancel()
            await asyncio.gather(self._zygote_restart, return_exceptions=True)
        async with self._zygote_lock:
            if self._zygote is not None:
                await self._zygote.close()
        if self._was_subreaper is not None:
            set_child_subreaper(self._was_subreaper)
            self._was_subreaper = None

    # --- sandboxes ----------------------------------------------------------------------------

    def _sandbox(self, target: SandboxTarget) -> _Sandbox:
        sb = self._sandboxes.get(target.sandbox_id)
        if sb is not None:
            sb.target = target  # used from the next (re)start on
            return sb
        if self._closing:
            raise WorkerUnavailable("the supervisor is closing")
        loop = asyncio.get_running_loop()
        sb = _Sandbox(
            target=target,
            status=service_pb.WorkerStatus(state=service_pb.WORKER_STARTING, netns_path=target.netns_path),
            stopping=loop.create_future(),
            changed=loop.create_future(),
        )
        self._sandboxes[target.sandbox_id] = sb
        sb.task = asyncio.create_task(self._supervise(sb), name=f"worker {target.sandbox_id}")
        return sb

    async def _stop_if_idle(self, sb: _Sandbox) -> None:
        if not (sb.pinned or sb.kept_warm or sb.regs or sb.inflight) and self._sandboxes.get(sb.target.sandbox_id) is sb:
            await self.stop_sandbox(sb.target.sandbox_id)

    def _set(self, sb: _Sandbox, state: int, **fields) -> None:
        sb.status.state = state
        sb.status.netns_path = sb.target.netns_path
        for name, value in fields.items():
            setattr(sb.status, name, value)
        changed, sb.changed = sb.changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)
        status = service_pb.WorkerStatus()
        status.CopyFrom(sb.status)
        try:
            self._on_worker(sb.target.sandbox_id, status)
        except Exception:  # a broken callback must not take the supervision down
            log.exception("on_worker callback failed", extra={"sandbox": sb.target.sandbox_id})

    async def _wait_until(self, sb: _Sandbox, predicate: Callable[[], bool], timeout_s: float | None) -> None:
        async def wait() -> None:
            while not predicate():
                await asyncio.shield(sb.changed)

        await asyncio.wait_for(wait(), timeout_s)

    @staticmethod
    def _unavailable(sb: _Sandbox) -> str:
        state = service_pb.WorkerState.Name(sb.status.state)
        detail = f": {sb.status.last_error}" if sb.status.last_error else ""
        return f"no running worker for sandbox {sb.target.sandbox_id} ({state}{detail})"

    def _forward(self, sandbox_id: str, event: worker_pb.WorkerEvent) -> None:
        try:
            self._on_event(sandbox_id, event)
        except Exception:
            log.exception("on_event callback failed", extra={"sandbox": sandbox_id})

    # --- a worker's lives ------------------------------------------------------------------------

    async def _supervise(self, sb: _Sandbox) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(*self._backoff)
        sid = sb.target.sandbox_id
        while True:
            began = loop.time()
            try:
                end = await self._live(sb)
            except Exception as exc:  # a bug here must not leave the sandbox unsupervised
                log.exception("supervising the worker failed", extra={"sandbox": sid})
                end = _LifeEnd(f"internal error: {exc!r}")
            if sb.stopping.done():
                return
            delay = backoff.next_delay(loop.time() - began)
            state = service_pb.WORKER_FAILED if end.fatal else service_pb.WORKER_BACKOFF
            self._set(sb, state, pid=0, last_error=end.reason, restarts=sb.status.restarts + 1)
            log.warning("worker ended: %s; restarting in %.3gs", end.reason, delay,
                        extra={"sandbox": sid, "restarts": sb.status.restarts})
            await asyncio.wait([sb.stopping], timeout=delay)
            if sb.stopping.done():
                return

    async def _live(self, sb: _Sandbox) -> _LifeEnd:
        """One worker, from spawn to death; returns why it ended (stopping: returns at once)."""
        self._set(sb, service_pb.WORKER_STARTING, pid=0)
        config = worker_pb.WorkerConfig()
        config.CopyFrom(self._config)
        config.sandbox_id, config.netns_path = sb.target.sandbox_id, sb.target.netns_path
        config.pod_ips[:] = sb.target.pod_ips
        try:
            zygote = await self._get_zygote()
            worker = await zygote.spawn(config, self._start_timeout_s)
        except (ZygoteError, TimeoutError) as exc:
            return _LifeEnd(f"cannot spawn a worker: {exc or 'the zygote did not answer in time'}")
        proc = WorkerProcess(worker)
        conn = WorkerConnection(lambda event: self._forward(sb.target.sandbox_id, event))
        try:
            try:
                await asyncio.get_running_loop().create_unix_connection(lambda: conn, sock=worker.sock)
            except OSError as exc:
                worker.sock.close()
                return await self._bury(proc, conn, f"cannot watch the worker's socket: {exc}")
            return await self._serve(sb, proc, conn)
        finally:
            sb.conn = None
            conn.fail("stopped")
            proc.close()

    async def _serve(self, sb: _Sandbox, proc: WorkerProcess, conn: WorkerConnection) -> _LifeEnd:
        ended = {conn.lost, proc.gone, sb.stopping}
        done, _ = await asyncio.wait(ended | {conn.first}, timeout=self._start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if sb.stopping.done():
            return await self._shutdown(proc, conn)
        if not conn.first.done():
            reason = f"no Ready from the worker within {self._start_timeout_s:g}s" if not done else None
            return await self._bury(proc, conn, reason)
        first = conn.first.result()
        if first.WhichOneof("msg") == "fatal":
            await self._bury(proc, conn, first.fatal.message)
            return _LifeEnd(first.fatal.message, fatal=True)

        ready = first.ready
        if conn.lost.done():  # Ready, then gone at once
            return await self._bury(proc, conn, None)
        # Replayed synchronously with the switch to RUNNING: an add_probe arriving meanwhile
        # either is in this snapshot or finds the connection and sends itself.
        replays = [(probe_id, conn.submit(add_probe=worker_pb.AddProbe(probe=reg))) for probe_id, reg in sb.regs.items()]
        sb.conn = conn
        self._set(sb, service_pb.WORKER_RUNNING, pid=ready.pid, netns_inode=ready.netns_inode,
                  started_at=time.time_ns())
        log.info("worker running", extra={"sandbox": sb.target.sandbox_id, "pid": ready.pid,
                                          "probes": len(replays), "restarts": sb.status.restarts})
        for probe_id, reply in replays:
            try:
                answer = await conn.reply(reply, self._request_timeout_s)
            except (WorkerUnavailable, TimeoutError):
                break  # the watch below sees why
            if answer.WhichOneof("msg") == "rejected":
                log.error("restarted worker rejected probe %s: %s", probe_id, "; ".join(answer.rejected.errors),
                          extra={"sandbox": sb.target.sandbox_id})

        loop = asyncio.get_running_loop()
        tick = min(self._heartbeat_interval_s, self._heartbeat_timeout_s / 4)
        while True:
            await asyncio.wait(ended, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
            if sb.stopping.done():
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

    async def _bury(self, proc: WorkerProcess, conn: WorkerConnection, reason: str | None) -> _LifeEnd:
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
            return _LifeEnd(reason)
        return _LifeEnd(status or conn.lost.result())

    async def _shutdown(self, proc: WorkerProcess, conn: WorkerConnection) -> _LifeEnd:
        if conn.first.done() and not conn.lost.done():
            try:
                await conn.request(self._stop_timeout_s, shutdown=worker_pb.Shutdown())
            except (WorkerUnavailable, TimeoutError):
                pass
            await asyncio.wait([proc.gone], timeout=self._stop_timeout_s)
        return await self._bury(proc, conn, "stopped")

    # --- the zygote -------------------------------------------------------------------------------

    async def _get_zygote(self) -> Zygote:
        async with self._zygote_lock:
            if self._closing:
                raise ZygoteError("the supervisor is closing")
            if self._zygote is None or not self._zygote.alive:
                if self._was_subreaper is None:
                    # Before the first fork: a worker orphaned by a dead zygote must become our child
                    # (reaped here, with its exit status), not init's.
                    self._was_subreaper = set_child_subreaper(1)
                self._zygote = await self._zygote_factory()
                self._zygote_started_at = asyncio.get_running_loop().time()
                self._zygote.died.add_done_callback(self._on_zygote_died)
            return self._zygote

    def _on_zygote_died(self, died: asyncio.Future[str]) -> None:
        if self._closing or died.cancelled():
            return
        lived = asyncio.get_running_loop().time() - self._zygote_started_at
        delay = self._zygote_backoff.next_delay(lived)
        log.warning("%s; starting a new one in %.3gs", died.result(), delay)
        # Started ahead of demand, so that the next new sandbox does not wait for its imports.
        if self._zygote_restart is None or self._zygote_restart.done():
            self._zygote_restart = asyncio.create_task(self._restart_zygote(delay), name="zygote restart")

    async def _restart_zygote(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self._get_zygote()
        except ZygoteError as exc:
            log.error("zygote restart failed: %s", exc)
