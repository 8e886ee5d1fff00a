"""The daemon's end of the zygote's control socket: requests out, events in, each answer matched to its request.

A SOCK_SEQPACKET socketpair (cri_proto/zygote.proto): one message per packet, so the descriptors passed with
SCM_RIGHTS stay attached to their message. Everything the zygote sends is read here, in the loop's reader: the
Hello, each answer (a Spawned with the worker's pidfd, an Assigned, the Adoptable workers...), and each worker's
exit, which resolves that worker's `exited` future. A lost connection fails every waiting request with
ZygoteError. What a request means is zygote_handle.py's; the packet rules are probe_api/zygote_protocol.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.zygote_protocol import MAX_PACKET, WorkerExit

log = logging.getLogger(__name__)


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


class ZygoteChannel:
    """Requests out (`pending` + `send`), events in (the loop's reader). `lose` ends it (idempotent)."""

    def __init__(self, control: socket.socket, on_exit: Callable[[WorkerExit], None] | None,
                 on_protocol_error: Callable[[], None]) -> None:
        self._control = control
        self._on_exit = on_exit
        self._on_protocol_error = on_protocol_error  # a broken zygote is killed and replaced
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # a Spawn's (pid, pidfd, exited), an Assign's Assigned...
        self._adopting: dict[int, list[AdoptableWorker]] = {}  # Adoptable answers so far, by the Adopt's seq
        self._workers: dict[int, asyncio.Future[WorkerExit]] = {}
        self.hello: asyncio.Future[zygote_pb.Hello] = self._loop.create_future()
        self.lost = False
        self._loop.add_reader(self._control.fileno(), self._on_readable)

    @contextlib.contextmanager
    def pending(self, *, adopt: bool = False) -> Iterator[tuple[int, asyncio.Future]]:
        """A request's seq and the future its answer resolves, for as long as the caller waits for it."""
        seq = next(self._seq)
        reply = self._pending[seq] = self._loop.create_future()
        if adopt:
            self._adopting[seq] = []
        try:
            yield seq, reply
        finally:
            self._pending.pop(seq, None)
            for worker in self._adopting.pop(seq, None) or []:  # not answered in full: nobody takes these
                if worker.pidfd is not None:
                    os.close(worker.pidfd)

    async def send(self, request: zygote_pb.ZygoteRequest, fd: int | None = None) -> None:
        if self.lost:
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
                self.lose(f"zygote connection failed: {exc}")
                raise ZygoteError("the zygote is not running") from None

    def lose(self, reason: str) -> None:
        """Ends the channel: waiting requests fail, and the workers' exits will not come from here any more."""
        if self.lost:
            return
        self.lost = True
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

    # --- events ------------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        while not self.lost:
            try:
                data, fds, flags, _ = socket.recv_fds(self._control, MAX_PACKET, 1)
            except BlockingIOError:
                return
            except OSError as exc:
                self.lose(f"zygote connection failed: {exc}")
                return
            if not data and not fds:
                self.lose("zygote died")
                return
            try:
                event = zygote_pb.ZygoteEvent.FromString(data)
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError("truncated packet")
            except Exception as exc:  # noqa: BLE001  a broken zygote is killed and replaced
                for fd in fds:
                    os.close(fd)
                log.error("protocol error from the zygote: %s", exc)
                self._on_protocol_error()
                self.lose("zygote protocol error")
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
