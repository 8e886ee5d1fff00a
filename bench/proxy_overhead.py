"""Scenario 5: what the shim's CRI proxy adds to a unary CRI call.

`Version` and `ListPodSandbox` straight to containerd's socket vs through the shim's
(a `probe-shim serve --runtime-endpoint` of that containerd), interleaved call by call;
the measuring is bench/proxy_latency.py's (owned by the proxy's author), this module
adds the overhead at each percentile.
"""

from __future__ import annotations

from bench.proxy_latency import proxy_overhead

METHODS = ("Version", "ListPodSandbox")


def overheads(compared: dict) -> dict:
    """direct/proxy summaries and the proxy's added ms at the median, p90 and p99 (pure)."""
    direct, proxied = compared["base"], compared["other"]
    return {"direct_ms": direct, "proxy_ms": proxied,
            "overhead_ms": {q: round(proxied[q] - direct[q], 3) for q in ("median", "p90", "p99")},
            "overhead_paired_median_ms": compared.get("added_paired_median_ms")}


def with_containerd(rig, count: int, warmup: int) -> dict:
    measured = proxy_overhead(rig.direct, rig.shim.channel, count, warmup)
    return {"calls_per_path": count, "pod_sandboxes": len(rig.pods),
            **{method: overheads(measured[method]) for method in METHODS}}
