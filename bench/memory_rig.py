#!/usr/bin/env python3
"""The measured setup of bench/worker_memory.py: loopback-only network namespaces (the pod IP on `lo`), one target
process outside the measured set that serves HTTP, TCP and gRPC health in every one of them, and the daemon in
embedded mode with a client that registers each sandbox's three probes and waits for their successes.

Run as a script, this file is the target process: it reads namespace names on stdin, one a line, and after each
blank line listens in the new ones and prints READY (sockets keep the namespace they were made in, so one process
serves them all).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.children import end  # noqa: E402

POD_IP = "198.18.0.2"  # benchmarking range (RFC 2544); on each namespace's own loopback
HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 8081, 8082
CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 60.0
DAEMON_STOP_TIMEOUT_S = 30.0


class Namespaces:
    """Loopback-only netns named like the tests' (cps-bench-PID-i), so a stale sweep finds them."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def grow(self, count: int) -> list[str]:
        added = []
        while len(self.names) < count:
            name = f"cps-bench-{os.getpid()}-{len(self.names)}"
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            self.names.append(name)
            added.append(name)
            for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{POD_IP}/32", "dev", "lo"]):
                subprocess.run(["ip", "-n", name, *cmd], check=True, capture_output=True)
        return added

    def destroy(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.names.clear()


def _setns(fd: int) -> None:
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


def serve_targets() -> None:
    """Target process: reads namespace names on stdin, one a line; after each blank line it
    listens in the new ones and prints READY. HTTP and TCP on asyncio, gRPC health on grpcio."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    class Http(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.head = transport, b""

        def data_received(self, data):
            self.head += data
            if b"\r\n\r\n" in self.head:
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                self.transport.close()

    class Tcp(asyncio.Protocol):
        def connection_made(self, transport):
            transport.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        servers = []  # grpcio binds a port (in this thread's netns) when it is added, none once started
        pending: list[str] = []
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip():
                pending.append(line.strip())
                continue
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
            for name in pending:
                fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
                try:
                    _setns(fd)
                    for protocol, port in ((Http, HTTP_PORT), (Tcp, TCP_PORT)):
                        await loop.create_server(protocol, sock=socket.create_server(("0.0.0.0", port), backlog=1024))
                    if server.add_insecure_port(f"0.0.0.0:{GRPC_PORT}") != GRPC_PORT:
                        raise OSError(f"grpc could not listen in {name}")
                finally:
                    _setns(home)
                    os.close(fd)
            server.start()
            servers.append(server)
            pending.clear()
            print("READY", flush=True)

    asyncio.run(main())


class Targets:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)

    def add(self, names: list[str]) -> None:
        self.proc.stdin.write("".join(f"{n}\n" for n in names) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the target process failed (see its stderr)")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# --- the daemon ------------------------------------------------------------------------------

class Daemon:
    """`probe-shim serve` in embedded mode in a private directory, and a client to it."""

    def __init__(self, workdir: str, env: dict[str, str] | None = None) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from cri_proto import probe_service_pb2_grpc as service_grpc

        sock = f"{workdir}/shim.sock"
        self.log = open(f"{workdir}/daemon.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none", "--listen", f"unix://{sock}",
             "--state-dir", f"{workdir}/state", "--metrics-listen", "127.0.0.1:0"],
            cwd=REPO_ROOT, env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), (env or {}).get("PYTHONPATH", "")) if p)},
            stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"unix://{sock}", options=[("grpc.use_local_subchannel_pool", 1)])
        health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S,
                                                       wait_for_ready=True)
        self.stub = service_grpc.ProbeServiceStub(self.channel)

    def run_probes(self, sandbox: str, kinds: Iterable[str] = ("http", "tcp", "grpc"), period_ms: int = 1000) -> list[str]:
        from cri_proto import probe_service_pb2 as service_pb
        from cri_proto import probe_spec_pb2 as spec_pb

        handlers = {
            "http": {"http_get": spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(number=HTTP_PORT))},
            "tcp": {"tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=TCP_PORT))},
            "grpc": {"grpc": spec_pb.GRPCAction(port=GRPC_PORT)},
        }
        return [self.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=sandbox, container_name=kind, type=spec_pb.READINESS,
            spec=spec_pb.ProbeSpec(period_ms=period_ms, timeout_ms=1000, **handler)), timeout=30).probe_id
            for kind, handler in handlers.items() if kind in kinds]

    def wait_for_successes(self, probe_ids: set[str], successes: int, timeout_s: float) -> int:
        """Until every probe in probe_ids has `successes` successful attempts (polling: a bench, not a
        test); returns how many of their attempts did not succeed (a loaded machine times some out)."""
        from cri_proto import probe_service_pb2 as service_pb

        deadline = time.monotonic() + timeout_s
        while True:
            probes = [p for p in self.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=30).probes
                      if p.probe_id in probe_ids]
            behind = [p for p in probes if p.status.totals.success < successes]
            if not behind:
                return sum(p.status.totals.warning + p.status.totals.failure + p.status.totals.unknown for p in probes)
            if time.monotonic() > deadline:
                p = behind[0]
                raise TimeoutError(f"{len(behind)} probes still below {successes} successes, e.g. {p.container_name} "
                                   f"in {p.pod_sandbox_id}: {p.status.last_attempt.output}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.channel.close()
        end(self.proc, DAEMON_STOP_TIMEOUT_S)
        self.log.close()


if __name__ == "__main__":
    serve_targets()
