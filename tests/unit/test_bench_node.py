"""The "node" scenario's pure parts (bench/node.py, bench/node_report.py): manifests, CPU arithmetic, verdicts.
No kubelet, no root."""

from __future__ import annotations

import json

import yaml

from bench import node, node_report, report


def phase(node_ms: float, probes_per_s: float, **roles) -> dict:
    cpu = {"node": node_ms, "kubelet": 10.0, "containerd": 5.0, "shim_daemon": 8.0, "shim_workers": 0.0, **roles}
    return {"pods": 30, "ready_s": 4.2, "window_s": 30.0, "probes_per_s": probes_per_s,
            "probe_results": {"successful": int(probes_per_s * 30)} if probes_per_s else {},
            "cpu_ms_per_s": cpu, "readiness_changes": 0, "not_ready_at_end": 0, "restarts": 0}


def measured(native_node: float = 62.0, bridged_node: float = 130.0, daemon: float = 50.0, workers: float = 35.0,
             delegated_node: float = 55.0):
    phases = {"none": phase(30.0, 0.0), "native": phase(native_node, 30.0),
              "exec": phase(740.0, 30.0, containerd=650.0), "bridged": phase(bridged_node, 30.0, shim_daemon=daemon,
                                                                               shim_workers=workers),
              "delegated": phase(delegated_node, 30.0, kubelet=13.0, shim_daemon=14.0, shim_workers=20.0)}
    for name in node.PROBED:
        phases[name]["per_probe_ms"] = node.per_probe_ms(phases[name], phases["none"])
    return {"pods": 30, "period_s": 1, "kubelet": "v1.32.10", "phases": phases}


def test_each_phase_has_its_probe_and_bridged_is_native_converted():
    native = yaml.safe_load(node.pod_manifest(3, "img", "native"))
    assert native["metadata"]["name"] == "native-003"
    (container,) = native["spec"]["containers"]
    assert container["readinessProbe"] == {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}
    assert container["command"][-4:] == ["-p", "8080", "-h", "/www"]  # 0.0.0.0: the node reaches it
    assert "readinessProbe" not in yaml.safe_load(node.pod_manifest(0, "img", "none"))["spec"]["containers"][0]
    delegated = yaml.safe_load(node.pod_manifest(3, "img", "delegated"))
    assert delegated["metadata"]["name"] == "delegated-003"  # unconverted: the kubelet hands it to the shim
    assert delegated["spec"]["containers"][0]["readinessProbe"] == container["readinessProbe"]
    exec_probe = yaml.safe_load(node.pod_manifest(0, "img", "exec"))["spec"]["containers"][0]["readinessProbe"]
    assert exec_probe["exec"]["command"][:2] == ["/bin/busybox", "wget"]
    assert exec_probe["exec"]["command"][-1] == "http://127.0.0.1:8080/healthz"
    bridged = yaml.safe_load(node.pod_manifest(0, "img", "bridged"))["spec"]["containers"][0]["readinessProbe"]
    command = bridged["exec"]["command"]
    assert command[:2] == ["cri-probe-shim", "readiness"] and bridged["periodSeconds"] == 1
    assert json.loads(command[2]) == {"httpGet": {"path": "/healthz", "port": 8080}}


def test_the_shims_totals_count_as_the_kubelets_series():
    from cri_proto import probe_service_pb2 as service_pb
    from cri_proto import probe_spec_pb2 as spec_pb
    probe = service_pb.Probe(container_name="web", type=spec_pb.READINESS,
                             labels={"io.kubernetes.pod.name": "delegated-000-node1"},
                             status=service_pb.ProbeStatus(totals=service_pb.AttemptTotals(success=7, warning=1,
                                                                                           failure=2)))
    assert node.attempt_counts([probe]) == {("delegated-000-node1", "web", "Readiness", "successful"): 8.0,
                                            ("delegated-000-node1", "web", "Readiness", "failed"): 2.0}


def test_node_busy_time_leaves_idle_and_iowait_out():
    stat = "cpu  100 20 30 1000 50 5 5 10 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n"
    assert node.node_busy_s(stat) * node.os.sysconf("SC_CLK_TCK") == 170


def test_cost_per_probe_is_above_the_baseline_phase():
    s = measured()
    assert s["phases"]["native"]["per_probe_ms"]["node"] == round((62.0 - 30.0) / 30.0, 3)
    assert s["phases"]["bridged"]["per_probe_ms"]["shim_daemon"] == round((50.0 - 8.0) / 30.0, 3)
    assert node.per_probe_ms(phase(40.0, 0.0), phase(30.0, 0.0))["node"] is None


def test_probe_rate_counts_every_result_of_every_pod():
    before = {("p-node1", "web", "Readiness", "successful"): 10.0}
    after = {("p-node1", "web", "Readiness", "successful"): 40.0, ("q-node1", "web", "Readiness", "failed"): 2.0}
    assert node.probe_rate(before, after, 16.0) == (2.0, {"failed": 2, "successful": 30})


def test_rows_show_the_node_cost_targets():
    rows = {r.figure: r for r in node_report.rows(measured())}
    healthy = rows["node (real kubelet): every pod Ready, no flip, no restart, every phase"]
    assert (healthy.measured, healthy.status) == ("0 not Ready, 0 flips, 0 restarts", report.MET)
    ratio = rows["node: node CPU per bridged probe vs the kubelet's own httpGet"]
    assert ratio.measured == "3.1x (3.33 vs 1.07 ms)" and ratio.status == report.NOT_MET
    assert "classic exec probe 23.7 ms" in ratio.note
    share = rows["node: the shim's CPU per bridged probe"]
    assert share.measured == "daemon 1.40 ms, workers 1.17 ms" and share.status == report.NOT_MET
    cheap = {r.figure: r for r in node_report.rows(measured(bridged_node=60.0, daemon=18.0, workers=12.0))}
    assert cheap["node: node CPU per bridged probe vs the kubelet's own httpGet"].status == report.MET
    assert cheap["node: the shim's CPU per bridged probe"].status == report.MET
    assert ratio.note.startswith("moonshot 1.0x NOT met")
    assert cheap["node: node CPU per bridged probe vs the kubelet's own httpGet"].note.startswith("moonshot 1.0x met")
    native = rows["node: node CPU per probe of the kubelet's own httpGet (the reference, same run)"]
    assert (native.measured, native.status, native.note) == ("1.07 ms", report.INFO, "kubelet 0.00 ms; 30 probes/s")


def test_the_delegated_row_is_against_the_kubelets_own_httpget_with_each_share():
    rows = {r.figure: r for r in node_report.rows(measured())}
    figure = "node: node CPU per delegated probe (the kubelet's CRIProbeDelegation) vs its own httpGet"
    delegated = rows[figure]
    assert delegated.measured == "0.78x (0.83 vs 1.07 ms)" and delegated.status == report.MET
    assert delegated.note == ("moonshot 0.5x NOT met; kubelet 0.10 ms, shim daemon 0.20 ms, workers 0.67 ms; "
                              "30 probes/s")
    costly = {r.figure: r for r in node_report.rows(measured(delegated_node=70.0))}[figure]
    assert costly.measured == "1.25x (1.33 vs 1.07 ms)" and costly.status == report.NOT_MET
    cheap = {r.figure: r for r in node_report.rows(measured(delegated_node=40.0))}[figure]
    assert cheap.note.startswith("moonshot 0.5x met")


def test_without_the_delegating_kubelet_its_phase_is_skipped_and_the_rest_stands():
    s = measured()
    s["phases"]["delegated"] = {"skipped": "needs the delegating kubelet"}
    rows = {r.figure: r for r in node_report.rows(s)}
    skipped = rows["node: node CPU per delegated probe (the kubelet's CRIProbeDelegation) vs its own httpGet"]
    assert (skipped.measured, skipped.note) == ("skipped", "needs the delegating kubelet")
    assert rows["node (real kubelet): every pod Ready, no flip, no restart, every phase"].status == report.MET
    last = node_report.details(s).splitlines()[-1].split()
    assert last[:6] == ["delegated", "-", "skipped:", "needs", "the", "delegating"]


def test_a_native_probe_cheaper_than_no_probe_gives_no_ratio():
    rows = {r.figure: r for r in node_report.rows(measured(native_node=25.0))}  # busier without probes: noise
    ratio = rows["node: node CPU per bridged probe vs the kubelet's own httpGet"]
    assert (ratio.measured, ratio.status) == ("no ratio", report.INFO)
    assert ratio.note.startswith("bridged 3.33 vs -0.17 ms: the kubelet's own probe measured no cost above no probes")


def test_a_flip_or_a_restart_fails_the_health_row():
    s = measured()
    s["phases"]["bridged"]["readiness_changes"] = 2
    (healthy, *_) = node_report.rows(s)
    assert healthy.status == report.NOT_MET and healthy.measured == "0 not Ready, 2 flips, 0 restarts"


def test_without_a_kubelet_every_row_says_why():
    rows = node_report.rows({"skipped": "needs a kubelet binary"})
    assert {(r.status, r.note) for r in rows} == {(report.SKIPPED, "needs a kubelet binary")}
    assert node_report.details({"skipped": "x"}) == ""


def test_the_table_has_a_line_per_phase():
    text = node_report.details(measured())
    lines = text.splitlines()
    assert lines[0].startswith("node: 30 static pods under a real kubelet v1.32.10 (released) on containerd 1.6, one")
    renamed = node_report.details({**measured(), "kubelet": "v1.37.2", "containerd": "2.4.2",
                                   "kubelet_build": "delegating"}).splitlines()[0]
    assert renamed.startswith("node: 30 static pods under a real kubelet v1.37.2 (delegating) on containerd 2.4.2")
    assert [line.split()[0] for line in lines[3:]] == list(node.PHASES)
    assert "130.0 (3.33)" in lines[-2]  # the bridged node: ms per second, and per probe above none
