"""Scenario 5: what the shim's CRI proxy adds to a unary CRI call, and whether that grows with the answer.

`Version`, `ListPodSandbox` and `ListContainers` straight to containerd's socket vs through the shim's (a
`probe-shim serve --runtime-endpoint` of that containerd), interleaved call by call; the measuring is
bench/proxy_latency.py's (owned by the proxy's author), this module adds the overhead at each percentile.
ListContainers is asked twice on the same containers (bench/containerd_rig.py's fillers): all of them
(LIST_CONTAINERS, the node cost target's "with 100 containers") and the SMALL_LIST_CONTAINERS marked ones (a label
selector): a proxy that only forwards bytes costs about the same for both answers, one that decodes or
rebuilds them pays per container (`size_growth`).
"""

from __future__ import annotations

from bench.containerd_rig import FILLER_LABEL
from bench.proxy_latency import UNARY_CALLS, proxy_overhead
from cri_proto import cri_runtime_v1_pb2 as cri_pb

LIST_CONTAINERS = 100
SMALL_LIST_CONTAINERS = 10
SMALL_LIST = f"ListContainers_{SMALL_LIST_CONTAINERS}"
METHODS = ("Version", "ListPodSandbox", "ListContainers", SMALL_LIST)
CALLS = {**UNARY_CALLS,
         "ListContainers": ("ListContainers", cri_pb.ListContainersRequest()),
         SMALL_LIST: ("ListContainers", cri_pb.ListContainersRequest(
             filter=cri_pb.ContainerFilter(label_selector={FILLER_LABEL: "marked"})))}


def rig_fillers(pod_count: int) -> dict:
    """ContainerdRig arguments giving LIST_CONTAINERS containers in all (a running one per pod, the rest
    created only) of which SMALL_LIST_CONTAINERS carry the marked label."""
    return {"filler_containers": LIST_CONTAINERS - pod_count, "filler_marked": SMALL_LIST_CONTAINERS}


def overheads(compared: dict) -> dict:
    """direct/proxy summaries and the proxy's added ms at the median, p90 and p99 (pure)."""
    direct, proxied = compared["base"], compared["other"]
    out = {"direct_ms": direct, "proxy_ms": proxied,
           "overhead_ms": {q: round(proxied[q] - direct[q], 3) for q in ("median", "p90", "p99")},
           "overhead_paired_median_ms": compared.get("added_paired_median_ms")}
    if "response_bytes" in compared:
        out["response_bytes"] = compared["response_bytes"]
    return out


def size_growth(small: dict, large: dict) -> dict:
    """How much more the proxy adds to the large answer than to the small one (pure): in ms, and per KiB of
    answer that it carries more (what forwarding costs per byte, when the proxy does nothing else)."""
    extra_ms = large["overhead_ms"]["median"] - small["overhead_ms"]["median"]
    extra_kib = (large["response_bytes"] - small["response_bytes"]) / 1024
    return {"small_bytes": small["response_bytes"], "large_bytes": large["response_bytes"],
            "extra_overhead_ms": round(extra_ms, 3),
            "extra_ms_per_kib": round(extra_ms / extra_kib, 4) if extra_kib > 0 else None}


def with_containerd(rig, count: int, warmup: int) -> dict:
    measured = proxy_overhead(rig.direct, rig.shim.channel, count, warmup, calls_by_name=CALLS)
    result = {"calls_per_path": count, "pod_sandboxes": len(rig.pods),
              **{method: overheads(measured[method]) for method in METHODS}}
    result["size_growth"] = size_growth(result[SMALL_LIST], result["ListContainers"])
    return result
