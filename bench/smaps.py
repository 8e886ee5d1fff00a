"""What the daemon's processes hold in memory, from /proc: PSS, RSS and private bytes per process, the daemon's
zygote and workers found from its pid, one moment's figures for all of them, and the memory target's ratio (PSS per
extra sandbox). Also where a process's private pages are, by kind of mapping.

Owned apart from bench/worker_memory.py (the run that sets up sandboxes and measures at each step) because the
reading is the part others reuse: `memory_of(pid)` / `memory_of_all(pids)` read smaps_rollup,
`shim_processes(daemon_pid)` finds the zygote and the workers, `shim_memory(daemon_pid)` returns every PSS figure of
one moment, `per_extra_sandbox(at_n, at_n0)` that ratio and `private_by_mapping(pid)` where a process's
private pages are. Pure but for the reads of /proc.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Memory:
    """One process's memory from /proc/PID/smaps_rollup, in bytes."""

    pid: int
    rss: int
    pss: int
    pss_anon: int
    pss_file: int
    private: int  # Private_Clean + Private_Dirty (what USS counts)

    @property
    def shared_pss(self) -> int:
        return self.pss - self.private


_ROLLUP_FIELDS = {"Rss": "rss", "Pss": "pss", "Pss_Anon": "pss_anon", "Pss_File": "pss_file"}


def memory_of(pid: int) -> Memory:
    values = {"rss": 0, "pss": 0, "pss_anon": 0, "pss_file": 0, "private": 0}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in _ROLLUP_FIELDS:
                values[_ROLLUP_FIELDS[key]] = int(rest.split()[0]) * 1024
            elif key in ("Private_Clean", "Private_Dirty"):
                values["private"] += int(rest.split()[0]) * 1024
    return Memory(pid=pid, **values)


def memory_of_all(pids: Iterable[int]) -> dict[int, Memory]:
    """Processes that exited meanwhile are left out."""
    found = {}
    for pid in pids:
        try:
            found[pid] = memory_of(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


@dataclass(frozen=True)
class ShimProcesses:
    daemon: int
    zygote: int | None
    workers: tuple[int, ...]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except FileNotFoundError:
        return []


def shim_processes(daemon_pid: int) -> ShimProcesses:
    """The daemon's zygote (its `-m probe_zygote.main` child) and the workers: the zygote's children, and
    the daemon's other children (workers it adopted when a zygote died)."""
    children = _children(daemon_pid)
    zygote = next((pid for pid in children if "probe_zygote" in _cmdline(pid)), None)
    adopted = [pid for pid in children if pid != zygote]
    workers = tuple(sorted((_children(zygote) if zygote else []) + adopted))
    return ShimProcesses(daemon_pid, zygote, workers)


@dataclass(frozen=True)
class ShimMemory:
    """PSS of every part of one daemon at one moment, in bytes."""

    daemon: Memory
    zygote: Memory | None
    workers: tuple[Memory, ...]

    @property
    def total_pss(self) -> int:
        return self.daemon.pss + (self.zygote.pss if self.zygote else 0) + sum(w.pss for w in self.workers)

    def summary_mib(self) -> dict[str, float]:
        pss = [w.pss for w in self.workers] or [0]
        private = [w.private for w in self.workers] or [0]
        return {
            "workers": len(self.workers),
            "daemon_pss_mib": round(self.daemon.pss / MIB, 2),
            "daemon_rss_mib": round(self.daemon.rss / MIB, 2),
            "zygote_pss_mib": round(self.zygote.pss / MIB, 2) if self.zygote else 0.0,
            "worker_pss_mean_mib": round(statistics.mean(pss) / MIB, 3),
            "worker_pss_max_mib": round(max(pss) / MIB, 3),
            "worker_private_mean_mib": round(statistics.mean(private) / MIB, 3),
            "total_pss_mib": round(self.total_pss / MIB, 2),
        }


def shim_memory(daemon_pid: int) -> ShimMemory:
    procs = shim_processes(daemon_pid)
    found = memory_of_all([procs.daemon, *([procs.zygote] if procs.zygote else []), *procs.workers])
    return ShimMemory(daemon=found[procs.daemon], zygote=found.get(procs.zygote),
                      workers=tuple(found[pid] for pid in procs.workers if pid in found))


def per_extra_sandbox(at_n: ShimMemory, at_n0: ShimMemory) -> float:
    """(total PSS at N - at N0) / (N - N0), in bytes, N counted as live workers."""
    extra = len(at_n.workers) - len(at_n0.workers)
    if extra <= 0:
        raise ValueError("the second measurement must have more workers than the first")
    return (at_n.total_pss - at_n0.total_pss) / extra


def mapping_kind(name: str, executable: bool) -> str:
    """A label for one /proc/PID/smaps mapping (pure)."""
    if name in ("[heap]", "[stack]", "[vvar]", "[vdso]", "[vsyscall]"):
        return name
    if not name:
        return "anonymous (pymalloc arenas, malloc mmaps, thread stacks)"
    if name.startswith("/memfd:") or name.startswith("/dev/"):
        return "other"
    base = os.path.basename(name)
    if base.startswith("python") or base.startswith("libpython"):
        return f"{base} ({'text' if executable else 'data'})"
    return f"other files ({'text' if executable else 'data'})"


def private_by_mapping(pid: int) -> dict[str, int]:
    """Private bytes (clean + dirty) of a process, summed by kind of mapping, largest first."""
    totals: dict[str, int] = {}
    kind = ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if not line[0].isupper():  # a mapping's header line ("start-end perms offset dev inode name")
                perms = fields[1]
                kind = mapping_kind(fields[5] if len(fields) > 5 else "", "x" in perms)
            elif fields[0] in ("Private_Clean:", "Private_Dirty:"):
                totals[kind] = totals.get(kind, 0) + int(fields[1]) * 1024
    return dict(sorted(((k, v) for k, v in totals.items() if v), key=lambda kv: -kv[1]))
