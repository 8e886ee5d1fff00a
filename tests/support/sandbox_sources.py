"""Stand-ins for what the sandbox cache and directory resolve through: a table-driven sandbox source, the SandboxInfo
it answers, and real child processes as pause processes (a `pause` fixture: import it into the test module)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shim.sandboxes.resolver import SandboxInfo

PAUSE = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # lives until its stdin closes


class FakeSource:
    """Answers from a table, counts calls; an exception in the table is raised."""

    def __init__(self, answers: dict[str, SandboxInfo | Exception]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        self.calls.append(sandbox_id)
        answer = self.answers[sandbox_id]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def pause():
    """Starts stand-ins for pause processes; `.stop()` ends one and reaps it."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(PAUSE, stdin=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=10)


def info(sandbox_id: str, pid: int, ready: bool = True) -> SandboxInfo:
    return SandboxInfo(id=sandbox_id, netns_path=f"/proc/{pid}/ns/net", pod_ips=("10.0.0.7",), ready=ready, pid=pid)
