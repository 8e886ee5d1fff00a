"""The description of the machine a run was made on, stored beside its figures."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("grpcio", "protobuf", "h2", "h11", "psutil", "prometheus-client", "opentelemetry-sdk", "matplotlib")
TOOLS = {"containerd": ["containerd", "--version"], "runc": ["runc", "--version"], "kernel_ip": ["ip", "-V"]}


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0] if out else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    commit = _first_line(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"])
    if commit is None:
        return None
    dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def describe() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "os": _first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": platform.python_version(),
        "packages": package_versions(),
        "tools": {name: _first_line(argv) for name, argv in TOOLS.items()},
        "git_commit": git_commit(),
        "loadavg_at_start": loadavg(),
    }
