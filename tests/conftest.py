"""Shared fixtures: real network namespaces and real worker processes."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from cri_proto import probe_worker_pb2 as worker_pb
from tests.support.daemon_env import DaemonProcess
from tests.support.netns_env import PodNetns, netns_unavailable_reason, remove_stale_namespaces
from tests.support.node_loopback import NodeLoopbackSentinel
from tests.support.worker_harness import WorkerHarness


def pytest_sessionstart(session):
    if netns_unavailable_reason() is None:
        remove_stale_namespaces()


def pytest_collection_modifyitems(config, items):
    reason = netns_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "netns" in item.keywords or {"pod_netns", "worker"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_workers_left_behind(tmp_path_factory):
    """Workers outlive a daemon that crashed or handed them over (SIGTERM), until the next daemon adopts them. A
    test that leaves some behind (its daemon is gone: their zygote is orphaned) has them stopped at its end, so
    that no test sees another's workers. Only the tests' own: a zygote whose state dir is under this run's
    temporary directory (never a real daemon's, nor a benchmark's)."""
    yield
    ours = str(tmp_path_factory.getbasetemp()) + os.sep
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = proc.info["cmdline"] or []
        if "probe_zygote.main" not in cmdline or "--handover-dir" not in cmdline:
            continue
        handover_dir = cmdline[cmdline.index("--handover-dir") + 1] if cmdline[-1] != "--handover-dir" else ""
        if handover_dir.startswith(ours) and proc.info["ppid"] == 1:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the zygote's session: it and its workers
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="session")
def node_loopback():
    """One server on the node's 127.0.0.1 for the whole suite, where the tests of hostNetwork sandboxes aim their
    probes: the shim must never reach it. Checked when the suite ends (an error of the last test using it)."""
    sentinel = NodeLoopbackSentinel()
    try:
        yield sentinel
    finally:
        sentinel.close()
    assert sentinel.connections == [], f"the node's 127.0.0.1 was reached: {sentinel.connections}"


@pytest.fixture
def pod_netns():
    ns = PodNetns.create()
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture
def make_worker():
    """Factory for workers with custom configs; all are shut down at teardown."""
    workers: list[WorkerHarness] = []

    def make(netns_path: str, pod_ips=(), sandbox_id: str = "test-sandbox", **config) -> WorkerHarness:
        worker = WorkerHarness(worker_pb.WorkerConfig(**config), netns_path, pod_ips, sandbox_id)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


@pytest.fixture
def worker(pod_netns, make_worker):
    """A real worker inside pod_netns, with the netns's IPs as the sandbox's pod IPs."""
    return make_worker(pod_netns.path, pod_ips=pod_netns.pod_ips, sandbox_id="test-sandbox")


@pytest.fixture
def daemon(tmp_path):
    """A real `probe-shim serve --runtime-endpoint none` on a socket in tmp_path."""
    d = DaemonProcess(tmp_path).start()
    yield d
    d.stop()
