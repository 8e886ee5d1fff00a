"""The daemon's handle on the worker zygote (the zygote program itself is probe_zygote/main.py).

The daemon starts the zygote first, with `python -m probe_zygote.main --fd N`, and talks to it over a
SOCK_SEQPACKET socketpair (cri_proto/zygote.proto): one message per packet, so the descriptors passed with
SCM_RIGHTS stay attached to their message. `Zygote` (asyncio) starts the process, spawns workers, assigns them
sandboxes (the zygote is their netns broker), resolves each worker's `exited` future and notices the zygote's own
death. The rules both ends share (packet size, protocol version, handover sockets, WorkerExit) are
probe_api/zygote_protocol.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.defaults import HANDOVER_TIMEOUT_S
from probe_api.zygote_protocol import (
    MAX_PACKET,
    WorkerExit,
    unix_address,
)

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
SPAWN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


# --- the daemon side ----------------------------------------------------------------------

class ZygoteError(Exception):
    """The zygote could not start, died, or refused a spawn."""


@dataclass
class SpawnedWorker:
    """A forked worker: the daemon's end of its socketpair, a pidfd, and its exit."""

    pid: int
    sock: socket.socket | None
    pidfd: int | None
    exited: asyncio.Future[WorkerExit] = field(repr=False)
    started_at_ns: int = 0  # when the zygote forked it

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signals the worker through its pidfd: never another process that reused the pid."""
        if self.pidfd is None or self.exited.done():
            return
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Releases the pidfd (the socket belongs to whoever took it over)."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


@dataclass
class AdoptableWorker:
    """A worker running under a zygote this daemon did not start (Adopt): its pidfd, its config, its netns."""

    pid: int
    config: worker_pb.WorkerConfig
    sandboxes: dict[str, int]  # sandbox id -> the inode of the netns the broker holds for it
    pidfd: int | None
    exited: asyncio.Future[WorkerExit] = field(repr=False)
    started_at_ns: int = 0


class Zygote:
    """Daemon side of one zygote process; asyncio, no thread. Started here (`start`), or found running under the
    handover directory after a restart (`connect`): then it is not this daemon's child, and its exit status and
    its workers' come from nobody (their pidfds still say when they end)."""

    def __init__(self, pid: int, control: socket.socket, proc: subprocess.Popen | None,
                 on_exit: Callable[[WorkerExit], None] | None) -> None:
        self.proc = proc
        self.pid = pid
        self._control = control
        self._on_exit = on_exit
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # a Spawn's (pid, pidfd, exited), an Assign's Assigned...
        self._adopting: dict[int, list[AdoptableWorker]] = {}  # Adoptable answers so far, by the Adopt's seq
        self._workers: dict[int, asyncio.Future[WorkerExit]] = {}
        self.hello: asyncio.Future[zygote_pb.Hello] = self._loop.create_future()
        self.died: asyncio.Future[str] = self._loop.create_future()  # why it ended; set once reaped
        self._lost = False
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError as exc:
            control.close()
            raise ZygoteError(f"zygote {pid} is gone: {exc.strerror}") from None
        self._loop.add_reader(self._control.fileno(), self._on_readable)
        self._loop.add_reader(self._pidfd, self._on_process_exit)

    @classmethod
    async def start(
        cls,
        *,
        python: str = sys.executable,
        gc_freeze: bool = True,
        child_gc_threshold: int | None = None,
        warm_up: bool = True,
        relocate: bool = True,
        fill_holes: bool = True,
        merge_pages: bool = False,
        handover_dir: str = "",
        handover_timeout_s: float = HANDOVER_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        on_exit: Callable[[WorkerExit], None] | None = None,
    ) -> "Zygote":
        """Starts `python -m probe_zygote.main` and waits until its imports are done. With handover_dir, the
        zygote and its workers outlive this daemon (close() still stops them; detach() leaves them running)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-P", "-m", "probe_zygote.main", "--fd", str(theirs.fileno())]
        argv += [] if gc_freeze else ["--no-gc-freeze"]
        argv += [] if child_gc_threshold is None else ["--child-gc-threshold", str(child_gc_threshold)]
        argv += [] if warm_up else ["--no-warm-up"]
        argv += [] if relocate else ["--no-relocate"]
        argv += [] if fill_holes else ["--no-fill-holes"]
        argv += ["--merge-pages"] if merge_pages else []
        argv += ["--handover-dir", handover_dir, "--handover-timeout", str(handover_timeout_s)] if handover_dir else []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            # A session of its own: a terminal's signals go to the daemon, which then closes the socket.
            proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd="/")
        except OSError as exc:
            ours.close()
            raise ZygoteError(f"cannot start the zygote: {exc}") from None
        finally:
            theirs.close()
        ours.setblocking(False)
        zygote = cls(proc.pid, ours, proc, on_exit)
        await zygote._wait_for_hello(start_timeout_s)
        log.info("zygote started", extra={"pid": zygote.pid, "modules": zygote.hello.result().preloaded_modules})
        return zygote

    @classmethod
    async def connect(cls, path: str, *, timeout_s: float = SPAWN_TIMEOUT_S,
                      on_exit: Callable[[WorkerExit], None] | None = None) -> "Zygote":
        """The zygote of an earlier daemon, waiting at its handover socket; ZygoteError if it is gone or busy."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            with unix_address(path) as address:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), timeout_s)
            pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
        except (OSError, TimeoutError) as exc:
            sock.close()
            raise ZygoteError(f"no zygote at {path}: {getattr(exc, 'strerror', None) or 'no answer'}") from None
        zygote = cls(pid, sock, None, on_exit)
        await zygote._wait_for_hello(timeout_s)
        return zygote

    async def _wait_for_hello(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.hello), timeout_s)
        except (TimeoutError, ZygoteError) as exc:
            await self.close()
            raise ZygoteError(f"the zygote did not start: {exc or 'no hello within ' + str(timeout_s) + 's'}") from None

    @property
    def alive(self) -> bool:
        return not self._lost and not self.died.done()

    async def spawn(self, config: worker_pb.WorkerConfig, timeout_s: float = SPAWN_TIMEOUT_S) -> SpawnedWorker:
        """Forks a worker for `config`. Its first frame on `sock` will be Ready or Fatal."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        seq = next(self._seq)
        reply = self._loop.create_future()
        self._pending[seq] = reply
        try:
            try:
                await self._send(zygote_pb.ZygoteRequest(seq=seq, spawn=zygote_pb.Spawn(config=config)), theirs.fileno())
            finally:
                theirs.close()  # in flight the descriptor is the kernel's; the child gets the only copy
            pid, pidfd, exited, started_at_ns = await asyncio.wait_for(reply, timeout_s)
        except BaseException:
            ours.close()  # the child, if forked, sees EOF and exits
            if reply.done() and not reply.cancelled() and reply.exception() is None and reply.result()[1] is not None:
                os.close(reply.result()[1])
            raise
        finally:
            self._pending.pop(seq, None)
        return SpawnedWorker(pid=pid, sock=ours, pidfd=pidfd, exited=exited, started_at_ns=started_at_ns)

    async def assign(self, worker_pid: int, sandbox_id: str, netns_path: str, *, find_pod_ips: bool = False,
                     timeout_s: float = SPAWN_TIMEOUT_S) -> zygote_pb.Assigned:
        """Lets the worker have sockets in the sandbox's netns (the zygote is the broker); ZygoteError says why not."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        seq = next(self._seq)
        reply = self._loop.create_future()
        self._pending[seq] = reply
        try:
            await self._send(zygote_pb.ZygoteRequest(seq=seq, assign=zygote_pb.Assign(
                worker_pid=worker_pid, sandbox_id=sandbox_id, netns_path=netns_path, find_pod_ips=find_pod_ips)))
            return await asyncio.wait_for(reply, timeout_s)
        finally:
            self._pending.pop(seq, None)

    async def unassign(self, worker_pid: int, sandbox_id: str) -> None:
        """Takes the sandbox back from the worker (no answer: a dead zygote took it back already)."""
        if self.alive:
            try:
                await self._send(zygote_pb.ZygoteRequest(unassign=zygote_pb.Unassign(
                    worker_pid=worker_pid, sandbox_id=sandbox_id)))
            except ZygoteError:
                pass

    async def adopt(self, timeout_s: float = SPAWN_TIMEOUT_S) -> list[AdoptableWorker]:
        """The workers running under this zygote (one forked for an earlier daemon), each with its pidfd."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        seq = next(self._seq)
        reply = self._pending[seq] = self._loop.create_future()
        self._adopting[seq] = []
        try:
            await self._send(zygote_pb.ZygoteRequest(seq=seq, adopt=zygote_pb.Adopt()))
            return await asyncio.wait_for(reply, timeout_s)
        finally:
            self._pending.pop(seq, None)
            for worker in self._adopting.pop(seq, None) or []:  # not answered in full: nobody takes these
                if worker.pidfd is not None:
                    os.close(worker.pidfd)

    async def reattach(self, worker_pid: int, sock: socket.socket, timeout_s: float = SPAWN_TIMEOUT_S) -> None:
        """Passes the worker `sock` (its end of a new socketpair) as its daemon's socket; ZygoteError says why not."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        seq = next(self._seq)
        reply = self._pending[seq] = self._loop.create_future()
        try:
            await self._send(zygote_pb.ZygoteRequest(seq=seq, reattach=zygote_pb.Reattach(worker_pid=worker_pid)),
                             sock.fileno())
            await asyncio.wait_for(reply, timeout_s)
        finally:
            self._pending.pop(seq, None)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stops the zygote and every worker it forked (Shutdown), and reaps it."""
        if self.alive:
            with contextlib.suppress(ZygoteError):
                await self._send(zygote_pb.ZygoteRequest(shutdown=zygote_pb.Shutdown()))
        self._connection_lost("zygote closed")
        try:
            await asyncio.wait_for(asyncio.shield(self.died), timeout_s)
        except TimeoutError:
            self._kill()
            await asyncio.shield(self.died)

    def detach(self) -> None:
        """Leaves the zygote and its workers running for the next daemon (a handover): our end closes without a
        Shutdown. Only for a zygote started with a handover_dir; any other one stops at once."""
        self._connection_lost("handed over")
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self.died.done():
            self.died.set_result("handed over to the next daemon")

    def _kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    # --- internals ---------------------------------------------------------------------

    async def _send(self, request: zygote_pb.ZygoteRequest, fd: int | None = None) -> None:
        if self._lost:
            raise ZygoteError("the zygote is not running")
        data = request.SerializeToString()
        while True:
            try:
                socket.send_fds(self._control, [data], [] if fd is None else [fd])
                return
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._control.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._control.fileno())
            except OSError as exc:
                self._connection_lost(f"zygote connection failed: {exc}")
                raise ZygoteError("the zygote is not running") from None

    def _on_readable(self) -> None:
        while not self._lost:
            try:
                data, fds, flags, _ = socket.recv_fds(self._control, MAX_PACKET, 1)
            except BlockingIOError:
                return
            except OSError as exc:
                self._connection_lost(f"zygote connection failed: {exc}")
                return
            if not data and not fds:
                self._connection_lost("zygote died")
                return
            try:
                event = zygote_pb.ZygoteEvent.FromString(data)
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError("truncated packet")
            except Exception as exc:  # noqa: BLE001  a broken zygote is killed and replaced
                for fd in fds:
                    os.close(fd)
                log.error("protocol error from the zygote: %s", exc)
                self._kill()
                self._connection_lost("zygote protocol error")
                return
            self._dispatch(event, fds)

    def _dispatch(self, event: zygote_pb.ZygoteEvent, fds: list[int]) -> None:
        kind = event.WhichOneof("msg")
        reply = self._pending.get(event.seq) if event.seq else None
        if kind == "hello" and not self.hello.done():
            self.hello.set_result(event.hello)
        elif kind == "spawned" and reply is not None and not reply.done():
            # Tracked now, not when spawn() resumes: the exit may be in the very next packet.
            exited = self._loop.create_future()
            self._workers[event.spawned.pid] = exited
            reply.set_result((event.spawned.pid, fds[0] if fds else None, exited, event.spawned.started_at_unix_ns))
            return
        elif kind == "spawn_failed" and reply is not None and not reply.done():
            reply.set_exception(ZygoteError(event.spawn_failed.message))
        elif kind == "assigned" and reply is not None and not reply.done():
            reply.set_result(event.assigned)
        elif kind == "assign_failed" and reply is not None and not reply.done():
            reply.set_exception(ZygoteError(event.assign_failed.message))
        elif kind == "reattached" and reply is not None and not reply.done():
            reply.set_result(None)
        elif kind == "adoptable" and event.seq in self._adopting:
            exited = self._workers.setdefault(event.adoptable.pid, self._loop.create_future())
            self._adopting[event.seq].append(AdoptableWorker(
                pid=event.adoptable.pid, config=event.adoptable.config, pidfd=fds[0] if fds else None,
                sandboxes={a.sandbox_id: a.netns_inode for a in event.adoptable.sandboxes}, exited=exited,
                started_at_ns=event.adoptable.started_at_unix_ns))
            fds = fds[1:]
        elif kind == "adopt_done" and reply is not None and not reply.done():
            reply.set_result(self._adopting.pop(event.seq, []))
        elif kind == "exited":
            ex = event.exited
            status = WorkerExit(pid=ex.pid, exit_code=None if ex.signal else ex.exit_code, signal=ex.signal or None)
            self._resolve_exit(status)
        for fd in fds:  # a pidfd nobody waits for any more (spawn timed out)
            os.close(fd)

    def _resolve_exit(self, status: WorkerExit) -> None:
        exited = self._workers.pop(status.pid, None)
        if exited is not None and not exited.done():
            exited.set_result(status)
        if self._on_exit is not None:
            self._on_exit(status)

    def _connection_lost(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        self._loop.remove_reader(self._control.fileno())
        self._control.close()
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(ZygoteError(reason))
        if not self.hello.done():
            self.hello.set_exception(ZygoteError(reason))
            self.hello.exception()  # retrieved: start() reports it
        # Its workers live on (adopted by the daemon), but their exit statuses no longer come from here.
        for pid in list(self._workers):
            self._resolve_exit(WorkerExit(pid=pid, reason=reason))

    def _on_process_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        if self.proc is not None:
            returncode = self.proc.wait()  # exited: does not block
            status = WorkerExit(pid=self.pid, exit_code=returncode if returncode >= 0 else None,
                                signal=-returncode if returncode < 0 else None)
        else:  # adopted: another daemon's child, reaped by whoever its parent is now
            returncode, status = None, WorkerExit(pid=self.pid, reason="exited")
        os.close(self._pidfd)
        self._pidfd = None
        self._connection_lost("zygote died")
        reason = f"zygote {status.describe()}"
        if not self.died.done():
            self.died.set_result(reason)
        log.log(logging.INFO if returncode == 0 else logging.WARNING, reason, extra={"pid": self.pid})
