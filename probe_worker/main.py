"""The worker process: start-up order, then the request loop.

Start-up order matters and is the point of this module:
  1. read the WorkerConfig frame (still in the parent's namespace, single thread);
  2. enter the pod netns from the main thread, before any other thread exists;
  3. find the pod IPs if the caller did not pass them;
  4. lower rlimits, drop groups/gid/uid, set no_new_privs, check CapEff is empty;
  5. send Ready, and only then start the event loop.
A RunOnce's max_tries and lifecycle_hook go to the prober as they are.
Every module the worker needs is imported at the top of this file, so nothing
is imported after the drop (the interpreter may live under a directory the
unprivileged uid cannot read). The zygote (shim/zygote.py) calls run() in each
forked child with the config it received.
"""

from __future__ import annotations

import argparse
import asyncio
import encodings.idna  # noqa: F401  hostnames in an explicit probe host need it after the drop
import logging
import os
import socket
import sys
import time

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION, WORKER_GID, WORKER_UID
from probe_api.worker_protocol import validate_registration, validate_run_once
from probe_worker.channel import AsyncChannel, BlockingChannel, ChannelClosed
from probe_worker.manager import ProbeManager
from probe_worker.netns import NetnsError, enter_netns
from probe_worker.pod_ips import discover_pod_ips
from probe_worker.privileges import PrivilegeError, apply_limits, die_with_parent, drop_privileges
from probe_worker.prober import Prober

log = logging.getLogger("probe_worker")

DEFAULT_MAX_MEMORY = 256 << 20
DEFAULT_MAX_FILES = 1024
DEFAULT_HEARTBEAT_MS = 1000
CONFIG_TIMEOUT_S = 30


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
    """Steps 2-4; raises StartError with a message fit for the operator."""
    if not config.netns_path:
        raise StartError("no netns_path in the worker config")
    try:
        inode = enter_netns(config.netns_path)
        pod_ips = list(config.pod_ips)
        if not pod_ips:
            pod_ips = discover_pod_ips()
        apply_limits(config.max_memory_bytes, config.max_open_files)
        if not config.keep_privileges:
            drop_privileges(config.run_as_uid, config.run_as_gid)
        if die_with_parent_process:  # not when forked by the zygote: a worker outlives a zygote crash
            die_with_parent()
    except (NetnsError, PrivilegeError, OSError) as exc:
        raise StartError(str(exc)) from None
    return worker_pb.Ready(pid=os.getpid(), netns_inode=inode, uid=os.getuid(), gid=os.getgid(), pod_ips=pod_ips)


def run(config: worker_pb.WorkerConfig, channel: BlockingChannel, die_with_parent_process: bool = True) -> int:
    """Runs a worker on the channel its config came from; returns the process exit code."""
    config = _with_defaults(config)
    try:
        ready = start(config, die_with_parent_process)
    except StartError as exc:
        log.error("worker for sandbox %s cannot start: %s", config.sandbox_id, exc)
        channel.send(worker_pb.WorkerEvent(fatal=worker_pb.Fatal(message=str(exc))))
        return 2
    prober = Prober(ready.pod_ips, config.user_agent_version)
    channel.send(worker_pb.WorkerEvent(ready=ready))
    asyncio.run(serve(channel.to_async(), prober, config.heartbeat_interval_ms))
    return 0


async def serve(channel: AsyncChannel, prober: Prober, heartbeat_ms: int) -> None:
    manager = ProbeManager(prober, channel.send)
    background: set[asyncio.Task[None]] = set()

    def spawn(coro) -> None:
        task = asyncio.create_task(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    async def heartbeat() -> None:
        while True:
            try:
                await channel.send(worker_pb.WorkerEvent(heartbeat=worker_pb.Heartbeat(
                    unix_ns=time.time_ns(), probes=len(manager))))
            except OSError:
                return  # the daemon is gone; the request loop sees EOF and ends the worker
            await asyncio.sleep(heartbeat_ms / 1000)

    async def run_once(seq: int, run: worker_pb.RunOnce) -> None:
        reg = run.probe
        attempt = await prober.run(reg.spec, reg.container.ports, max_tries=run.max_tries,
                                   lifecycle_hook=run.lifecycle_hook)
        await channel.send(worker_pb.WorkerEvent(seq=seq, attempt=worker_pb.AttemptReport(
            probe_id=reg.probe_id, attempt=attempt)))

    spawn(heartbeat())
    try:
        while True:
            try:
                request = worker_pb.WorkerRequest.FromString(await channel.recv())
            except (ChannelClosed, OSError):
                break
            seq, kind = request.seq, request.WhichOneof("msg")
            if kind in ("add_probe", "run_once"):
                if kind == "add_probe":
                    errors = validate_registration(request.add_probe.probe)
                else:
                    errors = validate_run_once(request.run_once)
                if errors:
                    await channel.send(worker_pb.WorkerEvent(seq=seq, rejected=worker_pb.Rejected(errors=errors)))
                elif kind == "add_probe":
                    await channel.send(worker_pb.WorkerEvent(seq=seq, ack=worker_pb.Ack()))
                    await manager.add(request.add_probe.probe)
                else:
                    spawn(run_once(seq, request.run_once))
            elif kind == "remove_probe":
                manager.remove(request.remove_probe.probe_id)
                await channel.send(worker_pb.WorkerEvent(seq=seq, ack=worker_pb.Ack()))
            elif kind == "heartbeat":
                await channel.send(worker_pb.WorkerEvent(seq=seq, heartbeat=worker_pb.Heartbeat(
                    unix_ns=time.time_ns(), probes=len(manager))))
            elif kind == "shutdown":
                await channel.send(worker_pb.WorkerEvent(seq=seq, ack=worker_pb.Ack()))
                break
            else:
                await channel.send(worker_pb.WorkerEvent(seq=seq, rejected=worker_pb.Rejected(
                    errors=[f"msg: Unsupported value: {kind!r}: the worker accepts add_probe, "
                            "remove_probe, run_once, heartbeat and shutdown"])))
    finally:
        await manager.close()
        for task in list(background):
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe_worker", description="cri-probe-shim per-sandbox probe worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socketpair end speaking the worker protocol")
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
    return run(first.config, channel)
