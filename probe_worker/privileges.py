"""Dropping everything the worker no longer needs once it is inside the pod netns.

The worker parses bytes chosen by the pod (HTTP responses, HTTP/2 frames); after
this it holds no more power than the pod itself: no supplementary groups, an
unprivileged uid/gid, no capabilities, no way to regain any (no_new_privs), and
bounded memory and file descriptors so a hostile target cannot bloat it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


class PrivilegeError(Exception):
    pass


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        raise PrivilegeError(f"prctl({option}) failed: {os.strerror(ctypes.get_errno())}")


def apply_limits(max_memory_bytes: int, max_open_files: int) -> None:
    """Lowers RLIMIT_AS and RLIMIT_NOFILE (before the drop, while raising is still possible)."""
    for kind, value in ((resource.RLIMIT_AS, max_memory_bytes), (resource.RLIMIT_NOFILE, max_open_files)):
        if value > 0:
            resource.setrlimit(kind, (value, value))


def effective_capabilities() -> int:
    # Bytes, not text: a codec is imported lazily on first use, and after the drop
    # the interpreter's files may no longer be readable.
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"CapEff:"):
                return int(line.split()[1], 16)
    raise PrivilegeError("CapEff not found in /proc/self/status")


def drop_privileges(uid: int, gid: int) -> None:
    """Groups first, then gid, then uid (after setuid we could no longer change groups)."""
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise PrivilegeError(f"cannot drop to uid {uid} gid {gid}: {exc.strerror}") from None
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    caps = effective_capabilities()
    if caps:
        raise PrivilegeError(f"capabilities remain after dropping privileges: CapEff={caps:016x}")


def die_with_parent() -> None:
    # Set after the drop: the kernel clears the parent-death signal on credential changes.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
