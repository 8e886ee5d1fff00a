"""The cleanup of a containerd session's leftovers on the host, for the end-to-end tests.

Owns: everything outside containerd's API a session may leave, removed by `clean_host` step by step (each step runs
even when one fails): the session's processes, its pod processes and cgroups, mounts under its directory, the CNI
bridge, and what containerd 1.6 puts outside its own directories (/run/containerd/s sockets, /var/lib/cni/results
entries); the session registry on disk (SESSION_FILE per work dir, a lock between concurrent runs) and
`sweep_stale_sessions`, which cleans the sessions whose test process was killed before its teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.support.containerd_session import (
    CNI_RESULTS_DIR, K8S_NAMESPACE, SESSION_DIR_PREFIX, SESSION_FILE, SHIM_SOCKET_DIR, WORKDIR_ROOTS, Session,
    mounts_under, shim_socket_name, start_ticks,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
MNT_DETACH = 2


def _pids_matching(predicate: Callable[[int], bool]) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if predicate(int(entry)):
                    pids.append(int(entry))
    return pids


def _cmdline_mentions(pid: int, text: str) -> bool:
    return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()


def _cgroup_dirs(parent: str) -> list[Path]:
    """This session's pod cgroup directories in every hierarchy (v1 controllers, v2 or hybrid), deepest first."""
    tops = [CGROUP_ROOT / parent.lstrip("/")]
    with contextlib.suppress(OSError):
        tops += [hierarchy / parent.lstrip("/") for hierarchy in CGROUP_ROOT.iterdir()]
    found = [Path(root) for top in tops if top.is_dir() for root, _, _ in os.walk(top)]
    return sorted(set(found), key=lambda p: (-len(p.parts), str(p)))


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _unmount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(point.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point (any more); ENOENT: gone
            raise OSError(err, os.strerror(err), point)


def clean_host(session: Session, errors: list[str]) -> None:
    """Everything outside containerd's API that a session may leave; each step runs even if one fails."""
    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # keep cleaning: a later step may still succeed
            errors.append(f"{name}: {exc!r}")

    # Processes started for this session (in a stale one, containerd itself: `--config <workdir>/...`; its
    # shims: `-address <workdir>/...`; a shim daemon pointed at it), then whatever runs in its pod cgroups.
    mine = session.workdir.rstrip("/") + "/"
    step("kill session processes", lambda: _kill(_pids_matching(lambda pid: _cmdline_mentions(pid, mine))))

    def kill_pods() -> None:
        pids = set()
        for d in _cgroup_dirs(session.cgroup_parent):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        _kill(pids)
    step("kill pod processes", kill_pods)

    def unmount_all() -> None:
        for point in mounts_under(session.workdir):
            _unmount(point)
    step("unmount", unmount_all)

    def delete_bridge() -> None:
        if Path(f"/sys/class/net/{session.bridge}").exists():
            subprocess.run(["ip", "link", "del", session.bridge], check=True, capture_output=True, timeout=30)
    step("delete bridge", delete_bridge)

    def remove_cni_results() -> None:
        if CNI_RESULTS_DIR.is_dir():
            for entry in CNI_RESULTS_DIR.glob(f"{session.network}-*"):
                entry.unlink(missing_ok=True)
    step("remove CNI results", remove_cni_results)

    def remove_cgroups() -> None:
        deadline = time.monotonic() + 10
        for d in _cgroup_dirs(session.cgroup_parent):
            while True:  # a killed process leaves its cgroup a moment after SIGKILL
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    _wait_a_moment()
    step("remove cgroups", remove_cgroups)

    def remove_shim_sockets() -> None:
        if session.shim_socket_dir != SHIM_SOCKET_DIR or not SHIM_SOCKET_DIR.is_dir():
            return  # containerd 2.x: they are under the session's own directory
        ids_file = Path(session.path("shim-ids.json"))
        ids = json.loads(ids_file.read_text()) if ids_file.exists() else []
        for shim_id in ids:
            (SHIM_SOCKET_DIR / shim_socket_name(session.address, K8S_NAMESPACE, shim_id)).unlink(missing_ok=True)
    step("remove shim sockets", remove_shim_sockets)

    def remove_new_host_dirs() -> None:
        for d in sorted(session.new_host_dirs, key=lambda p: -p.count("/")):
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(d)  # only when empty: anything else there is not ours
    step("remove host dirs", remove_new_host_dirs)

    step("remove workdir", lambda: shutil.rmtree(session.workdir) if os.path.exists(session.workdir) else None)


def _wait_a_moment() -> None:
    # Polling interval while the kernel finishes tearing a killed process down (no event to wait on).
    time.sleep(0.05)


def recorded_sessions(roots: Iterable[str]) -> list[Session]:
    found = []
    for root in dict.fromkeys(roots):
        for workdir in Path(root).glob(f"{SESSION_DIR_PREFIX}*"):
            try:
                found.append(Session(**json.loads((workdir / SESSION_FILE).read_text())))
            except (OSError, ValueError, TypeError):
                continue  # being created, or not one of ours
    return found


def session_alive(session: Session) -> bool:
    """The session's test process still runs (not exited, not a zombie, not a new process with its pid)."""
    return start_ticks(session.owner_pid) == session.owner_started




@contextlib.contextmanager
def sessions_lock():
    """Serializes session creation and sweeping between concurrent test runs (e.g. `make e2e` beside
    `make test`): two sessions must not pick the same subnet before either has made its bridge."""
    with open(os.path.join(tempfile.gettempdir(), f".{SESSION_DIR_PREFIX}lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sweep_stale_sessions(roots: Iterable[str] = WORKDIR_ROOTS) -> list[str]:
    """Cleans what sessions killed before their teardown left (their owner process is gone)."""
    swept = []
    with sessions_lock():
        for session in recorded_sessions(roots):
            if not session_alive(session):
                clean_host(session, [])
                swept.append(session.workdir)
    return swept
