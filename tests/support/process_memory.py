"""A process's memory as the kernel counts it, for the tests that bound what a peer can make a process hold."""

from __future__ import annotations


def memory_kib(pid: int, *, pss: bool = False) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS since start or the last reset_peak) from /proc/PID/status; with `pss`, Pss from
    smaps_rollup too."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    if pss:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    values["Pss"] = int(line.split()[1])
    return values


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM := VmRSS (proc(5))
