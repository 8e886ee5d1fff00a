#!/usr/bin/env python3
"""CPU per unary call of three gRPC servers answering a 40-byte message, at a paced rate.

    python3 servers.py [--rate 100] [--calls 1000]          # from anywhere; imports the checkout two levels up

Each server runs in a process of its own on a unix socket (grpc's EventEngine experiments off, as the daemon runs
grpc): grpcio's `grpc.aio.server`, a server on python-hyper's h2 state machine, and the daemon's own
(shim/rpc). The client (sync grpcio, one call at a time, paced) is another process; the server's CPU is read
from /proc before and after. Rounds alternate the servers so the machine's load hits them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = "-event_engine_client,-event_engine_listener"
RESPONSE = b"x" * 40


class _Echo:
    def service(self, details):
        import grpc

        async def answer(request, context):
            return RESPONSE

        return grpc.unary_unary_rpc_method_handler(answer)


async def _serve_grpcio(path: str) -> None:
    import grpc
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_Echo()])
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _serve_lean(path: str) -> None:
    from shim.rpc.server import Server
    server = Server()
    server.add_generic_rpc_handlers([_Echo()])
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _serve_h2(path: str) -> None:
    import h2.config
    import h2.connection
    import h2.events

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
            self.h2.initiate_connection()
            transport.write(self.h2.data_to_send())

        def data_received(self, data):
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    sid = event.stream_id
                    self.h2.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
                    self.h2.send_data(sid, b"\0" + struct.pack(">I", len(RESPONSE)) + RESPONSE)
                    self.h2.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
            self.transport.write(self.h2.data_to_send())

    if os.path.exists(path):
        os.unlink(path)
    server = await asyncio.get_running_loop().create_unix_server(Protocol, path)
    print("ready", flush=True)
    await server.serve_forever()


SERVERS = {"grpcio": _serve_grpcio, "h2": _serve_h2, "lean": _serve_lean}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(name: str, rate: float, calls: int, workdir: str) -> tuple[float, float]:
    import grpc
    path = f"{workdir}/{name}.sock"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", name, path], stdout=subprocess.PIPE,
                            env={**os.environ, "GRPC_EXPERIMENTS": EXPERIMENTS, "PYTHONPATH": str(ROOT)})
    try:
        proc.stdout.readline()
        with grpc.insecure_channel(f"unix://{path}") as channel:
            call = channel.unary_unary("/runtime.v1.RuntimeService/Version")
            for _ in range(200):
                call(b"abc", timeout=10)
            before, start, latencies = _cpu_s(proc.pid), time.perf_counter(), []
            for n in range(calls):
                began = time.perf_counter()
                call(b"abc", timeout=10)
                latencies.append(time.perf_counter() - began)
                if (pause := start + (n + 1) / rate - time.perf_counter()) > 0:
                    time.sleep(pause)
            cpu_ms = 1000 * (_cpu_s(proc.pid) - before) / calls
    finally:
        proc.kill()
        proc.wait()
    return cpu_ms, 1000 * sorted(latencies)[calls // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", nargs=2, metavar=("SERVER", "PATH"))
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(SERVERS[args.serve[0]](args.serve[1]))
        return
    import tempfile
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    with tempfile.TemporaryDirectory(prefix="grpc-servers-") as workdir:
        for round_ in range(args.rounds):
            for name in SERVERS:
                cpu_ms, median_ms = measure(name, args.rate, args.calls, workdir)
                print(f"round {round_ + 1} {name:7s} server CPU {cpu_ms:.3f} ms/call, latency median {median_ms:.3f} ms",
                      flush=True)


if __name__ == "__main__":
    main()
