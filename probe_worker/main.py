"""The worker process: start-up order, then the request loop.

Start-up order matters and is the point of this module:
  1. read the WorkerConfig frame (single thread);
  2. move into a new, empty network namespace of its own, before any other thread exists:
     every probe socket comes from the netns broker, made inside the sandbox it probes;
  3. lower rlimits, drop groups/gid/uid, set no_new_privs, install the seccomp filter
     (which refuses AF_INET/AF_INET6 sockets), check CapEff is empty;
  4. send Ready, and only then start the event loop.
Then the daemon adds sandboxes (AddSandbox: a group of them, or one in strict mode) and
their probes. A worker started with `outlives_daemon` does not end with its daemon: at EOF
(or after Detach) it probes on, queues its events (outbox.py) and waits for the next
daemon's socket, which the broker passes it; on that socket it says Ready (adopted), writes
what it queued, and answers Resume with a Snapshot of everything it serves. A RunOnce's max_tries and lifecycle_hook go to the prober as they are.
Requests are dispatched by a table, `Session.HANDLERS`: one handler per kind of WorkerRequest.
Every module the worker needs is imported at the top of this file, so nothing
is imported after the drop (the interpreter may live under a directory the
unprivileged uid cannot read). The zygote (probe_zygote/main.py), which is also the
broker, calls run() in each forked child with the config it received.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import encodings.idna  # noqa: F401  hostnames in an explicit probe host need it after the drop
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import HEARTBEAT_INTERVAL_MS, KUBELET_VERSION, WORKER_GID, WORKER_OPEN_FILES, WORKER_UID
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION, run_once_errors
from probe_worker.channel import AsyncChannel, BlockingChannel, ChannelClosed
from probe_worker.netns import NetnsError, isolate_network
from probe_worker.outbox import Outbox
from probe_worker.privileges import PrivilegeError, apply_limits, die_with_parent, drop_privileges
from probe_worker.sandbox_router import SandboxRouter, UnknownSandbox
from probe_worker.socket_source import BrokerSockets

log = logging.getLogger(__name__)

DEFAULT_MAX_MEMORY = 256 << 20
DEFAULT_MAX_FILES = WORKER_OPEN_FILES
DEFAULT_HEARTBEAT_MS = HEARTBEAT_INTERVAL_MS
CONFIG_TIMEOUT_S = 30
EXIT_BROKER_GONE = 3


class StartError(Exception):
    pass


def _with_defaults(config: worker_pb.WorkerConfig) -> worker_pb.WorkerConfig:
    c = worker_pb.WorkerConfig()
    c.CopyFrom(config)
    c.user_agent_version = c.user_agent_version or KUBELET_VERSION
    c.run_as_uid = c.run_as_uid or WORKER_UID
    c.run_as_gid = c.run_as_gid or WORKER_GID
    c.max_memory_bytes = c.max_memory_bytes or DEFAULT_MAX_MEMORY
    c.max_open_files = c.max_open_files or DEFAULT_MAX_FILES
    c.heartbeat_interval_ms = c.heartbeat_interval_ms or DEFAULT_HEARTBEAT_MS
    return c


def start(config: worker_pb.WorkerConfig, die_with_parent_process: bool = True) -> worker_pb.Ready:
    """Steps 2-3; raises StartError with a message fit for the operator."""
    try:
        inode = isolate_network()
        apply_limits(config.max_memory_bytes, config.max_open_files)
        if not config.keep_privileges:
            drop_privileges(config.run_as_uid, config.run_as_gid)
        if die_with_parent_process:  # not when forked by the zygote: a worker outlives a zygote crash
            die_with_parent()
    except (NetnsError, PrivilegeError, OSError) as exc:
        raise StartError(str(exc)) from None
    return worker_pb.Ready(pid=os.getpid(), netns_inode=inode, uid=os.getuid(), gid=os.getgid(),
                           protocol_version=WORKER_PROTOCOL_VERSION, group=config.group)


def run(config: worker_pb.WorkerConfig, channel: BlockingChannel, broker: socket.socket,
        die_with_parent_process: bool = True) -> int:
    """Runs a worker on the channel its config came from, its sockets from `broker`; returns the exit code."""
    config = _with_defaults(config)
    try:
        ready = start(config, die_with_parent_process)
    except StartError as exc:
        log.error("worker of group %s cannot start: %s", config.group, exc)
        channel.send(worker_pb.WorkerEvent(fatal=worker_pb.Fatal(message=str(exc))))
        return 2
    channel.send(worker_pb.WorkerEvent(ready=ready))
    return asyncio.run(_serve_with_broker(channel.to_async(), broker, config, ready))


async def _serve_with_broker(channel: AsyncChannel, broker: socket.socket, config: worker_pb.WorkerConfig,
                             ready: worker_pb.Ready) -> int:
    lost = asyncio.get_running_loop().create_future()
    handover = Handover() if config.outlives_daemon else None

    def on_lost(reason: str) -> None:
        if not lost.done():
            lost.set_result(reason)

    sockets = BrokerSockets(broker, on_lost, on_control=handover.put if handover is not None else None)
    try:
        await serve(channel, sockets, config.user_agent_version, config.heartbeat_interval_ms, stop=lost,
                    handover=handover, ready=ready)
    finally:
        sockets.close()
    if lost.done() and lost.result() != "closed":
        # Without its broker a worker can probe nothing: it ends, and the daemon starts it again
        # (through the zygote that replaced the broker).
        log.error("worker of group %s ends: the netns broker is gone (%s)", config.group, lost.result())
        return EXIT_BROKER_GONE
    return 0


class Handover:
    """New daemons' sockets, as the broker passes them on: `arrived` is done while one waits to be taken."""

    def __init__(self) -> None:
        self._sockets: collections.deque[socket.socket] = collections.deque()
        self.arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def put(self, sock: socket.socket) -> None:
        self._sockets.append(sock)
        if not self.arrived.done():
            self.arrived.set_result(None)

    def take(self) -> socket.socket:
        sock = self._sockets.popleft()
        if not self._sockets:
            self.arrived = asyncio.get_running_loop().create_future()
        return sock


async def serve(channel: AsyncChannel, sockets, user_agent_version: str, heartbeat_ms: int,
                stop: asyncio.Future | None = None, *, handover: "Handover | None" = None,
                ready: worker_pb.Ready | None = None) -> None:
    """The request loop, until Shutdown, `stop` (the broker lost), or the daemon's EOF. With `handover` (the
    worker outlives its daemon) EOF is not the end: the worker waits there for the next daemon's socket."""
    outbox = Outbox(channel)
    group = SandboxRouter(sockets, user_agent_version, outbox.send)
    await Session(channel, outbox, group, heartbeat_ms, stop, handover, ready).run()


class Session:
    """A worker's requests, from whichever daemon is connected: each kind of WorkerRequest has one handler (`HANDLERS`).

    A handler answers on the channel the request came from and returns True when the loop ends (Shutdown).
    Background tasks (the heartbeat, RunOnce attempts) end with the session.
    """

    def __init__(self, channel: AsyncChannel, outbox: Outbox, group: SandboxRouter, heartbeat_ms: int,
                 stop: asyncio.Future | None, handover: "Handover | None", ready: worker_pb.Ready | None) -> None:
        self.channel = channel
        self.outbox = outbox
        self.group = group
        self.heartbeat_ms = heartbeat_ms
        self.stop = stop
        self.handover = handover
        self.ready = ready
        self.background: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        self.spawn(self.send_heartbeats())
        try:
            while True:
                data = await self.next_request()
                if data is None:
                    self.outbox.detach(self.channel)
                    self.channel.close()
                    if self.handover is None or (self.stop is not None and self.stop.done()):
                        break
                    channel = await self.next_daemon()
                    if channel is None:
                        break
                    self.channel = channel
                    continue
                request = worker_pb.WorkerRequest.FromString(data)
                kind = request.WhichOneof("msg")
                handler = self.HANDLERS.get(kind) if kind != "detach" or self.handover is not None else None
                if handler is None:
                    await self.unsupported(request.seq, kind)
                elif await handler(self, request.seq, getattr(request, kind)):
                    break
        finally:
            await self.group.close()
            await self.outbox.flush()  # the last batch of events, to the daemon if one still listens
            for task in list(self.background):
                task.cancel()
            await asyncio.gather(*self.background, return_exceptions=True)

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def reply(self, seq: int, **event) -> None:
        await self.outbox.reply(self.channel, worker_pb.WorkerEvent(seq=seq, **event))

    async def reject(self, seq: int, errors: list[str]) -> None:
        await self.reply(seq, rejected=worker_pb.Rejected(errors=errors))

    # ------------------------------------------------------------------ the handlers, one per request kind

    async def add_sandbox(self, seq: int, msg: worker_pb.AddSandbox) -> None:
        if not msg.sandbox_id:
            await self.reject(seq, ["sandbox_id: Required value"])
            return
        self.group.add_sandbox(msg.sandbox_id, msg.pod_ips)
        await self.reply(seq, ack=worker_pb.Ack())

    async def remove_sandbox(self, seq: int, msg: worker_pb.RemoveSandbox) -> None:
        await self.group.remove_sandbox(msg.sandbox_id)
        await self.reply(seq, ack=worker_pb.Ack())

    async def add_probe(self, seq: int, msg: worker_pb.AddProbe) -> None:
        errors = self.group.check(msg.probe, needs_id=True)  # the spec is trusted: worker_protocol.py says why
        if errors:
            await self.reject(seq, errors)
            return
        await self.reply(seq, ack=worker_pb.Ack())
        await self.group.add_probe(msg.probe)

    async def remove_probe(self, seq: int, msg: worker_pb.RemoveProbe) -> None:
        self.group.remove_probe(msg.sandbox_id, msg.probe_id)
        await self.reply(seq, ack=worker_pb.Ack())

    async def run_once(self, seq: int, msg: worker_pb.RunOnce) -> None:
        errors = run_once_errors(msg) or self.group.check(msg.probe)
        if errors:
            await self.reject(seq, errors)
            return
        self.spawn(self.attempt(self.channel, seq, msg))

    async def heartbeat(self, seq: int, msg: worker_pb.Heartbeat) -> None:
        await self.reply(seq, heartbeat=worker_pb.Heartbeat(unix_ns=time.time_ns(), probes=self.group.probes))

    async def resume(self, seq: int, msg: worker_pb.Resume) -> None:
        snapshot = self.group.snapshot()
        snapshot.dropped_events = self.outbox.take_dropped()
        await self.reply(seq, snapshot=snapshot)

    async def shutdown(self, seq: int, msg: worker_pb.Shutdown) -> bool:
        await self.reply(seq, ack=worker_pb.Ack())
        return True

    async def detach(self, seq: int, msg: worker_pb.Detach) -> None:
        """Only for a worker that outlives its daemon (the loop refuses it otherwise)."""
        # Everything before the ack reached this daemon; everything after waits for the next one.
        await self.reply(seq, ack=worker_pb.Ack())
        self.outbox.detach(self.channel)

    HANDLERS: dict[str, Callable[["Session", int, Any], Awaitable[bool | None]]] = {
        "add_sandbox": add_sandbox, "remove_sandbox": remove_sandbox, "add_probe": add_probe,
        "remove_probe": remove_probe, "run_once": run_once, "heartbeat": heartbeat, "resume": resume,
        "shutdown": shutdown, "detach": detach,
    }

    async def unsupported(self, seq: int, kind: str | None) -> None:
        accepted = [k for k in self.HANDLERS if k != "detach"]
        await self.reject(seq, [f"msg: Unsupported value: {kind!r}: the worker accepts {', '.join(accepted)}"
                                + (" and detach" if self.handover is not None else "")])

    # ------------------------------------------------------------------ background and waits

    async def attempt(self, channel: AsyncChannel, seq: int, run: worker_pb.RunOnce) -> None:
        """A RunOnce's attempt; its report goes to the daemon that asked (`channel`), through the outbox."""
        reg = run.probe
        try:
            prober = self.group.prober(reg.sandbox_id)
        except UnknownSandbox as exc:  # removed since the request was checked
            await self.outbox.reply(channel, worker_pb.WorkerEvent(seq=seq, rejected=worker_pb.Rejected(
                errors=[f"probe.{exc}"])))
            return
        attempt = await prober.run(reg.spec, reg.container.ports, max_tries=run.max_tries,
                                   lifecycle_hook=run.lifecycle_hook)
        report = worker_pb.AttemptReport(probe_id=reg.probe_id)
        report.status.last_attempt.CopyFrom(attempt)  # a one-off attempt: no probe's bookkeeping besides it
        await self.outbox.reply(channel, worker_pb.WorkerEvent(seq=seq, attempt=report))

    async def send_heartbeats(self) -> None:
        """A Heartbeat every heartbeat_ms, unasked, to whichever daemon listens."""
        while True:
            if self.outbox.channel is not None:  # none while no daemon listens: nobody to tell
                try:
                    await self.outbox.channel.send(worker_pb.WorkerEvent(heartbeat=worker_pb.Heartbeat(
                        unix_ns=time.time_ns(), probes=self.group.probes)))
                except OSError:
                    pass  # the daemon is gone; the request loop sees EOF
            await asyncio.sleep(self.heartbeat_ms / 1000)

    async def next_request(self) -> bytes | None:
        """The next request's bytes; None at EOF, once `stop` is done, or when a new daemon's socket came."""
        interrupts = [f for f in (self.stop, self.handover and self.handover.arrived) if f is not None]
        while True:
            try:
                frame = self.channel.take()
            except (ChannelClosed, OSError):
                return None
            if frame is not None:
                return frame
            if any(f.done() for f in interrupts):
                return None
            # No task per request: the channel's own wait, cut short by the interrupts.
            await self.channel.wait(*interrupts)

    async def next_daemon(self) -> AsyncChannel | None:
        """The next daemon's channel, once it has our Ready and what was queued; None when the worker ends."""
        handover = self.handover
        assert handover is not None
        while True:
            await asyncio.wait([f for f in (self.stop, handover.arrived) if f is not None],
                               return_when=asyncio.FIRST_COMPLETED)
            if not handover.arrived.done():
                return None
            new = AsyncChannel(handover.take())
            hello = worker_pb.Ready()
            hello.CopyFrom(self.ready or worker_pb.Ready(pid=os.getpid(), protocol_version=WORKER_PROTOCOL_VERSION))
            hello.adopted = True
            try:
                await new.send(worker_pb.WorkerEvent(ready=hello))
                await self.outbox.attach(new)
                return new
            except OSError:
                new.close()  # that daemon is gone already: wait for the next


def main(argv: list[str] | None = None) -> int:
    """A worker started on its own (tests, tools): the daemon forks its workers from the zygote instead."""
    parser = argparse.ArgumentParser(prog="probe_worker", description="cri-probe-shim probe worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socketpair end speaking the worker protocol")
    parser.add_argument("--broker-fd", type=int, required=True,
                        help="inherited SOCK_SEQPACKET end of the netns broker's channel")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="probe-worker[%(process)d] %(levelname)s %(message)s")
    channel = BlockingChannel(socket.socket(fileno=args.fd))
    try:
        first = worker_pb.WorkerRequest.FromString(channel.recv(timeout=CONFIG_TIMEOUT_S))
    except (TimeoutError, ChannelClosed) as exc:
        log.error("no worker config received: %s", type(exc).__name__)
        return 2
    if first.WhichOneof("msg") != "config":
        log.error("the first frame must be a WorkerConfig, got %s", first.WhichOneof("msg"))
        return 2
    return run(first.config, channel, socket.socket(fileno=args.broker_fd))
