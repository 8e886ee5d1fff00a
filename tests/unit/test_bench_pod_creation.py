"""bench/pod_creation.py's pure parts: the API's timestamps read, its rows and details from a scenario's figures."""

from __future__ import annotations

from bench import pod_creation, report


def api_pod(created: str, ready_at: str | None) -> dict:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]
    if ready_at:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready_at})
    return {"metadata": {"creationTimestamp": created}, "status": {"conditions": conditions}}


def test_created_to_ready_is_read_from_the_apis_whole_seconds():
    assert pod_creation.api_ready_s(api_pod("2026-11-27T21:00:58Z", "2026-11-27T21:01:01Z")) == 3.0
    assert pod_creation.api_ready_s(api_pod("2026-11-27T21:00:58Z", None)) is None


def phase(create_p50: float, ready_p50: float, converted: int) -> dict:
    stats = lambda v: {"min": v, "median": v, "p90": v, "p99": v * 2, "max": v * 2}  # noqa: E731
    return {"pods": 10, "ready": 10, "converted": converted, "create_ms": stats(create_p50),
            "ready_seen_s": stats(ready_p50), "ready_api_s": stats(float(round(ready_p50))),
            "apiserver_webhook_calls": 20.0 if converted else 0.0,
            "apiserver_webhook_mean_ms": 3.5 if converted else None}


def test_rows_put_the_two_phases_side_by_side():
    scenario = {"pods": 10, "interval_s": 0.5, "kubernetes": "v1.37.2", "containerd": "2.4.2",
                "phases": {"webhook": phase(12.0, 2.4, 10), "no_webhook": phase(8.0, 2.2, 0)}}
    create, ready = pod_creation.rows(scenario)
    assert create.status == report.INFO and "p50 12.0 / p99 24.0 ms vs 8.0 / 16.0 ms without" in create.measured
    assert "10/10 converted" in create.note
    assert ready.status == report.MET and "p50 2.40 / p99 4.80 s vs 2.20 / 4.40 s" in ready.measured
    assert "webhook" in pod_creation.details(scenario) and "no_webhook" in pod_creation.details(scenario)


def test_a_skipped_scenario_is_a_skipped_row():
    rows = pod_creation.rows({"skipped": "needs the control plane's binaries"})
    assert all(r.status == report.SKIPPED for r in rows)
    assert pod_creation.details({"skipped": "x"}) == ""
