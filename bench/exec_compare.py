"""Scenario 3: ExecProbe end to end against the exec probes operators run today.

All paths fetch the same URL from inside the pod: with containerd, the pod's
tests/servers/http_server.py on 127.0.0.1 (an application-like server; the image's busybox
httpd forks per request, which would add ~0.4 ms to every path alike and flatten the
ratios), else bench/targets.py's /healthz. They are timed by the caller (wall time), in
turns of BLOCK calls per path (bench/proxy_latency.py's `interleaved`) so that load from
elsewhere hits every path alike:
- ExecProbe: client -> shim -> worker (already running) -> client, one persistent channel;
- CRI ExecSync of `wget -q -O- URL` in the pod's busybox container, through real
  containerd (what a kubelet exec probe does);
- `nsenter --net=<pod netns> curl` (and busybox wget) as a subprocess per probe.
Without containerd the pod is a plain netns served by bench/targets.py and ExecSync is
skipped with the reason.
"""

from __future__ import annotations

import shutil

from bench.env import sandbox_rig
from bench.proxy_latency import (
    HEALTHZ_PATH, SERVER_PATH, exec_probe_call, exec_sync_call, http_probe_spec, interleaved, subprocess_call, wget_argv,
)
from bench.stats import ratio, summarize
from bench.targets import HTTP_PORT

BASE = "exec_probe"
# Calls per path in a row (see proxy_latency.interleaved): an ExecSync's aftermath (containerd and runc
# reaping the exec) would otherwise land on the ExecProbe call right after it on a 2-core machine.
BLOCK = 10


def nsenter_calls(netns_path: str, port: int, busybox: str | None, path: str = HEALTHZ_PATH) -> dict:
    """One subprocess per probe, entering the pod's netns: curl when installed, busybox wget when found."""
    calls = {}
    if busybox:
        calls["nsenter_wget"] = subprocess_call(
            ["nsenter", f"--net={netns_path}", busybox, *wget_argv(port, path)[1:]])
    curl = shutil.which("curl")
    if curl:
        calls["nsenter_curl"] = subprocess_call(["nsenter", f"--net={netns_path}", curl, "-sf", "-o", "/dev/null",
                                                 f"http://127.0.0.1:{port}{path}"])
    return calls


def speedups(times_ms: dict[str, list[float]]) -> dict:
    """Each path's summary, and how many times faster ExecProbe is than each other path (medians)."""
    summaries = {name: summarize(values) for name, values in times_ms.items()}
    base = summaries[BASE]["median"]
    return {"paths_ms": summaries,
            "speedup_median": {name: ratio(s["median"], base, 1) for name, s in summaries.items() if name != BASE}}


def with_containerd(rig, count: int, warmup: int) -> dict:
    pod = rig.pods[0]
    port = rig.server_port
    calls = {BASE: exec_probe_call(rig.shim.channel, pod.id, http_probe_spec(port, SERVER_PATH)),
             "exec_sync_wget": exec_sync_call(rig.direct, pod.containers["http"], wget_argv(port, SERVER_PATH)),
             **nsenter_calls(pod.netns_path, port, rig.busybox, SERVER_PATH)}
    return {"pod": "tests/servers/http_server.py on 127.0.0.1 in a containerd pod", "calls_per_path": count,
            **speedups(interleaved(calls, count, warmup, BLOCK))}


def in_netns(count: int, warmup: int, skipped_reason: str) -> dict:
    with sandbox_rig() as (daemon, ns, _targets):
        calls = {BASE: exec_probe_call(daemon.channel, ns.name, http_probe_spec(HTTP_PORT)),
                 **nsenter_calls(ns.path, HTTP_PORT, shutil.which("busybox"))}
        result = speedups(interleaved(calls, count, warmup, BLOCK))
    return {"pod": "network namespace served by bench/targets.py", "calls_per_path": count,
            "exec_sync_wget": {"skipped": skipped_reason}, **result}
