"""The worker's own network namespace: a new, empty one (`isolate_network`), made before any thread exists.

A worker reaches its sandboxes only through sockets the broker made inside them (probe_zygote/netns_broker.py enters
their namespaces, not the worker); its own netns has no interface but a loopback that stays down, so a socket it
made itself would reach nothing.

unshare(2) changes only the calling thread, and Python 3.11 has no os.unshare, so this calls libc through
ctypes. It must run before any other thread exists: a thread created earlier would keep the node's namespace.
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
    before = namespace_id("/proc/thread-self/ns/net")
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise NetnsError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    # Trust but verify: a worker left in the node's netns would reach whatever the node reaches.
    after = namespace_id("/proc/thread-self/ns/net")
    if after == before:
        raise NetnsError("unshare(CLONE_NEWNET) returned but /proc/thread-self/ns/net did not change")
    return after[1]
