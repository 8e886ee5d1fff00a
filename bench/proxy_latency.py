#!/usr/bin/env python3
"""Latency of the shim's two request paths, against a real containerd: the transparent CRI proxy, and ExecProbe.

1. Proxy overhead: unary CRI calls (`Version`, `ListPodSandbox` with a few pod sandboxes present) straight to
   containerd's socket vs through the shim's socket (a real `probe-shim serve --runtime-endpoint` daemon).
2. ExecProbe end to end (client -> shim -> worker -> client, one persistent client channel, the sandbox's worker
   already running because a probe is registered there) vs what operators do today: a CRI `ExecSync` of
   `busybox wget` in the pod's container, and `nsenter --net=<pod netns>` + curl / busybox wget as a subprocess.
   All fetch the same URL from the same server on the pod's 127.0.0.1: by default tests/support/servers/http_server.py
   (one asyncio process, started in the pod's netns); `--target busybox` uses the pod's own busybox httpd, which
   forks a process per request (about 0.4 ms more for every path, so the ratios shrink).

Every comparison is interleaved call by call (A, B, A, B, ...) so that whatever else the machine does hits the
paths alike; the median of paired (neighbouring) differences is reported beside the difference of medians.
The client is sync grpcio, one call at a time, each with a deadline, as the kubelet calls.

    python3 bench/proxy_latency.py                      # root; containerd as tests/support/containerd_env.py finds it
    python3 bench/proxy_latency.py --ab-grpc-defaults   # also a second shim with grpc's default EventEngine I/O
    python3 bench/proxy_latency.py --fake               # the proxy alone, in front of tests/support/fake_cri.py
    python3 bench/proxy_latency.py --json

This module owns the two measurements and their report; the parts live beside it: bench/interleave.py (timing in
interleaved turns), bench/cri_calls.py (the timed calls), bench/containerd_rig.py (containerd, the pods and the
shims; the suite's exec and proxy scenarios use it too) and bench/fake_proxy.py (--fake). bench/suite.py reuses
`proxy_overhead`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from bench.containerd_rig import ContainerdRig  # noqa: E402
from bench.cri_calls import (  # noqa: E402
    HEALTHZ_PATH, SERVER_PATH, cri_call, curl_argv, exec_probe_call, exec_sync_call, http_probe_spec, subprocess_call,
    wget_argv,
)
from bench.interleave import compare, interleaved  # noqa: E402
from bench.stats import summarize  # noqa: E402
from cri_proto import cri_runtime_v1_pb2 as cri_pb  # noqa: E402

# grpc's own default (EventEngine endpoints on), for a shim to compare with (see shim/grpc_tuning.py). The
# operator's GRPC_EXPERIMENTS wins over the daemon's tuning, so this re-enables what the daemon turns off.
GRPC_DEFAULTS_ENV = {"GRPC_EXPERIMENTS": "event_engine_client,event_engine_listener"}


# ---------------------------------------------------------------- the measurements


UNARY_CALLS = {"Version": ("Version", cri_pb.VersionRequest(version="v1")),
               "ListPodSandbox": ("ListPodSandbox", cri_pb.ListPodSandboxRequest())}


def proxy_overhead(direct: grpc.Channel, proxied: grpc.Channel, count: int, warmup: int = 200,
                   others: dict[str, grpc.Channel] | None = None, calls_by_name: dict | None = None) -> dict:
    """Version and ListPodSandbox (or `calls_by_name`: name -> (CRI method, request)), direct vs through the shim,
    interleaved call by call. `others`: more shims measured in the same turns, each compared with the same
    direct calls (under "others")."""
    results = {}
    for name, (method, request) in (calls_by_name or UNARY_CALLS).items():
        raw = request.SerializeToString()
        calls = {"direct": cri_call(direct, method, raw), "proxy": cri_call(proxied, method, raw)}
        calls.update({other: cri_call(channel, method, raw) for other, channel in (others or {}).items()})
        times = interleaved(calls, count, warmup)
        results[name] = compare(times["direct"], times["proxy"])
        results[name]["response_bytes"] = len(calls["direct"]())
        if others:
            results[name]["others"] = {other: compare(times["direct"], times[other]) for other in others}
    return results


def exec_comparison(rig: ContainerdRig, count: int, slow_count: int, target: str = "server",
                    warmup: int = 100) -> dict:
    """ExecProbe vs ExecSync(busybox wget) vs nsenter + curl / busybox wget, all against one server in one pod."""
    pod = rig.pods[0]
    port, path = (rig.server_port, SERVER_PATH) if target == "server" else (rig.http_port, HEALTHZ_PATH)
    attempts_ms: list[float] = []
    exec_probe = exec_probe_call(rig.shim.channel, pod.id, http_probe_spec(port, path), attempts_ms)
    slow = {
        "exec_sync_wget": exec_sync_call(rig.direct, pod.containers["http"], wget_argv(port, path)),
        "nsenter_wget": subprocess_call(["nsenter", f"--net={pod.netns_path}", rig.busybox, *wget_argv(port, path)[1:]]),
    }
    if shutil.which("curl"):
        slow["nsenter_curl"] = subprocess_call(["nsenter", f"--net={pod.netns_path}", *curl_argv(port, path)])
    fast = interleaved({"exec_probe": exec_probe}, count, warmup)["exec_probe"]
    engine = summarize(attempts_ms[-count:])
    # The slow paths take 3-40 ms a call: fewer turns, each beside one ExecProbe (the ratio is taken in these).
    beside = interleaved({"exec_probe": exec_probe, **slow}, slow_count, 3)
    base = statistics.median(beside["exec_probe"])
    results = {
        "target": "tests/support/servers/http_server.py" if target == "server" else "busybox httpd (forks per request)",
        "exec_probe": summarize(fast),
        "exec_probe_attempt": engine,   # the attempt alone, as the worker timed it
        "exec_probe_overhead_median_ms": round(statistics.median(fast) - engine["median"], 3),
        "exec_probe_beside_slow": summarize(beside["exec_probe"]),
    }
    for name in slow:
        results[name] = summarize(beside[name])
        # Beside: the ExecProbe calls taken in the same turns (they also pay for the machine cleaning up after each
        # subprocess or exec, so this ratio is the conservative one); fast loop: ExecProbe called back to back.
        results[f"speedup_vs_{name}"] = round(statistics.median(beside[name]) / base, 1)
        results[f"speedup_vs_{name}_fast_loop"] = round(statistics.median(beside[name]) / statistics.median(fast), 1)
    return results


# ---------------------------------------------------------------- report


def run(fake: bool, count: int, exec_count: int, pods: int, warmup: int, target: str, ab_grpc: bool,
        apply_tuning: bool) -> dict:
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    if fake:
        from bench.fake_proxy import fake_rig

        with fake_rig() as (direct, proxied):
            results: dict = {"runtime": "fake", "proxy": proxy_overhead(direct, proxied, count, warmup)}
    else:
        shim_envs = {"grpc_defaults": GRPC_DEFAULTS_ENV} if ab_grpc else {}
        shim_env: dict[str, str] = {}
        if apply_tuning:
            from shim import grpc_tuning
            grpc_tuning.apply(shim_env)
        with ContainerdRig(pod_count=pods, shim_env=shim_env, shim_envs=shim_envs) as rig:
            others = {name: daemon.channel for name, daemon in rig.others.items()}
            results = {"runtime": "containerd", "pods": pods,
                       "proxy": proxy_overhead(rig.direct, rig.shim.channel, count, warmup, others),
                       "exec": exec_comparison(rig, count, exec_count, target)}
    results["loadavg_before"] = load_before
    results["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    return results


def print_table(results: dict, count: int) -> None:
    cols = ("min", "median", "p90", "p99", "max")
    header = f"{'':30}" + "".join(f"{k:>9}" for k in cols)
    print(f"unary CRI calls, {count} per path interleaved call by call, against {results['runtime']} (ms)")
    print(header)
    for method, r in results["proxy"].items():
        rows = [("direct", r["base"]), ("through the shim", r["other"])]
        rows += [(f"through the shim ({name})", o["other"]) for name, o in r.get("others", {}).items()]
        for name, summary in rows:
            print(f"{method + ' ' + name:30}" + "".join(f"{summary[k]:9.3f}" for k in cols))
        print(f"{'':30}added: median {r['added_median_ms']:.3f} ms (paired {r['added_paired_median_ms']:.3f} ms)"
              + "".join(f"; {name}: {o['added_median_ms']:.3f} ms" for name, o in r.get("others", {}).items()))
    if "exec" in results:
        e = results["exec"]
        print(f"\none HTTP GET of the pod's 127.0.0.1 ({e['target']}) (ms)")
        print(header)
        rows = [("ExecProbe", "exec_probe"), ("  its attempt (worker's timing)", "exec_probe_attempt"),
                ("ExecProbe beside the slow ones", "exec_probe_beside_slow"), ("CRI ExecSync wget", "exec_sync_wget"),
                ("nsenter + busybox wget", "nsenter_wget"), ("nsenter + curl", "nsenter_curl")]
        for name, key in rows:
            if key in e:
                print(f"{name:30}" + "".join(f"{e[key][k]:9.3f}" for k in cols))
        for suffix, how in (("", "ExecProbe calls taken beside each"), ("_fast_loop", "ExecProbe back to back")):
            print(f"ExecProbe is faster by (medians; {how}): " + ", ".join(
                f"{name} {e[f'speedup_vs_{name}{suffix}']}x" for name in ("exec_sync_wget", "nsenter_wget", "nsenter_curl")
                if f"speedup_vs_{name}{suffix}" in e))
    print(f"load average before {' '.join(results['loadavg_before'])}, after {' '.join(results['loadavg_after'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="proxy only, in front of tests/support/fake_cri.py")
    parser.add_argument("--count", type=int, default=2000, help="calls per path (default 2000)")
    parser.add_argument("--exec-count", type=int, default=200, help="ExecSync and nsenter calls (default 200)")
    parser.add_argument("--pods", type=int, default=3, help="pod sandboxes present (default 3)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--target", choices=("server", "busybox"), default="server",
                        help="HTTP server the exec paths fetch from (default: tests/support/servers/http_server.py)")
    parser.add_argument("--ab-grpc-defaults", action="store_true",
                        help="also measure a second shim with grpc's default EventEngine I/O (shim/grpc_tuning.py)")
    parser.add_argument("--apply-grpc-tuning", action="store_true",
                        help="start the shim with shim/grpc_tuning.py applied to its environment (for a daemon "
                             "whose entry point does not apply it itself)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args()
    results = run(args.fake, args.count, args.exec_count, args.pods, args.warmup, args.target, args.ab_grpc_defaults,
                  args.apply_grpc_tuning)
    if args.json:
        print(json.dumps(results))
    else:
        print_table(results, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
