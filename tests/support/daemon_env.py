"""A real probe-shim daemon process for end-to-end tests, in a private directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.netns_env import REPO_ROOT

START_TIMEOUT_S = 20


@dataclass
class DaemonProcess:
    workdir: Path
    extra_args: list[str] = field(default_factory=list)
    code_root: Path = REPO_ROOT  # where the daemon's code is: another one is another version (code_copy)
    proc: subprocess.Popen | None = None
    channel: grpc.Channel | None = None

    @property
    def socket_path(self) -> str:
        return str(self.workdir / "shim.sock")

    @property
    def state_dir(self) -> str:
        return str(self.workdir / "state")

    def start(self) -> "DaemonProcess":
        env = dict(os.environ, PYTHONPATH=str(self.code_root))
        self.log = open(self.workdir / "daemon.log", "ab")
        self.proc = subprocess.Popen(
            # Later flags win: extra_args may replace the embedded runtime or the metrics address.
            [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none",
             "--listen", f"unix://{self.socket_path}", "--state-dir", self.state_dir,
             "--metrics-listen", "", *self.extra_args],
            cwd=self.code_root, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        # A private subchannel pool: grpc shares connections between channels of one
        # process, and a channel to a daemon a test killed must not lend its dead one.
        self.channel = grpc.insecure_channel(f"unix://{self.socket_path}",
                                             options=[("grpc.use_local_subchannel_pool", 1)])
        # wait_for_ready: the call waits (bounded) for the socket instead of failing fast.
        health = health_pb2_grpc.HealthStub(self.channel)
        try:
            answer = health.Check(health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True)
        except grpc.RpcError as exc:
            self.stop(signal.SIGKILL)
            raise AssertionError(f"daemon did not come up: {exc}\n--- daemon log ---\n{self.logs()}") from None
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        return self

    @property
    def stub(self) -> service_grpc.ProbeServiceStub:
        return service_grpc.ProbeServiceStub(self.channel)

    def logs(self) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")

    def crash(self) -> None:
        """SIGKILL, as a crash would; the client's channel goes with it."""
        self.proc.kill()
        self.proc.wait()
        self.stop()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        """SIGINT (the default) stops the daemon and its workers; SIGTERM hands the workers over to the next
        daemon (they go on probing until one adopts them, or the handover time is up)."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode


def code_copy(where: Path, replacements: dict[str, tuple[str, str]]) -> Path:
    """A copy of the daemon's code, as an upgrade would install it, with some lines changed: {relative path:
    (old text, new text)}. Run it with DaemonProcess(..., code_root=the copy)."""
    root = where / "code"
    for package in ("shim", "probe_worker", "probe_api", "cri_proto"):
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for relative, (old, new) in replacements.items():
        path = root / relative
        text = path.read_text()
        assert old in text, f"{relative} has no {old!r} to change"
        path.write_text(text.replace(old, new))
    return root


# --- helpers for tests that talk to a daemon -------------------------------------------

def tcp_spec(port, **kw):
    kw.setdefault("period_ms", 100)
    kw.setdefault("timeout_ms", 500)
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), **kw)


def run(daemon, ns, spec, probe_type=spec_pb.READINESS, container="app", **kw):
    req = service_pb.RunProbeRequest(pod_sandbox_id=ns.name, container_name=container, type=probe_type, spec=spec, **kw)
    return daemon.stub.RunProbe(req, timeout=10).probe_id


def wait_for(daemon, predicate, probe_id=None, timeout=15, every_attempt=True, request=None):
    """Watches until predicate(probe) holds for an event's probe; returns that probe."""
    req = request or service_pb.WatchProbeStatusRequest(
        filter=service_pb.ProbeFilter(probe_id=probe_id or ""), every_attempt=every_attempt)
    stream = daemon.stub.WatchProbeStatus(req, timeout=timeout)
    try:
        for event in stream:
            if event.type in (service_pb.SNAPSHOT, service_pb.UPDATED, service_pb.ATTEMPT) and predicate(event.probe):
                return event.probe
    finally:
        stream.cancel()
    raise AssertionError("the watch ended before the condition held")


def status(daemon, **filter_fields):
    return daemon.stub.ProbeStatus(
        service_pb.ProbeStatusRequest(filter=service_pb.ProbeFilter(**filter_fields)), timeout=5)
