"""probectl apply: every probe of a multi-container pod manifest registered, the example manifest, errors naming
the manifest's path, and the pod's own loopback written as host.

The real CLI against a real `probe-shim serve --runtime-endpoint none`, real netns and servers; commands run
in-process through main(argv) with captured output (fixtures: tests/system/probectl/conftest.py), exit codes
and the unreachable shim as `python -m probectl.cli` subprocesses. Every wait is on something the daemon or the
CLI sends, bounded by a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import json

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import wait_for
from tests.support.netns_env import REPO_ROOT
from tests.support.probectl_runs import assert_aligned, assert_one_line_error, wait_probed

pytestmark = pytest.mark.netns


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
