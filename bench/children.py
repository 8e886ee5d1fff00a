"""The benchmark's child processes: how one is started, how its reply lines are read with a bound, how it is ended.

One place for the rule every module that starts a child follows: a child is asked to end (SIGTERM, or its own
way, e.g. EOF on stdin), given a bounded wait, then killed, so that none outlives the run; and a line that does
not come within its bound is a failure, never a hang.
"""

from __future__ import annotations

import os
import select
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 15.0  # a server child's READY line


def spawn(argv: Sequence[str]) -> subprocess.Popen:
    """A child that talks in lines on stdin and stdout, with this checkout importable, in its own session: a
    Ctrl-C reaches only the suite, which then stops it in order."""
    return subprocess.Popen(
        list(argv), cwd=REPO_ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )


def read_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The child's next stdout line ("" at EOF), or None when none came within `timeout_s`."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else None


def end(proc: subprocess.Popen, timeout_s: float, ask: Callable[[], object] | None = None) -> None:
    """Asks a running child to end (`ask`, by default SIGTERM), waits up to `timeout_s`, then kills it."""
    if proc.poll() is None:
        (ask or proc.terminate)()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Starts a server process and waits (bounded) for its READY line; returns the process and that line."""
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=env)
    line = read_line(proc, READY_TIMEOUT_S)
    if line is None:
        proc.kill()
        raise SystemExit(f"{argv} did not print READY within {READY_TIMEOUT_S}s")
    if not line.startswith("READY"):
        proc.kill()
        raise SystemExit(f"{argv} failed to start: {line!r}")
    return proc, line


def stop_server(proc: subprocess.Popen) -> None:
    """Ends a server started by start_server and closes its pipe."""
    end(proc, 5)
    if proc.stdout is not None:
        proc.stdout.close()
