"""The daemon's handle on the worker zygote (the zygote program itself is probe_zygote/main.py).

The daemon starts the zygote first, with `python -m probe_zygote.main --fd N`, and talks to it over a
SOCK_SEQPACKET socketpair (cri_proto/zygote.proto), whose reading and answer matching are zygote_channel.py's.
`Zygote` (asyncio) owns the process: it starts it (or finds an earlier daemon's at its handover socket), asks it
to spawn workers, assign them sandboxes (the zygote is their netns broker), list and reattach the workers it runs,
and notices its death from its pidfd. The rules both ends share (packet size, protocol version, handover sockets,
WorkerExit) are probe_api/zygote_protocol.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.defaults import HANDOVER_TIMEOUT_S
from probe_api.zygote_protocol import WorkerExit, unix_address
from shim.workers.zygote_channel import AdoptableWorker, SpawnedWorker, ZygoteChannel, ZygoteError

__all__ = ["AdoptableWorker", "SpawnedWorker", "Zygote", "ZygoteError"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
SPAWN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class Zygote:
    """Daemon side of one zygote process; asyncio, no thread. Started here (`start`), or found running under the
    handover directory after a restart (`connect`): then it is not this daemon's child, and its exit status and
    its workers' come from nobody (their pidfds still say when they end)."""

    def __init__(self, pid: int, control: socket.socket, proc: subprocess.Popen | None,
                 on_exit: Callable[[WorkerExit], None] | None) -> None:
        self.proc = proc
        self.pid = pid
        self._loop = asyncio.get_running_loop()
        self.died: asyncio.Future[str] = self._loop.create_future()  # why it ended; set once reaped
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError as exc:
            control.close()
            raise ZygoteError(f"zygote {pid} is gone: {exc.strerror}") from None
        self._channel = ZygoteChannel(control, on_exit, on_protocol_error=self._kill)
        self.hello: asyncio.Future[zygote_pb.Hello] = self._channel.hello
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
        return not self._channel.lost and not self.died.done()

    async def spawn(self, config: worker_pb.WorkerConfig, timeout_s: float = SPAWN_TIMEOUT_S) -> SpawnedWorker:
        """Forks a worker for `config`. Its first frame on `sock` will be Ready or Fatal."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._channel.pending() as (seq, reply):
            try:
                try:
                    await self._channel.send(zygote_pb.ZygoteRequest(seq=seq, spawn=zygote_pb.Spawn(config=config)),
                                             theirs.fileno())
                finally:
                    theirs.close()  # in flight the descriptor is the kernel's; the child gets the only copy
                pid, pidfd, exited, started_at_ns = await asyncio.wait_for(reply, timeout_s)
            except BaseException:
                ours.close()  # the child, if forked, sees EOF and exits
                if reply.done() and not reply.cancelled() and reply.exception() is None \
                        and reply.result()[1] is not None:
                    os.close(reply.result()[1])
                raise
        return SpawnedWorker(pid=pid, sock=ours, pidfd=pidfd, exited=exited, started_at_ns=started_at_ns)

    async def assign(self, worker_pid: int, sandbox_id: str, netns_path: str, *, find_pod_ips: bool = False,
                     timeout_s: float = SPAWN_TIMEOUT_S) -> zygote_pb.Assigned:
        """Lets the worker have sockets in the sandbox's netns (the zygote is the broker); ZygoteError says why not."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        with self._channel.pending() as (seq, reply):
            await self._channel.send(zygote_pb.ZygoteRequest(seq=seq, assign=zygote_pb.Assign(
                worker_pid=worker_pid, sandbox_id=sandbox_id, netns_path=netns_path, find_pod_ips=find_pod_ips)))
            return await asyncio.wait_for(reply, timeout_s)

    async def unassign(self, worker_pid: int, sandbox_id: str) -> None:
        """Takes the sandbox back from the worker (no answer: a dead zygote took it back already)."""
        if self.alive:
            try:
                await self._channel.send(zygote_pb.ZygoteRequest(unassign=zygote_pb.Unassign(
                    worker_pid=worker_pid, sandbox_id=sandbox_id)))
            except ZygoteError:
                pass

    async def adopt(self, timeout_s: float = SPAWN_TIMEOUT_S) -> list[AdoptableWorker]:
        """The workers running under this zygote (one forked for an earlier daemon), each with its pidfd."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        with self._channel.pending(adopt=True) as (seq, reply):
            await self._channel.send(zygote_pb.ZygoteRequest(seq=seq, adopt=zygote_pb.Adopt()))
            return await asyncio.wait_for(reply, timeout_s)

    async def reattach(self, worker_pid: int, sock: socket.socket, timeout_s: float = SPAWN_TIMEOUT_S) -> None:
        """Passes the worker `sock` (its end of a new socketpair) as its daemon's socket; ZygoteError says why not."""
        if not self.alive:
            raise ZygoteError("the zygote is not running")
        with self._channel.pending() as (seq, reply):
            await self._channel.send(zygote_pb.ZygoteRequest(seq=seq, reattach=zygote_pb.Reattach(
                worker_pid=worker_pid)), sock.fileno())
            await asyncio.wait_for(reply, timeout_s)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stops the zygote and every worker it forked (Shutdown), and reaps it."""
        if self.alive:
            with contextlib.suppress(ZygoteError):
                await self._channel.send(zygote_pb.ZygoteRequest(shutdown=zygote_pb.Shutdown()))
        self._channel.lose("zygote closed")
        try:
            await asyncio.wait_for(asyncio.shield(self.died), timeout_s)
        except TimeoutError:
            self._kill()
            await asyncio.shield(self.died)

    def detach(self) -> None:
        """Leaves the zygote and its workers running for the next daemon (a handover): our end closes without a
        Shutdown. Only for a zygote started with a handover_dir; any other one stops at once."""
        self._channel.lose("handed over")
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
        self._channel.lose("zygote died")
        reason = f"zygote {status.describe()}"
        if not self.died.done():
            self.died.set_result(reason)
        log.log(logging.INFO if returncode == 0 else logging.WARNING, reason, extra={"pid": self.pid})
