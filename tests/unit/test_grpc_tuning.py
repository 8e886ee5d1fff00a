"""The daemon's gRPC core settings: merged into GRPC_EXPERIMENTS without overriding the operator, and
importable before grpc is."""

from __future__ import annotations

import subprocess
import sys

from shim.grpc_tuning import DISABLED_EXPERIMENTS, apply, experiments_setting
from tests.support.netns_env import REPO_ROOT

OURS = ",".join(f"-{name}" for name in DISABLED_EXPERIMENTS)


def test_nothing_set_turns_the_event_engine_endpoints_off():
    assert experiments_setting(None) == OURS == "-event_engine_client,-event_engine_listener"
    assert experiments_setting("") == OURS


def test_the_operator_keeps_what_they_named():
    assert experiments_setting("event_engine_client") == "event_engine_client,-event_engine_listener"
    assert experiments_setting("-event_engine_listener, tcp_rcv_lowat") == (
        "-event_engine_listener,tcp_rcv_lowat,-event_engine_client")
    assert experiments_setting(OURS) == OURS  # applied twice: unchanged


def test_apply_writes_the_environment_it_is_given():
    environ = {"GRPC_EXPERIMENTS": "tcp_rcv_lowat"}
    apply(environ)
    assert environ == {"GRPC_EXPERIMENTS": f"tcp_rcv_lowat,{OURS}"}


def test_the_module_imports_no_grpc():
    # It must run before grpc core starts: importing it cannot be what starts grpc.
    code = "import sys, shim.grpc_tuning; print(any(m == 'grpc' or m.startswith('grpc.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
