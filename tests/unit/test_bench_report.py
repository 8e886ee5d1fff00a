"""The benchmark's verdicts, tables and readings (bench/report.py, promtext.py, watching.py,
procstats.py and the pure parts of the scenarios). No root, no sockets."""

from __future__ import annotations

from bench import procstats, promtext, report
from bench.exec_compare import bridge_figures, speedups
from bench.latency import engine_vs_floor
from bench.pressure import failures
from bench.proxy_overhead import overheads
from bench.scale import per_extra_sandbox
from bench.watching import StateChanges

METRICS = """\
# HELP prober_probe_total x
# TYPE prober_probe_total counter
prober_probe_total{probe_type="Readiness",result="successful",container="a",pod="p",namespace="",pod_uid=""} 7.0
prober_probe_total{probe_type="Readiness",result="failed",container="b",pod="p",namespace="",pod_uid=""} 2.0
prober_probe_total{probe_type="Liveness",result="successful",container="c",pod="p",namespace="",pod_uid=""} 3.0
# HELP probe_shim_workers x
# TYPE probe_shim_workers gauge
probe_shim_workers 2.0
"""


def summary(median: float, p99: float | None = None) -> dict:
    p99 = median if p99 is None else p99
    return {"min": median, "median": median, "p90": median, "p99": p99, "max": p99}


def step(n: int, cpu: float, late: int = 0, daemon_pss: float = 40.0, total_pss: float = 100.0) -> dict:
    return {"sandboxes": n, "punctuality": {"late": late, "missed": 0, "attempts": 3 * n * 10,
                                            "method": "grid recovered from attempt start times"},
            "cpu_percent": {"shim_total": cpu}, "memory": {"daemon_pss_mib": daemon_pss, "total_pss_mib": total_pss,
                                                           "zygote_pss_mib": 5.0, "workers_pss_total_mib": total_pss - 45}}


def scenarios() -> dict:
    return {
        "scale": {"steps": [step(10, 5.0, total_pss=60.0), step(250, 31.0, late=2, total_pss=660.0)],
                  "per_extra_sandbox": {"total_pss_mib": 1.0}},
        "scale_strict": {"steps": [step(10, 6.0, total_pss=90.0), step(250, 62.0, total_pss=1200.0)],
                         "per_extra_sandbox": {"total_pss_mib": 4.6}},
        "latency": {k: {**engine_vs_floor([0.3] * 5, [0.25] * 5), "engine_failures": 0} for k in ("http", "tcp", "grpc")},
        "exec": {"exec_sync_wget": {"skipped": "needs containerd"},
                 "bridged_exec_sync": {"skipped": "needs containerd"},
                 **speedups({"exec_probe": [2.0], "nsenter_wget": [8.0]})},
        "spawn": {"error": "RuntimeError: boom\ntraceback"},
        "pressure": {"window_s": 60.2, "probes_per_s": 600.0, "time_wait_sockets": 0, "failures": 0},
    }


def test_each_target_gets_a_verdict_with_what_it_was_measured_at():
    rows = {r.figure: r for r in report.evaluate(scenarios())}
    late = rows["250 sandboxes x 3 probes at 1 s, pooled workers: late or missed attempts"]
    assert (late.measured, late.status) == ("2 late, 0 missed of 7500", report.NOT_MET)
    cpu = rows["same: CPU of daemon + zygote (broker) + workers"]
    assert (cpu.measured, cpu.status, cpu.note) == ("31.0%", report.NOT_MET, "")
    assert rows["same: PSS per extra sandbox"].status == report.MET  # 1.0 <= 1.0
    # The strict mode against the design before pooling (51.3%, 4.60 MiB), with a margin of 10%: 62% is beyond it.
    strict_cpu = rows["strict mode: CPU of daemon + zygote + workers"]
    assert (strict_cpu.target, strict_cpu.measured, strict_cpu.status) == ("no worse than before (51.3%)", "62.0%",
                                                                           report.NOT_MET)
    assert rows["strict mode: PSS per extra sandbox"].status == report.MET
    assert rows["strict mode (a worker per sandbox): late or missed attempts"].status == report.MET
    http = rows["engine latency vs raw-socket floor, HTTP (median)"]
    assert (http.measured, http.status, http.note) == ("1.20x (0.300 vs 0.250 ms)", report.MET, "")
    assert rows["engine latency vs raw-socket floor, gRPC (median)"].status == report.INFO
    sync = rows["ExecProbe vs CRI ExecSync exec probe (median)"]
    assert (sync.status, sync.note) == (report.SKIPPED, "needs containerd")
    nsenter = rows["ExecProbe vs nsenter + curl subprocess (median)"]
    assert (nsenter.measured, nsenter.status) == ("4.0x faster", report.NOT_MET)
    assert nsenter.note.startswith("curl not installed: busybox wget")
    for figure in BRIDGE_ROWS:
        assert (rows[figure].measured, rows[figure].status, rows[figure].note) == ("-", report.SKIPPED,
                                                                                  "needs containerd")
    spawn = rows["first attempt after RunProbe on a new sandbox (p99)"]
    assert (spawn.status, spawn.note) == (report.ERROR, "RuntimeError: boom")
    assert rows["proxy overhead per unary CRI call, Version (median)"].status == report.SKIPPED  # not run
    pressure = rows["600 probes/s against one target: failures"]
    assert (pressure.status, pressure.note) == (report.MET, "600 probes/s for 60 s; 0 TIME_WAIT sockets")


BRIDGE_ROWS = ("kubelet bridge: marker ExecSync through the shim, median",
               "kubelet bridge vs real exec probe (busybox wget ExecSync), median")


def with_containerd(bridged_ms: list[float], real_ms: list[float]) -> dict:
    """An exec scenario as with_containerd writes it: ExecProbe 1.5 ms, the engine's own attempt 0.5 ms."""
    measured = speedups({"exec_probe": [1.5], "bridged_exec_sync": bridged_ms, "exec_sync_wget": real_ms,
                         "nsenter_curl": [9.0]})
    bridge = bridge_figures(measured["paths_ms"], [0.5] * 99 + [0.9])
    bridge["board_row"] = {"probe_id": "bridged-readiness-0", "successes": 103, "failures": 0, "last_attempt_ms": 0.6}
    return {"pod": "a containerd pod", "calls_per_path": 100, **measured, "bridge": bridge}


def test_the_kubelet_bridge_is_measured_against_its_targets_with_its_p99():
    rows = {r.figure: r for r in report.evaluate({"exec": with_containerd([2.0] * 99 + [6.0], [20.0] * 99 + [40.0])})}
    bridged, versus = (rows[figure] for figure in BRIDGE_ROWS)
    assert (bridged.measured, bridged.status) == ("2.00 ms (p99 6.00 ms)", report.MET)
    assert bridged.note == "engine's own attempt 0.50 ms (p99 0.90); ExecProbe 1.50 ms"
    assert (versus.measured, versus.status) == ("10.0x faster (2.00 vs 20.00 ms; p99 6.00 vs 40.00 ms)", report.MET)
    assert versus.note == bridged.note


def test_a_slow_kubelet_bridge_misses_both_targets():
    rows = {r.figure: r for r in report.evaluate({"exec": with_containerd([2.6], [20.0])})}
    bridged, versus = (rows[figure] for figure in BRIDGE_ROWS)
    assert (bridged.measured, bridged.status) == ("2.60 ms (p99 2.60 ms)", report.NOT_MET)
    assert (versus.measured, versus.status) == ("7.7x faster (2.60 vs 20.00 ms; p99 2.60 vs 20.00 ms)",
                                                report.NOT_MET)


def test_a_run_without_the_bridged_path_says_its_figure_is_missing():
    exec_ = with_containerd([2.0], [20.0])
    del exec_["paths_ms"]["bridged_exec_sync"], exec_["bridge"]  # a results.json from before the bridge
    rows = {r.figure: r for r in report.evaluate({"exec": exec_})}
    assert [rows[figure].status for figure in BRIDGE_ROWS] == [report.ERROR, report.ERROR]
    assert rows["ExecProbe vs CRI ExecSync exec probe (median)"].measured == "13.3x faster"  # the others still read


def test_a_smaller_scale_says_so():
    s = scenarios()
    s["scale"]["steps"] = [step(10, 5.0), step(50, 12.0)]
    s["pressure"]["window_s"] = 10.0
    rows = {r.figure: r for r in report.evaluate(s)}
    assert rows["same: CPU of daemon + zygote (broker) + workers"].note == "at N=50 (150/s); the target is for N=250"
    assert rows["600 probes/s against one target: failures"].note.endswith("the target is for 60 s")


def test_tables_line_up():
    text = report.table(["a", "long header"], [["xxxxx", "1"], ["y", "22"]])
    assert text.splitlines() == ["a      long header", "-----  -----------", "xxxxx  1", "y      22"]
    rendered = report.targets_table(report.evaluate(scenarios()))
    assert "NOT met" in rendered and len(rendered.splitlines()) == 2 + 18 + 5  # the general rows, the restart ones


def test_details_render_what_was_measured():
    s = {"latency": {"attempts_per_kind": 5, **{k: {**engine_vs_floor([0.3] * 5, [0.25] * 5),
                                                   "exec_probe_wall_ms": summary(1.0)} for k in ("http", "tcp", "grpc")}},
         "proxy": {"calls_per_path": 10, **{m: overheads({"base": summary(0.3), "other": summary(0.7, 1.0)})
                                            for m in ("Version", "ListPodSandbox")}}}
    s["spawn"] = {"sandboxes": 3, "first_attempt_ms": summary(12.0, 30.0), "run_probe_answered_ms": summary(10.0)}
    s["pressure"] = {"probes": 60, "period_ms": 100, "window_s": 10.0, "probes_per_s": 600.0, "failures": 0,
                     "results": {"successful": 6000}, "http_requests_served": 6000, "time_wait_sockets": 0,
                     "late": 0, "ticks_missed": 0, "cpu_percent_daemon_and_workers": 48.0}
    s["exec"] = with_containerd([2.0], [20.0])
    text = report.details(s)
    assert "per-attempt latency, 5 per kind (ms; floor: lone attempts" in text and "CRI proxy, 10 calls per path (ms)" in text
    assert [line.split()[:5] for line in text.splitlines() if line.startswith("bridged_exec_sync")] == \
        [["bridged_exec_sync", "2.00", "2.00", "2.00", "1.3"]]  # ExecProbe (1.5 ms) is faster by 2.0 / 1.5
    assert ("kubelet bridge: 10.0x faster than the busybox wget ExecSync (medians); the engine's own attempt median "
            "0.50, p99 0.90; the bridge adds 1.50 to it (medians); its row on the board: 103 successes, 0 failures, "
            "last attempt 0.60 ms") in text
    assert "first attempt seen median 12.0, p99 30.0" in text
    assert "600 probes/s, results {'successful': 6000}, 6000 requests served, late/missed 0/0" in text


def restarted(kind: str, age: float, events: dict, late: int = 0, settled: int = 250) -> dict:
    """One restart as bench/restart.py writes it: 20 workers over 250 sandboxes."""
    return {"daemon_age_s": age, "exit_code": 0 if kind == "SIGTERM" else -9, "stop_s": 2.1, "start_to_serving_s": 1.03,
            "gap_s": 3.16, "workers_before": 20, "workers_alive_without_daemon": 20, "workers_adopted": 20,
            "workers_after": 20, "adopted_workers_metric": 20, "sandboxes": 250, "sandboxes_same_worker": 250,
            "settle_s": 30.2, "sandboxes_same_worker_after_settle": settled, "worker_restarts": 0, "ticks_missed": 0,
            "late": late, "attempts_counted": 22500, "attempts_due_since_exit": 22600, "attempts_counted_ratio": 0.996,
            "store_writes": 1, "store_rows": 750,
            "watch": {"ended_by": "UNAVAILABLE", "resumed_from": {"instance_id": "i", "since_revision": 3520},
                      "flaps": 0, "snapshot_state_changed": 0, "events": events, "error": None}}


def restart_scenario(**kill) -> dict:
    return {"sandboxes": 250, "namespaces": 10, "period_ms": 1000, "registration_s": 11.1,
            "steady": {"window_s": 60.1, "probes": 750, "attempts_per_s_expected": 750.0, "attempts_per_s": 750.4,
                       "store_writes_per_s": 0.033, "store_rows_per_s": 24.96, "late": 0, "ticks_missed": 0,
                       "workers": 20},
            "restarts": {"SIGTERM": restarted("SIGTERM", 70.0, {"UPDATED": 1500}),
                         "kill -9": restarted("kill -9", 31.0, {"SNAPSHOT": 750, "SNAPSHOT_COMPLETE": 1}, **kill)},
            "stopped": {"exit_code": 0, "shim_processes": 21, "left_running": []}}


def test_restarts_are_measured_against_their_targets():
    rows = {r.figure: r for r in report.evaluate({"restart": restart_scenario(late=3)})}
    adopted = rows["daemon restart (SIGTERM, kill -9): workers adopted (same pid, still after settling)"]
    assert (adopted.measured, adopted.status, adopted.note) == ("SIGTERM 20/20; kill -9 20/20", report.MET, "")
    serving = rows["restart: new daemon's start to SERVING (all adopted)"]
    assert (serving.measured, serving.status) == ("SIGTERM 1.03 s; kill -9 1.03 s", report.INFO)
    assert serving.note == "no daemon for SIGTERM 3.16 s; kill -9 3.16 s"
    missed = rows["restart: ticks missed, attempts late (new daemon)"]
    assert (missed.measured, missed.status) == ("SIGTERM 0 missed, 0 late; kill -9 0 missed, 3 late", report.NOT_MET)
    assert missed.note == "the new daemon's counters 30 s after it served"
    # No state changed, but the watch resumed after kill -9 got a snapshot in place of the changes it missed.
    watch = rows["restart: state changes seen by a watch resumed across it"]
    assert (watch.measured, watch.status) == ("SIGTERM 0; kill -9 0", report.NOT_MET)
    assert watch.note == "kill -9: a snapshot, not the changes missed (the daemon had run 31 s)"
    writes = rows["store writes behind the board, steady at 750 attempts/s"]
    assert (writes.measured, writes.status, writes.note) == ("0.033/s (25.0 rows/s)", report.INFO,
                                                             "at 750 attempts/s over 60 s")


def test_a_worker_replaced_after_adoption_is_not_adopted_and_a_smaller_run_says_so():
    s = restart_scenario(settled=240)
    s["sandboxes"] = 20
    rows = {r.figure: r for r in report.evaluate({"restart": s})}
    adopted = rows["daemon restart (SIGTERM, kill -9): workers adopted (same pid, still after settling)"]
    assert (adopted.status, adopted.note) == (report.NOT_MET, "at N=20 (60/s); the target is for N=250")


def test_the_restart_table():
    text = report.details({"restart": restart_scenario()})
    lines = text.splitlines()
    assert lines[0].startswith("restart, 250 sandboxes x 3 probes at 1000 ms in 10 namespaces, one state dir: "
                               "steady 750.4 attempts/s (750 due), store 0.033 writes/s, 25.0 rows/s over 60 s")
    assert lines[3].split()[:12] == ["SIGTERM", "70", "2.10", "1.03", "3.16", "20/20", "(20)", "250/250/250", "0",
                                     "0/0", "22500/22600", "1"]
    assert lines[4].endswith("750 SNAPSHOT, 1 SNAPSHOT_COMPLETE  0")
    assert lines[-1] == ("SIGINT at the end: exit 0, 21 zygote and worker processes seen over the run, "
                         "left running: none")


def test_metrics_text_sums_and_deltas():
    assert promtext.probe_results(METRICS) == {"successful": 10.0, "failed": 2.0}
    assert promtext.sample_sums(METRICS)["probe_shim_workers"] == 2.0
    assert promtext.delta({"a": 1.0, "b": 2.0}, {"b": 5.0, "c": 1.0}) == {"a": -1.0, "b": 3.0, "c": 1.0}
    assert not promtext.has_punctuality_counters(METRICS)
    with_counters = METRICS + ("# TYPE probe_shim_attempts_late_total counter\nprobe_shim_attempts_late_total 0\n"
                               "# TYPE probe_shim_ticks_missed_total counter\nprobe_shim_ticks_missed_total 0\n")
    assert promtext.has_punctuality_counters(with_counters)


def test_state_changes_count_only_changes_of_known_probes():
    changes = StateChanges()
    assert changes.observe("p", 2, 0, 100) is None  # first sighting (registration)
    assert changes.observe("p", 1, 1_000_000, 3_500_000) == 2.5  # failure -> success
    assert changes.observe("p", 1, 5_000_000, 9_000_000) is None  # no change (a worker update, say)
    assert changes.observe("q", 1, 1, 2) is None


def test_cpu_percent_counts_only_processes_seen_in_both_samples():
    assert procstats.cpu_percent({1: 1.0, 2: 5.0}, {1: 1.5, 2: 5.5, 3: 9.0}, wall_s=2.0) == 50.0
    assert procstats.cpu_percent({1: 1.0}, {}, wall_s=2.0) == 0.0


def test_memory_summary_in_mib():
    mib = procstats.MIB
    fp = procstats.ProcessFootprint
    m = procstats.memory_summary(fp(60 * mib, 40 * mib, 30 * mib, 50, 9), fp(9 * mib, 6 * mib, 2 * mib, 10, 1),
                                 [fp(8 * mib, 2 * mib, 1 * mib, 7, 1), fp(8 * mib, 4 * mib, 1 * mib, 7, 1)])
    assert (m["daemon_rss_mib"], m["daemon_pss_mib"], m["worker_pss_mean_mib"], m["total_pss_mib"]) == (60, 40, 3, 52)
    assert m["fds"] == {"daemon": 50, "zygote": 10, "workers_total": 14}


def test_scenario_figures():
    assert per_extra_sandbox([step(10, 1, total_pss=60.0), step(50, 1, total_pss=160.0)])["total_pss_mib"] == 2.5
    assert speedups({"exec_probe": [2.0, 2.0], "exec_sync_wget": [30.0, 31.0]})["speedup_median"] == \
        {"exec_sync_wget": 15.2}
    paths = speedups({"exec_probe": [1.5], "bridged_exec_sync": [2.0, 2.2], "exec_sync_wget": [21.0]})["paths_ms"]
    assert bridge_figures(paths, [0.4, 0.6, 0.5]) == {
        "faster_than_exec_sync_wget_median": 10.0, "added_to_attempt_median_ms": 1.6,
        "engine_attempt_ms": {"min": 0.4, "median": 0.5, "p90": 0.6, "p99": 0.6, "max": 0.6}}
    assert overheads({"base": summary(0.3), "other": summary(0.7, 1.0)})["overhead_ms"] == \
        {"median": 0.4, "p90": 0.4, "p99": 0.7}
    assert failures({"successful": 600.0, "failed": 1.0, "unknown": 2.0}) == 3


def test_the_latency_target_is_read_against_lone_floor_attempts_and_the_warm_loop_is_noted():
    k = {**engine_vs_floor([0.45] * 5, [0.33] * 5), "engine_failures": 0,
         "floor_warm_ms": summary(0.16), "ratio_median_warm": 2.81}
    rows = {r.figure: r for r in report.evaluate({"latency": {"http": k, "tcp": k, "grpc": k}})}
    http = rows["engine latency vs raw-socket floor, HTTP (median)"]
    assert (http.measured, http.status) == ("1.36x (0.450 vs 0.330 ms)", report.MET)
    assert http.note == "lone attempts alike; a warm floor loop: 0.160 ms (2.81x)"
