"""probectl version, run (each handler), ps (table, JSON, YAML), inspect, rm, pods and workers.

The real CLI against a real `probe-shim serve --runtime-endpoint none`, real netns and servers; commands run
in-process through main(argv) with captured output (fixtures: tests/system/probectl/conftest.py), exit codes
and the unreachable shim as `python -m probectl.cli` subprocesses. Every wait is on something the daemon or the
CLI sends, bounded by a deadline; nothing sleeps to let time pass.
"""

from __future__ import annotations

import json

import pytest
import yaml

from cri_proto import probe_service_pb2 as service_pb
from probectl import render
from tests.support.daemon_env import status, wait_for
from tests.support.probectl_runs import assert_aligned, assert_one_line_error, run_three, wait_probed

pytestmark = pytest.mark.netns


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
