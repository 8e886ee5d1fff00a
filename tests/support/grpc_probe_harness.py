"""The gRPC probe executor's test harness: test servers run as subprocesses on loopback, a spec, one attempt.

Shared by tests/test_grpc_probe*.py (real servers, scripted HTTP/2 servers, through a worker in a pod netns)."""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
from pathlib import Path

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import KUBELET_VERSION
from probe_worker.attempt import AttemptContext, Endpoint
from probe_worker.deadline import AttemptDeadline
from probe_worker.probes.grpc import executor as grpc_probe

SERVERS = Path(__file__).resolve().parent / "servers"
REPO_ROOT = SERVERS.parent.parent
UA = f"kube-probe/{KUBELET_VERSION}"


class LocalServer:
    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVERS / script), "--host", "127.0.0.1", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"{script} {args} did not start: {line!r}")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def grpc_spec(port: int, service: str | None = None, timeout_ms: int = 1000, mode: int = spec_pb.PLAINTEXT):
    action = spec_pb.GRPCAction(port=port, mode=mode)
    if service is not None:
        action.service = service
    return spec_pb.ProbeSpec(grpc=action, timeout_ms=timeout_ms)


async def run_probe(port: int, service: str | None = None, timeout: float = 1.0, host: str = "127.0.0.1",
                    mode: int = spec_pb.PLAINTEXT):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    timer = AttemptDeadline(deadline)  # the attempt's one timer, as the prober gives it (probe_worker/deadline.py)
    ctx = AttemptContext(deadline=deadline, timeout_ns=int(timeout * 1e9), user_agent=UA, timer=timer)
    started = loop.time()
    try:
        outcome = await grpc_probe.probe(grpc_spec(port, service, mode=mode), Endpoint(host, (host,), port), ctx)
    finally:
        timer.close()
    return outcome, loop.time() - started, ctx.trace.phases


def probe_once(port: int, service: str | None = None, timeout: float = 1.0, mode: int = spec_pb.PLAINTEXT):
    return asyncio.run(run_probe(port, service, timeout, mode=mode))


def phase_names(phases) -> list[str]:
    return [p.name for p in phases]


def refused_port() -> socket.socket:
    """A bound, never-listening socket: its port refuses connections and cannot be reused meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock
