"""bench/ab.py: two benchmark runs compared row by row (pure: no files but a temporary one, no root)."""

from __future__ import annotations

import json
import sys

from bench import ab


def row(figure: str, measured: str, status: str = "NOT met", target: str = "<= 0.4 ms") -> dict:
    return {"figure": figure, "target": target, "measured": measured, "status": status, "note": ""}


def run(commit: str, rows: list[dict], bridge_load: dict | None = None) -> dict:
    return {"mode": "full", "machine": {"git_commit": commit, "date": "2026-11-27", "hostname": "vm",
                                       "cpu_model": "Xeon", "cpu_cores": 2, "loadavg_at_start": [0.5],
                                       "loadavg_at_end": [1.0]},
            "targets": rows, "scenarios": {"bridge_load": bridge_load} if bridge_load else {}}


def rates(daemon30: float, daemon300: float) -> dict:
    return {"rates": [{"rate_per_s": r, "daemon_ms_per_call": d, "workers_ms_per_call": d / 2,
                       "latency_ms": {"median": 2.0}} for r, d in ((30.0, daemon30), (300.0, daemon300))]}


def test_the_leading_number_is_the_figure_the_target_is_about():
    assert ab.leading_number("1.55 ms (p99 2.30 ms)") == 1.55
    assert ab.leading_number("3.1x (3.33 vs 1.07 ms)") == 3.1
    assert ab.leading_number("+0.017 ms (0.499 vs 0.516 ms)") == 0.017
    assert ab.leading_number("2 late, 0 missed of 7500") == 2
    assert ab.leading_number("-") is None


def test_rows_pair_by_figure_in_the_after_runs_order():
    before = [row("a", "1.50 ms"), row("gone", "1 ms"), row("b", "-", "skipped")]
    after = [row("b", "0.30 ms", "met"), row("a", "0.50 ms"), row("new", "2 ms")]
    both, only_before, only_after = ab.pairs(before, after)
    assert [(p.figure, p.before, p.after) for p in both] == [("b", "-", "0.30 ms"), ("a", "1.50 ms", "0.50 ms")]
    assert both[0].ratio is None and round(both[1].ratio, 3) == 0.333
    assert (only_before, only_after) == (["gone"], ["new"])
    assert ab.Pair("z", "", "0 failures", "3 failures", "met", "NOT met").ratio is None  # nothing to divide by


def test_the_report_shows_before_after_ratio_and_a_changed_verdict():
    before = run("7b56778", [row("daemon CPU per bridged probe at 30/s", "1.55 ms"), row("x|y", "2 ms")])
    after = run("abc1234", [row("daemon CPU per bridged probe at 30/s", "0.31 ms", "met"), row("x|y", "2 ms")])
    text = ab.report(before, after)
    assert "- before: commit 7b56778, full mode" in text and "- after: commit abc1234" in text
    assert "| daemon CPU per bridged probe at 30/s | <= 0.4 ms | 1.55 ms | 0.31 ms | 0.20 | NOT met -> met |" in text
    assert "| x\\|y | <= 0.4 ms | 2 ms | 2 ms | 1.00 | NOT met |" in text  # a | in a cell does not split it
    assert "same windows" not in text  # no shim ran beside this one


def test_rows_measured_in_neither_run_are_named_not_tabled():
    before = run("7b56778", [row("scale", "-", "skipped"), row("a", "1 ms")])
    after = run("abc1234", [row("scale", "-", "error"), row("a", "1 ms")])
    text = ab.report(before, after)
    assert "| scale |" not in text and "measured in neither run: scale" in text


def test_a_shim_measured_beside_in_the_same_windows_gets_its_own_table():
    after = run("abc1234", [], {**rates(0.30, 0.20), "beside": {"before": rates(1.50, 0.80)}})
    text = ab.report(run("7b56778", []), after)
    assert "bridge_load in the same windows, alternating: before (--before-code) vs this code" in text
    assert "| daemon CPU ms per probe at 30/s | 1.500 | 0.300 | 0.20 |" in text
    assert "| workers CPU ms per probe at 300/s | 0.400 | 0.100 | 0.25 |" in text
    assert "| latency median at 300/s (ms) | 2.00 | 2.00 | 1.00 |" in text


def test_main_writes_ab_md_beside_the_after_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    (tmp_path / "before" / "results.json").write_text(json.dumps(run("7b56778", [row("a", "1 ms")])))
    (tmp_path / "after" / "results.json").write_text(json.dumps(run("abc1234", [row("a", "0.5 ms")])))
    monkeypatch.setattr(sys, "argv", ["ab.py", str(tmp_path / "before" / "results.json"),
                                      str(tmp_path / "after" / "results.json")])
    assert ab.main() == 0
    written = (tmp_path / "after" / "ab.md").read_text()
    assert "| a | <= 0.4 ms | 1 ms | 0.5 ms | 0.50 | NOT met |" in written
    assert written in capsys.readouterr().out
