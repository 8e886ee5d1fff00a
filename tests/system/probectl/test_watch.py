"""probectl watch: JSON lines until Ctrl-C, the table with attempts, and carrying on across a daemon restart.

The real CLI against a real `probe-shim serve --runtime-endpoint none`, real netns and servers; commands run
in-process through main(argv) with captured output (fixtures: tests/system/probectl/conftest.py), exit codes
and the unreachable shim as `python -m probectl.cli` subprocesses. Every wait is on something the daemon or the
CLI sends, bounded by a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.support.daemon_env import DaemonProcess
from tests.support.netns_env import REPO_ROOT, listen
from tests.support.probectl_runs import probectl_process, run_three, wait_probed

pytestmark = pytest.mark.netns

LINE_TIMEOUT_S = 15


# --- watch -------------------------------------------------------------------------------

def read_line(proc: subprocess.Popen, deadline: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise AssertionError("probectl watch printed nothing before the deadline")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"probectl watch exited: {proc.wait()} {proc.stderr.read()}")
    return line


@contextlib.contextmanager
def watching(endpoint: str, *args: str):
    """`probectl -r ENDPOINT watch ARGS` in a fresh interpreter, its pipes read by the test; killed if still
    running at the end (a test that asserts its exit code sends it Ctrl-C first)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "probectl.cli", "-r", endpoint, "watch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_watch_json_lines_until_ctrl_c(daemon, probectl, pod_netns, servers):
    with watching(f"unix://{daemon.socket_path}", "--pod", pod_netns.name, "-o", "json") as proc:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        first = json.loads(read_line(proc, deadline))
        assert first["type"] == "SNAPSHOT_COMPLETE"  # no probes yet: the snapshot is empty
        probe_id = run_three(probectl, pod_netns, servers)["http"]
        while True:
            event = json.loads(read_line(proc, deadline))
            assert event["type"] == "UPDATED"
            if event["probe"]["probeId"] == probe_id and event["probe"]["status"]["state"] == "STATE_SUCCESS":
                break
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0, proc.stderr.read()
        assert "Traceback" not in proc.stderr.read()


def test_watch_table_with_attempts(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    wait_probed(daemon, ids["http"])
    with watching(f"unix://{daemon.socket_path}", "--container", "web", "--attempts") as proc:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        header = read_line(proc, deadline)
        assert header.split()[:3] == ["TIME", "EVENT", "PROBE"]
        kinds = []
        while "attempt" not in kinds:
            line = read_line(proc, deadline)
            kinds.append(line.split()[1])
            if kinds[-1] in ("snapshot", "attempt"):
                # Only --container web's probes (the filter is on names, client-side), not api's.
                assert line.split()[2] in (ids["http"][:13], ids["tcp"][:13]) and line.split()[4] == "web"
        assert kinds[:3] == ["snapshot", "snapshot", "synced"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0


def test_watch_carries_on_across_a_daemon_restart(tmp_path, pod_netns):
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    endpoint = f"unix://{first.socket_path}"
    second = None
    try:
        with watching(endpoint, "-o", "json") as proc:
            deadline = time.monotonic() + LINE_TIMEOUT_S
            assert json.loads(read_line(proc, deadline))["type"] == "SNAPSHOT_COMPLETE"
            assert probectl_process("-r", endpoint, "run", "--pod", pod_netns.name, "--container", "app", "--type",
                                    "readiness", "--tcp", str(server.port)).rc == 0
            event = json.loads(read_line(proc, deadline))
            assert event["type"] == "UPDATED"
            old_instance, probe_id = event["instanceId"], event["probe"]["probeId"]
            assert first.stop(signal.SIGTERM) == 0  # a restart: the workers are handed over, the board stored
            second = DaemonProcess(tmp_path).start()
            deadline = time.monotonic() + LINE_TIMEOUT_S
            # The same board goes on: the watch resumes with what changed meanwhile (its worker adopted), no full state.
            event = json.loads(read_line(proc, deadline))
            assert event["type"] == "UPDATED" and event["probe"]["probeId"] == probe_id
            assert event["instanceId"] == old_instance
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
    finally:
        if second is not None:
            second.stop()
        first.stop()
