"""What probectl loads before it does anything: `--help` and `convert` never load grpc (60 ms of the 80 ms a start
may take here; crictl starts in 10), `--help` not the converter either, and the client library loads grpc only
when a command calls the shim. Asserted on imports, in a fresh interpreter each, not on timings.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.netns_env import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden" / "convert"
HEAVY = ("grpc", "psutil", "probectl.client", "probectl.render")
CONVERTER = ("yaml", "probectl.convert", "probe_api.pod_conversion")


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after `code` (which may call probectl.cli.main)."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=60, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def run_cli(*argv: str) -> str:
    return ("from probectl import cli\n"
            "import contextlib, io\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    cli.main({list(argv)!r})\n")


def roots(modules: set[str], wanted: tuple[str, ...]) -> set[str]:
    return {name for name in wanted if name in modules or any(m.startswith(name + ".") for m in modules)}


@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["version", "--help"], ["ps", "--help"]])
def test_help_loads_neither_grpc_nor_the_converter(argv):
    modules = loaded_after(run_cli(*argv))
    assert roots(modules, HEAVY + CONVERTER) == set()


def test_convert_loads_no_grpc():
    modules = loaded_after(run_cli("convert", "-f", str(GOLDEN / "list.yaml")))
    assert roots(modules, HEAVY) == set()
    assert roots(modules, CONVERTER) == set(CONVERTER)  # it did convert


def test_version_parses_its_arguments_without_grpc_and_loads_it_to_call_the_shim():
    parsed = loaded_after("from probectl import cli\ncli.build_parser().parse_args(['version'])\n")
    assert roots(parsed, HEAVY) == set()
    called = loaded_after(run_cli("-r", "unix:///nonexistent/probe-shim.sock", "version"))
    assert "grpc" in called


def test_importing_probectl_loads_no_grpc_until_the_client_is_asked_for():
    assert roots(loaded_after("import probectl"), HEAVY) == set()
    assert "grpc" in loaded_after("from probectl import ProbeShimClient")


def test_the_names_the_parser_offers_are_the_ones_the_commands_take():
    from probectl import cli, client, convert, render

    assert cli.OUTPUTS == render.OUTPUTS
    assert cli.CONVERT_OUTPUTS == convert.OUTPUTS
    assert cli.ENDPOINT_ENV == client.ENDPOINT_ENV
