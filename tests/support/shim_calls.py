"""What the end-to-end tests do to a shim in front of a real containerd, as the kubelet and an operator would.

Owns: comparing a CRI answer through the shim with containerd's own (field for field, errors too); the probe specs
of the e2e workloads (tests/support/containerd_session.py: busybox httpd and nc); RunProbe as the kubelet calls it
for a container; reading a probe's status and waiting on a WatchProbeStatus stream (`Watch`); waiting on a process's
exit (pidfd) and on a port; what the node itself reaches over HTTP; probectl run against the shim's socket.
Used by tests/e2e/test_cri_proxy.py, test_pod_probes.py, test_sandbox_lifecycle.py, test_probectl_on_containerd.py
and test_kubelet_bridge.py.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_session import HTTP_PORT, TCP_PORT
from tests.support.cri_client import CriClient, Pod
from tests.support.netns_env import REPO_ROOT

PERIOD_MS = 200
WATCH_TIMEOUT_S = 60

# --- helpers -----------------------------------------------------------------------------------

def same_answer(direct: CriClient, proxied: CriClient, method: str, request):
    """Asks both ways; the shim's answer must be containerd's, field by field (unknown fields too).

    Go marshals maps in random order, so two answers of containerd differ as bytes even when equal: both
    are compared in protobuf's deterministic (map-sorted) form."""
    response_type = getattr(cri_pb, method + "Response")
    via_shim = response_type.FromString(proxied.raw(method, request))
    at_containerd = response_type.FromString(direct.raw(method, request))
    assert via_shim.SerializeToString(deterministic=True) == at_containerd.SerializeToString(deterministic=True), (
        f"{method} through the shim differs from containerd's answer:\nshim:       {via_shim}\n"
        f"containerd: {at_containerd}")
    return via_shim


def same_error(direct: CriClient, proxied: CriClient, method: str, request) -> grpc.RpcError:
    errors = []
    for client in (proxied, direct):
        with pytest.raises(grpc.RpcError) as caught:
            client.raw(method, request)
        errors.append(caught.value)
    via_shim, at_containerd = errors
    assert (via_shim.code(), via_shim.details()) == (at_containerd.code(), at_containerd.details())
    return via_shim


def canonical(items) -> list[bytes]:
    """List answers come in map order: compare the items as a set, every field (unknown ones too)."""
    return sorted(item.SerializeToString(deterministic=True) for item in items)


def http_spec(path="/healthz", port=HTTP_PORT, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=port)), **kw)


def tcp_spec(port=TCP_PORT, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), **kw)


def grpc_spec(port: int, **kw) -> spec_pb.ProbeSpec:
    kw.setdefault("period_ms", PERIOD_MS)
    kw.setdefault("timeout_ms", 1000)
    return spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=port), **kw)


def run_probe(shim, pod: Pod, container: str, probe_type, spec, cri: CriClient | None = None) -> str:
    """RunProbe as the kubelet would call it for a container: its id, name and start time."""
    container_id = pod.containers.get(container, "")
    started_at = cri.container_status(container_id).started_at if cri and container_id else 0
    return shim.stub.RunProbe(service_pb.RunProbeRequest(
        pod_sandbox_id=pod.id, container_id=container_id, container_name=container, type=probe_type, spec=spec,
        container_started_at=started_at), timeout=30).probe_id


def probe_status(shim, probe_id: str) -> service_pb.Probe | None:
    probes = shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(
        filter=service_pb.ProbeFilter(probe_id=probe_id)), timeout=10).probes
    return probes[0] if probes else None


class Watch:
    """A WatchProbeStatus stream opened before the action it observes; `until` reads it up to a deadline."""

    def __init__(self, shim, timeout_s: float = WATCH_TIMEOUT_S, **filter_fields) -> None:
        self.events: list[service_pb.WatchProbeStatusResponse] = []
        self._stream = shim.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
            filter=service_pb.ProbeFilter(**filter_fields), every_attempt=True), timeout=timeout_s)

    def until(self, predicate: Callable[[service_pb.WatchProbeStatusResponse], bool], what: str):
        try:
            for event in self._stream:
                self.events.append(event)
                if predicate(event):
                    return event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        raise AssertionError(f"watch: {what} did not happen; last events: {self.describe(self.events[-8:])}")

    @staticmethod
    def describe(events) -> list[str]:
        return [f"{service_pb.WatchEventType.Name(e.type)} {e.probe.probe_id} "
                f"{spec_pb.ProbeState.Name(e.probe.status.state)} {spec_pb.AttemptResult.Name(e.probe.status.last_attempt.result)} "
                f"{e.probe.status.last_attempt.output[:80]!r}" for e in events]

    def close(self) -> None:
        self._stream.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_state(probe_id: str, state) -> Callable:
    return lambda e: e.type != service_pb.REMOVED and e.probe.probe_id == probe_id and e.probe.status.state == state


def exit_waiter(pid: int):
    """A pidfd: readable once the process has exited (zombie or reaped), whoever its parent is."""
    return os.pidfd_open(pid)


def exited_within(pidfd: int, timeout_s: float) -> bool:
    readable, _, _ = select.select([pidfd], [], [], max(0.0, timeout_s))
    return bool(readable)


def cannot_connect(host: str, port: int) -> bool:
    """True when this process (the node's network namespace) gets no connection: refused or unreachable."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except OSError:
        return True


def wait_listening(host: str, port: int, timeout_s: float = 30) -> None:
    """Polls (bounded) until the workload accepts connections: a container is started before its program
    listens, and a liveness probe that fails failureThreshold times meanwhile would be put on hold."""
    deadline = time.monotonic() + timeout_s
    while cannot_connect(host, port):
        assert time.monotonic() < deadline, f"nothing listens on {host}:{port} after {timeout_s:g}s"
        time.sleep(0.02)  # polling interval of a readiness check


def host_http_body(url: str) -> str | None:
    """What the NODE gets from url: the body, or None when nothing answers (no proxy in the way)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as answer:
            return answer.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError):
        return None


def probectl(shim, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probectl.cli", "-r", f"unix://{shim.socket_path}", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
