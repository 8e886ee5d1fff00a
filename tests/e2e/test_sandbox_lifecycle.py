"""Sandbox life under the shim beside a real containerd: StopPodSandbox through the shim ends the worker at once and
for good (no reconcile pass brings it back while containerd is still stopping the pod), a sandbox removed behind the
shim's back is noticed by reconciliation, and 20 pod lifecycles leak no worker, fd, netns reference or mount.
Fixtures: tests/e2e/conftest.py; helpers: tests/support/shim_calls.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_env import RECONCILE_INTERVAL_S
from tests.support.containerd_session import TCP_PORT, mounts_under
from tests.support.cri_client import Kubelet
from tests.support.shim_calls import Watch, exit_waiter, exited_within, probe_status, run_probe, tcp_spec

pytestmark = pytest.mark.e2e

STOP_BUDGET_S = 1.0                       # StopPodSandbox through the shim: the worker is gone within this
RECONCILE_GRACE_S = 1.5                   # one reconcile pass (a ListPodSandbox) on a busy machine
CYCLES = 20
STOP_ROUNDS = 5

# --- 4. sandbox life ---------------------------------------------------------------------------

def test_stop_pod_sandbox_through_the_shim_ends_the_worker_for_good(containerd, make_shim):
    # Reconciling every 50 ms makes a pass during containerd's own StopPodSandbox (~0.1 s) near certain:
    # the runtime still says READY then, and that must not bring the worker back.
    shim = make_shim(reconcile_interval_s=0.05)
    kubelet = Kubelet(shim.cri, containerd)
    for n in range(STOP_ROUNDS):
        pod = kubelet.run_pod(f"stopped-{n}")
        probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
        worker = probe_status(shim, probe).status.worker
        assert worker.state == service_pb.WORKER_RUNNING
        pidfd = exit_waiter(worker.pid)
        try:
            with Watch(shim, probe_id=probe) as watch:
                watch.until(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE, "the snapshot")
                began = time.monotonic()
                kubelet.stop_pod(pod)
                assert exited_within(pidfd, began + STOP_BUDGET_S - time.monotonic()), \
                    f"worker {worker.pid} still running {STOP_BUDGET_S:g}s after StopPodSandbox"
                # A stopped sandbox never runs again (CRI): the runtime reports it NOTREADY once its stop is
                # done, and reconciliation drops its probes. Until then no worker may start for it again.
                watch.until(lambda e: e.type == service_pb.REMOVED, "reconciliation dropping the stopped pod's probe")
        finally:
            os.close(pidfd)
        restarted = [e.probe.status.worker for e in watch.events if e.type != service_pb.REMOVED
                     and e.probe.status.worker.state in (service_pb.WORKER_STARTING, service_pb.WORKER_RUNNING)
                     and e.probe.status.worker.pid != worker.pid]
        assert not restarted, f"round {n}: a worker was started again for the stopped sandbox: {restarted[-1]}"
        kubelet.remove_pod(pod)
        assert probe_status(shim, probe) is None


def test_sandbox_removed_behind_the_shims_back_is_noticed_by_reconciliation(containerd, shim, kubelet):
    pod = kubelet.run_pod("removed-directly")
    probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
    worker = probe_status(shim, probe).status.worker
    assert worker.state == service_pb.WORKER_RUNNING
    pidfd = exit_waiter(worker.pid)
    try:
        with Watch(shim, timeout_s=RECONCILE_INTERVAL_S + RECONCILE_GRACE_S + 5, probe_id=probe) as watch:
            watch.until(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE, "the snapshot")
            containerd.cri.call("RemovePodSandbox", cri_pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
            removed_at = time.monotonic()
            watch.until(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe, "the probe's removal")
            noticed_after = time.monotonic() - removed_at
        assert noticed_after <= RECONCILE_INTERVAL_S + RECONCILE_GRACE_S, noticed_after
        assert exited_within(pidfd, 10), f"worker {worker.pid} outlived its sandbox"
    finally:
        os.close(pidfd)
    assert probe_status(shim, probe) is None


@dataclass
class Census:
    """What the daemon side holds (fds of the daemon and zygote, workers, netns references) and the mounts."""
    zygote_pid: int
    daemon_fds: list[str]
    zygote_fds: list[str]
    workers: list[int]                    # the zygote's session: live, zombie or reparented workers
    netns_refs: list[str]
    mounts: list[str]                     # under the session's dir: pod rootfs, shm, netns files

    def settled_as(self, base: "Census") -> bool:
        return (self.zygote_pid == base.zygote_pid and len(self.daemon_fds) <= len(base.daemon_fds)
                and len(self.zygote_fds) <= len(base.zygote_fds) and not self.workers
                and self.netns_refs == base.netns_refs and self.mounts == base.mounts)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return []  # exited meanwhile
    for fd in fds:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass  # closed while listing
    return sorted(targets)


def session_members(sid: int) -> list[int]:
    """Processes of a session, wherever they were reparented: the zygote leads its own session and its
    workers never leave it, so a worker that escaped its supervisor is still found here."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # exited while scanning
            fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state ppid pgrp session ...
            if int(fields[3]) == sid:
                members.append(int(entry))
    return sorted(members)


def census(shim, netns_dir: str, session_dir: str) -> Census:
    daemon = shim.proc.pid
    zygotes = []
    for child in psutil.Process(daemon).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "probe_zygote" in " ".join(child.cmdline()):
                zygotes.append(child.pid)
    assert len(zygotes) == 1, f"expected one zygote among the daemon's children, found {zygotes}"
    zygote = zygotes[0]
    workers = [pid for pid in session_members(zygote) if pid != zygote]
    home = f"net:[{os.stat('/proc/self/ns/net').st_ino}]"  # the broker's way back to the node's netns: kept
    refs = [f"{pid}:{target}" for pid in [daemon, zygote, *workers] for target in _fd_targets(pid)
            if (target.startswith("net:[") and target != home) or target.startswith(netns_dir)]
    return Census(zygote, _fd_targets(daemon), _fd_targets(zygote), workers, sorted(refs), mounts_under(session_dir))


def test_twenty_pod_lifecycles_leak_no_worker_fd_netns_or_mount(containerd, shim, kubelet):
    netns_dir = containerd.session.netns_dir

    def lifecycle(n: int) -> None:
        pod = kubelet.run_pod(f"cycle-{n}")
        probe = run_probe(shim, pod, "app", spec_pb.READINESS, tcp_spec())
        worker = probe_status(shim, probe).status.worker
        assert worker.state == service_pb.WORKER_RUNNING and worker.netns_path == pod.netns_path
        once = shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=pod.id, spec=tcp_spec()), timeout=30)
        # Refused by the pod's own kernel: the attempt ran inside this pod's namespace.
        assert once.attempt.output.endswith(f"dial tcp {pod.ip}:{TCP_PORT}: connect: connection refused")
        if n == 0:  # the census sees a running worker (it would see a leaked one)
            assert worker.pid in snapshot().workers
        pidfd = exit_waiter(worker.pid)
        try:
            kubelet.stop_pod(pod)
            kubelet.remove_pod(pod)
            assert exited_within(pidfd, 10), f"cycle {n}: worker {worker.pid} survived its sandbox"
        finally:
            os.close(pidfd)
        assert probe_status(shim, probe) is None

    def snapshot() -> Census:
        return census(shim, netns_dir, containerd.session.workdir)

    lifecycle(0)  # warm-up: the first pod makes the daemon open what it keeps (connections, caches)
    deadline = time.monotonic() + 10
    base = snapshot()
    while base.workers and time.monotonic() < deadline:
        base = snapshot()  # until the zygote has reaped the warm-up worker
    assert not base.workers and not base.netns_refs, base

    for n in range(1, CYCLES + 1):
        lifecycle(n)

    # Settling is asynchronous (the zygote reaps, grpc closes a stream): poll, bounded.
    deadline = time.monotonic() + 10
    after = snapshot()
    while not after.settled_as(base) and time.monotonic() < deadline:
        after = snapshot()
    assert after.zygote_pid == base.zygote_pid, "the zygote was restarted"
    assert after.workers == [], f"worker processes left: {after.workers}"
    assert after.netns_refs == base.netns_refs, f"netns references left: {after.netns_refs}"
    assert after.mounts == base.mounts, f"mounts left under containerd's dirs: {after.mounts}"
    leaked_daemon = sorted(set(after.daemon_fds) - set(base.daemon_fds))
    assert len(after.daemon_fds) <= len(base.daemon_fds), f"daemon fds grew by {leaked_daemon}"
    leaked_zygote = sorted(set(after.zygote_fds) - set(base.zygote_fds))
    assert len(after.zygote_fds) <= len(base.zygote_fds), f"zygote fds grew by {leaked_zygote}"
