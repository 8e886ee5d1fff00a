"""The node cost rows of the benchmark (bench/node_cost.py) and the pure parts of the scenarios behind them
(bench/bridge_load.py, bench/proxy_overhead.py). No root, no sockets."""

from __future__ import annotations

from bench import node_cost, report
from bench.bridge_load import Tally, answer_problem, cpu_used_s
from bench.exec_compare import speedups
from bench.proxy_overhead import overheads, size_growth
from cri_proto import cri_runtime_v1_pb2 as cri_pb


def summary(median: float, p99: float | None = None) -> dict:
    p99 = median if p99 is None else p99
    return {"min": median, "median": median, "p90": median, "p99": p99, "max": p99}


def rate(per_s: float, daemon: float, workers: float, bad: dict | None = None) -> dict:
    tally = Tally()
    calls = int(per_s * 10)
    tally.add_window(calls, 10.0, daemon * calls / 1000, workers * calls / 1000, [1.5] * calls, bad or {})
    return tally.figures(per_s)


def bridge_load(daemon30=1.55, workers30=1.17, daemon300=0.82, workers300=0.66, **extra) -> dict:
    return {"pods": 6, "path": "/healthz",
            "rates": [rate(30.0, daemon30, workers30), rate(300.0, daemon300, workers300)], **extra}


def proxied(overhead_ms: float, size: int) -> dict:
    return {**overheads({"base": summary(0.3), "other": summary(0.3 + overhead_ms), "response_bytes": size})}


def proxy(small_ms: float = 0.30, large_ms: float = 0.32) -> dict:
    s = {"calls_per_path": 1000, "Version": proxied(0.35, 35), "ListPodSandbox": proxied(0.38, 2000),
         "ListContainers": proxied(large_ms, 50_000), "ListContainers_10": proxied(small_ms, 5_000)}
    s["size_growth"] = size_growth(s["ListContainers_10"], s["ListContainers"])
    return s


def scale_step(n: int, cpu: float, late: int = 0) -> dict:
    return {"sandboxes": n, "punctuality": {"late": late, "missed": 0, "attempts": 3 * n * 10, "method": "counters"},
            "cpu_percent": {"shim_total": cpu}, "memory": {"daemon_pss_mib": 40.0, "total_pss_mib": 100.0}}


def all_rows(scenarios: dict) -> dict[str, report.Row]:
    return {r.figure: r for r in node_cost.rows(scenarios, report.evaluate(scenarios))}


def test_cpu_used_counts_processes_started_in_the_window_from_zero():
    assert cpu_used_s({1: 2.0, 2: 1.0}, {1: 2.5, 3: 0.25}) == 0.75  # 2 ended: its remainder is lost


def test_tally_adds_windows_into_per_call_figures():
    tally = Tally()
    tally.add_window(300, 10.0, 0.3, 0.15, [1.0] * 300, {})
    tally.add_window(300, 10.0, 0.3, 0.15, [3.0] * 291 + [9.0] * 9, {"exit 1": 2})
    figures = tally.figures(30.0)
    assert (figures["calls"], figures["achieved_per_s"], figures["window_s"]) == (600, 30.0, 20.0)
    assert (figures["daemon_ms_per_call"], figures["workers_ms_per_call"]) == (1.0, 0.5)
    assert figures["latency_ms"]["median"] == 2.0 and figures["latency_ms"]["p99"] == 9.0
    assert figures["bad_answers"] == {"exit 1": 2}


def test_an_answer_counts_only_with_exit_0_and_the_pods_body():
    assert answer_problem(cri_pb.ExecSyncResponse(stdout=b"ok token\n", exit_code=0)) is None
    assert answer_problem(cri_pb.ExecSyncResponse(stdout=b"HTTP probe failed with statuscode: 404",
                                                  exit_code=1)) == "exit 1"
    assert answer_problem(cri_pb.ExecSyncResponse(stdout=b"<html>", exit_code=0)) == "unexpected body"


def test_the_proxys_growth_with_the_answer_is_per_kib_of_answer():
    growth = proxy(0.30, 0.32)["size_growth"]
    assert (growth["small_bytes"], growth["large_bytes"], growth["extra_overhead_ms"]) == (5000, 50000, 0.02)
    assert growth["extra_ms_per_kib"] == round(0.02 / (45000 / 1024), 4)
    assert size_growth(proxied(0.3, 10), proxied(0.3, 10))["extra_ms_per_kib"] is None


def test_the_shims_share_is_a_row_per_rate_and_process_group_with_the_interleaved_before_beside_it():
    rows = all_rows({"bridge_load": bridge_load(beside={"before": bridge_load()}, daemon300=0.39)})
    daemon30 = rows["bridge_load: daemon CPU per bridged probe at 30/s"]
    assert (daemon30.target, daemon30.measured, daemon30.status) == ("<= 0.4 ms", "1.55 ms", report.NOT_MET)
    assert daemon30.note == "300 calls at 30/s; before: 1.55 ms"
    assert rows["bridge_load: daemon CPU per bridged probe at 300/s"].status == report.MET
    workers300 = rows["bridge_load: workers (zygote, broker, workers) CPU per bridged probe at 300/s"]
    assert (workers300.measured, workers300.status) == ("0.66 ms", report.NOT_MET)
    answers = rows["bridge_load: every bridged probe answered 200 by the pod (exit code, body)"]
    assert (answers.measured, answers.status) == ("0 bad of 3300", report.MET)
    assert "30/s median 1.50 ms, p99 1.50 ms" in answers.note


def test_a_bad_answer_fails_the_answers_row():
    s = bridge_load()
    s["rates"][1] = rate(300.0, 0.3, 0.3, bad={"exit 1": 4})
    answers = all_rows({"bridge_load": s})["bridge_load: every bridged probe answered 200 by the pod (exit code, body)"]
    assert (answers.measured, answers.status) == ("4 bad of 3300", report.NOT_MET)


def test_scale_rows_hold_the_tighter_node_cost_targets_and_reuse_the_general_late_row():
    scale = {"steps": [scale_step(10, 3.0), scale_step(250, 26.0, late=1)],
             "per_extra_sandbox": {"total_pss_mib": 0.45}}
    rows = all_rows({"scale": scale})
    cpu = rows["RunProbe path, 250 sandboxes x 3 probes at 1 s: CPU of daemon + broker + workers"]
    assert (cpu.target, cpu.measured, cpu.status) == ("<= 25% of one core", "26.0%", report.NOT_MET)
    late = rows["250 sandboxes x 3 probes at 1 s, pooled workers: late or missed attempts"]
    assert late == {r.figure: r for r in report.evaluate({"scale": scale})}[late.figure]
    assert late.status == report.NOT_MET
    assert rows["RunProbe path: PSS per sandbox"].status == report.MET


def test_proxy_rows_cover_three_methods_and_the_growth_with_the_answer():
    rows = all_rows({"proxy": proxy(0.30, 0.32)})
    version = rows["CRI proxy overhead per call, Version (median)"]
    assert (version.measured, version.status, version.note) == ("0.350 ms", report.MET,
                                                                 "1000 calls per path; answer 35 bytes")
    assert rows["CRI proxy overhead per call, ListContainers with 100 containers (median)"].status == report.MET
    growth = rows["CRI proxy: ListContainers overhead, 100 vs 10 containers"]
    assert (growth.measured, growth.status) == ("+0.020 ms (0.300 vs 0.320 ms)", report.MET)
    decoding = all_rows({"proxy": proxy(0.30, 0.80)})["CRI proxy: ListContainers overhead, 100 vs 10 containers"]
    assert decoding.status == report.NOT_MET  # 0.5 ms more for 44 KiB more: a cost per container, not per byte


def test_latency_rows_read_the_exec_and_spawn_scenarios():
    exec_ = {**speedups({"exec_probe": [1.0], "bridged_exec_sync": [2.1] * 99 + [5.0], "exec_sync_wget": [20.0]})}
    spawn = {"sandboxes": 100, "first_attempt_ms": summary(20.0, 45.0)}
    rows = all_rows({"exec": exec_, "spawn": spawn})
    bridged = rows["latency: bridged probe (marker ExecSync through the shim), median"]
    assert (bridged.measured, bridged.status, bridged.note) == ("2.10 ms", report.NOT_MET, "p99 5.00 ms")
    first = rows["latency: first attempt after RunProbe on a new sandbox, p99"]
    assert (first.measured, first.status) == ("45.0 ms", report.MET)


def test_every_node_cost_target_has_a_row_even_in_a_run_without_its_scenario():
    rows = node_cost.rows({}, report.evaluate({}))
    assert len(rows) == 5 + 5 + 3 + 4 + 2  # node's rows include the delegated kubelet's
    assert {r.status for r in rows} == {report.SKIPPED}


def test_the_bridge_load_table_has_a_line_per_shim_and_rate():
    text = node_cost.details({"bridge_load": bridge_load(beside={"before": bridge_load()})})
    lines = text.splitlines()
    assert lines[0].startswith("bridge_load: marker ExecSyncs (readiness httpGet /healthz)")
    assert [line.split()[:2] for line in lines[3:]] == [["this", "code"], ["this", "code"], ["before", "30"],
                                                         ["before", "300"]]
    assert node_cost.details({}) == ""
