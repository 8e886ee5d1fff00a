#!/usr/bin/env python3
"""The raw-socket floor: the least a probe of each kind can cost, measured from inside the pod netns.

Runs inside the sandbox (`ip netns exec NAME python bench/floor.py ...`) against the same
servers and address the worker probes, and does only what the protocol needs, with
plain asyncio socket calls: HTTP = connect, send the kubelet's request, read the whole
response to EOF; TCP = connect, close; gRPC = connect, HTTP/2 preface and SETTINGS,
one health Check (h2), read to the trailers. Sockets close with SO_LINGER {1, 0} like
the worker's, so the ratio compares the engine's overhead and not two ways of closing.

Driven over stdin/stdout: after `READY 0`, each line `KIND COUNT` (http, tcp or grpc)
answers one JSON list of COUNT durations in milliseconds. `FloorProcess` is the
suite's side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))

import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.events  # noqa: E402

from bench.children import end, read_line, spawn  # noqa: E402
from bench.target_protocols import CHECK_PATH, grpc_frame  # noqa: E402

KINDS = ("http", "tcp", "grpc")
REPLY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
_LINGER_RST = struct.pack("ii", 1, 0)
# HealthCheckRequest{service: ""} serializes to nothing.
_CHECK_BODY = grpc_frame(b"")


def http_request(host_port: str, path: str) -> bytes:
    """The kubelet's probe request (what the worker sends), byte for byte."""
    return (f"GET {path} HTTP/1.1\r\nHost: {host_port}\r\nUser-Agent: kube-probe/1.37\r\n"
            f"Accept: */*\r\nConnection: close\r\n\r\n").encode()


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _connect(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    return sock


async def http_once(host: str, port: int, request: bytes) -> None:
    loop = asyncio.get_running_loop()
    sock = await _connect(host, port)
    try:
        await loop.sock_sendall(sock, request)
        response = b""
        while chunk := await loop.sock_recv(sock, 65536):
            response += chunk
    finally:
        sock.close()
    if not response.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"floor: unexpected HTTP response {response[:60]!r}")


async def tcp_once(host: str, port: int) -> None:
    (await _connect(host, port)).close()


async def grpc_once(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    sock = await _connect(host, port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    try:
        conn.initiate_connection()
        await loop.sock_sendall(sock, conn.data_to_send())
        settled = ended = False
        status = None
        while not ended:
            data = await loop.sock_recv(sock, 65536)
            if not data:
                raise RuntimeError("floor: gRPC server closed the connection")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged) and not settled:
                    settled = True  # like grpc-go, call only once the server's SETTINGS arrived
                    stream = conn.get_next_available_stream_id()
                    conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", CHECK_PATH),
                                               (":authority", join_host_port(host, port)),
                                               ("content-type", "application/grpc"), ("te", "trailers")])
                    conn.send_data(stream, _CHECK_BODY, end_stream=True)
                elif isinstance(event, h2.events.TrailersReceived):
                    status = dict(event.headers).get("grpc-status")
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            await loop.sock_sendall(sock, conn.data_to_send())
        if status != "0":
            raise RuntimeError(f"floor: gRPC health Check answered grpc-status {status}")
        conn.close_connection()
        sock.send(conn.data_to_send())
    finally:
        sock.close()


async def timed(kind: str, count: int, args: argparse.Namespace) -> list[float]:
    request = http_request(join_host_port(args.host, args.http_port), args.path)
    once = {"http": lambda: http_once(args.host, args.http_port, request),
            "tcp": lambda: tcp_once(args.host, args.tcp_port),
            "grpc": lambda: grpc_once(args.host, args.grpc_port)}[kind]
    out = []
    for _ in range(count):
        begin = time.perf_counter_ns()
        await once()
        out.append((time.perf_counter_ns() - begin) / 1e6)
    return out


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY 0", flush=True)
    while line := (await reader.readline()).decode():
        kind, count = line.split()
        print(json.dumps(await timed(kind, int(count), args)), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--tcp-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--path", default="/healthz")
    asyncio.run(serve(parser.parse_args()))
    return 0


class FloorProcess:
    """bench/floor.py inside a netns, in its own session (the suite stops it)."""

    def __init__(self, netns_name: str, host: str, ports: tuple[int, int, int], path: str = "/healthz") -> None:
        http, tcp, grpc = ports
        self.proc = spawn(
            ["ip", "netns", "exec", netns_name, sys.executable, str(Path(__file__).resolve()), "--host", host,
             "--http-port", str(http), "--tcp-port", str(tcp), "--grpc-port", str(grpc), "--path", path])
        try:
            self._line("READY")
        except BaseException:
            self.stop()
            raise

    def _line(self, prefix: str = "") -> str:
        line = read_line(self.proc, REPLY_TIMEOUT_S) or ""
        if not line or not line.startswith(prefix):
            raise RuntimeError(f"bench/floor.py: expected {prefix or 'a reply'!r}, got {line.strip()!r}")
        return line

    def measure(self, kind: str, count: int) -> list[float]:
        self.proc.stdin.write(f"{kind} {count}\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def stop(self) -> None:
        end(self.proc, STOP_TIMEOUT_S, ask=self.proc.stdin.close)  # EOF ends it
        if not self.proc.stdout.closed:
            self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
