"""Least privilege of the probe workers, read from /proc of workers that a real daemon forked.

A worker parses bytes chosen by the pod; it must hold no more power than the pod: an unprivileged
uid/gid (65534 unless configured), no supplementary groups, every capability set empty (even when the
daemon itself was started with inheritable or ambient capabilities), no_new_privs, rlimits on
memory and open files, and a network namespace of its own with nothing in it (its probe sockets come
from the netns broker, made inside the pod's netns), where its seccomp filter refuses inet sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys

import pytest

from cri_proto import probe_service_pb2 as service_pb
from tests.support.daemon_env import DaemonProcess, run, tcp_spec, wait_for
from tests.support.netns_env import REPO_ROOT, listen

pytestmark = pytest.mark.netns

WORKER_MAX_MEMORY = 256 << 20   # probe_worker.main defaults
WORKER_MAX_FILES = 1024
CAP_NET_BIND_SERVICE, CAP_NET_RAW = 10, 13
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = 47, 2, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {key: value.strip() for key, _, value in (line.partition(":") for line in f)}


def proc_limits(pid: int) -> dict[str, tuple[str, str]]:
    """'Max open files' -> (soft, hard), from the fixed-width table of /proc/PID/limits."""
    with open(f"/proc/{pid}/limits") as f:
        rows = f.read().splitlines()[1:]
    return {row[:26].strip(): tuple(row[26:].split()[:2]) for row in rows}


def running_worker(daemon, ns) -> int:
    server = listen(ns)
    probe_id = run(daemon, ns, tcp_spec(server.port))
    probe = wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING and p.status.worker.pid > 0, probe_id)
    return probe.status.worker.pid


def interfaces_of(pid: int) -> dict[str, str]:
    """Name -> operational state of every interface in the process's netns (`ip` run inside it)."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return {line.split(":")[1].strip().split("@")[0]: line.split(" state ")[1].split()[0]
            for line in out.splitlines()}


def assert_least_privilege(pid: int, ns, uid: int, gid: int) -> None:
    status = proc_status(pid)
    own = os.stat(f"/proc/{pid}/ns/net").st_ino
    assert own not in (os.stat(ns.path).st_ino, os.stat("/proc/self/ns/net").st_ino), \
        "the worker must sit in a netns of its own, neither the pod's nor the node's"
    assert interfaces_of(pid) == {"lo": "DOWN"}, "the worker's own netns must be empty"
    assert status["Uid"].split() == [str(uid)] * 4  # real, effective, saved, filesystem
    assert status["Gid"].split() == [str(gid)] * 4
    assert status["Groups"] == ""
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[capability_set], 16) == 0, f"{capability_set}: {status[capability_set]}"
    assert status["NoNewPrivs"] == "1"
    # A seccomp filter (mode 2) where the worker has one (x86_64), none elsewhere.
    assert status["Seccomp"] == ("2" if os.uname().machine == "x86_64" else "0")
    limits = proc_limits(pid)
    assert limits["Max address space"] == (str(WORKER_MAX_MEMORY),) * 2
    assert limits["Max open files"] == (str(WORKER_MAX_FILES),) * 2


def test_a_daemon_spawned_worker_holds_no_privilege(daemon, pod_netns):
    pid = running_worker(daemon, pod_netns)
    assert_least_privilege(pid, pod_netns, uid=65534, gid=65534)
    assert proc_status(daemon.proc.pid)["Uid"].split()[0] == "0", "the test needs the daemon to run as root"


def test_the_worker_ids_are_configurable(tmp_path, pod_netns):
    config = tmp_path / "shim.toml"
    config.write_text("worker_uid = 4242\nworker_gid = 4343\n")
    d = DaemonProcess(tmp_path, ["--config", str(config)]).start()
    try:
        assert_least_privilege(running_worker(d, pod_netns), pod_netns, uid=4242, gid=4343)
    finally:
        d.stop()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def inherited_capabilities(*caps: int):
    """This process's inheritable and ambient sets raised, so that a daemon started inside inherits them."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    assert libc.capget(ctypes.byref(header), data) == 0
    saved = data[0].inheritable
    for cap in caps:
        data[0].inheritable |= 1 << cap
    assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    try:
        for cap in caps:
            assert libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) == 0, os.strerror(ctypes.get_errno())
        yield
    finally:
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        data[0].inheritable = saved
        libc.capset(ctypes.byref(header), data)


def test_capabilities_the_daemon_inherited_do_not_reach_the_worker(tmp_path, pod_netns):
    """setuid empties the permitted, effective and ambient sets but not the inheritable one: the worker must."""
    wanted = (1 << CAP_NET_BIND_SERVICE) | (1 << CAP_NET_RAW)
    with inherited_capabilities(CAP_NET_BIND_SERVICE, CAP_NET_RAW):
        d = DaemonProcess(tmp_path).start()
    try:
        daemon_status = proc_status(d.proc.pid)
        assert int(daemon_status["CapInh"], 16) == wanted and int(daemon_status["CapAmb"], 16) == wanted
        assert_least_privilege(running_worker(d, pod_netns), pod_netns, uid=65534, gid=65534)
    finally:
        d.stop()
    assert int(proc_status(os.getpid())["CapAmb"], 16) == 0


# Runs as root (so that without the filter every call below would succeed), installs the worker's
# filter the way the worker does, then tries what a compromised worker might.
SYSCALLS_UNDER_THE_FILTER = r"""
import ctypes, errno, json, os, socket, sys, threading
from probe_worker import privileges

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET, PTRACE_TRACEME = 0x10000000, 0x40000000, 0

def errno_of(call):
    ctypes.set_errno(0)
    return "ok" if call() == 0 else errno.errorcode[ctypes.get_errno()]

libc.prctl(privileges.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
privileges.install_syscall_filter()
seen = {
    "unshare user": errno_of(lambda: libc.unshare(CLONE_NEWUSER)),
    "unshare net": errno_of(lambda: libc.unshare(CLONE_NEWNET)),
    "ptrace": errno_of(lambda: libc.ptrace(PTRACE_TRACEME, 0, 0, 0)),
    "keyctl": errno_of(lambda: libc.syscall(250, 0, 0, 0, 0)),
    "bpf": errno_of(lambda: libc.syscall(321, 0, 0, 0)),
    "io_uring_setup": errno_of(lambda: libc.syscall(425, 1, 0)),
}
try:
    os.execv("/bin/true", ["true"])
except OSError as exc:
    seen["execve"] = errno.errorcode[exc.errno]
ran = []
thread = threading.Thread(target=lambda: ran.append(True))
thread.start()
thread.join()
seen["thread"] = "ok" if ran else "failed"
pair = socket.socketpair()
pair[0].sendall(b"x")
seen["socket"] = "ok" if pair[1].recv(1) == b"x" else "failed"
for name, family, kind in (("inet tcp", socket.AF_INET, socket.SOCK_STREAM), ("inet udp", socket.AF_INET, socket.SOCK_DGRAM),
                           ("inet6 tcp", socket.AF_INET6, socket.SOCK_STREAM)):
    try:
        socket.socket(family, kind).close()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
seen["Seccomp"] = open("/proc/self/status").read().split("Seccomp:")[1].split()[0]
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the worker's seccomp filter exists for x86_64 only")
def test_the_worker_syscall_filter_refuses_namespaces_exec_inet_sockets_and_friends_but_not_its_channels():
    done = subprocess.run([sys.executable, "-c", SYSCALLS_UNDER_THE_FILTER], capture_output=True, text=True,
                          timeout=60, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "unshare user": "EPERM", "unshare net": "EPERM", "ptrace": "EPERM", "keyctl": "EPERM", "bpf": "EPERM",
        "io_uring_setup": "EPERM", "execve": "EPERM", "thread": "ok", "socket": "ok", "Seccomp": "2",
        "inet tcp": "EPERM", "inet udp": "EPERM", "inet6 tcp": "EPERM"}
