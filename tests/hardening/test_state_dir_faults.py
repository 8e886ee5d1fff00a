"""Faults: the state dir full (UNAVAILABLE, nothing stored, recovery when space returns), or read-only at start-up
(a one-line error, nothing lost). Helpers: tests/support/fault_harness.py; `make_netns`: tests/hardening/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from tests.support.daemon_env import DaemonProcess, run, status
from tests.support.fault_harness import PERIOD_MS, RUNNING, loopback_spec, report, serve_loopback

pytestmark = pytest.mark.netns


# --- the state dir full, or read-only ------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """tmp_path/state as a 1 MiB tmpfs (unmounted at teardown)."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    yield state
    subprocess.run(["umount", "-l", str(state)], check=True)


def fill(directory) -> int:
    """Writes a filler file until the file system is full; returns its size."""
    path = os.path.join(directory, "filler")
    written = 0
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                written += f.write(bytes(65536))
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC
    while True:  # the last partial page too
        try:
            with open(path, "ab", buffering=0) as f:
                written += f.write(bytes(512))
        except OSError:
            return written


def test_full_state_dir_answers_unavailable_stores_nothing_and_recovers(tmp_path, small_tmpfs, make_netns):
    (ns,) = make_netns(1)
    server = serve_loopback([ns])
    daemon = DaemonProcess(tmp_path).start()
    assert daemon.state_dir == str(small_tmpfs)
    restarted = None
    try:
        first = run(daemon, ns, loopback_spec(server.port), container="a")
        fill(small_tmpfs)
        with pytest.raises(grpc.RpcError) as refused:
            run(daemon, ns, loopback_spec(server.port), container="b")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        message = refused.value.details()
        assert f"state directory {small_tmpfs} is not writable: [Errno 28] No space left on device" in message
        # A replacement is refused the same way and the stored registration stays in force.
        with pytest.raises(grpc.RpcError) as replaced:
            run(daemon, ns, loopback_spec(server.port, period_ms=200), container="a")
        assert replaced.value.code() == grpc.StatusCode.UNAVAILABLE
        # So is a removal: the probe stays registered and running rather than come back after a restart.
        with pytest.raises(grpc.RpcError) as stopped:
            daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=first), timeout=10)
        assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not removed" in stopped.value.details()
        (only,) = status(daemon).probes
        assert (only.probe_id, only.spec.period_ms) == (first, PERIOD_MS)
        assert daemon.proc.poll() is None  # no crash, it goes on serving
        assert status(daemon).probes[0].status.worker.state == RUNNING

        os.unlink(small_tmpfs / "filler")
        second = run(daemon, ns, loopback_spec(server.port), container="b")  # recovered without a restart
        daemon.crash()
        restarted = DaemonProcess(tmp_path).start()
        stored = sorted(p.probe_id for p in status(restarted).probes)
        report("state-dir-full", code=refused.value.code().name, message=repr(message),
               stored_after_restart=len(stored))
        assert stored == sorted([first, second])
    finally:
        if restarted is not None:
            restarted.stop()
        daemon.stop()


def serve_once(tmp_path) -> subprocess.CompletedProcess:
    """`probe-shim serve` as DaemonProcess runs it, expected to exit by itself."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(
        [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none", "--listen",
         f"unix://{tmp_path}/shim.sock", "--state-dir", str(tmp_path / "state"), "--metrics-listen", ""],
        capture_output=True, text=True, timeout=60, env=env)


def test_read_only_state_dir_is_a_one_line_error_at_start_and_loses_nothing(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = serve_loopback([ns])
    state = tmp_path / "state"
    daemon = DaemonProcess(tmp_path).start()
    mounted = False
    try:
        first = run(daemon, ns, loopback_spec(server.port), container="a")
        # Read-only over a running daemon: its open database is on the mount below, and it keeps storing there
        # (the kernel refuses a read-only remount of a file system with files open for writing).
        subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
        mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        second = run(daemon, ns, loopback_spec(server.port), container="b")
        assert daemon.stop() == 0

        started = time.monotonic()
        refused = serve_once(tmp_path)
        lines = (refused.stdout + refused.stderr).strip().splitlines()
        report("state-dir-read-only", exit_code=refused.returncode, exit_after_s=f"{time.monotonic() - started:.2f}",
               output=repr(lines))
        assert refused.returncode == 1
        assert len(lines) == 1 and "Traceback" not in lines[0]
        assert f"state directory {state} is not writable: [Errno 30] Read-only file system" in lines[0]
        assert not [name for name in os.listdir(state) if "corrupt" in name]  # nothing moved aside

        subprocess.run(["umount", str(state)], check=True)
        mounted = False
        daemon = DaemonProcess(tmp_path).start()
        assert sorted(p.probe_id for p in status(daemon).probes) == sorted([first, second])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(state)], check=False)
        daemon.stop()
