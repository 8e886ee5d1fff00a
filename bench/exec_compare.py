"""Scenario 3: ExecProbe and the kubelet bridge end to end against the exec probes operators run today.

All paths fetch the same URL from inside the pod: with containerd, the pod's
tests/support/servers/http_server.py on 127.0.0.1 (an application-like server; the image's busybox
httpd forks per request, which would add ~0.4 ms to every path alike and flatten the
ratios), else bench/targets.py's /healthz. They are timed by the caller (wall time), in
turns of BLOCK calls per path (bench/interleave.py's `interleaved`) so that load from
elsewhere hits every path alike:
- ExecProbe: client -> shim -> worker (already running) -> client, one persistent channel;
- the kubelet bridge: CRI ExecSync of the marker command (shim/bridge/command.py, `--target
  loopback`, timeout 1 s as the kubelet sends it for timeoutSeconds: 1) through the shim's
  socket, answered by the shim from the same worker (what a kubelet exec probe becomes);
- CRI ExecSync of `wget -q -O- URL` in the pod's busybox container, through real
  containerd (what a kubelet exec probe does);
- `nsenter --net=<pod netns> curl` (and busybox wget) as a subprocess per probe.
The engine's own attempt is the worker's timing of each ExecProbe attempt (same worker, same
URL, same turns); the bridged handler's row on the shim's board is read after the run (its
totals count every bridged call, its last attempt is the engine's timing of the last one).
Without containerd the pod is a plain netns served by bench/targets.py and both ExecSync
paths are skipped with the reason.
"""

from __future__ import annotations

import shutil

from bench.cri_calls import (
    HEALTHZ_PATH, SERVER_PATH, exec_probe_call, exec_sync_call, http_probe_spec, subprocess_call, wget_argv,
)
from bench.env import sandbox_rig
from bench.interleave import interleaved
from bench.stats import ratio, summarize
from bench.targets import HTTP_PORT
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from probe_api.bridge_command import command_for

BASE = "exec_probe"
BRIDGED = "bridged_exec_sync"
REAL_EXEC = "exec_sync_wget"
# Calls per path in a row (see bench/interleave.py): an ExecSync's aftermath (containerd and runc
# reaping the exec) would otherwise land on the ExecProbe call right after it on a 2-core machine.
BLOCK = 10


def bridged_argv(port: int, path: str) -> list[str]:
    """The marker command `probectl convert` writes for readiness httpGet, aimed at the pod's 127.0.0.1."""
    return command_for("readiness", {"httpGet": {"path": path, "port": port}}) + ["--target", "loopback"]


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


def bridge_figures(paths_ms: dict[str, dict], engine_attempt_ms: list[float]) -> dict:
    """The bridged path beside the real exec probe it replaces and the engine's own attempt (pure)."""
    bridged, engine = paths_ms[BRIDGED], summarize(engine_attempt_ms)
    return {"faster_than_exec_sync_wget_median": ratio(paths_ms[REAL_EXEC]["median"], bridged["median"], 1),
            "engine_attempt_ms": engine,
            "added_to_attempt_median_ms": round(bridged["median"] - engine["median"], 3)}


def bridged_row(channel, container_id: str) -> dict:
    """The bridged handler's row on the shim's board: its totals count every bridged call the engine ran.
    A cross-check read after the run, so a row not found is reported beside the figures, not instead of them."""
    response = service_grpc.ProbeServiceStub(channel).ProbeStatus(
        service_pb.ProbeStatusRequest(filter=service_pb.ProbeFilter(container_id=container_id)), timeout=10)
    rows = [probe for probe in response.probes if probe.bridged.role]
    if len(rows) != 1:
        return {"error": f"{len(rows)} bridged rows for container {container_id}, expected 1"}
    row = rows[0]
    return {"probe_id": row.probe_id, "successes": row.status.totals.success, "failures": row.status.totals.failure,
            "last_attempt_ms": round(row.status.last_attempt.duration_ns / 1e6, 3)}


def with_containerd(rig, count: int, warmup: int) -> dict:
    pod = rig.pods[0]
    port = rig.server_port
    container = pod.containers["http"]
    attempts_ms: list[float] = []
    calls = {BASE: exec_probe_call(rig.shim.channel, pod.id, http_probe_spec(port, SERVER_PATH), attempts_ms),
             # Through the shim's socket, as the kubelet's ExecSync reaches it; exit code != 0 aborts the run.
             BRIDGED: exec_sync_call(rig.shim.channel, container, bridged_argv(port, SERVER_PATH)),
             REAL_EXEC: exec_sync_call(rig.direct, container, wget_argv(port, SERVER_PATH)),
             **nsenter_calls(pod.netns_path, port, rig.busybox, SERVER_PATH)}
    result = speedups(interleaved(calls, count, warmup, BLOCK))
    bridge = bridge_figures(result["paths_ms"], attempts_ms[-count:])  # the warm-up's attempts come first
    bridge["board_row"] = bridged_row(rig.shim.channel, container)
    return {"pod": "tests/support/servers/http_server.py on 127.0.0.1 in a containerd pod", "calls_per_path": count,
            **result, "bridge": bridge}


def in_netns(count: int, warmup: int, skipped_reason: str) -> dict:
    with sandbox_rig() as (daemon, ns, _targets):
        calls = {BASE: exec_probe_call(daemon.channel, ns.name, http_probe_spec(HTTP_PORT)),
                 **nsenter_calls(ns.path, HTTP_PORT, shutil.which("busybox"))}
        result = speedups(interleaved(calls, count, warmup, BLOCK))
    return {"pod": "network namespace served by bench/targets.py", "calls_per_path": count,
            REAL_EXEC: {"skipped": skipped_reason}, BRIDGED: {"skipped": skipped_reason}, **result}
