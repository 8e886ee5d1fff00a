"""The worker's own network namespace: a new, empty one (`isolate_network`), made before any thread exists.

A worker reaches its sandboxes only through sockets the broker made inside them; its own netns has no
interface but a loopback that stays down, so a socket it made itself would reach nothing. `enter_netns`
(moving the main thread into an existing namespace) stays for the tools that need it.

setns(2) changes only the calling thread, and Python 3.11 has no os.setns, so this
calls libc through ctypes on an O_CLOEXEC fd. It must run before any other thread
exists: a thread created earlier would keep probing from the host namespace.
pyroute2.netns.setns is not used because it creates a missing namespace unless
given flags=0, which would turn a typo into a silent probe of an empty netns.
"""

from __future__ import annotations

import ctypes
import os
import threading

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(Exception):
    """The worker cannot run in the requested namespace; the message says why."""


def namespace_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def isolate_network() -> int:
    """Moves this process into a new network namespace of its own (needs CAP_SYS_ADMIN); returns its inode."""
    if threading.current_thread() is not threading.main_thread() or _thread_count() != 1:
        raise NetnsError("refusing to unshare the network namespace: other threads already exist")
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise NetnsError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    return os.stat("/proc/thread-self/ns/net").st_ino


def enter_netns(path: str) -> int:
    """Moves the calling (main) thread into the netns at `path`; returns its inode."""
    if threading.current_thread() is not threading.main_thread() or _thread_count() != 1:
        raise NetnsError("refusing to enter a network namespace: other threads already exist")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsError(f"cannot open network namespace {path}: {exc.strerror}") from None
    try:
        target = os.fstat(fd)
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            hint = " (not a network namespace file?)" if err == 22 else ""
            raise NetnsError(f"setns({path}) failed: {os.strerror(err)}{hint}")
    finally:
        os.close(fd)
    # Trust but verify: the kernel's view of this thread must now be the target.
    if namespace_id("/proc/thread-self/ns/net") != (target.st_dev, target.st_ino):
        raise NetnsError(f"entered {path} but /proc/thread-self/ns/net points elsewhere")
    return target.st_ino
