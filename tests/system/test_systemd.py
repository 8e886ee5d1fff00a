"""The systemd integration: the unit, the example config, the kubelet drop-in, sd_notify.

- `systemd-analyze verify` and `security --offline` on the shipped unit files (Debian package
  `systemd`; skipped without it). systemd need not be PID 1 for either: they only load unit files.
- shim/sdnotify.py against real AF_UNIX datagram sockets (a path and an abstract name).
- a real daemon with $NOTIFY_SOCKET pointing at a socket the test binds: READY=1 once it serves,
  WATCHDOG=1 pings, STOPPING=1 on SIGTERM.
- a real daemon started with the unit's CapabilityBoundingSet and NoNewPrivileges (setpriv) and
  MemoryDenyWriteExecute's kernel counterpart (PR_SET_MDWE): each capability is exercised by what
  needs it. The unit's mount and seccomp sandboxing need a running systemd and are not emulated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim import sdnotify
from probe_api import rollout
from probectl import doctor
from shim.config import Config, load
from shim.sdnotify import Notifier
from tests.support.daemon_env import DaemonProcess, tcp_spec, wait_for
from tests.support.netns_env import REPO_ROOT, listen

SYSTEMD_DIR = REPO_ROOT / "systemd"
UNIT = SYSTEMD_DIR / "probe-shim.service"
CONFIG_EXAMPLE = SYSTEMD_DIR / "config.toml"
KUBELET_DROP_IN = SYSTEMD_DIR / "kubelet-probe-shim.conf"
SHIPPED_EXEC_START = "/usr/local/bin/probe-shim serve --config /etc/probe-shim/config.toml"
RECV_TIMEOUT_S = 20  # the daemon's start-up bound (DaemonProcess waits as long)
MAX_EXPOSURE = 40  # `systemd-analyze security` scale x10: 4.0 and below is "OK"; the unit scores 3.2

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (Debian package `systemd`)")


def directives(path: Path) -> dict[str, list[str]]:
    """Key -> every value it is given, in order (systemd keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def installed_probe_shim() -> str:
    """The console script next to this interpreter (a venv's bin/), on PATH, or `python -m shim.cli`."""
    beside = Path(sys.executable).parent / "probe-shim"
    if beside.exists():
        return str(beside)
    return shutil.which("probe-shim") or f"{sys.executable} -m shim.cli"


def analyze(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SYSTEMD_COLORS="0", **(env or {})))


def runnable_unit(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart's binary replaced by the installed one: verify checks it exists."""
    text = UNIT.read_text()
    assert f"\nExecStart={SHIPPED_EXEC_START}\n" in text
    copy = tmp_path / "probe-shim.service"
    copy.write_text(text.replace("ExecStart=/usr/local/bin/probe-shim", f"ExecStart={installed_probe_shim()}"))
    return copy


# --- the files agree with the daemon ---------------------------------------------------------

def test_unit_runs_the_daemon_with_its_default_paths():
    unit = directives(UNIT)
    defaults = Config()
    assert unit["Type"] == ["notify"] and unit["ExecStart"] == [SHIPPED_EXEC_START]
    assert unit["Restart"] == ["always"]
    assert "/run/" + unit["RuntimeDirectory"][0] == os.path.dirname(defaults.socket_path)
    assert "/var/lib/" + unit["StateDirectory"][0] == defaults.state_dir
    # Wants=, not Requires=/BindsTo=: a containerd restart must not restart the shim (see the unit).
    assert unit["Wants"] == ["containerd.service"] and unit["After"] == ["containerd.service"]
    assert "Requires" not in unit and "BindsTo" not in unit


def test_unit_lets_the_workers_outlive_a_restart_as_containerds_shims_do():
    """KillMode=process: systemd signals the daemon alone on stop and restart, so the zygote and the workers
    live on and the next daemon adopts them (tests/system/test_handover.py does what systemd does: SIGTERM to the main
    process only, or SIGKILL for a crash, then the same ExecStart again). A stop without a start is bounded by
    the daemon's handover_timeout_s: the workers stop by themselves."""
    unit = directives(UNIT)
    assert unit["KillMode"] == ["process"]
    assert unit["Restart"] == ["always"]
    assert "ExecStop" not in unit  # a stop is a SIGTERM: the daemon hands over
    assert "SendSIGKILL" not in unit or unit["SendSIGKILL"] == ["yes"]  # a daemon stuck on stop is still killed
    # systemd's own stop timeout is the daemon's, not the workers': they are not waited for.
    assert int(unit["TimeoutStopSec"][0].removesuffix("s")) <= 60
    assert Config().handover_timeout_s > 0
    # The state directory (store and handover sockets) survives restarts; the runtime one may not.
    assert "StateDirectory" in unit and Config().state_dir.startswith("/var/lib/")


def test_kubelet_drop_in_points_the_kubelet_at_the_shims_socket_and_labels_the_node():
    drop_in = directives(KUBELET_DROP_IN)
    assert [v.strip('"') for v in drop_in["Environment"]] == [
        f"PROBE_SHIM_ARGS=--container-runtime-endpoint={Config().listen} "
        f"--node-labels={rollout.NODE_LABEL}={rollout.NODE_LABEL_VALUE}"]
    # What `probectl doctor` reads from the kubelet's command line is what the drop-in gives it.
    argv = ["/usr/bin/kubelet", *drop_in["Environment"][0].strip('"').split("=", 1)[1].split()]
    assert doctor.node_labels(argv) == {rollout.NODE_LABEL: rollout.NODE_LABEL_VALUE}
    assert doctor.flag_values(argv, "container-runtime-endpoint") == [Config().listen]
    assert f"kubectl label node NODE {rollout.NODE_LABEL}={rollout.NODE_LABEL_VALUE}" in KUBELET_DROP_IN.read_text()
    assert drop_in["ExecStart"][0] == "" and drop_in["ExecStart"][1].endswith(" $PROBE_SHIM_ARGS")
    assert f"containerRuntimeEndpoint: {Config().listen}" in KUBELET_DROP_IN.read_text()
    assert drop_in["After"] == ["probe-shim.service"]


def test_config_example_is_valid_and_lists_every_key_with_its_default():
    values = tomllib.loads(CONFIG_EXAMPLE.read_text())
    assert set(values) == {f.name for f in dataclasses.fields(Config)}
    assert load(str(CONFIG_EXAMPLE), {}) == Config()
    lines = CONFIG_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+ = ", line):
            assert lines[i - 1].startswith("# "), f"{line!r} has no comment line above it"


# --- systemd-analyze ------------------------------------------------------------------------------

@needs_systemd_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path):
    result = analyze("verify", str(runnable_unit(tmp_path)))
    # verify exits 0 on warnings such as unknown keys, so its output must be empty too.
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr
    # And it does catch mistakes here (systemd is not PID 1 on CI, the check must not be vacuous).
    broken = tmp_path / "broken.service"
    broken.write_text(runnable_unit(tmp_path).read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes"))
    assert "Unknown key 'ProtectHomes'" in analyze("verify", str(broken)).stderr


@needs_systemd_analyze
def test_kubelet_drop_in_passes_systemd_analyze_verify(tmp_path):
    """Verified as a drop-in of a stand-in kubelet.service, found through SYSTEMD_UNIT_PATH."""
    kubelet = shutil.which("kubelet") or "/bin/true"  # verify insists that ExecStart's binary exists
    (tmp_path / "kubelet.service").write_text(f"[Service]\nExecStart={kubelet}\n")
    (tmp_path / "kubelet.service.d").mkdir()
    (tmp_path / "kubelet.service.d" / "20-probe-shim.conf").write_text(
        KUBELET_DROP_IN.read_text().replace("/usr/bin/kubelet ", f"{kubelet} "))
    runnable_unit(tmp_path)  # the probe-shim.service it orders itself after
    result = analyze("verify", str(tmp_path / "kubelet.service"), env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_systemd_analyze
def test_unit_hardening_exposure_stays_ok(tmp_path):
    result = analyze("security", "--offline=true", f"--threshold={MAX_EXPOSURE}", str(runnable_unit(tmp_path)))
    if "--offline" in result.stderr and result.returncode != 0 and "Overall" not in result.stdout:
        pytest.skip(f"this systemd-analyze has no offline security review: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout[-600:]


# --- sd_notify, unit level --------------------------------------------------------------------

def test_notify_socket_addresses():
    assert sdnotify.socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert sdnotify.socket_address("@/org/freedesktop/systemd1/notify/1") == "\0/org/freedesktop/systemd1/notify/1"
    assert sdnotify.socket_address(None) is None and sdnotify.socket_address("") is None
    assert sdnotify.socket_address("vsock:2:1234") is None  # a VM's host manager: not supported, no-op
    assert sdnotify.socket_address("relative/path") is None


def test_watchdog_interval_is_half_the_timeout_and_only_for_this_process():
    assert sdnotify.watchdog_interval_s("30000000", None, own_pid=42) == 15.0
    assert sdnotify.watchdog_interval_s("30000000", "42", own_pid=42) == 15.0
    assert sdnotify.watchdog_interval_s("30000000", "41", own_pid=42) is None
    assert sdnotify.watchdog_interval_s(None, None, own_pid=42) is None
    assert sdnotify.watchdog_interval_s("0", None, own_pid=42) is None
    assert sdnotify.watchdog_interval_s("soon", None, own_pid=42) is None


def test_message_fields_cannot_smuggle_a_field():
    assert sdnotify.message("READY=1", "STATUS=a\nMAINPID=1") == b"READY=1\nSTATUS=a MAINPID=1"


def datagram_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(RECV_TIMEOUT_S)
    return sock


def test_notifications_reach_a_socket_path(tmp_path):
    path = str(tmp_path / "notify.sock")
    with datagram_socket(path) as receiver:
        environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "OTHER": "kept"}
        notifier = Notifier.from_environment(environ)
        assert environ == {"OTHER": "kept"}  # like sd_notify's unset_environment: children never see it
        assert notifier.watchdog_s == 2.0
        assert notifier.ready("serving on unix:///run/probe-shim/probe-shim.sock")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=serving on unix:///run/probe-shim/probe-shim.sock"
        assert notifier.stopping()
        assert receiver.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_notifications_reach_an_abstract_socket():
    name = f"probe-shim-test-{uuid.uuid4().hex}"
    with datagram_socket("\0" + name) as receiver:
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier.notify("STATUS=abstract")
        assert receiver.recv(4096) == b"STATUS=abstract"


def test_without_notify_socket_everything_is_a_no_op():
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert notifier.address is None and notifier.watchdog_s is None
    assert notifier.ready("serving") is False and notifier.stopping() is False
    asyncio.run(asyncio.wait_for(notifier.keep_alive(), timeout=5))  # returns at once: no watchdog


def test_a_dead_notify_socket_never_raises_and_warns_once(tmp_path, caplog):
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert notifier.ready("serving") is False
    assert notifier.notify("WATCHDOG=1") is False
    assert len([r for r in caplog.records if "cannot notify systemd" in r.getMessage()]) == 1


def test_keep_alive_pings_the_watchdog(tmp_path):
    path = str(tmp_path / "notify.sock")

    async def two_pings(receiver: socket.socket) -> list[bytes]:
        loop = asyncio.get_running_loop()
        pinger = asyncio.create_task(Notifier(address=path, watchdog_s=0.01).keep_alive())
        try:
            return [await asyncio.wait_for(loop.sock_recv(receiver, 4096), RECV_TIMEOUT_S) for _ in range(2)]
        finally:
            pinger.cancel()

    with datagram_socket(path) as receiver:
        receiver.setblocking(False)
        assert asyncio.run(two_pings(receiver)) == [b"WATCHDOG=1", b"WATCHDOG=1"]


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
