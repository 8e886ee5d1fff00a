"""The processes a reader sees in the layout hold in the imports (read from the source, statically):
- probe_api/, the contract, imports only the standard library, protobuf and cri_proto: the worker, the zygote, the
  daemon and probectl on a laptop can all afford it;
- probe_worker/ (the data plane, one process per worker group) imports nothing of the other processes;
- probe_zygote/ (the zygote and its netns broker) preloads the worker's code and imports nothing of the daemon;
- shim/ (the daemon, and its admission webhook) imports nothing of the worker, the zygote or probectl: it spawns the
  zygote by module name, and every rule it shares with them lives in probe_api/;
- probectl/ (the command line and its client library) imports nothing of the daemon, the zygote or the worker."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.support.netns_env import REPO_ROOT

CONTRACT_MAY_IMPORT = {"google", "cri_proto", "probe_api"}
PROCESSES = {"shim", "probe_worker", "probe_zygote", "probectl"}
# Which of the other processes' packages each one may import.
MAY_IMPORT = {
    "probe_worker": set(),
    "probe_zygote": {"probe_worker"},
    "shim": set(),
    "probectl": set(),
}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (at any depth of its code)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def offenders(package: str, forbidden) -> dict[str, list[str]]:
    found = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        bad = sorted(name for name in imported_modules(path) if forbidden(name))
        if bad:
            found[str(path.relative_to(REPO_ROOT))] = bad
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def test_the_contract_imports_only_the_stdlib_protobuf_and_cri_proto():
    def forbidden(name: str) -> bool:
        return top(name) not in CONTRACT_MAY_IMPORT and top(name) not in sys.stdlib_module_names
    assert offenders("probe_api", forbidden) == {}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_process_imports_nothing_of_the_others(package):
    others = PROCESSES - {package} - MAY_IMPORT[package]
    assert offenders(package, lambda name: top(name) in others) == {}


def test_every_package_of_the_project_is_judged():
    tops = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert tops - {"tests", "bench", "examples"} == PROCESSES | {"probe_api", "cri_proto"}


# The daemon's floors, lowest first: a package imports only from floors below its own (or from itself), so that
# no import runs back up (the API's rules are the contract's, probe_api/request_rules.py, not a floor above).
DAEMON_FLOORS = (
    {"shim.rpc", "shim.http1_server", "shim.event_loop", "shim.sdnotify", "shim.grpc_tuning"},
    {"shim.workers"},
    {"shim.config", "shim.sandboxes"},
    {"shim.state"},
    {"shim.observe"},
    {"shim.api", "shim.bridge", "shim.webhook"},
    {"shim.cri"},
    {"shim.daemon", "shim.cli"},
)


def floor_of(name: str) -> int:
    unit = ".".join(name.split(".")[:2])
    return next(i for i, floor in enumerate(DAEMON_FLOORS) if unit in floor)


def test_every_unit_of_the_daemon_has_a_floor():
    units = {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts[:2]) for p in (REPO_ROOT / "shim").rglob("*.py")}
    assert units - {"shim.__init__"} == set().union(*DAEMON_FLOORS)


def test_no_import_of_the_daemon_runs_back_up_its_floors():
    def upward(path: Path) -> list[str]:
        unit = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts[:2])
        return [name for name in imported_modules(path) if top(name) == "shim" and name != "shim"
                and ".".join(name.split(".")[:2]) != unit and floor_of(name) >= floor_of(unit)]

    found = {str(p.relative_to(REPO_ROOT)): bad for p in sorted((REPO_ROOT / "shim").rglob("*.py")) if (bad := upward(p))}
    assert found == {}
