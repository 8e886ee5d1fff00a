#!/usr/bin/env python3
"""Memory per sandbox: the real daemon, N sandboxes, 3 live probes each (HTTP, TCP, gRPC at 1 s).

The memory target's figure: PSS per extra sandbox = (total PSS of daemon + zygote + workers at N
- the same at N0) / (N - N0), and the daemon's own PSS, with every sandbox probed by
three probes (one per kind) at a period of 1 s against a real server in its netns.

How: N network namespaces (loopback only, the pod IP 198.18.0.2 on `lo`: every
sandbox has the same IP, as overlapping pod IPs do), one target process OUTSIDE the
measured set that holds, in every namespace, an HTTP server (200 "ok"), a TCP
listener and a real grpcio server with the standard health service (sockets keep the
namespace they were made in, so one process serves them all); then the daemon
(`probe-shim serve --runtime-endpoint none`, embedded mode: the workers find their
pod IP themselves) and, for each sandbox, RunProbe x3 (target POD_IP, period 1 s).
Sandboxes are added in steps (N0, then each N); at each step the bench waits until
every probe has succeeded at least --attempts times, lets them run --settle-s more,
then reads /proc/PID/smaps_rollup of every process. Every namespace it made is
deleted and every process it started is killed at the end, even on failure.

    python3 bench/worker_memory.py --sandboxes 10 100 250        # needs root
    python3 bench/worker_memory.py --sandboxes 10 --breakdown    # + private memory of a worker by mapping

This module owns the run (the steps, what is measured at each, the printed lines and the
JSON); the reading of /proc is bench/smaps.py's, the namespaces, the target process and
the daemon are bench/memory_rig.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.memory_rig import Daemon, Namespaces, Targets  # noqa: E402
from bench.smaps import MIB, ShimMemory, per_extra_sandbox, private_by_mapping, shim_memory  # noqa: E402

# --- the run ---------------------------------------------------------------------------------

def measure(counts: list[int], baseline: int, attempts: int, settle_s: float, breakdown: bool) -> dict:
    namespaces, targets, daemon = Namespaces(), None, None
    steps: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cps-memory-") as workdir:
        try:
            targets = Targets()
            daemon = Daemon(workdir)
            probe_ids: set[str] = set()
            at_n0: ShimMemory | None = None
            for count in sorted({baseline, *counts}):
                added = namespaces.grow(count)
                targets.add(added)
                started = time.monotonic()
                for name in added:
                    probe_ids.update(daemon.run_probes(name))
                registered_s = time.monotonic() - started
                unsuccessful = daemon.wait_for_successes(probe_ids, attempts, timeout_s=60 + count * 0.2)
                time.sleep(settle_s)  # let every worker run its probes in steady state
                memory = shim_memory(daemon.proc.pid)
                if len(memory.workers) != count:
                    raise RuntimeError(f"{len(memory.workers)} workers for {count} sandboxes")
                step = {"sandboxes": count, "probes": len(probe_ids), "register_s": round(registered_s, 1),
                        "unsuccessful_attempts": unsuccessful, **memory.summary_mib()}
                if at_n0 is None:
                    at_n0 = memory
                else:
                    step["per_extra_sandbox_mib"] = round(per_extra_sandbox(memory, at_n0) / MIB, 3)
                if breakdown:
                    step["worker_private_by_mapping_kib"] = {
                        k: v // 1024 for k, v in private_by_mapping(memory.workers[-1].pid).items()}
                    step["daemon_private_by_mapping_kib"] = {
                        k: v // 1024 for k, v in private_by_mapping(memory.daemon.pid).items()}
                steps.append(step)
                show(step)
        finally:
            if daemon is not None:
                daemon.stop()
            if targets is not None:
                targets.stop()
            namespaces.destroy()
    return {"python": sys.version.split()[0], "baseline_sandboxes": baseline, "settle_s": settle_s, "steps": steps}


def show(step: dict) -> None:
    extra = step.get("per_extra_sandbox_mib")
    print(f"{step['sandboxes']:4} sandboxes, {step['probes']} probes: daemon {step['daemon_pss_mib']:.1f} MiB, "
          f"zygote {step['zygote_pss_mib']:.1f} MiB, worker {step['worker_pss_mean_mib']:.2f} MiB mean "
          f"({step['worker_private_mean_mib']:.2f} private), total {step['total_pss_mib']:.1f} MiB"
          + (f", per extra sandbox {extra:.2f} MiB" if extra is not None else " (baseline)")
          + (f"; {step['unsuccessful_attempts']} attempts did not succeed" if step["unsuccessful_attempts"] else ""),
          flush=True)
    for key in ("worker_private_by_mapping_kib", "daemon_private_by_mapping_kib"):
        for kind, kib in step.get(key, {}).items():
            print(f"       {key.split('_')[0]} private {kib:7d} KiB  {kind}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--baseline", type=int, default=1, help="N0: sandboxes at the first measurement")
    parser.add_argument("--attempts", type=int, default=3, help="successes every probe needs before a measurement")
    parser.add_argument("--settle-s", type=float, default=5.0, help="steady-state seconds before each measurement")
    parser.add_argument("--breakdown", action="store_true", help="private memory of a worker and the daemon by mapping")
    parser.add_argument("--json", metavar="FILE", help="also write the results there")
    args = parser.parse_args()
    from tests.support.netns_env import netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        print(f"skipped: {reason}", file=sys.stderr)
        return 1
    if any(n <= args.baseline for n in args.sandboxes):
        parser.error("every --sandboxes count must be larger than --baseline")
    result = measure(args.sandboxes, args.baseline, args.attempts, args.settle_s, args.breakdown)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
