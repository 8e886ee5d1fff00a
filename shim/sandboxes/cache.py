"""The memory of resolved pod sandboxes for ExecProbe and the kubelet bridge (held by the daemon's one sandbox
directory, directory.py): one CRI PodSandboxStatus per sandbox, not one per call.

Resolving a sandbox over CRI (verbose PodSandboxStatus, then parsing the runtime's JSON) costs about 1 ms, more
than everything else ExecProbe does on a warm worker. What it yields cannot change while the sandbox lives: a
CRI sandbox keeps its network namespace, IPs and identity from RunPodSandbox until it is stopped, and is never
started again. So a resolution is reused only while all of these hold:
- the sandbox's own process (the pid the runtime reported: the pause process) has not exited. It is held as a
  pidfd, which names that one process: a recycled pid cannot pass for it. The runtime kills that process when
  the sandbox stops, through the shim or behind its back, and the entry is dropped the moment it exits;
- nothing told us the sandbox is stopping (`forget`, on StopPodSandbox / RemovePodSandbox seen by the proxy);
- it is younger than `ttl_s`, a bound for runtimes whose sandbox process could outlive the sandbox's READY.
A sandbox without a pid (the embedded mode, whose resolution is one stat() anyway), or whose pid this process
cannot open (another pid namespace), is never remembered: it is resolved at every call, as before.

The rule is pure (`fresh`); the class adds pidfds, the event loop and a clock.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

from shim.sandboxes.resolver import SandboxInfo, SandboxSource

DEFAULT_TTL_S = 10.0
MAX_ENTRIES = 1024  # above a node's pod limit (110 by default): only a flood of distinct sandboxes reaches it


def fresh(resolved_at: float, now: float, ttl_s: float, process_exited: bool) -> bool:
    """Whether a remembered resolution may answer now."""
    return not process_exited and 0.0 <= now - resolved_at < ttl_s


def pidfd_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (one syscall, no /proc parsing)."""
    readable, _, _ = select.select([pidfd], [], [], 0)
    return bool(readable)


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone already, another pid namespace, or no pidfd support
        return None


@dataclass(frozen=True)
class _Entry:
    info: SandboxInfo
    pidfd: int
    resolved_at: float  # monotonic seconds


class ResolvedSandboxes:
    """`resolve` like the source's, answered from memory while the sandbox provably lives (see the module).

    Create it inside the event loop that calls it: a remembered sandbox's pidfd is watched on that loop."""

    def __init__(self, source: SandboxSource, *, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_ENTRIES) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[str, _Entry] = {}

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        entry = self._entries.get(sandbox_id)
        if entry is not None:
            if fresh(entry.resolved_at, self._clock(), self._ttl_s, pidfd_exited(entry.pidfd)):
                return entry.info
            self.forget(sandbox_id)
        # SandboxNotFound / SandboxNotReady / RuntimeUnavailable propagate: nothing is remembered then.
        info = await self._source.resolve(sandbox_id)
        self._remember(info)
        return info

    def forget(self, sandbox_id: str) -> None:
        entry = self._entries.pop(sandbox_id, None)
        if entry is not None:
            asyncio.get_running_loop().remove_reader(entry.pidfd)
            os.close(entry.pidfd)

    def close(self) -> None:
        for sandbox_id in list(self._entries):
            self.forget(sandbox_id)

    def __len__(self) -> int:
        return len(self._entries)

    def _remember(self, info: SandboxInfo) -> None:
        if not info.pid or not info.ready:
            return
        # Opened after the runtime said READY: if the process died in between, there is nothing to open, or
        # the pidfd polls readable at once and the entry is dropped on the next loop iteration.
        pidfd = open_pidfd(info.pid)
        if pidfd is None:
            return
        self.forget(info.id)  # a concurrent call may have remembered it meanwhile
        if len(self._entries) >= self._max_entries:
            self.forget(next(iter(self._entries)))  # the oldest resolution
        self._entries[info.id] = _Entry(info, pidfd, self._clock())
        # Dropped (and its fd closed) as soon as the sandbox's process exits, used or not.
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit, info.id, pidfd)

    def _on_exit(self, sandbox_id: str, pidfd: int) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is not None and entry.pidfd == pidfd:
            self.forget(sandbox_id)
