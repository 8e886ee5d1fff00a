"""The `probectl convert` command (probectl/cli.py): output on stdout, notes on stderr, exit codes, stdin, JSON,
--allow-host. No daemon (none is asked), no root."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from probe_api.pod_conversion import HOST_FORBIDDEN
from probectl import cli, client
from tests.support.convert_manifests import GOLDEN, parsed, pod


@pytest.fixture
def no_shim(monkeypatch):
    """convert needs no daemon: building a client at all is a failure."""
    def refuse(*args, **kwargs):
        raise AssertionError("probectl convert created a client")
    monkeypatch.setattr(client, "ProbeShimClient", refuse)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_the_conversion_and_notes_on_stderr(capsys, no_shim, tmp_path):
    source = GOLDEN / "list.yaml"
    code, out, err = run_cli(capsys, "convert", "-f", str(source))
    assert code == 0
    assert out == (GOLDEN / "list.converted.yaml").read_text()
    assert err == 'probectl: items[0]: Service "echo" has no pod spec: left unchanged\n'


def test_cli_reads_stdin_and_reverses(capsys, no_shim, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO((GOLDEN / "deployment.converted.yaml").read_text()))
    code, out, err = run_cli(capsys, "convert", "-f", "-", "--reverse")
    assert (code, err) == (0, "")
    assert parsed(out) == parsed((GOLDEN / "deployment.yaml").read_text())


def test_cli_json_output(capsys, no_shim):
    code, out, _ = run_cli(capsys, "convert", "-f", str(GOLDEN / "job.yaml"), "-o", "json")
    assert code == 0
    assert json.loads(out) == yaml.safe_load((GOLDEN / "job.converted.yaml").read_text())


def test_cli_errors_exit_1_with_nothing_on_stdout(capsys, no_shim, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod("readinessProbe: {httpGet: {host: 10.0.0.1, port: 0}}\n"
                            "livenessProbe: {tcpSocket: {port: 0}}\n"))
    code, out, err = run_cli(capsys, "convert", "-f", str(manifest))
    assert (code, out) == (1, "")
    assert err == ("probectl: spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 0: must be between 1 "
                   "and 65535, inclusive\n"
                   f"probectl: spec.containers[0].readinessProbe.httpGet.host: {HOST_FORBIDDEN}\n")


def test_cli_allow_host(capsys, no_shim, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod("readinessProbe: {httpGet: {host: 10.0.0.1, port: 80}}\n"))
    assert run_cli(capsys, "convert", "-f", str(manifest))[0] == 1
    code, out, err = run_cli(capsys, "convert", "-f", str(manifest), "--allow-host")
    assert (code, err) == (0, "")
    assert '"host":"10.0.0.1"' in out


@pytest.mark.parametrize("args, fragment", [
    (["convert"], "the following arguments are required: -f/--filename"),
    (["convert", "-f", "x.yaml", "-o", "table"], "argument -o/--output: invalid choice: 'table'"),
    (["convert", "-f", "/nonexistent/pod.yaml"], "cannot read /nonexistent/pod.yaml: No such file or directory"),
])
def test_cli_bad_arguments_exit_1(capsys, no_shim, args, fragment):
    code, out, err = run_cli(capsys, *args)
    assert (code, out) == (1, "")
    assert err.startswith("probectl: ") and fragment in err and err.count("\n") == 1
