"""probectl as the system tests run it (tests/system/probectl/): a run's exit code and output, the console script in a
fresh interpreter, and the checks every command's output must pass (a one-line error, aligned table columns).

Owns: `Result`, `probectl_process` (`python -m probectl.cli` without PROBE_SHIM_ENDPOINT), `assert_one_line_error`,
`assert_aligned`, registering one probe of each handler (`run_three`) and waiting until a probe has succeeded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import wait_for
from tests.support.netns_env import REPO_ROOT


@dataclass
class Result:
    rc: int
    out: str
    err: str


def probectl_process(*args: str, timeout: float = 30) -> Result:
    """The console script's code path: `python -m probectl.cli ...` in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("PROBE_SHIM_ENDPOINT", None)
    done = subprocess.run([sys.executable, "-m", "probectl.cli", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=timeout)
    return Result(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(result: Result, rc: int, *fragments: str) -> None:
    assert result.rc == rc, result
    assert result.err.startswith("probectl: ") and result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err, result.err


def columns(header: str, names) -> list[int]:
    return [header.index(name) for name in names]


def assert_aligned(table: str, header_names) -> list[str]:
    """Every cell starts where its column's header starts; returns the lines."""
    lines = table.rstrip("\n").splitlines()
    starts = columns(lines[0], header_names)
    assert starts == sorted(starts)
    for line in lines[1:]:
        for start in starts[1:]:
            if len(line) > start:  # a row may end early: an empty last cell is not padded
                assert line[start - 3:start] == "   " and line[start] != " ", (line, start)
    return lines

def run_three(probectl, pod_netns, servers) -> dict[str, str]:
    ids = {}
    for kind, container, probe_type, handler in (
        ("http", "web", "readiness", ["--http-get", f":{servers['http'].port}/ok", "--header", "X-Probe: yes"]),
        ("tcp", "web", "liveness", ["--tcp", str(servers["tcp"].port)]),
        ("grpc", "api", "startup", ["--grpc", str(servers["grpc"].port)]),
    ):
        result = probectl("run", "--pod", pod_netns.name, "--container", container, "--type", probe_type,
                          *handler, "--period", "200ms", "--timeout", "500ms")
        assert result.rc == 0 and result.err == "", result
        ids[kind] = result.out.strip()
        assert ids[kind].startswith(f"{probe_type}-")
    return ids


def wait_probed(daemon, probe_id):
    return wait_for(daemon, lambda p: p.status.state == spec_pb.STATE_SUCCESS and p.status.last_attempt.started_at_unix_ns, probe_id)
