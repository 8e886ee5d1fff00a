"""Preparing the zygote's memory so that forked workers copy as few pages as possible.

A forked worker shares the zygote's pages until it writes to one; then that page (4 KiB)
is copied into the worker. CPython 3.11 writes to every object it touches (its reference
count, even when the count goes back to where it was), so a worker costs roughly one
page per distinct page holding an object it touches. Measured with uffd write-protection
(first write per page, mapped back to objects), a worker with 3 probes copies ~1100
pages: reference counts of code objects, functions, strings (also through the type
attribute cache), types, tuples, modules and descriptors, plus its own new objects.

Warm-up: run the worker's own code, in the zygote, before any fork. CPython 3.11 writes
into a function's code object during its first calls (the quickening warm-up counter,
then the specializing interpreter's inline caches) and fills lazily built caches on
first use. Done in a forked worker, each of those writes copies a shared page; done once
here, every worker inherits the result. So the zygote runs a short, real session of
`probe_worker.main.serve` over a socketpair: periodic and one-shot TCP, HTTP and gRPC
probes (success and failure, to the pod IP and to loopback) against servers it runs
itself on 127.0.0.1, heartbeats, removal and shutdown. Nothing leaves the loopback
interface, no thread is started, and every socket is closed before it returns.

Relocation: the code objects a worker runs are scattered among the cold objects of their
modules, so touching ~900 of them copied ~350 pages. The zygote profiles one warm-up run,
then gives every function running that code a fresh copy (`func.__code__ = code.replace()`)
allocated in one go, so the hot code fills ~110 pages of its own (-0.5 MiB per worker).
Copying functions or constants the same way did not pay (their pages hold other touched
objects too) and would change object identities; code objects are safe to replace.

Hole filling: pymalloc hands out free blocks of partly used pools first. Free blocks
left in the zygote's pools (by imports and the warm-up) would take a worker's first
allocations, and each would copy a shared page to store a few bytes. Filling them
with objects that stay alive in the zygote sends a worker's allocations to fresh
pools instead, where they are packed together. The same holds for glibc's free
chunks, for the allocations above pymalloc's 512 bytes.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import re
import socket
import sys
import threading
import types
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION
from probe_worker import main as worker_main
from probe_worker import netns, privileges
from probe_worker.channel import AsyncChannel, BlockingChannel
from probe_worker.netns import _thread_count
from probe_worker.pod_ips import discover_pod_ips
from probe_worker.privileges import effective_capabilities
from probe_worker.socket_source import BrokerSockets
from probe_zygote.netns_broker import NetnsBroker

# More than the 8 calls after which 3.11 quickens a function, for every path below.
ROUNDS = 12
TIMEOUT_S = 10.0
HEARTBEAT_MS = 10
_HTTP_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_SERVING = b"\x00\x00\x00\x00\x02\x08\x01"  # gRPC frame: HealthCheckResponse{status: SERVING}


class _HttpTarget(asyncio.Protocol):
    """Answers any request with 200 "ok" once the request head is complete."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.head = b""

    def data_received(self, data: bytes) -> None:
        self.head += data
        if b"\r\n\r\n" in self.head:
            self.transport.write(_HTTP_RESPONSE)
            self.transport.close()


class _GrpcHealthTarget(asyncio.Protocol):
    """grpc.health.v1.Health/Check answering SERVING, on h2's server side, with the frames
    grpcio's server sends besides the answer (a connection WINDOW_UPDATE and a BDP PING)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(1 << 20)
        self.h2.ping(b"warm-up!")
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.h2.send_headers(event.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                self.h2.send_data(event.stream_id, _SERVING)
                self.h2.send_headers(event.stream_id, [("grpc-status", "0"), ("grpc-message", "")], end_stream=True)
        self.transport.write(self.h2.data_to_send())


def _specs(http_port: int, grpc_port: int, closed_port: int) -> list[spec_pb.ProbeSpec]:
    def timing(**handler) -> spec_pb.ProbeSpec:
        # The pod IP (the default target) is 127.0.0.1 here: both targets' code paths run.
        target = spec_pb.LOOPBACK if handler.pop("loopback", False) else spec_pb.POD_IP
        return spec_pb.ProbeSpec(target=target, period_ms=10, timeout_ms=1000, **handler)

    return [
        timing(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=http_port))),
        timing(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=closed_port)), loopback=True),
        timing(http_get=spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(number=http_port))),
        timing(http_get=spec_pb.HTTPGetAction(path="/", port=spec_pb.PortRef(number=closed_port)), loopback=True),
        timing(grpc=spec_pb.GRPCAction(port=grpc_port)),
        timing(grpc=spec_pb.GRPCAction(port=grpc_port), loopback=True),
        # No gRPC probe of a closed port: like grpc-go, it would retry for its whole timeout.
    ]


async def _session(user_agent_version: str) -> None:
    loop = asyncio.get_running_loop()
    http_server = await loop.create_server(_HttpTarget, "127.0.0.1", 0)
    grpc_server = await loop.create_server(_GrpcHealthTarget, "127.0.0.1", 0)
    worker_end, daemon_end = socket.socketpair()
    # As in a forked worker: Ready on the blocking channel, then the same socket to asyncio.
    worker_channel = BlockingChannel(worker_end)
    worker_channel.send(worker_pb.WorkerEvent(ready=worker_pb.Ready(pid=os.getpid())))
    # The sockets come from a broker, as in a worker: a broker of the zygote's own netns, served on this loop.
    broker = NetnsBroker()
    broker_end, sockets_end = broker.channel_pair()
    broker.attach(0, broker_end)
    broker.assign(0, "warm", "/proc/self/ns/net")
    loop.add_reader(broker_end.fileno(), broker.serve_channel, 0)
    sockets = BrokerSockets(sockets_end)
    closed = socket.socket()  # bound, never listening: connects to it are refused
    try:
        closed.bind(("127.0.0.1", 0))
        specs = _specs(http_server.sockets[0].getsockname()[1], grpc_server.sockets[0].getsockname()[1],
                       closed.getsockname()[1])
        daemon = AsyncChannel(daemon_end)
        worker = asyncio.create_task(worker_main.serve(
            worker_channel.to_async(), sockets, user_agent_version, HEARTBEAT_MS))
        seq = 0

        async def request(**msg) -> None:
            nonlocal seq
            seq += 1
            await daemon.send(worker_pb.WorkerRequest(seq=seq, **msg))

        await request(add_sandbox=worker_pb.AddSandbox(sandbox_id="warm", pod_ips=["127.0.0.1"]))
        for i, spec in enumerate(specs):
            reg = worker_pb.ProbeRegistration(probe_id=f"warm-{i}", sandbox_id="warm", type=spec_pb.READINESS,
                                              spec=spec, start_now=True,
                                              container=worker_pb.ContainerRef(id="warm", name="warm"))
            await request(add_probe=worker_pb.AddProbe(probe=reg))
            for _ in range(ROUNDS):
                await request(run_once=worker_pb.RunOnce(probe=reg))
        attempts: dict[str, int] = {}
        while len(attempts) < len(specs) or min(attempts.values()) < ROUNDS:
            event = worker_pb.WorkerEvent.FromString(await daemon.recv())
            if event.WhichOneof("msg") == "rejected":
                raise RuntimeError(f"warm-up probe rejected: {list(event.rejected.errors)}")
            if event.WhichOneof("msg") == "attempt" and event.seq == 0:
                attempts[event.attempt.probe_id] = attempts.get(event.attempt.probe_id, 0) + 1
            if event.WhichOneof("msg") == "attempt" and len(attempts) == len(specs):
                await request(heartbeat=worker_pb.Heartbeat())
        for i in range(len(specs)):
            await request(remove_probe=worker_pb.RemoveProbe(probe_id=f"warm-{i}", sandbox_id="warm"))
        await request(remove_sandbox=worker_pb.RemoveSandbox(sandbox_id="warm"))
        await request(shutdown=worker_pb.Shutdown())
        await worker
    finally:
        loop.remove_reader(broker_end.fileno())
        sockets.close()
        broker.close()
        closed.close()
        worker_end.close()
        daemon_end.close()
        http_server.close()
        grpc_server.close()
        await http_server.wait_closed()
        await grpc_server.wait_closed()


def _start_path() -> None:
    """The read-only part of a worker's start-up (the rest changes the process: not here)."""
    # ctypes makes a function object on a library's first attribute lookup and keeps it:
    # made here, it is shared; made in each worker, it would cost each worker pages.
    for library in (netns._libc, privileges._libc):
        for name in ("setns", "unshare", "prctl", "capset"):
            getattr(library, name, None)
    for _ in range(ROUNDS):
        discover_pod_ips()  # the zygote's own netns: a read-only netlink dump
        worker_main._with_defaults(worker_pb.WorkerConfig(group="warm"))
        threading.current_thread()
        _thread_count()
        os.stat("/proc/thread-self/ns/net")
        effective_capabilities()
        for event in (worker_pb.WorkerEvent(ready=worker_pb.Ready(pid=os.getpid())),
                      worker_pb.WorkerEvent(fatal=worker_pb.Fatal(message="warm-up")),
                      worker_pb.WorkerEvent(seq=1, rejected=worker_pb.Rejected(errors=["warm-up"]))):
            worker_pb.WorkerEvent.FromString(event.SerializeToString()).WhichOneof("msg")


def warm_up(user_agent_version: str = KUBELET_VERSION) -> None:
    _start_path()
    asyncio.run(asyncio.wait_for(_session(user_agent_version), TIMEOUT_S))


def executed_code(run: Callable[[], None]) -> list[types.CodeType]:
    """Runs `run` under a profiler; the code of every Python frame it entered, in first-call order."""
    seen: dict[int, types.CodeType] = {}

    def record(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            seen.setdefault(id(frame.f_code), frame.f_code)

    sys.setprofile(record)
    try:
        run()
    finally:
        sys.setprofile(None)
    return list(seen.values())


def relocate_code(hot: list[types.CodeType]) -> list[types.CodeType]:
    """Gives every function running code in `hot` a fresh copy of it; returns the copies.

    The copies are allocated now, one after the other, so they fill a few pages
    instead of being scattered among the cold objects of their modules.
    """
    hot_ids = {id(code) for code in hot}
    copies: dict[int, types.CodeType] = {}  # by id: code objects compare (and hash) by value

    def copy(code: types.CodeType) -> types.CodeType:
        if id(code) not in copies:
            consts = tuple(copy(c) if isinstance(c, types.CodeType) and id(c) in hot_ids else c
                           for c in code.co_consts)
            copies[id(code)] = code.replace(co_consts=consts)
        return copies[id(code)]

    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and id(obj.__code__) in hot_ids:
            obj.__code__ = copy(obj.__code__)
    return list(copies.values())


_BALLAST: list[object] = []  # the filling: alive (and frozen) for the zygote's lifetime
_STATS_ROW = re.compile(rb"^\s*\d+\s+(\d+)\s+\d+\s+\d+\s+(\d+)\s*$")
_BYTES_OVERHEAD = sys.getsizeof(b"")  # header + trailing NUL of a bytes object


def pymalloc_free_blocks() -> dict[int, int]:
    """Free blocks per block size in pymalloc's used pools (parsed from sys._debugmallocstats)."""
    out = os.memfd_create("mallocstats")
    saved = os.dup(2)
    try:
        os.dup2(out, 2)  # the statistics are written by C to stderr
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    try:
        os.lseek(out, 0, os.SEEK_SET)
        text = b""
        while chunk := os.read(out, 65536):
            text += chunk
    finally:
        os.close(out)
    return {int(m[1]): int(m[2]) for line in text.splitlines() if (m := _STATS_ROW.match(line))}


def fill_pool_holes(passes: int = 2) -> int:
    """Allocates one object per free block (bytes sized to the block); returns how many."""
    filled = 0
    for _ in range(passes):  # the first pass allocates too (the list grows): a second tops up
        for size, free in pymalloc_free_blocks().items():
            if size - _BYTES_OVERHEAD >= 2:  # smaller classes hold no bytes object (1-byte ones are cached)
                _BALLAST.extend(bytes(size - _BYTES_OVERHEAD) for _ in range(free))
                filled += free
    return filled


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _MallInfo2
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_MALLOC_BALLAST: list[int] = []
_TCACHE_COUNT, _TCACHE_MAX = 7, 1032  # glibc's per-thread cache: 7 chunks per size up to 1032 bytes


def malloc_free_bytes() -> int:
    """Bytes in glibc's free chunks of the main heap, outside the top chunk (and the tcache)."""
    info = _libc.mallinfo2()
    return info.fordblks - info.keepcost


def fill_malloc_holes() -> int:
    """Takes glibc's free chunks (never freed): a worker's malloc()s then go to fresh memory."""
    taken = 0
    for size in range(24, _TCACHE_MAX + 1, 16):  # the tcache is invisible to mallinfo2: drain it blindly
        _MALLOC_BALLAST.extend(_libc.malloc(size) for _ in range(_TCACHE_COUNT + 1))
    size = 1 << 16
    while size >= 32:
        before = malloc_free_bytes()
        chunk = _libc.malloc(size)
        if malloc_free_bytes() < before:  # served from a hole: keep it, try the same size again
            _MALLOC_BALLAST.append(chunk)
            taken += size
        else:  # from the top chunk: no hole this big is left
            _libc.free(chunk)
            size //= 2
    return taken
