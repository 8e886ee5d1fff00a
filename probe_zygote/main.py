"""The worker zygote: a preloaded, single-threaded process that forks probe workers (`python -m
probe_zygote.main --fd N`), and the netns broker that hands those workers their probe sockets.

The daemon runs grpc threads, and forking a process that has threads is unsafe, so workers are forked by this
small process instead. It preloads everything a worker needs, prepares its memory (probe_zygote/prefork.py), freezes
the GC so the preloaded objects stay in pages the children share, forks one child per Spawn (probe_zygote/fork.py:
the fork and the child's set-up) and reports each child's pid (with a pidfd) and later its exit status, over the
SOCK_SEQPACKET socketpair of cri_proto/zygote.proto. This module is the request loop. The daemon's side of that
socket is shim/workers/zygote_handle.py. Imports stay lean (probe_worker and the standard library, never grpcio):
every worker inherits what the zygote holds.

It is also the netns broker (probe_zygote/netns_broker.py): privileged and single-threaded already, it makes each worker's
broker channel when it forks it, holds the netns of every sandbox the daemon assigns to a worker, and answers the
workers' SocketRequests from the same poll loop. A worker whose zygote died loses its broker and ends; the daemon
starts a new zygote and, through it, new workers.

Handover: the zygote and its workers outlive the daemon (a crash, a restart, an upgrade). With --handover-dir it
listens on DIR/zygote-PID.sock; when the daemon's end closes without a Shutdown it keeps everything running and
waits there, up to --handover-timeout seconds, for the next daemon, which adopts the workers (Adopt lists them,
Reattach passes each a new daemon socket over its broker channel). Nobody in time: it kills its workers and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import resource
import select
import signal
import socket
import sys
import time

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_worker.pod_ips import discover_pod_ips
from probe_zygote.fork import become_worker, merge_pages, warm_up
from probe_zygote.netns_broker import BrokerError, NetnsBroker
from probe_zygote.prefork import fill_malloc_holes, fill_pool_holes
from probe_api.defaults import HANDOVER_TIMEOUT_S, SHIM_VERSION
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from probe_api.zygote_protocol import MAX_PACKET, ZYGOTE_PROTOCOL_VERSION, exit_from_waitid, handover_socket_name, unix_address

log = logging.getLogger(__spec__.name if __spec__ else __name__)  # run as `-m probe_zygote.main`: not "__main__"


def _send(control: socket.socket, event: zygote_pb.ZygoteEvent, fds: list[int] | None = None) -> None:
    socket.send_fds(control, [event.SerializeToString()], fds or [])


def _hello(adopted: bool) -> zygote_pb.ZygoteEvent:
    return zygote_pb.ZygoteEvent(hello=zygote_pb.Hello(
        pid=os.getpid(), preloaded_modules=len(sys.modules), gc_frozen=gc.get_freeze_count() > 0,
        protocol_version=ZYGOTE_PROTOCOL_VERSION, worker_protocol_version=WORKER_PROTOCOL_VERSION,
        version=SHIM_VERSION, adopted=adopted))


def _listen(directory: str) -> tuple[socket.socket, str]:
    """The handover socket, DIR/zygote-PID.sock (0600 in a 0700 directory: the daemon's user only)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, handover_socket_name(os.getpid()))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a zygote that had our pid before us, long gone
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with unix_address(path) as address:
        listener.bind(address)
    os.chmod(path, 0o600)
    listener.listen(4)
    return listener, path


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _recv(control: socket.socket) -> tuple[zygote_pb.ZygoteRequest | None, list[int]]:
    """One request and the descriptors that came with it; (None, []) when the daemon is gone."""
    data, fds, flags, _ = socket.recv_fds(control, MAX_PACKET, 4)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        _close(fds)
        raise ValueError("truncated packet from the daemon")
    if not data and not fds:
        return None, []
    return zygote_pb.ZygoteRequest.FromString(data), fds


class _ZygoteProcess:
    """The blocking loop: poll the control socket and one pidfd per live child."""

    def __init__(self, control: socket.socket, gc_freeze: bool, child_gc_threshold: int,
                 handover_dir: str = "", handover_timeout_s: float = 0.0) -> None:
        self.control: socket.socket | None = control  # None while no daemon is connected (handover)
        self.gc_freeze = gc_freeze
        self.child_gc_threshold = child_gc_threshold
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.configs: dict[int, worker_pb.WorkerConfig] = {}  # pid -> what it was spawned with
        self.started: dict[int, int] = {}  # pid -> when it was forked (ns since the epoch)
        self.channels: dict[int, int] = {}  # broker channel fd -> worker pid
        self.broker = NetnsBroker(find_pod_ips=discover_pod_ips)
        # epoll, not poll: with a worker per sandbox the zygote watches two descriptors per worker (its pidfd and
        # its broker channel), and poll()'s cost per wake-up grows with all of them (a third of the zygote's CPU
        # at 250 workers). The child closes its copy first thing (fork.py).
        self.poller = select.epoll()
        self.poller.register(control, select.EPOLLIN)
        self.pid = os.getpid()
        self.max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.listener: socket.socket | None = None
        self.handover_path = ""
        self.handover_timeout_s = handover_timeout_s
        self.orphaned_at: float | None = None  # when the last daemon went, while none is connected
        if handover_dir:
            self.listener, self.handover_path = _listen(handover_dir)
            self.poller.register(self.listener, select.EPOLLIN)

    def serve(self) -> int:
        """Until Shutdown, or the daemon's end closes with no handover (or none came in time). A malformed request
        ends the zygote: the daemon starts another."""
        while True:
            events = self.poller.poll(self._orphan_wait_s())
            if not events and self.orphaned_at is not None and self._orphan_wait_s() == 0:
                log.warning("no daemon adopted the workers within %gs; stopping them", self.handover_timeout_s)
                return self._end()
            for fd, _ in events:
                if self.control is not None and fd == self.control.fileno():
                    request, fds = _recv(self.control)
                    if request is None and self.listener is None:
                        return self._end()
                    if request is None:
                        self._orphan()
                    elif request.WhichOneof("msg") == "shutdown":
                        _close(fds)
                        return self._end()
                    else:
                        self._handle(request, fds)
                elif self.listener is not None and fd == self.listener.fileno():
                    self._accept()
                elif fd in self.children:
                    self._reap(fd)
                elif fd in self.channels and not self.broker.serve_channel(self.channels[fd]):
                    self._forget_channel(fd)

    # --- handover --------------------------------------------------------------------------------------

    def _orphan_wait_s(self) -> float | None:
        if self.orphaned_at is None:
            return None
        return max(0.0, self.orphaned_at + self.handover_timeout_s - time.monotonic())

    def _orphan(self) -> None:
        """The daemon went without a Shutdown: its workers run on, and the next daemon may adopt them."""
        self.poller.unregister(self.control)
        self.control.close()
        self.control = None
        self.orphaned_at = time.monotonic()
        log.info("the daemon is gone; %d workers wait up to %gs for the next one at %s", len(self.children),
                 self.handover_timeout_s, self.handover_path)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.control is not None:
            conn.close()  # one daemon at a time: the one connected keeps its workers
            return
        conn.setblocking(True)
        self.control, self.orphaned_at = conn, None
        self.poller.register(conn, select.EPOLLIN)
        self._send(_hello(adopted=True))

    def _adopt(self, seq: int) -> None:
        for pidfd, pid in self.children.items():
            self._send(zygote_pb.ZygoteEvent(seq=seq, adoptable=zygote_pb.Adoptable(
                pid=pid, config=self.configs.get(pid), started_at_unix_ns=self.started.get(pid, 0),
                sandboxes=[zygote_pb.Assignment(sandbox_id=sid, netns_inode=inode)
                           for sid, inode in self.broker.assignments(pid)])), [pidfd])
        self._send(zygote_pb.ZygoteEvent(seq=seq, adopt_done=zygote_pb.AdoptDone(workers=len(self.children))))

    def _reattach(self, seq: int, reattach: zygote_pb.Reattach, fds: list[int]) -> None:
        try:
            if len(fds) != 1:
                raise BrokerError(f"a reattach request with exactly one descriptor was expected, got {len(fds)}")
            self.broker.pass_control(reattach.worker_pid, fds[0])
        except BrokerError as exc:
            self._send(zygote_pb.ZygoteEvent(seq=seq, assign_failed=zygote_pb.AssignFailed(message=str(exc))))
        else:
            self._send(zygote_pb.ZygoteEvent(seq=seq, reattached=zygote_pb.Reattached()))
        finally:
            _close(fds)  # in flight, the worker's copy is the kernel's

    def _end(self) -> int:
        self._kill_children()
        self.broker.close()
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.handover_path)
        return 0

    def _send(self, event: zygote_pb.ZygoteEvent, fds: list[int] | None = None) -> None:
        """To the daemon, if one is connected (a worker's exit while none is: the next one finds it gone)."""
        if self.control is None:
            return
        try:
            _send(self.control, event, fds)
        except OSError:
            pass  # the daemon is going: its EOF comes next

    # --- requests ----------------------------------------------------------------------------------------

    def _handle(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        """One request, by its kind (a table, one handler each); each handler owns the descriptors it came with."""
        self._HANDLERS.get(request.WhichOneof("msg"), _ZygoteProcess._refuse)(self, request, fds)

    def _refuse(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        _close(fds)
        self._send(zygote_pb.ZygoteEvent(seq=request.seq, spawn_failed=zygote_pb.SpawnFailed(
            message=f"a spawn request with exactly one descriptor was expected, got "
                    f"{request.WhichOneof('msg')} with {len(fds)}")))

    def _on_adopt(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        _close(fds)
        self._adopt(request.seq)

    def _on_reattach(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        self._reattach(request.seq, request.reattach, fds)

    def _on_assign(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        _close(fds)
        self._assign(request.seq, request.assign)

    def _on_unassign(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        _close(fds)
        self.broker.unassign(request.unassign.worker_pid, request.unassign.sandbox_id)

    def _on_spawn(self, request: zygote_pb.ZygoteRequest, fds: list[int]) -> None:
        if len(fds) != 1:
            self._refuse(request, fds)
        else:
            self._spawn(request.seq, request.spawn.config, fds[0])

    _HANDLERS = {"adopt": _on_adopt, "reattach": _on_reattach, "assign": _on_assign, "unassign": _on_unassign,
                 "spawn": _on_spawn}

    def _spawn(self, seq: int, config: worker_pb.WorkerConfig, worker_fd: int) -> None:
        """Forks a worker (probe_zygote/fork.py sets the child up), with its broker channel; reports its pid."""
        ours, theirs = self.broker.channel_pair()
        if self.gc_freeze:
            gc.freeze()  # what this loop allocated since the last fork joins the shared generation
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(worker_fd)
            ours.close()
            theirs.close()
            self._send(zygote_pb.ZygoteEvent(seq=seq, spawn_failed=zygote_pb.SpawnFailed(
                message=f"fork failed: {exc.strerror}")))
            return
        if pid == 0:  # never returns
            become_worker(config, worker_fd, theirs.fileno(), zygote_pid=self.pid, control=self.control,
                          poller=self.poller, max_fd=self.max_fd, child_gc_threshold=self.child_gc_threshold)
        os.close(worker_fd)
        theirs.close()
        self.broker.attach(pid, ours)
        self.channels[ours.fileno()] = pid
        self.poller.register(ours, select.EPOLLIN)
        pidfd = os.pidfd_open(pid)  # the child cannot be reaped before we poll it: it stays valid
        self.children[pidfd] = pid
        self.configs[pid] = config
        self.started[pid] = started = time.time_ns()
        self.poller.register(pidfd, select.EPOLLIN)
        self._send(zygote_pb.ZygoteEvent(seq=seq, spawned=zygote_pb.Spawned(pid=pid, started_at_unix_ns=started)),
                   [pidfd])

    def _assign(self, seq: int, assign: zygote_pb.Assign) -> None:
        try:
            inode, pod_ips = self.broker.assign(assign.worker_pid, assign.sandbox_id, assign.netns_path,
                                                assign.find_pod_ips)
        except (BrokerError, OSError) as exc:
            self._send(zygote_pb.ZygoteEvent(seq=seq, assign_failed=zygote_pb.AssignFailed(message=str(exc))))
            return
        self._send(zygote_pb.ZygoteEvent(seq=seq, assigned=zygote_pb.Assigned(netns_inode=inode,
                                                                                         pod_ips=pod_ips)))

    def _forget_channel(self, fd: int) -> None:
        pid = self.channels.pop(fd)
        try:
            self.poller.unregister(fd)
        except OSError:
            pass  # the broker closed it already (the worker hung up): closing took it out of the epoll set
        self.broker.detach(pid)

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.configs.pop(pid, None)
        self.started.pop(pid, None)
        self.poller.unregister(pidfd)
        channel = self.broker.channel_of(pid)
        if channel is not None:
            self._forget_channel(channel.fileno())
        result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        os.close(pidfd)
        status = exit_from_waitid(pid, result.si_code, result.si_status)
        self._send(zygote_pb.ZygoteEvent(exited=zygote_pb.WorkerExited(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe_zygote.main", description="cri-probe-shim worker zygote")
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
    parser.add_argument("--handover-dir", default="",
                        help="keep the workers when the daemon goes and wait for the next one on DIR/zygote-PID.sock")
    parser.add_argument("--handover-timeout", type=float, default=HANDOVER_TIMEOUT_S,
                        help="seconds the workers wait for the next daemon before they are stopped")
    args = parser.parse_args(argv)
    # No collection from here on in the zygote: a collection would free objects and leave
    # holes in pages that the children then fill, copying those pages.
    gc.disable()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s[%(process)d] %(levelname)s %(message)s")
    control = socket.socket(fileno=args.fd)
    control.setblocking(True)
    if args.warm_up:
        try:
            warm_up(args.relocate)
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
        merge_pages()
    if args.gc_freeze:
        # Frozen objects are never examined by a child's collections, which would otherwise
        # write to every object's GC header (and copy every page) at the first full collection.
        gc.freeze()
    zygote = _ZygoteProcess(control, args.gc_freeze, args.child_gc_threshold, args.handover_dir,
                            args.handover_timeout)
    _send(control, _hello(adopted=False))
    return zygote.serve()


if __name__ == "__main__":
    sys.exit(main())
