"""probectl end to end: the real CLI against a real `probe-shim serve --runtime-endpoint none`, real netns and servers.

Most commands run in-process through main(argv) with captured output; exit codes, the unreachable shim,
argument errors and watch run as `python -m probectl.cli` subprocesses. Every wait is on something the
daemon or the CLI sends (a watch event, a line), bounded by a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import yaml

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probectl import cli, render
from tests.support.daemon_env import DaemonProcess, status, wait_for
from tests.support.netns_env import REPO_ROOT, listen

pytestmark = pytest.mark.netns

LINE_TIMEOUT_S = 15


@dataclass
class Result:
    rc: int
    out: str
    err: str


@pytest.fixture
def probectl(daemon, capsys):
    """main(argv) in-process against the test daemon, with its output captured."""
    def run(*args: str) -> Result:
        capsys.readouterr()
        rc = cli.main(["-r", f"unix://{daemon.socket_path}", *args])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)
    return run


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


@pytest.fixture
def servers(pod_netns):
    """An HTTP server, a gRPC health server and a TCP listener in the pod netns."""
    return {
        "http": pod_netns.spawn_python("http_server.py", "--port", "0"),
        "grpc": pod_netns.spawn_python("grpc_health_server.py", "--port", "0"),
        "tcp": listen(pod_netns),
    }


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


# --- version, run, ps, inspect -----------------------------------------------------------

def test_version(probectl):
    result = probectl("version")
    assert result.rc == 0
    lines = dict(line.split(":", 1) for line in result.out.splitlines())
    assert lines["ShimApiVersion"].strip() == "v1alpha1" and lines["RuntimeEndpoint"].strip() == "none"
    assert {"ClientVersion", "ShimVersion", "ShimInstanceId"} <= set(lines)
    data = json.loads(probectl("version", "-o", "json").out)
    assert data["shim"]["apiVersion"] == "v1alpha1" and data["runtime"] is None and data["clientVersion"]


def test_run_each_handler_then_ps_table(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    for probe_id in ids.values():
        wait_probed(daemon, probe_id)
    result = probectl("ps")
    assert result.rc == 0
    lines = assert_aligned(result.out, render.PS_HEADERS)
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {probe_id[:13] for probe_id in ids.values()}
    http = rows[ids["http"][:13]]
    assert http[1:6] == [pod_netns.name[:13], "web", "readiness", "http-get", f"http://:{servers['http'].port}/ok"]
    assert http[6:8] == ["success", "success"] and http[8].endswith("ms")
    assert rows[ids["tcp"][:13]][3:6] == ["liveness", "tcp-socket", f":{servers['tcp'].port}"]
    assert rows[ids["grpc"][:13]][2:6] == ["api", "startup", "grpc", f":{servers['grpc'].port}"]

    wide = probectl("ps", "--no-trunc").out.splitlines()
    assert {line.split()[0] for line in wide[1:]} == set(ids.values())
    assert [line.split()[0] for line in probectl("ps", "--container", "api").out.splitlines()[1:]] == \
        [ids["grpc"][:13]]
    assert probectl("ps", "--type", "liveness", "-q").out.split() == [ids["tcp"]]
    assert probectl("probes", "--state", "failure").out.splitlines()[1:] == []


def test_ps_json_and_yaml_shape(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    wait_probed(daemon, ids["http"])
    data = json.loads(probectl("ps", "--pod", pod_netns.name, "-o", "json").out)
    assert list(data) == ["probes"]
    by_id = {p["probeId"]: p for p in data["probes"]}
    assert set(by_id) == set(ids.values())
    http = by_id[ids["http"]]
    assert http["type"] == "READINESS" and http["podSandboxId"] == pod_netns.name
    assert http["spec"]["httpGet"]["httpHeaders"] == [{"name": "X-Probe", "value": "yes"}]
    assert http["spec"]["periodMs"] == "200"                        # protojson: int64 as a string
    assert http["status"]["lastAttempt"]["result"] == "RESULT_SUCCESS"
    # The same data as YAML (a second listing: the probes' results may have moved on, their identity not).
    as_yaml = yaml.safe_load(probectl("ps", "--pod", pod_netns.name, "-o", "yaml").out)["probes"]
    assert [(p["probeId"], p["type"], p["spec"]) for p in as_yaml] == \
        [(p["probeId"], p["type"], p["spec"]) for p in data["probes"]]


def test_inspect_json_by_id_or_prefix(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    wait_probed(daemon, ids["http"])
    one = json.loads(probectl("inspect", ids["http"]).out)
    assert one["probeId"] == ids["http"] and one["status"]["state"] == "STATE_SUCCESS"
    assert [p["name"] for p in one["status"]["lastAttempt"]["phases"]] == ["connect", "request", "processing", "transfer"]
    assert len(one["status"]["lastTraceId"]) == 32
    several = json.loads(probectl("inspect", ids["http"][:13], ids["tcp"]).out)
    assert [p["probeId"] for p in several] == [ids["http"], ids["tcp"]]
    described = probectl("inspect", ids["http"], "-o", "table").out
    assert "State:" in described and "PHASE" in described and "processing" in described
    missing = probectl("inspect", "readiness-ffffffffffffffff")
    assert_one_line_error(missing, 1, "no probe with id", "probectl ps")
    ambiguous = probectl("inspect", "")
    assert ambiguous.rc == 1


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
    assert_one_line_error(refused, 1, 'http_get.protocol: Invalid value: "HTTP2": HTTP2 cannot be combined with '
                                      "scheme HTTPS")


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


# --- apply -------------------------------------------------------------------------------

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: shop
spec:
  containers:
  - name: web
    image: web
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      httpGet:
        path: /echo
        port: http
        httpHeaders:
        - name: X-Probe
          value: readiness
      periodSeconds: 1
    livenessProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 1
  - name: cart
    image: cart
    startupProbe:
      grpc:
        port: 9090
      periodSeconds: 1
  - name: shipper
    image: shipper
    livenessProbe:
      exec:
        command: [/bin/true]
"""


@pytest.fixture
def fixed_port_servers(pod_netns):
    """Servers at the ports the manifests name (the netns is private, so fixed ports are free)."""
    return [pod_netns.spawn_python("http_server.py", "--port", "8080"),
            pod_netns.spawn_python("grpc_health_server.py", "--port", "9090")]


def test_apply_registers_every_probe_of_a_multi_container_pod(daemon, probectl, pod_netns, fixed_port_servers,
                                                              tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(MANIFEST)
    result = probectl("apply", "-f", str(manifest), "--pod", pod_netns.name, "--no-trunc")
    assert result.rc == 0, result
    lines = assert_aligned(result.out, ("PROBE ID", "CONTAINER", "TYPE", "HANDLER", "SOURCE"))
    applied = {(row.split()[1], row.split()[2]): row.split() for row in lines[1:]}
    assert set(applied) == {("web", "readiness"), ("web", "liveness"), ("cart", "startup")}
    assert applied["web", "readiness"][3:5] == ["http-get", "http://:http/echo"]
    assert applied["web", "readiness"][5] == "spec.containers[0].readinessProbe"
    assert "skipped spec.containers[2].livenessProbe" in result.err and "exec" in result.err

    listed = probectl("ps", "--pod", pod_netns.name, "--no-trunc").out.splitlines()[1:]
    assert {line.split()[0] for line in listed} == {row[0] for row in applied.values()}
    # The named port resolved to 8080 and the header was sent (/echo answers with the request head).
    readiness = wait_probed(daemon, applied["web", "readiness"][0])
    assert readiness.status.last_attempt.address == f"{pod_netns.ipv4}:8080"
    assert "X-Probe: readiness" in readiness.status.last_attempt.output
    for row in applied.values():
        wait_probed(daemon, row[0])


def test_apply_the_example_manifest(probectl, pod_netns, fixed_port_servers):
    result = probectl("apply", "-f", str(REPO_ROOT / "examples" / "pod.yaml"), "--pod", pod_netns.name, "-o", "json")
    assert result.rc == 0, result
    data = json.loads(result.out)
    assert sorted((a["containerName"], a["type"]) for a in data["applied"]) == [
        ("cart", "READINESS"), ("web", "LIVENESS"), ("web", "READINESS"), ("web", "STARTUP")]
    assert len(data["skipped"]) == 1 and "livenessProbe" in data["skipped"][0]
    listed = json.loads(probectl("ps", "-o", "json").out)["probes"]
    assert {p["probeId"] for p in listed} == {a["probeId"] for a in data["applied"]}


def test_apply_error_names_the_manifest_path(probectl, pod_netns, tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(MANIFEST.replace("port: http", "port: web"))
    result = probectl("apply", "-f", str(manifest), "--pod", pod_netns.name)
    assert result.rc == 1 and result.out == ""
    assert "spec.containers[0].readinessProbe.httpGet.port" in result.err and '"web"' in result.err
    assert all(line.startswith("probectl: ") for line in result.err.splitlines())
    assert probectl("ps", "-q").out == ""  # nothing registered from an invalid manifest
    unreadable = probectl("apply", "-f", str(tmp_path / "missing.yaml"), "--pod", pod_netns.name)
    assert_one_line_error(unreadable, 1, "missing.yaml")


def test_a_daemon_refusal_of_apply_names_the_manifest_path(probectl, pod_netns, tmp_path):
    """The host gate is the daemon's, not the manifest's: its error comes back as data and is named in the
    manifest's words."""
    manifest = tmp_path / "host.yaml"
    manifest.write_text(MANIFEST.replace("        path: /echo\n", "        path: /echo\n        host: 10.0.0.1\n"))
    result = probectl("apply", "-f", str(manifest), "--pod", pod_netns.name)
    assert result.rc == 1 and result.out == ""
    assert (f"probectl: INVALID_ARGUMENT: {manifest}: spec.containers[0].readinessProbe.httpGet.host: Forbidden: "
            "the host field makes the runtime connect") in result.err



def test_apply_probes_the_pods_own_loopback_written_as_host(daemon, probectl, pod_netns, tmp_path):
    """`host: 127.0.0.1` in a manifest is the pod's admin port, not the node's: no --allow-host-field needed."""
    admin = pod_netns.spawn_python("http_server.py", "--host", "127.0.0.1", "--port", "0")
    manifest = tmp_path / "admin.yaml"
    manifest.write_text(f"""\
apiVersion: v1
kind: Pod
metadata: {{name: admin}}
spec:
  containers:
  - name: envoy
    image: envoy
    readinessProbe:
      httpGet: {{host: 127.0.0.1, path: /ok, port: {admin.port}}}
      periodSeconds: 1
""")
    applied = probectl("apply", "-f", str(manifest), "--pod", pod_netns.name)
    assert applied.rc == 0 and applied.err == "", applied
    probed = wait_for(daemon, lambda p: p.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
    assert probed.status.last_attempt.address == f"127.0.0.1:{admin.port}" and probed.spec.http_get.host == "127.0.0.1"

# --- rm, pods, workers -----------------------------------------------------------------------

def test_rm_by_id_and_by_pod(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    removed = probectl("rm", ids["http"][:13])
    assert removed.rc == 0 and removed.out.split() == [ids["http"]]
    assert {p.probe_id for p in status(daemon).probes} == {ids["tcp"], ids["grpc"]}
    assert_one_line_error(probectl("rm", ids["http"]), 1, "no probe with id")
    by_pod = probectl("rm", "--pod", pod_netns.name)
    assert by_pod.rc == 0 and sorted(by_pod.out.split()) == sorted([ids["tcp"], ids["grpc"]])
    assert status(daemon).probes == []


def test_pods_and_workers_show_the_worker(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    worker_pid = wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, ids["http"]).status.worker.pid
    pods = assert_aligned(probectl("pods", "--no-trunc").out, render.PODS_HEADERS)
    mine = next(line.split() for line in pods[1:] if line.split()[0] == pod_netns.name)
    assert mine[3:7] == ["Ready", pod_netns.path, str(worker_pid), "3"]

    result = probectl("workers", "--interval", "100ms", "--no-trunc")
    assert result.rc == 0
    lines = assert_aligned(result.out, render.WORKERS_HEADERS)
    (row,) = [line.split() for line in lines[1:] if line.split()[0] == str(worker_pid)]
    assert row[1:4] == ["default#1", "1", pod_netns.name]  # the embedded mode's one tenancy
    assert row[5].endswith("MiB") and float(row[6]) >= 0 and row[7:] == ["3", "0"]
    data = json.loads(probectl("workers", "--interval", "100ms", "-o", "json").out)
    assert [(w["pid"], w["group"], w["podSandboxIds"]) for w in data["workers"]] == [
        (worker_pid, "default#1", [pod_netns.name])]
    assert int(data["workers"][0]["pssBytes"]) > 0


# --- watch -------------------------------------------------------------------------------

def read_line(proc: subprocess.Popen, deadline: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise AssertionError("probectl watch printed nothing before the deadline")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"probectl watch exited: {proc.wait()} {proc.stderr.read()}")
    return line


def test_watch_json_lines_until_ctrl_c(daemon, probectl, pod_netns, servers):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "probectl.cli", "-r", f"unix://{daemon.socket_path}",
                             "watch", "--pod", pod_netns.name, "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        first = json.loads(read_line(proc, deadline))
        assert first["type"] == "SNAPSHOT_COMPLETE"  # no probes yet: the snapshot is empty
        probe_id = run_three(probectl, pod_netns, servers)["http"]
        while True:
            event = json.loads(read_line(proc, deadline))
            assert event["type"] == "UPDATED"
            if event["probe"]["probeId"] == probe_id and event["probe"]["status"]["state"] == "STATE_SUCCESS":
                break
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0, proc.stderr.read()
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_watch_table_with_attempts(daemon, probectl, pod_netns, servers):
    ids = run_three(probectl, pod_netns, servers)
    wait_probed(daemon, ids["http"])
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "probectl.cli", "-r", f"unix://{daemon.socket_path}",
                             "watch", "--container", "web", "--attempts"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        header = read_line(proc, deadline)
        assert header.split()[:3] == ["TIME", "EVENT", "PROBE"]
        kinds = []
        while "attempt" not in kinds:
            line = read_line(proc, deadline)
            kinds.append(line.split()[1])
            if kinds[-1] in ("snapshot", "attempt"):
                # Only --container web's probes (the filter is on names, client-side), not api's.
                assert line.split()[2] in (ids["http"][:13], ids["tcp"][:13]) and line.split()[4] == "web"
        assert kinds[:3] == ["snapshot", "snapshot", "synced"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_watch_carries_on_across_a_daemon_restart(tmp_path, pod_netns):
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    endpoint = f"unix://{first.socket_path}"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "probectl.cli", "-r", endpoint, "watch", "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    second = None
    try:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        assert json.loads(read_line(proc, deadline))["type"] == "SNAPSHOT_COMPLETE"
        assert probectl_process("-r", endpoint, "run", "--pod", pod_netns.name, "--container", "app", "--type",
                                "readiness", "--tcp", str(server.port)).rc == 0
        event = json.loads(read_line(proc, deadline))
        assert event["type"] == "UPDATED"
        old_instance, probe_id = event["instanceId"], event["probe"]["probeId"]
        assert first.stop(signal.SIGTERM) == 0  # a restart: the workers are handed over, the board stored
        second = DaemonProcess(tmp_path).start()
        deadline = time.monotonic() + LINE_TIMEOUT_S
        # The same board goes on: the watch resumes with what changed meanwhile (its worker adopted), no full state.
        event = json.loads(read_line(proc, deadline))
        assert event["type"] == "UPDATED" and event["probe"]["probeId"] == probe_id
        assert event["instanceId"] == old_instance
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=LINE_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        if second is not None:
            second.stop()
        first.stop()
