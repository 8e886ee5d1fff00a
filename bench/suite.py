#!/usr/bin/env python3
"""The benchmark: every scenario in one run so that ratios are fair on a noisy machine, each figure beside its target.

    python bench/suite.py --mode quick|full [--out DIR] [--only NAME,...]     # root (network namespaces)

Scenarios, in this order (bench/<module>.py each):
  1. scale      N sandboxes (in 10 namespaces) x 3 probes (HTTP, TCP, gRPC) at 1 s:
                probes/s, late/missed, CPU, memory, fds, threads, state-change latency;
                once with pooled workers (the default), once in the strict mode
  2. latency    one attempt per kind: engine vs raw-socket floor in the same netns
  3. exec       ExecProbe and the kubelet bridge (marker ExecSync through the shim) vs
                CRI ExecSync (busybox wget, real containerd) vs nsenter + curl
  3b. bridge_load marker ExecSyncs (a converted readiness httpGet) paced at 30 and 300/s over the pods of
                the exec scenario's containerd: the shim daemon's and its workers' CPU per probe, latency
                (a node cost target); with --before-code, another checkout's shim in alternating windows
  4. spawn      RunProbe on a new sandbox -> its first attempt
  5. proxy      unary CRI calls direct to containerd vs through the shim: Version, ListPodSandbox,
                ListContainers with 100 containers and with 10 (does the cost grow with the answer?)
  6. pressure   600 probes/s against one server for a fixed window: failures, TIME_WAIT
  7. restart    N sandboxes x 3 probes at 1 s: store writes/s in steady state; the daemon
                restarted (SIGTERM, then kill -9): start to SERVING (all adopted), workers kept,
                missed ticks, what a resumed watch saw
  8. node       N static pods under a real kubelet, one readiness probe each at 1 s: none,
                the kubelet's own httpGet, a classic exec probe, the same httpGet bridged; node CPU
                and the kubelet's, containerd's and the shim's, per probe above no probes
  9. admission  the admission webhook at 200 AdmissionReviews/s: latency, CPU, memory
 10. pod_creation  pods created on a one-machine cluster (etcd, API server, scheduler, the kubelet through the
                shim) through the webhook registered from deploy/ and without it: the create request's latency,
                created to Ready from the API's timestamps and as seen by the client
 11. probectl_startup  probectl --help, convert, and version (nobody at the socket; a daemon), each the
                installed console script, start to exit, median of 9 (target 80 ms)
Without containerd (or runc, busybox-static, CNI plugins) the ExecSync and proxy figures
are reported as skipped with the reason, and without a kubelet (KUBELET_BIN, else the
one `make k8s` builds) the node figures; everything else still runs. A scenario that
fails is reported as an error and the others still run. --only runs the named scenarios
alone (scale, scale_strict, latency, spawn, pressure, exec, bridge_load, proxy, restart, node,
admission, pod_creation, probectl_startup), into DIR ending in -only-NAME... The summary ends with the node cost
targets (bench/node_cost.py), each met or NOT met; bench/ab.py compares two runs (e.g. the code before a change
and after) row by row.

Writes DIR/results.json (every figure, the machine's description), DIR/summary.txt (the
tables printed at the end) and DIR/*.png; DIR defaults to
bench/results/<YYYY-MM-DD>-<hostname>-<mode>/. Everything started is stopped and every
network namespace removed, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402

from bench import (  # noqa: E402
    admission, bridge_load, exec_compare, latency, machine, node, node_cost, node_report, plots, pod_creation,
    pressure, probectl_startup, proxy_overhead, report, restart, scale, spawn,
)
from bench.modes import MODES, Mode  # noqa: E402
from bench.containerd_rig import ContainerdRig  # noqa: E402
from shim.workers.grouping import POOLED, STRICT  # noqa: E402
from tests.support.containerd_env import sweep_stale_sessions, unavailable_reason  # noqa: E402
from tests.support.netns_env import netns_unavailable_reason, remove_stale_namespaces  # noqa: E402

RESULTS_DIR = REPO_ROOT / "bench" / "results"


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def default_out(mode: str) -> Path:
    return RESULTS_DIR / f"{datetime.date.today().isoformat()}-{socket.gethostname()}-{mode}"


def scenario(name: str, run: Callable[[], dict]) -> dict:
    """Runs one scenario; a failure becomes {"error": ...} so that the others still run."""
    log(f"{name} ...")
    begin = time.monotonic()
    try:
        result = run()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden: the table shows it as an error
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["elapsed_s"] = round(time.monotonic() - begin, 1)
    log(f"{name} done in {result['elapsed_s']} s")
    return result


CONTAINERD_SCENARIOS = ("exec", "bridge_load", "proxy")
CONTAINERD_PODS = 6  # bridge_load spreads its probes over them (a worker each, as on a node)


def containerd_scenarios(mode: Mode, scenarios: dict, wanted: Callable[[str], bool],
                         before_code: Path | None = None) -> None:
    """exec, bridge_load and proxy share one containerd (its start costs seconds); without it, exec runs in a
    netns. `before_code`: another checkout whose shim bridge_load measures beside this one, window by window."""
    names = [name for name in CONTAINERD_SCENARIOS if wanted(name)]
    reason = unavailable_reason()
    if reason is not None:
        log(f"containerd: {reason}")
        for name in names:
            scenarios[name] = {"skipped": reason}
        if "exec" in names:
            scenarios["exec"] = scenario("exec", lambda: exec_compare.in_netns(mode.exec_count, mode.exec_warmup,
                                                                                reason))
        return
    sweep_stale_sessions()
    runs = {"exec": lambda rig: exec_compare.with_containerd(rig, mode.exec_count, mode.exec_warmup),
            "bridge_load": lambda rig: bridge_load.with_containerd(rig, mode.bridge_load),
            "proxy": lambda rig: proxy_overhead.with_containerd(rig, mode.proxy_count, mode.proxy_warmup)}
    fillers = proxy_overhead.rig_fillers(CONTAINERD_PODS) if "proxy" in names else {}
    beside = {"before": before_code} if before_code is not None and "bridge_load" in names else {}
    log(f"containerd: starting ({CONTAINERD_PODS} pod sandboxes, a busybox httpd container in each, "
        f"{CONTAINERD_PODS + fillers.get('filler_containers', 0)} containers in all, an HTTP server in the first pod"
        + (f"; a shim of {before_code} beside this one" if beside else "") + ")")
    try:
        with ContainerdRig(pod_count=CONTAINERD_PODS, shim_roots=beside, **fillers) as rig:
            for name in names:
                scenarios[name] = scenario(name, lambda name=name: runs[name](rig))
    except Exception as exc:  # noqa: BLE001 - containerd itself did not come up
        traceback.print_exc()
        for name in names:
            scenarios.setdefault(name, {"error": f"containerd: {type(exc).__name__}: {exc}"})


SCENARIOS = ("scale", "scale_strict", "latency", "spawn", "pressure", "exec", "bridge_load", "proxy", "restart",
             "node", "admission", "pod_creation", "probectl_startup")


def run_all(mode: Mode, scenarios: dict, only: frozenset[str] = frozenset(), before_code: Path | None = None) -> None:
    """Every scenario, or those named in `only`."""
    def wanted(name: str) -> bool:
        return not only or name in only
    # Both worker modes, one after the other in the same run: "scale" is the default (pooled) one.
    if wanted("scale"):
        scenarios["scale"] = scenario("scale", lambda: scale.run(mode.scale, POOLED))
    if wanted("scale_strict"):
        scenarios["scale_strict"] = scenario("scale (strict)", lambda: scale.run(mode.scale, STRICT))
    if wanted("latency"):
        scenarios["latency"] = scenario("latency", lambda: latency.run(
            mode.latency_count, mode.latency_block, mode.latency_warmup))
    if wanted("spawn"):
        scenarios["spawn"] = scenario("spawn", lambda: spawn.run(mode.spawn_sandboxes))
    if wanted("pressure"):
        scenarios["pressure"] = scenario("pressure", lambda: pressure.run(mode.pressure_s, mode.pressure_warmup_s))
    if any(wanted(name) for name in CONTAINERD_SCENARIOS):
        containerd_scenarios(mode, scenarios, wanted, before_code)
    if wanted("restart"):
        scenarios["restart"] = scenario("restart", lambda: restart.run(mode.restart))
    if wanted("node"):
        scenarios["node"] = scenario("node", lambda: node.run(mode.node))
    if wanted("admission"):
        scenarios["admission"] = scenario("admission", lambda: admission.run(mode.admission))
    if wanted("pod_creation"):
        scenarios["pod_creation"] = scenario("pod_creation", lambda: pod_creation.run(mode.pod_creation))
    if wanted("probectl_startup"):
        scenarios["probectl_startup"] = scenario("probectl_startup", probectl_startup.run)


def leftovers() -> dict:
    """What this run left behind: namespaces named after its pid, child processes. Both must be empty."""
    tag = f"-{os.getpid()}-"
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    namespaces = [line.split()[0] for line in listing.splitlines() if tag in line]
    children = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in psutil.Process().children(recursive=True)]
    return {"netns": namespaces, "processes": children}


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--out", type=Path, help="output directory (default bench/results/<date>-<host>-<mode>)")
    parser.add_argument("--only", type=lambda text: frozenset(text.split(",")), default=frozenset(),
                        help=f"comma-separated scenarios to run alone: {', '.join(SCENARIOS)}")
    parser.add_argument("--before-code", type=Path, metavar="DIR",
                        help="another checkout (e.g. a git worktree of the commit before a change) whose shim "
                             "bridge_load measures beside this one's, window by window (see bench/ab.py)")
    args = parser.parse_args()
    if unknown := args.only - set(SCENARIOS):
        parser.error(f"--only: no scenario {', '.join(sorted(unknown))} (there are {', '.join(SCENARIOS)})")
    reason = netns_unavailable_reason()
    if reason:
        print(f"bench: cannot run: {reason}", file=sys.stderr)
        return 1
    mode = MODES[args.mode]
    out = args.out or default_out(mode.name + ("-only-" + "-".join(sorted(args.only)) if args.only else ""))
    # Teardown runs on SIGTERM as on Ctrl-C, and on SIGINT even when started with it ignored (`cmd &`).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    removed = remove_stale_namespaces()
    if removed:
        log(f"removed {len(removed)} namespaces left by killed runs")

    results: dict = {"mode": mode.name, "parameters": asdict(mode), "machine": machine.describe(),
                     "scenarios": {}}
    begin = time.monotonic()
    interrupted = False
    try:
        run_all(mode, results["scenarios"], args.only, args.before_code)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: everything started was stopped")
    results["duration_s"] = round(time.monotonic() - begin, 1)
    results["machine"]["loadavg_at_end"] = machine.loadavg()
    results["leftovers"] = leftovers()
    results["interrupted"] = interrupted
    general = (report.evaluate(results["scenarios"]) + admission.rows(results["scenarios"].get("admission"))
               + pod_creation.rows(results["scenarios"].get("pod_creation"))
               + probectl_startup.rows(results["scenarios"].get("probectl_startup")))
    node_costs = node_cost.rows(results["scenarios"], general)
    # Every row once (the node cost targets reuse some general ones): bench/ab.py pairs two runs' rows by figure.
    rows = general + [r for r in node_costs if r not in general]
    results["targets"] = [r.as_dict() for r in rows]

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    pictures = plots.write_all(results["scenarios"], out)
    m = results["machine"]
    summary = "\n\n".join(part for part in [
        f"cri-probe-shim benchmark, {mode.name} mode, {m['date']}, {m['hostname']}: {m['cpu_model']}, "
        f"{m['cpu_cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, Python {m['python']}, "
        f"commit {m['git_commit']}; load average {m['loadavg_at_start']} at start, {m['loadavg_at_end']} at end; "
        f"{results['duration_s']} s",
        report.details(results["scenarios"]),
        node_report.details(results["scenarios"].get("node")),
        node_cost.details(results["scenarios"]),
        admission.details(results["scenarios"].get("admission")),
        pod_creation.details(results["scenarios"].get("pod_creation")),
        "targets (scale, latency, exec, spawn, proxy, pressure, restart, admission, pod creation, probectl start-up)\n"
        + report.targets_table(general),
        "node cost: every target\n" + report.targets_table(node_costs),
    ] if part)
    (out / "summary.txt").write_text(summary + "\n")
    print(summary)
    print(f"\nresults: {out / 'results.json'}; plots: {', '.join(p.name for p in pictures) or 'none'}")
    left = results["leftovers"]
    if left["netns"] or left["processes"]:
        print(f"bench: LEFT BEHIND: {left}", file=sys.stderr)
        return 1
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
