"""What the daemon's processes cost: CPU over a window, memory, fds and threads (psutil).

Roles: the daemon, its zygote, the workers (one per sandbox), and the benchmark's
target process (reported apart: it stands for the pods' own servers, not for the
shim). CPU is user + system time consumed during the window divided by the window's
wall time, in % of one core; a process that exits mid-window counts for what it used
up to the last sample that saw it. The arithmetic is pure; sampling reads /proc.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

MIB = 1 << 20


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """pid -> user + system CPU seconds so far (children not included); vanished pids are left out."""
    out = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[pid] = times.user + times.system
    return out


def cpu_percent(before: Mapping[int, float], after: Mapping[int, float], wall_s: float) -> float:
    """% of one core the pids seen in both samples used between them."""
    if wall_s <= 0:
        return 0.0
    used = sum(max(0.0, after[pid] - before[pid]) for pid in after if pid in before)
    return used / wall_s * 100


@dataclass(frozen=True)
class ProcessFootprint:
    rss: int
    pss: int
    uss: int
    fds: int
    threads: int


def footprint(pid: int) -> ProcessFootprint | None:
    try:
        p = psutil.Process(pid)
        mem = p.memory_full_info()  # smaps_rollup: PSS and USS
        return ProcessFootprint(mem.rss, mem.pss, mem.uss, p.num_fds(), p.num_threads())
    except psutil.Error:
        return None


def memory_summary(daemon: ProcessFootprint, zygote: ProcessFootprint | None,
                   workers: list[ProcessFootprint]) -> dict:
    """The memory figures the targets are about, in MiB: daemon RSS and PSS, PSS per worker, total PSS
    (daemon + zygote + workers); fds and threads per role."""
    worker_pss = [w.pss for w in workers]
    zygote_pss = zygote.pss if zygote else 0
    return {
        "daemon_rss_mib": round(daemon.rss / MIB, 2),
        "daemon_pss_mib": round(daemon.pss / MIB, 2),
        "zygote_pss_mib": round(zygote_pss / MIB, 2),
        "worker_pss_mean_mib": round(statistics.fmean(worker_pss) / MIB, 3) if workers else None,
        "worker_pss_max_mib": round(max(worker_pss) / MIB, 3) if workers else None,
        "worker_uss_mean_mib": round(statistics.fmean(w.uss for w in workers) / MIB, 3) if workers else None,
        "workers_pss_total_mib": round(sum(worker_pss) / MIB, 2),
        "total_pss_mib": round((daemon.pss + zygote_pss + sum(worker_pss)) / MIB, 2),
        "fds": {"daemon": daemon.fds, "zygote": zygote.fds if zygote else 0,
                "workers_total": sum(w.fds for w in workers)},
        "threads": {"daemon": daemon.threads, "zygote": zygote.threads if zygote else 0,
                    "workers_total": sum(w.threads for w in workers)},
    }


def zygote_pid(daemon_pid: int) -> int | None:
    """The daemon's child running `python -m probe_zygote.main`."""
    try:
        for child in psutil.Process(daemon_pid).children():
            if "probe_zygote" in " ".join(child.cmdline()):
                return child.pid
    except psutil.Error:
        return None
    return None
