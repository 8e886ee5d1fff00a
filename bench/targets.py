#!/usr/bin/env python3
"""The benchmark's probe targets: ONE process serving HTTP, TCP and gRPC health in every sandbox.

A server process per sandbox would cost the machine 250 interpreters at the largest
scale, and their CPU would drown what is measured. Instead this process enters each
sandbox's network namespace in turn (setns on /var/run/netns/NAME, from the main
thread, which it then returns to its own namespace), creates its listening sockets
there (a socket stays in the namespace it was created in), and serves all of them
from one asyncio loop. Answers come from bench/target_protocols.py.

Driven over stdin/stdout, one line each way:
    add NAME FLIP_S     listen in netns NAME; FLIP_S > 0 flips /healthz between 200 and 500
                        every FLIP_S seconds (a phase per sandbox spreads the flips)  -> "added NAME"
    stats               -> "stats {json}": requests served per kind, and bad ones
EOF on stdin or SIGTERM ends it. `TargetProcess` is the suite's side of that pipe.

    python bench/targets.py [--http-port 8080] [--tcp-port 8081] [--grpc-port 9090]   # root
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import resource
import signal
import socket
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))

import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.events  # noqa: E402
import h2.exceptions  # noqa: E402

from bench import target_protocols as proto  # noqa: E402
from bench.children import end, read_line, spawn  # noqa: E402

HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 8081, 9090
CLONE_NEWNET = 0x40000000
REPLY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_libc = ctypes.CDLL(None, use_errno=True)


# ---------------------------------------------------------------- the server process


@dataclass
class Counters:
    http: int = 0
    tcp: int = 0
    grpc: int = 0
    bad: int = 0


@dataclass
class Site:
    """One sandbox's endpoints and its health schedule."""
    name: str
    flip_s: float
    phase_s: float
    started: float = field(default_factory=time.monotonic)

    def healthy(self) -> bool:
        return proto.healthy_at(time.monotonic() - self.started, self.flip_s, self.phase_s)


class HttpTarget(asyncio.Protocol):
    def __init__(self, site: Site, counters: Counters) -> None:
        self.site, self.counters = site, counters
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.head += data
        try:
            path = proto.request_path(self.head)
        except proto.BadRequest:
            self.counters.bad += 1
            self.transport.close()
            return
        if path is None:
            return
        self.counters.http += 1
        self.transport.write(proto.http_answer(path, self.site.healthy()))
        self.transport.close()  # Connection: close, as the probe asked


class TcpTarget(asyncio.Protocol):
    """Accepts and closes: a TCP probe only needs the handshake."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.counters.tcp += 1
        transport.close()


class GrpcTarget(asyncio.Protocol):
    """A gRPC server of the health service over h2: SETTINGS first, then one answer per stream."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.streams: dict[int, tuple[str, bytearray]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.conn.initiate_connection()  # the client waits for our SETTINGS before calling
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            for event in self.conn.receive_data(data):
                self._on(event)
        except h2.exceptions.ProtocolError:
            self.counters.bad += 1
            self.transport.close()
            return
        self.transport.write(self.conn.data_to_send())

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            path = dict(event.headers).get(":path", "")
            self.streams[event.stream_id] = (path, bytearray())
        elif isinstance(event, h2.events.DataReceived):
            self.streams.get(event.stream_id, ("", bytearray()))[1].extend(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id in self.streams:
            path, body = self.streams.pop(event.stream_id)
            self._answer(event.stream_id, path, bytes(body))
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.transport.close()

    def _answer(self, stream_id: int, path: str, body: bytes) -> None:
        status, message = proto.health_check(path, body)
        self.counters.grpc += 1
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        if message is None:  # trailers-only response
            self.conn.send_headers(stream_id, [*headers, ("grpc-status", str(status))], end_stream=True)
            return
        self.conn.send_headers(stream_id, headers)
        self.conn.send_data(stream_id, message)
        self.conn.send_headers(stream_id, [("grpc-status", str(status))], end_stream=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")


def listeners_in(netns_path: str, ports: tuple[int, int, int]) -> list[socket.socket]:
    """Listening sockets (dual-stack ::) created inside the netns; the calling thread comes back home.

    setns moves only the calling thread, and nothing else runs on this loop meanwhile.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    socks: list[socket.socket] = []
    try:
        _setns(target)
        try:
            for port in ports:
                sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                socks.append(sock)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("::", port))
                sock.listen(4096)
                sock.setblocking(False)
        finally:
            _setns(home)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    finally:
        os.close(target)
        os.close(home)
    return socks


class TargetServer:
    def __init__(self, ports: tuple[int, int, int]) -> None:
        self.ports = ports
        self.counters = Counters()
        self.servers: list[asyncio.AbstractServer] = []

    async def add(self, name: str, flip_s: float) -> None:
        loop = asyncio.get_running_loop()
        # A phase from the name: reproducible, and different for each sandbox.
        site = Site(name, flip_s, phase_s=(zlib.crc32(name.encode()) % 1000) / 1000 * flip_s)
        http_sock, tcp_sock, grpc_sock = listeners_in(f"/var/run/netns/{name}", self.ports)
        self.servers.append(await loop.create_server(lambda: HttpTarget(site, self.counters), sock=http_sock))
        self.servers.append(await loop.create_server(lambda: TcpTarget(self.counters), sock=tcp_sock))
        self.servers.append(await loop.create_server(lambda: GrpcTarget(self.counters), sock=grpc_sock))

    async def command(self, line: str) -> str:
        words = line.split()
        if words[:1] == ["add"] and len(words) == 3:
            await self.add(words[1], float(words[2]))
            return f"added {words[1]}"
        if words == ["stats"]:
            return "stats " + json.dumps(self.counters.__dict__)
        return f"error unknown command {line!r}"


async def serve(ports: tuple[int, int, int]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = TargetServer(ports)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY 0", flush=True)

    async def commands() -> None:
        while line := (await reader.readline()).decode():
            try:
                reply = await server.command(line.strip())
            except OSError as exc:
                reply = f"error {exc}"
            print(reply, flush=True)
        stop.set()

    task = asyncio.create_task(commands())
    await stop.wait()
    task.cancel()
    for s in server.servers:
        s.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http-port", type=int, default=HTTP_PORT)
    parser.add_argument("--tcp-port", type=int, default=TCP_PORT)
    parser.add_argument("--grpc-port", type=int, default=GRPC_PORT)
    args = parser.parse_args()
    # 3 listeners per sandbox plus connections in flight: 250 sandboxes need more than 1024 fds.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve((args.http_port, args.tcp_port, args.grpc_port)))
    return 0


# ---------------------------------------------------------------- the suite's side


class TargetProcess:
    """Starts bench/targets.py (its own session: a Ctrl-C reaches only the suite, which stops it in order)."""

    def __init__(self) -> None:
        self.proc = spawn([sys.executable, str(Path(__file__).resolve())])
        try:
            self._expect("READY")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _expect(self, prefix: str) -> str:
        line = read_line(self.proc, REPLY_TIMEOUT_S) or ""
        if not line.startswith(prefix):
            raise RuntimeError(f"bench/targets.py: expected {prefix!r}, got {line.strip()!r}")
        return line.strip()

    def _ask(self, line: str, prefix: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._expect(prefix)

    def add(self, netns_name: str, flip_s: float = 0.0) -> None:
        self._ask(f"add {netns_name} {flip_s}", "added")

    def stats(self) -> dict[str, int]:
        return json.loads(self._ask("stats", "stats").split(" ", 1)[1])

    def stop(self) -> None:
        end(self.proc, STOP_TIMEOUT_S)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


if __name__ == "__main__":
    sys.exit(main())
