"""The shipped systemd files: the unit, the example config, the kubelet drop-in, checked against the daemon's
defaults and by `systemd-analyze verify` and `security --offline` (Debian package `systemd`; skipped without it).
systemd need not be PID 1 for either: they only load unit files. (sd_notify: tests/unit/test_sdnotify.py; a real
daemon under the unit's privileges and notify socket: tests/system/test_systemd_daemon.py.)
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from probe_api import rollout
from probectl import doctor
from shim.config import Config, load
from tests.support.systemd_env import CONFIG_EXAMPLE, KUBELET_DROP_IN, UNIT, directives

SHIPPED_EXEC_START = "/usr/local/bin/probe-shim serve --config /etc/probe-shim/config.toml"
MAX_EXPOSURE = 40  # `systemd-analyze security` scale x10: 4.0 and below is "OK"; the unit scores 3.2

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (Debian package `systemd`)")


def installed_probe_shim() -> str:
    """The console script next to this interpreter (a venv's bin/), on PATH, or `python -m shim.cli`."""
    beside = Path(sys.executable).parent / "probe-shim"
    if beside.exists():
        return str(beside)
    return shutil.which("probe-shim") or f"{sys.executable} -m shim.cli"


def analyze(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SYSTEMD_COLORS="0", **(env or {})))


def runnable_unit(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart's binary replaced by the installed one: verify checks it exists."""
    text = UNIT.read_text()
    assert f"\nExecStart={SHIPPED_EXEC_START}\n" in text
    copy = tmp_path / "probe-shim.service"
    copy.write_text(text.replace("ExecStart=/usr/local/bin/probe-shim", f"ExecStart={installed_probe_shim()}"))
    return copy


# --- the files agree with the daemon ---------------------------------------------------------

def test_unit_runs_the_daemon_with_its_default_paths():
    unit = directives(UNIT)
    defaults = Config()
    assert unit["Type"] == ["notify"] and unit["ExecStart"] == [SHIPPED_EXEC_START]
    assert unit["Restart"] == ["always"]
    assert "/run/" + unit["RuntimeDirectory"][0] == os.path.dirname(defaults.socket_path)
    assert "/var/lib/" + unit["StateDirectory"][0] == defaults.state_dir
    # Wants=, not Requires=/BindsTo=: a containerd restart must not restart the shim (see the unit).
    assert unit["Wants"] == ["containerd.service"] and unit["After"] == ["containerd.service"]
    assert "Requires" not in unit and "BindsTo" not in unit


def test_unit_lets_the_workers_outlive_a_restart_as_containerds_shims_do():
    """KillMode=process: systemd signals the daemon alone on stop and restart, so the zygote and the workers
    live on and the next daemon adopts them (tests/system/test_handover.py does what systemd does: SIGTERM to the main
    process only, or SIGKILL for a crash, then the same ExecStart again). A stop without a start is bounded by
    the daemon's handover_timeout_s: the workers stop by themselves."""
    unit = directives(UNIT)
    assert unit["KillMode"] == ["process"]
    assert unit["Restart"] == ["always"]
    assert "ExecStop" not in unit  # a stop is a SIGTERM: the daemon hands over
    assert "SendSIGKILL" not in unit or unit["SendSIGKILL"] == ["yes"]  # a daemon stuck on stop is still killed
    # systemd's own stop timeout is the daemon's, not the workers': they are not waited for.
    assert int(unit["TimeoutStopSec"][0].removesuffix("s")) <= 60
    assert Config().handover_timeout_s > 0
    # The state directory (store and handover sockets) survives restarts; the runtime one may not.
    assert "StateDirectory" in unit and Config().state_dir.startswith("/var/lib/")


def test_kubelet_drop_in_points_the_kubelet_at_the_shims_socket_and_labels_the_node():
    drop_in = directives(KUBELET_DROP_IN)
    assert [v.strip('"') for v in drop_in["Environment"]] == [
        f"PROBE_SHIM_ARGS=--container-runtime-endpoint={Config().listen} "
        f"--node-labels={rollout.NODE_LABEL}={rollout.NODE_LABEL_VALUE}"]
    # What `probectl doctor` reads from the kubelet's command line is what the drop-in gives it.
    argv = ["/usr/bin/kubelet", *drop_in["Environment"][0].strip('"').split("=", 1)[1].split()]
    assert doctor.node_labels(argv) == {rollout.NODE_LABEL: rollout.NODE_LABEL_VALUE}
    assert doctor.flag_values(argv, "container-runtime-endpoint") == [Config().listen]
    assert f"kubectl label node NODE {rollout.NODE_LABEL}={rollout.NODE_LABEL_VALUE}" in KUBELET_DROP_IN.read_text()
    assert drop_in["ExecStart"][0] == "" and drop_in["ExecStart"][1].endswith(" $PROBE_SHIM_ARGS")
    assert f"containerRuntimeEndpoint: {Config().listen}" in KUBELET_DROP_IN.read_text()
    assert drop_in["After"] == ["probe-shim.service"]


def test_config_example_is_valid_and_lists_every_key_with_its_default():
    values = tomllib.loads(CONFIG_EXAMPLE.read_text())
    assert set(values) == {f.name for f in dataclasses.fields(Config)}
    assert load(str(CONFIG_EXAMPLE), {}) == Config()
    lines = CONFIG_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+ = ", line):
            assert lines[i - 1].startswith("# "), f"{line!r} has no comment line above it"


# --- systemd-analyze ------------------------------------------------------------------------------

@needs_systemd_analyze
def test_unit_passes_systemd_analyze_verify(tmp_path):
    result = analyze("verify", str(runnable_unit(tmp_path)))
    # verify exits 0 on warnings such as unknown keys, so its output must be empty too.
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr
    # And it does catch mistakes here (systemd is not PID 1 on CI, the check must not be vacuous).
    broken = tmp_path / "broken.service"
    broken.write_text(runnable_unit(tmp_path).read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes"))
    assert "Unknown key 'ProtectHomes'" in analyze("verify", str(broken)).stderr


@needs_systemd_analyze
def test_kubelet_drop_in_passes_systemd_analyze_verify(tmp_path):
    """Verified as a drop-in of a stand-in kubelet.service, found through SYSTEMD_UNIT_PATH."""
    kubelet = shutil.which("kubelet") or "/bin/true"  # verify insists that ExecStart's binary exists
    (tmp_path / "kubelet.service").write_text(f"[Service]\nExecStart={kubelet}\n")
    (tmp_path / "kubelet.service.d").mkdir()
    (tmp_path / "kubelet.service.d" / "20-probe-shim.conf").write_text(
        KUBELET_DROP_IN.read_text().replace("/usr/bin/kubelet ", f"{kubelet} "))
    runnable_unit(tmp_path)  # the probe-shim.service it orders itself after
    result = analyze("verify", str(tmp_path / "kubelet.service"), env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_systemd_analyze
def test_unit_hardening_exposure_stays_ok(tmp_path):
    result = analyze("security", "--offline=true", f"--threshold={MAX_EXPOSURE}", str(runnable_unit(tmp_path)))
    if "--offline" in result.stderr and result.returncode != 0 and "Overall" not in result.stdout:
        pytest.skip(f"this systemd-analyze has no offline security review: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout[-600:]


# --- sd_notify, unit level --------------------------------------------------------------------


# --- sd_notify from a real daemon -----------------------------------------------------------------


# --- the daemon under the unit's privileges ----------------------------------------------------
