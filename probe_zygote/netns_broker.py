"""The netns broker: makes probe sockets inside sandboxes' network namespaces for the workers allowed them.

Entering a netns needs CAP_SYS_ADMIN, and the code that parses a pod's bytes must hold no privilege. The broker
keeps the two apart: it is privileged and never reads a byte from a pod; the workers read every byte and hold
nothing. A socket made inside a netns stays in that netns wherever its descriptor goes, so the broker makes
TCP sockets there (non-blocking, SO_LINGER {1, 0}, TCP_NODELAY: connect.py's options) and passes them to the
worker over that worker's own SOCK_SEQPACKET channel with SCM_RIGHTS (cri_proto/probe_worker.proto:
SocketRequest / SocketReply). It answers a worker only for the sandboxes the daemon assigned to it.

It never makes a socket in the node's own network namespace (probe_api/node_netns.py: PID 1's, or its own),
whatever the daemon asks: the daemon refuses such sandboxes first, and this is where the privilege is.

The broker lives in the zygote (probe_zygote/main.py), which is privileged and single-threaded already and
makes each worker's channel when it forks it; `serve_channel` is called from its poll loop. It also works in
any one thread (tests run it beside a worker started on its own): setns(2) moves only the calling thread, and
every request puts that thread back in its own netns before it returns. Nothing here blocks: a worker that does
not read its replies loses them (its request times out), it never stalls the broker.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.node_netns import netns_id, node_netns_ids

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
MAX_BATCH = 16
MAX_PACKET = 4096
FAMILIES = (socket.AF_INET, socket.AF_INET6)
_LINGER_RST = struct.pack("ii", 1, 0)

_libc = ctypes.CDLL(None, use_errno=True)


class BrokerError(Exception):
    """An assignment the broker cannot make; str() says why, for the operator."""


@dataclass
class _Worker:
    channel: socket.socket
    netns: dict[str, int] = field(default_factory=dict)  # sandbox id -> an O_RDONLY fd of its netns


def _setns(fd: int) -> int:
    """0, or the errno of setns(fd, CLONE_NEWNET) for the calling thread."""
    return 0 if _libc.setns(fd, CLONE_NEWNET) == 0 else ctypes.get_errno()


class NetnsBroker:
    def __init__(self, find_pod_ips: Callable[[], list[str]] | None = None) -> None:
        """find_pod_ips: an rtnetlink dump of the current netns's global addresses (probe_worker.pod_ips)."""
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._node = node_netns_ids((self._home,))
        self._find_pod_ips = find_pod_ips
        self._workers: dict[int, _Worker] = {}

    # --- the daemon's side (through the zygote's control socket) ------------------------------------

    @staticmethod
    def channel_pair() -> tuple[socket.socket, socket.socket]:
        """(ours, the worker's): made before the worker exists, attached once its id (pid) is known."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        return ours, theirs

    def attach(self, worker_id: int, channel: socket.socket) -> None:
        self.detach(worker_id)
        self._workers[worker_id] = _Worker(channel)

    def detach(self, worker_id: int) -> None:
        """The worker is gone: its channel and every netns it was given are closed."""
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return
        worker.channel.close()
        for fd in worker.netns.values():
            os.close(fd)

    def channel_of(self, worker_id: int) -> socket.socket | None:
        worker = self._workers.get(worker_id)
        return worker.channel if worker is not None else None

    def assign(self, worker_id: int, sandbox_id: str, netns_path: str,
               find_pod_ips: bool = False) -> tuple[int, list[str]]:
        """Gives the worker sockets in the netns at netns_path; returns its inode and, if asked, the pod's IPs."""
        worker = self._workers.get(worker_id)
        if worker is None:
            raise BrokerError(f"no worker {worker_id} here")
        if not sandbox_id or not netns_path:
            raise BrokerError("an assignment needs a sandbox id and a netns path")
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise BrokerError(f"cannot open network namespace {netns_path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if netns_id(st) in self._node:
                raise BrokerError(f"{netns_path} is the node's own network namespace: no probe socket is made there")
            inode = st.st_ino
            pod_ips = self._visit(fd, netns_path, self._find_pod_ips if find_pod_ips else None)
        except BaseException:
            os.close(fd)
            raise
        old = worker.netns.pop(sandbox_id, None)
        if old is not None:
            os.close(old)
        worker.netns[sandbox_id] = fd
        return inode, pod_ips

    def unassign(self, worker_id: int, sandbox_id: str) -> None:
        worker = self._workers.get(worker_id)
        fd = worker.netns.pop(sandbox_id, None) if worker is not None else None
        if fd is not None:
            os.close(fd)

    def assigned(self, worker_id: int) -> list[str]:
        worker = self._workers.get(worker_id)
        return sorted(worker.netns) if worker is not None else []

    def assignments(self, worker_id: int) -> list[tuple[str, int]]:
        """(sandbox id, netns inode) of each sandbox the worker may have sockets in: what a new daemon adopts."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return []
        return sorted((sandbox_id, os.fstat(fd).st_ino) for sandbox_id, fd in worker.netns.items())

    def pass_control(self, worker_id: int, fd: int) -> None:
        """Gives the worker a new daemon's socket (SocketReply with `control`) after its daemon went away."""
        worker = self._workers.get(worker_id)
        if worker is None:
            raise BrokerError(f"no worker {worker_id} here")
        push = worker_pb.SocketReply(control=True).SerializeToString()
        try:
            socket.send_fds(worker.channel, [push], [fd], socket.MSG_DONTWAIT)
        except OSError as exc:
            raise BrokerError(f"cannot pass worker {worker_id} its new daemon socket: {exc.strerror or exc}") from None

    def close(self) -> None:
        for worker_id in list(self._workers):
            self.detach(worker_id)
        os.close(self._home)

    # --- the workers' side ----------------------------------------------------------------------------

    def serve_channel(self, worker_id: int) -> bool:
        """Answers every request waiting on the worker's channel; False once the worker closed it (detached)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(worker.channel, MAX_PACKET, 1)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self.detach(worker_id)
                return False
            for fd in fds:  # a worker has nothing to pass the broker
                os.close(fd)
            if not data and not fds:
                self.detach(worker_id)
                return False
            try:
                if flags & socket.MSG_TRUNC:
                    raise ValueError("truncated packet")
                request = worker_pb.SocketRequest.FromString(data)
            except Exception:  # noqa: BLE001  a worker that speaks nonsense loses its broker, and so ends
                log.error("protocol error on the broker channel of worker %d; closing it", worker_id)
                self.detach(worker_id)
                return False
            self._answer(worker, request)

    def _answer(self, worker: _Worker, request: worker_pb.SocketRequest) -> None:
        error = ""
        sockets: list[socket.socket] = []
        if request.family not in FAMILIES:
            error = f"family: Unsupported value: {request.family}: supported values: {', '.join(map(str, FAMILIES))}"
        elif not 1 <= request.count <= MAX_BATCH:
            error = f"count: Invalid value: {request.count}: must be between 1 and {MAX_BATCH}, inclusive"
        elif request.sandbox_id not in worker.netns:
            error = f"sandbox {request.sandbox_id!r} is not assigned to this worker"
        else:
            try:
                sockets = self._sockets(worker.netns[request.sandbox_id], request.family, request.count)
            except OSError as exc:
                error = f"cannot make a socket in sandbox {request.sandbox_id!r}: {exc.strerror or exc}"
        reply = worker_pb.SocketReply(seq=request.seq, count=len(sockets), error=error)
        try:
            socket.send_fds(worker.channel, [reply.SerializeToString()], [s.fileno() for s in sockets],
                            socket.MSG_DONTWAIT)
        except OSError:
            pass  # a worker that does not read loses this reply (its request times out); never wait for it
        finally:
            for sock in sockets:
                sock.close()  # in flight, the worker's copies are the kernel's

    def _sockets(self, netns_fd: int, family: int, count: int) -> list[socket.socket]:
        def make() -> list[socket.socket]:
            made: list[socket.socket] = []
            try:
                for _ in range(count):
                    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
                    made.append(sock)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except BaseException:
                for sock in made:
                    sock.close()
                raise
            return made

        return self._visit(netns_fd, "", make)

    def _visit(self, netns_fd: int, label: str, work):
        """Runs work() (if any) with this thread in the netns, and always comes home."""
        err = _setns(netns_fd)
        if err:
            hint = " (not a network namespace file?)" if err == 22 else ""
            raise BrokerError(f"setns({label}) failed: {os.strerror(err)}{hint}") if label else \
                OSError(err, os.strerror(err))
        try:
            return work() if work is not None else []
        finally:
            home = _setns(self._home)
            if home:
                # Stuck in a pod's netns, every later socket would be made in the wrong place: end here.
                log.critical("cannot return to the broker's own network namespace: %s", os.strerror(home))
                os._exit(70)
