"""The benchmark's moving parts and their teardown: a daemon with /metrics, sandboxes, probe specs.

Every scenario builds what it needs inside a contextlib.ExitStack, so the daemon,
the target process, the floor process and every network namespace are stopped and
removed when the scenario ends, fails, or is interrupted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from bench.procstats import zygote_pid
from bench.targets import GRPC_PORT, HTTP_PORT, TCP_PORT, TargetProcess
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess
from tests.support.netns_env import PodNetns

PORTS = (HTTP_PORT, TCP_PORT, GRPC_PORT)


class Unavailable(Exception):
    """What this machine lacks for a scenario (containerd, a kubelet): the scenario is reported skipped with it."""


def unavailable(reason: str) -> NoReturn:
    """The `unavailable` callback of tests/support's rigs (running_containerd), for a scenario: raises Unavailable."""
    raise Unavailable(reason)
# Generous limits: the suite registers 3 probes in each of 250 sandboxes and 60 in one.
CONFIG_TOML = "max_probes_per_sandbox = 1024\nmax_probes_total = 8192\n"


class BenchDaemon:
    """`probe-shim serve` (embedded mode unless told otherwise), traces to nowhere, /metrics on loopback."""

    def __init__(self, extra_args: list[str] = ()) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="probe-shim-bench-"))
        (self.workdir / "shim.toml").write_text(CONFIG_TOML)
        self.metrics_port = _free_loopback_port()
        self.process = DaemonProcess(self.workdir, [
            "--config", str(self.workdir / "shim.toml"), "--trace-exporter", "none",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *extra_args,
        ])
        try:
            self.process.start()
        except BaseException:
            self.close()
            raise
        self.stub = self.process.stub
        self.channel = self.process.channel

    def start_again(self) -> None:
        """`probe-shim serve` again on the same workdir (state dir, socket, /metrics port) once this one is gone:
        after `process.stop(signal.SIGTERM)` (a handover) or `process.crash()` (kill -9)."""
        self.process.start()
        self.stub = self.process.stub
        self.channel = self.process.channel

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    @property
    def zygote_pid(self) -> int | None:
        return zygote_pid(self.pid)

    def worker_pids(self) -> list[int]:
        sandboxes = self.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(), timeout=30).sandboxes
        # Distinct: a pooled worker serves several sandboxes.
        return sorted({s.worker.pid for s in sandboxes if s.worker.state == service_pb.WORKER_RUNNING and s.worker.pid})

    def metrics(self) -> str:
        """The /metrics text (the daemon reports SERVING only once that endpoint is up)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
            return r.read().decode()

    def run_probe(self, sandbox: str, container: str, spec: spec_pb.ProbeSpec,
                  probe_type: int = spec_pb.READINESS) -> str:
        return self.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=sandbox, container_name=container, type=probe_type, spec=spec), timeout=60).probe_id

    def exec_probe(self, sandbox: str, spec: spec_pb.ProbeSpec) -> spec_pb.Attempt:
        return self.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=sandbox, spec=spec), timeout=30).attempt

    def close(self) -> None:
        try:
            if self.process.proc is not None:
                code = self.process.stop()
                if code not in (0, None):
                    print(f"bench: the daemon exited {code}; log tail:\n{self.process.logs()[-2000:]}")
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _free_loopback_port() -> int:
    # The daemon does not report an ephemeral metrics port, so one is picked here; the
    # gap between closing it and the daemon binding it is harmless on loopback.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- specs


def port(n: int) -> spec_pb.PortRef:
    return spec_pb.PortRef(number=n)


def http_spec(period_ms: int = 1000, **kw) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/healthz", port=port(HTTP_PORT)),
                             period_ms=period_ms, timeout_ms=1000, **kw)


def tcp_spec(period_ms: int = 1000, **kw) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=port(TCP_PORT)),
                             period_ms=period_ms, timeout_ms=1000, **kw)


def grpc_spec(period_ms: int = 1000, **kw) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=GRPC_PORT), period_ms=period_ms, timeout_ms=1000, **kw)


SPECS = {"http": http_spec, "tcp": tcp_spec, "grpc": grpc_spec}
# A probe that keeps a sandbox's worker up (ExecProbe alone forks one per call and stops it after).
WARM_PERIOD_MS = 10_000


# ---------------------------------------------------------------- sandboxes


@contextlib.contextmanager
def sandbox_rig() -> Iterator[tuple[BenchDaemon, PodNetns, TargetProcess]]:
    """A daemon, one sandbox (netns with the pod IPs) whose targets are served by a target
    process, and a rare probe there that keeps its worker warm. Torn down in reverse order."""
    with contextlib.ExitStack() as own:
        ns = PodNetns.create()
        own.callback(ns.destroy)
        targets = TargetProcess()
        own.callback(targets.stop)
        targets.add(ns.name)
        daemon = BenchDaemon()
        own.callback(daemon.close)
        daemon.run_probe(ns.name, "warm", tcp_spec(WARM_PERIOD_MS), spec_pb.LIVENESS)
        yield daemon, ns, targets
