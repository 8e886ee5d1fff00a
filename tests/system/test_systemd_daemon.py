"""A real daemon under systemd's terms (the unit files and shim/sdnotify.py alone: tests/unit/test_systemd_units.py,
tests/unit/test_sdnotify.py).

- $NOTIFY_SOCKET pointing at a socket the test binds: READY=1 once it serves, WATCHDOG=1 pings, STOPPING=1 on SIGTERM.
- started with the unit's CapabilityBoundingSet and NoNewPrivileges (setpriv) and MemoryDenyWriteExecute's kernel
  counterpart (PR_SET_MDWE): each capability is exercised by what needs it. The unit's mount and seccomp sandboxing
  need a running systemd and are not emulated.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, tcp_spec, wait_for
from tests.support.netns_env import listen
from tests.support.systemd_env import RECV_TIMEOUT_S, UNIT, datagram_socket, directives

# --- sd_notify from a real daemon -----------------------------------------------------------------

def receive_until(receiver: socket.socket, field: bytes, timeout: float = RECV_TIMEOUT_S) -> list[bytes]:
    """Datagrams up to and including the first one holding `field`, within `timeout` in all
    (watchdog pings keep arriving, so a per-datagram timeout alone would never expire)."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        receiver.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            seen.append(receiver.recv(4096))
        except TimeoutError:
            raise AssertionError(f"no {field!r} within {timeout}s; got {seen[-5:]}") from None
        if field in seen[-1].split(b"\n"):
            return seen


def test_daemon_notifies_ready_watchdog_and_stopping(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with datagram_socket(path) as receiver:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
        daemon = DaemonProcess(tmp_path).start()
        try:
            ready = receive_until(receiver, b"READY=1")
            # READY comes first, once: the watchdog pinger starts after it.
            assert ready == [f"READY=1\nSTATUS=serving on unix://{daemon.socket_path}".encode()]
            receive_until(receiver, b"WATCHDOG=1")
            # The zygote (and so every worker) was started without the notify socket in its environment.
            (zygote,) = [p for p in psutil.Process(daemon.proc.pid).children() if "probe_zygote.main" in p.cmdline()]
            assert "NOTIFY_SOCKET" not in zygote.environ() and "WATCHDOG_USEC" not in zygote.environ()
        finally:
            assert daemon.stop(signal.SIGTERM) == 0
        stopping = receive_until(receiver, b"STOPPING=1")
        assert stopping[-1] == b"STOPPING=1\nSTATUS=stopping"
        assert set(stopping[:-1]) <= {b"WATCHDOG=1"}


# --- the daemon under the unit's privileges ----------------------------------------------------

CAPABILITY_BITS = {"CAP_CHOWN": 0, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21,
                   "CAP_DAC_OVERRIDE": 1, "CAP_NET_ADMIN": 12, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13}


PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


# Runs argv with PR_SET_MDWE set (Linux >= 6.3; inherited by every child): no memory may become
# writable and executable, the kernel's version of systemd's MemoryDenyWriteExecute= filter.
MDWE_EXEC = (
    "import ctypes, os, sys\n"
    f"if ctypes.CDLL(None, use_errno=True).prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:\n"
    "    print('PR_SET_MDWE unavailable:', os.strerror(ctypes.get_errno()), file=sys.stderr, flush=True)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def unit_capabilities() -> list[str]:
    (caps,) = directives(UNIT)["CapabilityBoundingSet"]
    unknown = [c for c in caps.split() if c not in CAPABILITY_BITS]
    assert not unknown, f"add {unknown} to CAPABILITY_BITS"
    return caps.split()


def effective_capabilities(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff line")


@pytest.fixture
def hardened_python(tmp_path):
    """An interpreter wrapper that applies the unit's bounding set, no_new_privs and W^X, then runs python."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to apply the unit's capability bounding set")
    unit = directives(UNIT)
    assert unit["NoNewPrivileges"] == ["yes"] and unit["MemoryDenyWriteExecute"] == ["yes"]
    bounding = ",".join(["-all"] + ["+" + c.removeprefix("CAP_").lower() for c in unit_capabilities()])
    wrapper = tmp_path / "python-hardened"
    python = shlex.quote(sys.executable)
    wrapper.write_text("#!/bin/sh\n"
                       f"exec setpriv --bounding-set={bounding} --no-new-privs {python} -c {shlex.quote(MDWE_EXEC)} "
                       f"{python} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.netns
def test_daemon_works_with_exactly_the_units_capabilities(tmp_path, pod_netns, hardened_python, monkeypatch):
    config = tmp_path / "config.toml"
    # CAP_CHOWN: the socket goes to a group root is not a member of (Debian's nogroup, 65534).
    config.write_text('heartbeat_timeout_s = 1.0\nsocket_group = "65534"\n')
    daemon = DaemonProcess(tmp_path, extra_args=["--config", str(config)])
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", hardened_python)  # DaemonProcess starts `sys.executable -m shim.cli`
        daemon.start()
    worker = None
    try:
        expected = sum(1 << CAPABILITY_BITS[c] for c in unit_capabilities())
        assert effective_capabilities(daemon.proc.pid) == expected
        assert "NoNewPrivs:\t1" in Path(f"/proc/{daemon.proc.pid}/status").read_text()
        assert os.stat(daemon.socket_path).st_gid == 65534

        # CAP_SYS_PTRACE: the sandbox is /proc/PID/ns/net of a pause-like process of another uid,
        # as the daemon resolves hostNetwork pods. CAP_SYS_ADMIN: setns. CAP_SETUID/SETGID: the drop.
        pause = pod_netns.spawn(["setpriv", "--reuid=65535", "--regid=65535", "--clear-groups",
                                 "sh", "-c", "echo READY 0; exec sleep 300"])
        server = listen(pod_netns)
        probe_id = daemon.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=f"/proc/{pause.proc.pid}/ns/net", container_name="app", type=spec_pb.READINESS,
            spec=tcp_spec(server.port)), timeout=10).probe_id
        probe = wait_for(daemon, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS, probe_id)
        assert probe.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"
        worker = psutil.Process(probe.status.worker.pid)
        assert worker.uids().effective == 65534 and effective_capabilities(worker.pid) == 0

        # CAP_KILL: a worker that stops answering runs as uid 65534, so only CAP_KILL lets the
        # daemon kill it; without it the stuck worker would stay behind forever.
        worker.suspend()
        restarted = wait_for(daemon, lambda p: p.status.worker.restarts == 1 and p.status.worker.state == service_pb.WORKER_RUNNING,
                             probe_id)
        assert "missed heartbeats" in restarted.status.worker.last_error
        worker.wait(timeout=10)  # gone (psutil raises TimeoutExpired if it is still there)
        assert "PermissionError" not in daemon.logs()
    finally:
        if worker is not None and worker.is_running():
            worker.kill()  # a stopped worker the daemon failed to kill must not outlive the test
        assert daemon.stop() == 0, daemon.logs()
