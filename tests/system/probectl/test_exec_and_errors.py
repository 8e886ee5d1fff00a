"""probectl exec (the waterfall table, JSON, exit codes, h2c) and its errors: exit code 2 when nobody serves the
socket, 1 with one line for bad arguments and for the shim's refusals, the traceback with --debug.

The real CLI against a real `probe-shim serve --runtime-endpoint none`, real netns and servers; commands run
in-process through main(argv) with captured output (fixtures: tests/system/probectl/conftest.py), exit codes
and the unreachable shim as `python -m probectl.cli` subprocesses. Every wait is on something the daemon or the
CLI sends, bounded by a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import json
import socket

import pytest

from probectl import render
from tests.support.probectl_runs import assert_aligned, assert_one_line_error, probectl_process

pytestmark = pytest.mark.netns


# --- exec --------------------------------------------------------------------------------

def test_exec_table_draws_the_waterfall(probectl, pod_netns, servers):
    port = servers["http"].port
    result = probectl("exec", "--pod", pod_netns.name, "--http-get", f":{port}/redirect?to=/ok")
    assert result.rc == 0, result
    head, waterfall = result.out.split("\n\n")
    fields = dict(line.split(":", 1) for line in head.splitlines())
    assert fields["Result"].strip() == "success" and fields["Output"].strip() == "ok"
    assert fields["Address"].strip() == f"{pod_netns.ipv4}:{port}"
    lines = assert_aligned(waterfall, render.WATERFALL_HEADERS)
    names = [line[:lines[0].index("START")].rstrip() for line in lines[1:]]
    assert names == ["connect", "request", "processing", "transfer", "redirect",
                     "  connect", "  request", "  processing", "  transfer"]
    for line in lines[1:]:
        assert "|" in line and "█" in line  # every phase has its bar


def test_exec_json_and_exit_codes(probectl, pod_netns, servers):
    ok = probectl("exec", "--pod", pod_netns.name, "--grpc", str(servers["grpc"].port), "-o", "json")
    assert ok.rc == 0
    data = json.loads(ok.out)["attempt"]  # the ExecProbeResponse as protojson
    assert {"result", "output", "durationNs", "address", "phases"} <= set(data)
    assert data["result"] == "RESULT_SUCCESS" and data["output"] == "service healthy"
    assert [phase["name"] for phase in data["phases"]][-1] == "check"

    failed = probectl("exec", "--pod", pod_netns.name, "--http-get", f":{servers['http'].port}/status/503",
                      "-o", "json")
    assert failed.rc == 4 and json.loads(failed.out)["attempt"]["result"] == "RESULT_FAILURE"
    # A named port the container does not have: the probe cannot be built, the result is unknown.
    unknown = probectl("exec", "--pod", pod_netns.name, "--tcp", "web")
    assert unknown.rc == 3 and "Result:    unknown" in unknown.out
    named = probectl("exec", "--pod", pod_netns.name, "--tcp", "web", "--container-port",
                     f"web={servers['tcp'].port}")
    assert named.rc == 0


def test_exec_and_run_h2c_through_the_daemon(probectl, pod_netns):
    # httpGet.protocol HTTP2 (1.37, KEP-5999) from the flag to the worker: HTTP/2 with prior knowledge.
    port = pod_netns.spawn_python("h2_server.py", "--mode", "h2c").port
    result = probectl("exec", "--pod", pod_netns.name, "--http-get", f":{port}/echo", "--http-protocol", "HTTP2",
                      "-o", "json")
    assert result.rc == 0, result
    attempt = json.loads(result.out)["attempt"]
    assert json.loads(attempt["output"])["protocol"] == "h2"
    assert "GET /echo HTTP/2.0" in [phase.get("detail") for phase in attempt["phases"]]
    run = probectl("run", "--pod", pod_netns.name, "--container", "web", "--type", "readiness", "--http-get",
                   f":{port}/ok", "--http-protocol", "HTTP2")
    assert run.rc == 0, run
    assert f"http://:{port}/ok (h2c)" in probectl("ps", "--pod", pod_netns.name).out
    # validateHTTPGetAction: HTTP2 with scheme HTTPS is refused by the daemon, with the field's path.
    refused = probectl("run", "--pod", pod_netns.name, "--container", "web", "--type", "liveness", "--http-get",
                       f"https://:{port}/ok", "--http-protocol", "HTTP2")
    assert_one_line_error(refused, 1, 'http_get.protocol: Invalid value: "HTTP2": is only supported with HTTP (H2C)')


def test_exit_code_2_when_nobody_serves_the_socket(tmp_path):
    result = probectl_process("-r", f"unix://{tmp_path}/nobody.sock", "exec", "--pod", "x", "--tcp", "80")
    assert_one_line_error(result, 2, f"unix://{tmp_path}/nobody.sock", "probe-shim serve")
    assert probectl_process("-r", f"unix://{tmp_path}/nobody.sock", "ps").rc == 2
    # A stale socket file: bound by nobody listening any more, connect() is refused.
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(f"{tmp_path}/stale.sock")
        result = probectl_process("-r", f"unix://{tmp_path}/stale.sock", "watch")
    assert_one_line_error(result, 2, "stale.sock")


@pytest.mark.parametrize("args, fragment", [
    (["exec", "--pod", "x", "--http-get", "http://:99999/"], "--http-get"),    # bad handler syntax
    (["exec", "--pod", "x", "--tcp", "80", "--grpc", "81"], "not allowed with"),
    (["exec", "--tcp", "80"], "--pod"),                                         # argparse: missing flag
    (["run", "--pod", "x", "--container", "c", "--type", "sometimes", "--tcp", "80"], "invalid choice"),
    (["run", "--pod", "x", "--container", "c", "--type", "liveness", "--tcp", "80", "--period", "5x"],
     "invalid duration"),
    (["frobnicate"], "invalid choice"),
    (["-t", "soon", "ps"], "-t/--timeout"),
    (["rm"], "probe ids or --pod"),
])
def test_bad_arguments_exit_1_with_one_line(tmp_path, args, fragment):
    result = probectl_process("-r", f"unix://{tmp_path}/nobody.sock", *args)
    assert_one_line_error(result, 1, fragment)


def test_errors_from_the_shim_are_one_line(probectl):
    unknown = probectl("run", "--pod", "cps-no-such-netns", "--container", "a", "--type", "readiness", "--tcp", "80")
    assert_one_line_error(unknown, 1, "NOT_FOUND", "cps-no-such-netns", "probectl pods")
    invalid = probectl("run", "--pod", "x", "--container", "a", "--type", "liveness", "--tcp", "80",
                       "--success-threshold", "2")
    assert_one_line_error(invalid, 1, "INVALID_ARGUMENT", "spec.success_threshold: Invalid value: 2")


def test_debug_shows_the_traceback(tmp_path):
    result = probectl_process("-D", "-r", f"unix://{tmp_path}/nobody.sock", "ps")
    assert result.rc == 2 and "Traceback" in result.err and result.err.splitlines()[-1].startswith("probectl: ")
