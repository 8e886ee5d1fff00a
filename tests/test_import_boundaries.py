"""The boundaries a reader sees in the layout hold in the imports (read from the source, statically):
- probe_api/, the contract, imports only the standard library, protobuf and cri_proto: the worker, the daemon and
  probectl on a laptop can all afford it;
- the data plane (probe_worker/) imports nothing of the daemon (shim/);
- the daemon and probectl use the data plane only to spawn workers: the zygote program (which preloads the worker's
  code, and runs as its own process) and the pre-fork preparation of its memory. Every rule they share with the
  worker lives in probe_api/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.netns_env import REPO_ROOT

SPAWNING = {"shim/zygote_process.py", "shim/zygote_prefork.py"}
CONTRACT_MAY_IMPORT = {"google", "cri_proto", "probe_api"}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (at any depth of its code)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def sources(package: str) -> list[Path]:
    return sorted((REPO_ROOT / package).rglob("*.py"))


def offenders(package: str, forbidden) -> dict[str, list[str]]:
    found = {}
    for path in sources(package):
        bad = sorted(name for name in imported_modules(path) if forbidden(path, name))
        if bad:
            found[str(path.relative_to(REPO_ROOT))] = bad
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def test_the_contract_imports_only_the_stdlib_protobuf_and_cri_proto():
    def forbidden(_path: Path, name: str) -> bool:
        return top(name) not in CONTRACT_MAY_IMPORT and top(name) not in sys.stdlib_module_names
    assert offenders("probe_api", forbidden) == {}


def test_the_data_plane_imports_nothing_of_the_daemon():
    assert offenders("probe_worker", lambda _path, name: top(name) == "shim") == {}


def test_the_daemon_and_probectl_use_the_data_plane_only_to_spawn_workers():
    def forbidden(path: Path, name: str) -> bool:
        return top(name) == "probe_worker" and str(path.relative_to(REPO_ROOT)) not in SPAWNING
    assert offenders("shim", forbidden) == {}
