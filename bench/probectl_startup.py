"""Scenario "probectl_startup": how long the command line takes, start to exit, for what an operator runs most.

crictl answers in about 10 ms; probectl is Python, and its target is 80 ms on a 2-core node (median of 9 runs):
- `probectl --help`;
- `probectl convert -f tests/golden/convert/list.yaml` (no shim: the converter, YAML in and out);
- `probectl version` against a socket nobody serves ("cannot reach the probe shim", exit 2);
- `probectl version` against a daemon of this checkout (embedded mode, no runtime: one ShimVersion call).
Each is the installed console script (the venv's bin/probectl, as an operator runs it), in rounds: one run of
each command per round, after a first round not counted, so that whatever else the machine does hits each alike.
Wall time of the process, stdout and stderr to pipes. Timed as on a node, where the installed package has its
bytecode: the runs get a bytecode cache of their own (PYTHONPYCACHEPREFIX, filled by the round not counted), even
where this environment sets PYTHONDONTWRITEBYTECODE (there every start would compile probectl's modules again, about
20 ms, which no installed probectl pays).

What a start loads is asserted by tests/unit/test_probectl_startup.py; here it is only timed. `run` does the I/O,
`figures` and `rows` are pure.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import Row, measured_row

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNS = 9
TARGET_MS = 80.0
GOLDEN = REPO_ROOT / "tests" / "golden" / "convert" / "list.yaml"
UNREACHABLE = "unix:///nonexistent/probe-shim.sock"
# name -> (what the row calls it, the arguments; {socket} is the daemon's endpoint, the exit code expected)
COMMANDS = {
    "help": ("probectl --help", ["--help"], 0),
    "convert": ("probectl convert -f tests/golden/convert/list.yaml", ["convert", "-f", str(GOLDEN)], 0),
    "version_unreachable": ("probectl version, nobody at the socket", ["-r", UNREACHABLE, "version"], 2),
    "version": ("probectl version against the daemon", ["-r", "{socket}", "version"], 0),
}


def probectl_path() -> Path:
    """The console script of the venv this runs in."""
    return Path(sys.executable).parent / "probectl"


def bytecode_note(environ: dict[str, str]) -> str:
    if environ.get("PYTHONDONTWRITEBYTECODE"):
        return "bytecode compiled at each start (PYTHONDONTWRITEBYTECODE)"
    return "bytecode cached"


def figures(times_ms: dict[str, list[float]], environ: dict[str, str]) -> dict:
    """The scenario's results from each command's times (pure)."""
    return {"runs": min(len(t) for t in times_ms.values()), "bytecode": bytecode_note(environ),
            "commands": {name: {"median_ms": round(statistics.median(t), 1), "min_ms": round(min(t), 1),
                                "max_ms": round(max(t), 1), "times_ms": [round(x, 1) for x in t]}
                         for name, t in times_ms.items()}}


def rows(scenario: dict | None) -> list[Row]:
    """A row per command: the median against TARGET_MS (pure)."""
    out = []
    for name, (what, _, _) in COMMANDS.items():
        def measure(s: dict, name=name):
            c = s["commands"][name]
            load = f"; load average {s['loadavg'][0]:.1f} to {s['loadavg'][1]:.1f}" if "loadavg" in s else ""
            return (f"{c['median_ms']:.0f} ms", c["median_ms"] <= TARGET_MS,
                    f"median of {s['runs']}; min {c['min_ms']:.0f}, max {c['max_ms']:.0f} ms; {s['bytecode']}{load}")
        out.append(measured_row(f"probectl start-up: {what}", f"<= {TARGET_MS:.0f} ms", scenario, measure))
    return out


def node_environment(environ: dict[str, str], cache_dir: str) -> dict[str, str]:
    """The environment the runs get: bytecode cached (in cache_dir), as an installed probectl has it (pure)."""
    env = {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def _time_once(argv: list[str], expected: int, env: dict[str, str]) -> float:
    begin = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, timeout=30, env=env)
    elapsed = (time.perf_counter() - begin) * 1000
    if done.returncode != expected:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}, not {expected}: "
                           f"{done.stderr.decode(errors='replace').strip()[:200]}")
    return elapsed


def run(runs: int = RUNS) -> dict:
    script = probectl_path()
    if not script.exists():
        return {"skipped": f"no console script at {script} (pip install -e . makes it)"}
    from tests.support.daemon_env import DaemonProcess

    load_before = os.getloadavg()[0]  # a start is a few CPU-bound ms: what else runs shows in the figures
    with tempfile.TemporaryDirectory(prefix="bench-probectl-") as workdir:
        daemon = DaemonProcess(Path(workdir)).start()
        env = node_environment(dict(os.environ), os.path.join(workdir, "pycache"))
        try:
            argvs = {name: [str(script), *(a.replace("{socket}", f"unix://{daemon.socket_path}") for a in args)]
                     for name, (_, args, _) in COMMANDS.items()}
            times: dict[str, list[float]] = {name: [] for name in COMMANDS}
            for round_ in range(runs + 1):
                for name, argv in argvs.items():
                    elapsed = _time_once(argv, COMMANDS[name][2], env)
                    if round_:  # the first round fills the bytecode and page caches and is not counted
                        times[name].append(elapsed)
        finally:
            daemon.stop()
    return {**figures(times, env), "loadavg": [load_before, os.getloadavg()[0]]}


if __name__ == "__main__":  # python -m bench.probectl_startup, from the checkout's top: this scenario alone
    import json

    result = run()
    print(json.dumps(result, indent=1))
    for row in rows(result):
        print(f"{row.figure}: {row.measured} ({row.status}; {row.note})")
