"""The worker zygote: a preloaded, single-threaded process that forks probe workers.

The daemon runs grpc threads, and forking a process that has threads is unsafe, so
workers are forked by this small process instead. The daemon starts it first, with
`python -m shim.zygote --fd N`, and talks to it over a SOCK_SEQPACKET socketpair
(cri_proto/zygote.proto): one message per packet, so the descriptors passed with
SCM_RIGHTS stay attached to their message.

This module owns both sides:
- the zygote process (`main`): preloads everything a worker needs, freezes the GC so
  the preloaded objects stay in pages the children share, forks one child per Spawn
  and reports each child's pid (with a pidfd) and later its exit status;
- the daemon side (`Zygote`, asyncio): starts the process, spawns workers, resolves
  each worker's `exited` future, notices the zygote's own death.
Imports stay lean (probe_worker and the standard library, never grpcio), because the
zygote imports this module and every worker inherits what the zygote holds.
"""

from __future__ import annotations

import _signal
import argparse
import asyncio
import ctypes
import gc
import itertools
import logging
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
import probe_worker.main as worker_main  # the preload: every forked worker shares these pages
from probe_worker.channel import BlockingChannel
from shim.zygote_prefork import executed_code, fill_malloc_holes, fill_pool_holes, relocate_code, warm_up

log = logging.getLogger("shim.zygote")

MAX_PACKET = 1 << 16  # a Spawn is a WorkerConfig: a few hundred bytes
START_TIMEOUT_S = 30.0
SPAWN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE: the child failed outside run()
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
PR_SET_MEMORY_MERGE = 67

_libc = ctypes.CDLL(None, use_errno=True)


# --- exit statuses (pure) ------------------------------------------------------------

@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended: an exit code, a signal, or only a reason when nobody saw it."""

    pid: int
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""  # when the status is unknown, e.g. "zygote died"

    def describe(self) -> str:
        if self.signal:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"exited with signal {self.signal} ({name})"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return self.reason or "exited"


def exit_from_waitid(pid: int, code: int, status: int) -> WorkerExit:
    """From a waitid() si_code/si_status pair (CLD_EXITED gives a code, the others a signal)."""
    if code == os.CLD_EXITED:
        return WorkerExit(pid=pid, exit_code=status)
    return WorkerExit(pid=pid, signal=status)


# --- the zygote process -----------------------------------------------------------------

def _send(control: socket.socket, event: zygote_pb.ZygoteEvent, fds: list[int] | None = None) -> None:
    socket.send_fds(control, [event.SerializeToString()], fds or [])


def _recv(control: socket.socket) -> tuple[zygote_pb.ZygoteRequest | None, list[int]]:
    """One request and the descriptors that came with it; (None, []) when the daemon is gone."""
    data, fds, flags, _ = socket.recv_fds(control, MAX_PACKET, 4)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("truncated packet from the daemon")
    if not data and not fds:
        return None, []
    return zygote_pb.ZygoteRequest.FromString(data), fds


class _ZygoteProcess:
    """The blocking loop: poll the control socket and one pidfd per live child."""

    def __init__(self, control: socket.socket, gc_freeze: bool, child_gc_threshold: int) -> None:
        self.control = control
        self.gc_freeze = gc_freeze
        self.child_gc_threshold = child_gc_threshold
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.poller = select.poll()  # not epoll: poll holds no descriptor a child would inherit
        self.poller.register(control, select.POLLIN)
        self.pid = os.getpid()
        self.max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    def serve(self) -> int:
        """Until the daemon's end closes (a malformed request ends the zygote: the daemon starts another)."""
        while True:
            for fd, _ in self.poller.poll():
                if fd == self.control.fileno():
                    request, fds = _recv(self.control)
                    if request is None:
                        self._kill_children()
                        return 0
                    self._handle(request, fds)
                elif fd in self.children:
                    self._reap(fd)

    def _handle(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        if request.WhichOneof("msg") != "spawn" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            _send(self.control, zygote_pb.ZygoteEvent(seq=request.seq, spawn_failed=zygote_pb.SpawnFailed(
                message=f"a spawn request with exactly one descriptor was expected, got "
                        f"{request.WhichOneof('msg')} with {len(fds)}")))
            return
        worker_fd = fds[0]
        if self.gc_freeze:
            gc.freeze()  # what this loop allocated since the last fork joins the shared generation
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(worker_fd)
            _send(self.control, zygote_pb.ZygoteEvent(seq=request.seq, spawn_failed=zygote_pb.SpawnFailed(
                message=f"fork failed: {exc.strerror}")))
            return
        if pid == 0:
            self._child(request.spawn.config, worker_fd)  # never returns
        os.close(worker_fd)
        pidfd = os.pidfd_open(pid)  # the child cannot be reaped before we poll it: it stays valid
        self.children[pidfd] = pid
        self.poller.register(pidfd, select.POLLIN)
        _send(self.control, zygote_pb.ZygoteEvent(seq=request.seq, spawned=zygote_pb.Spawned(pid=pid)), [pidfd])

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.poller.unregister(pidfd)
        result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        os.close(pidfd)
        status = exit_from_waitid(pid, result.si_code, result.si_status)
        _send(self.control, zygote_pb.ZygoteEvent(exited=zygote_pb.WorkerExited(
            pid=pid, exit_code=status.exit_code or 0, signal=status.signal or 0)))

    def _kill_children(self) -> None:
        for pidfd in self.children:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pidfd in list(self.children):
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            os.close(pidfd)
        self.children.clear()

    def _child(self, config: worker_pb.WorkerConfig, worker_fd: int) -> None:
        """In the forked child: shed the zygote's state, then become the worker."""
        code = EXIT_INTERNAL_ERROR
        try:
            # No parent-death signal: a worker outlives a zygote crash (the daemon adopts it,
            # shim/supervisor.py) and exits at EOF of its socket when the daemon is gone.
            if os.getppid() != self.pid:
                os._exit(EXIT_INTERNAL_ERROR)  # the zygote died before it could hand us over
            # Every Python object the child touches copies the page it is on: this prelude sticks
            # to C functions and ints (closerange also closes the control socket and the pidfds).
            self.control.detach()
            # Anything else (inherited by the zygote by mistake) must not reach a pod's process.
            os.closerange(3, worker_fd)
            os.closerange(worker_fd + 1, self.max_fd)
            _reset_signals()
            if self.child_gc_threshold > 0:
                gc.set_threshold(self.child_gc_threshold)
                gc.enable()
            channel = BlockingChannel(socket.socket(fileno=worker_fd))
            code = worker_main.run(config, channel, die_with_parent_process=False)
        except BaseException:  # noqa: BLE001  the child must end here, never return into the zygote loop
            traceback.print_exc()
        finally:
            logging.shutdown()
            os._exit(code)


# Handlers as the interpreter set them before the zygote touched any, restored in children.
# _signal's raw ints and handlers: signal.signal() would convert through enums in every child.
_STARTUP_HANDLERS = tuple((int(sig), _signal.getsignal(sig))
                          for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE))


def _reset_signals() -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    for signum, handler in _STARTUP_HANDLERS:
        _signal.signal(signum, handler if handler is not None else _signal.SIG_DFL)


def _warm_up_once() -> None:
    for _ in range(12):
        _reset_signals()  # what each child runs first, while the handlers are still the startup ones
    warm_up()


def _warm_up(relocate: bool) -> None:
    """Runs the worker's code here, before any fork (shim/zygote_prefork.py says why). With
    relocate, a first, profiled run finds the code a worker runs, that code is copied into
    fresh pages, packed (fill the holes first, or the copies would land in them), and the
    second run warms the copies up."""
    if relocate:
        hot = executed_code(_warm_up_once)
        gc.collect()
        fill_pool_holes()
        fill_malloc_holes()
        relocate_code(hot)
    _warm_up_once()


def _merge_pages() -> None:
    """Opts this process and every worker forked from it into KSM (Linux >= 6.4). Pages a worker
    copied but left identical (reference counts back where they were) are merged again, if the
    node runs ksmd (/sys/kernel/mm/ksm/run = 1): a node-wide choice, hence off by default."""
    if _libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        log.warning("KSM merging not enabled: prctl(PR_SET_MEMORY_MERGE): %s", os.strerror(ctypes.get_errno()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shim.zygote", description="cri-probe-shim worker zygote")
    parser.add_argument("--fd", type=int, required=True, help="inherited SOCK_SEQPACKET end of the control socketpair")
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                        help="do not freeze the preloaded objects before forking (for measurements)")
    parser.add_argument("--child-gc-threshold", type=int, default=gc.get_threshold()[0],
                        help="generation-0 GC threshold in the workers; 0 leaves their GC disabled")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="do not run a worker session on loopback before forking (for measurements)")
    parser.add_argument("--no-relocate", dest="relocate", action="store_false",
                        help="do not copy the code workers run into packed pages (for measurements)")
    parser.add_argument("--merge-pages", action="store_true",
                        help="opt the workers into KSM page merging (needs ksmd running on the node)")
    parser.add_argument("--no-fill-holes", dest="fill_holes", action="store_false",
                        help="do not fill pymalloc's free blocks before forking (for measurements)")
    args = parser.parse_args(argv)
    # No collection from here on in the zygote: a collection would free objects and leave
    # holes in pages that the children then fill, copying those pages.
    gc.disable()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s[%(process)d] %(levelname)s %(message)s")
    control = socket.socket(fileno=args.fd)
    control.setblocking(True)
    if args.warm_up:
        try:
            _warm_up(args.relocate)
        except Exception:  # noqa: BLE001  only memory is at stake: workers still work cold
            log.exception("zygote warm-up failed; workers will start cold")
    # The daemon decides when the zygote ends (by closing the socket); a terminal's Ctrl-C must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.gc_freeze:
        gc.collect()  # the warm-up's garbage, before the survivors are frozen
    if args.fill_holes:
        fill_pool_holes()  # after the collection: it made holes too
        fill_malloc_holes()
    if args.merge_pages:
        _merge_pages()
    if args.gc_freeze:
        # Frozen objects are never examined by a child's collections, which would otherwise
        # write to every object's GC header (and copy every page) at the first full collection.
        gc.freeze()
    _send(control, zygote_pb.ZygoteEvent(hello=zygote_pb.Hello(
        pid=os.getpid(), preloaded_modules=len(sys.modules), gc_frozen=args.gc_freeze)))
    return _ZygoteProcess(control, args.gc_freeze, args.child_gc_threshold).serve()


# --- the daemon side ----------------------------------------------------------------------

class ZygoteError(Exception):
    """The zygote could not start, died, or refused a spawn."""


@dataclass
class SpawnedWorker:
    """A forked worker: the daemon's end of its socketpair, a pidfd, and its exit."""

    pid: int
    sock: socket.socket
    pidfd: int | None
    exited: asyncio.Future[WorkerExit] = field(repr=False)

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


class Zygote:
    """Daemon side of one zygote process; asyncio, no thread."""

    def __init__(self, proc: subprocess.Popen, control: socket.socket, on_exit: Callable[[WorkerExit], None] | None) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._control = control
        self._on_exit = on_exit
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[int, int | None, asyncio.Future[WorkerExit]]]] = {}
        self._workers: dict[int, asyncio.Future[WorkerExit]] = {}
        self.hello: asyncio.Future[zygote_pb.Hello] = self._loop.create_future()
        self.died: asyncio.Future[str] = self._loop.create_future()  # why it ended; set once reaped
        self._lost = False
        self._pidfd = os.pidfd_open(proc.pid)
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
        start_timeout_s: float = START_TIMEOUT_S,
        on_exit: Callable[[WorkerExit], None] | None = None,
    ) -> "Zygote":
        """Starts `python -m shim.zygote` and waits until its imports are done."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-P", "-m", "shim.zygote", "--fd", str(theirs.fileno())]
        argv += [] if gc_freeze else ["--no-gc-freeze"]
        argv += [] if child_gc_threshold is None else ["--child-gc-threshold", str(child_gc_threshold)]
        argv += [] if warm_up else ["--no-warm-up"]
        argv += [] if relocate else ["--no-relocate"]
        argv += [] if fill_holes else ["--no-fill-holes"]
        argv += ["--merge-pages"] if merge_pages else []
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
        zygote = cls(proc, ours, on_exit)
        try:
            await asyncio.wait_for(asyncio.shield(zygote.hello), start_timeout_s)
        except (TimeoutError, ZygoteError) as exc:
            await zygote.close()
            raise ZygoteError(f"the zygote did not start: {exc or 'no hello within ' + str(start_timeout_s) + 's'}") from None
        log.info("zygote started", extra={"pid": zygote.pid, "modules": zygote.hello.result().preloaded_modules})
        return zygote

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
            pid, pidfd, exited = await asyncio.wait_for(reply, timeout_s)
        except BaseException:
            ours.close()  # the child, if forked, sees EOF and exits
            if reply.done() and not reply.cancelled() and reply.exception() is None and reply.result()[1] is not None:
                os.close(reply.result()[1])
            raise
        finally:
            self._pending.pop(seq, None)
        return SpawnedWorker(pid=pid, sock=ours, pidfd=pidfd, exited=exited)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Closes the control socket (the zygote then kills its workers and exits) and reaps it."""
        self._connection_lost("zygote closed")
        try:
            await asyncio.wait_for(asyncio.shield(self.died), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await asyncio.shield(self.died)

    # --- internals ---------------------------------------------------------------------

    async def _send(self, request: zygote_pb.ZygoteRequest, fd: int) -> None:
        data = request.SerializeToString()
        while True:
            try:
                socket.send_fds(self._control, [data], [fd])
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
                self.proc.kill()
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
            reply.set_result((event.spawned.pid, fds[0] if fds else None, exited))
            return
        elif kind == "spawn_failed" and reply is not None and not reply.done():
            reply.set_exception(ZygoteError(event.spawn_failed.message))
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
        returncode = self.proc.wait()  # exited: does not block
        os.close(self._pidfd)
        self._connection_lost("zygote died")
        status = WorkerExit(pid=self.pid, exit_code=returncode if returncode >= 0 else None,
                            signal=-returncode if returncode < 0 else None)
        reason = f"zygote {status.describe()}"
        if not self.died.done():
            self.died.set_result(reason)
        log.log(logging.INFO if returncode == 0 else logging.WARNING, reason, extra={"pid": self.pid})


if __name__ == "__main__":
    sys.exit(main())
