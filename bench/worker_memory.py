#!/usr/bin/env python3
"""Memory of workers forked from the zygote, and the time from spawn request to first attempt.

For each count N given with --sandboxes, the bench creates N network namespaces (loopback
only), starts a supervisor (a zygote), and for each sandbox in turn asks for a worker and
registers one TCP probe (every --period-ms, on the pod's loopback, against a closed port
or, with --listener, a port something listens on). Then it lets every worker make a few
attempts, and reports with psutil (`memory_full_info`):
  - PSS of each worker (its private pages plus its share of the pages it shares with the
    zygote and the other workers), its USS, and their mean / max;
  - the zygote's PSS alone before any spawn, and the total PSS of zygote + workers after;
  - "per extra sandbox": (total after - zygote alone) / N, what each sandbox really adds;
  - spawn request -> Ready, and spawn request -> first attempt report (median, p90, max).
Every namespace it made is deleted at the end, even on failure.

    python3 bench/worker_memory.py --sandboxes 10 100            # needs root
    python3 bench/worker_memory.py --sandboxes 100 --no-gc-freeze
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from cri_proto import probe_spec_pb2 as spec_pb  # noqa: E402
from cri_proto import probe_worker_pb2 as worker_pb  # noqa: E402
from shim.supervisor import SandboxTarget, WorkerSupervisor  # noqa: E402
from shim.zygote import Zygote  # noqa: E402
from tests.netns_env import netns_unavailable_reason  # noqa: E402

MIB = 1 << 20
CLOSED_PORT = 9  # discard: nothing listens on the pod's loopback there
LISTENER = (  # accepts and drops connections on the pod's loopback; prints its port
    "import socket, signal\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(512)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)


def pss(pid: int) -> tuple[int, int]:
    info = psutil.Process(pid).memory_full_info()
    return info.pss, info.uss


def summary_ms(values_s: list[float]) -> dict[str, float]:
    s = sorted(v * 1000 for v in values_s)
    return {"median": round(statistics.median(s), 1), "p90": round(s[min(len(s) - 1, int(0.9 * len(s)))], 1),
            "max": round(s[-1], 1)}


class Namespaces:
    """Loopback-only netns for the bench, named like the tests' so a stale sweep finds them."""

    def __init__(self, count: int, listener: bool) -> None:
        self.names: list[str] = []
        self.listeners: list[subprocess.Popen] = []
        self.ports: list[int] = []
        try:
            for i in range(count):
                name = f"cps-bench-{os.getpid()}-{i}"
                subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
                self.names.append(name)
                subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
                self.ports.append(self._listen(name) if listener else CLOSED_PORT)
        except BaseException:
            self.destroy()
            raise

    def _listen(self, name: str) -> int:
        proc = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", LISTENER],
                                stdout=subprocess.PIPE, text=True)
        self.listeners.append(proc)
        return int(proc.stdout.readline())

    def destroy(self) -> None:
        for proc in self.listeners:
            proc.kill()
            proc.wait()
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def registration(port: int, period_ms: int) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id="tcp", type=spec_pb.READINESS, start_now=True,
        container=worker_pb.ContainerRef(id="c", name="app"),
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)),
                               target=spec_pb.LOOPBACK, period_ms=period_ms, timeout_ms=1000),
    )


async def measure(args: argparse.Namespace, count: int, namespaces: Namespaces) -> dict:
    loop = asyncio.get_running_loop()
    attempts: dict[str, int] = {}
    first_attempt: dict[str, float] = {}
    enough = asyncio.Event()

    def on_event(sandbox_id: str, event: worker_pb.WorkerEvent) -> None:
        if event.WhichOneof("msg") != "attempt":
            return
        first_attempt.setdefault(sandbox_id, loop.time())
        attempts[sandbox_id] = attempts.get(sandbox_id, 0) + 1
        if len(attempts) == count and min(attempts.values()) >= args.attempts:
            enough.set()

    async def zygote_factory() -> Zygote:
        return await Zygote.start(python=args.python, gc_freeze=args.gc_freeze, child_gc_threshold=args.child_gc_threshold,
                                  preload_pod_ips=args.preload_pod_ips, warm_up=args.warm_up,
                                  fill_holes=args.fill_holes)

    supervisor = WorkerSupervisor(zygote_factory, on_event, lambda *_: None,
                                  heartbeat_timeout_s=30.0, start_timeout_s=60.0)
    try:
        await supervisor.start()
        zygote_pid = supervisor.zygote.pid
        zygote_alone, _ = pss(zygote_pid)
        requested: dict[str, float] = {}
        ready_after: list[float] = []
        for i, name in enumerate(namespaces.names):
            sid = f"sb{i}"
            requested[sid] = loop.time()
            pod_ips = [] if args.discover_pod_ips else ["127.0.0.1"]
            await supervisor.ensure(SandboxTarget(sid, f"/var/run/netns/{name}", pod_ips))
            ready_after.append(loop.time() - requested[sid])
            await supervisor.add_probe(sid, registration(namespaces.ports[i], args.period_ms))
        await asyncio.wait_for(enough.wait(), args.attempts * args.period_ms / 1000 + 60)
        workers = [supervisor.status(f"sb{i}").pid for i in range(count)]
        per_worker = [pss(pid) for pid in workers]
        zygote_after, _ = pss(zygote_pid)
        total = zygote_after + sum(p for p, _ in per_worker)
        return {
            "sandboxes": count,
            "python": args.python,
            "gc_freeze": args.gc_freeze,
            "child_gc_threshold": args.child_gc_threshold,
            "warm_up": args.warm_up,
            "fill_holes": args.fill_holes,
            "zygote_pss_alone_mib": round(zygote_alone / MIB, 2),
            "zygote_pss_after_mib": round(zygote_after / MIB, 2),
            "worker_pss_mean_mib": round(statistics.mean(p for p, _ in per_worker) / MIB, 2),
            "worker_pss_max_mib": round(max(p for p, _ in per_worker) / MIB, 2),
            "worker_uss_mean_mib": round(statistics.mean(u for _, u in per_worker) / MIB, 2),
            "total_pss_mib": round(total / MIB, 1),
            "per_extra_sandbox_mib": round((total - zygote_alone) / count / MIB, 2),
            "spawn_to_ready_ms": summary_ms(ready_after),
            "spawn_to_first_attempt_ms": summary_ms([first_attempt[s] - requested[s] for s in requested]),
            "attempts_per_worker_min": min(attempts.values()),
        }
    finally:
        await supervisor.close()


def show(result: dict) -> None:
    print(f"{result['sandboxes']} sandboxes (gc_freeze={result['gc_freeze']}, warm_up={result['warm_up']}, "
          f"fill_holes={result['fill_holes']}, "
          f"child gc threshold={result['child_gc_threshold']}):")
    print(f"  zygote PSS          {result['zygote_pss_alone_mib']:7.2f} MiB alone, "
          f"{result['zygote_pss_after_mib']:.2f} MiB with its workers")
    print(f"  worker PSS          {result['worker_pss_mean_mib']:7.2f} MiB mean, {result['worker_pss_max_mib']:.2f} max; "
          f"USS {result['worker_uss_mean_mib']:.2f} MiB mean")
    print(f"  total PSS           {result['total_pss_mib']:7.1f} MiB (zygote + workers)")
    print(f"  per extra sandbox   {result['per_extra_sandbox_mib']:7.2f} MiB  (target <= 2.5 at 100)")
    for key in ("spawn_to_ready_ms", "spawn_to_first_attempt_ms"):
        s = result[key]
        print(f"  {key.replace('_', ' '):19} median {s['median']} ms, p90 {s['p90']} ms, max {s['max']} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--period-ms", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=5, help="attempts every worker makes before measuring")
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false")
    parser.add_argument("--child-gc-threshold", type=int, default=None,
                        help="generation-0 GC threshold in workers (0: GC disabled); default: the interpreter's")
    parser.add_argument("--no-preload-pod-ips", dest="preload_pod_ips", action="store_false")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument("--no-fill-holes", dest="fill_holes", action="store_false")
    parser.add_argument("--discover-pod-ips", action="store_true",
                        help="pass no pod IPs: every worker discovers them (pyroute2)")
    parser.add_argument("--listener", action="store_true", help="probe a listener (success) instead of a closed port")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the zygote and its workers (needs protobuf, h11, h2, pyroute2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        print(f"skipped: {reason}", file=sys.stderr)
        return 1
    results = []
    for count in args.sandboxes:
        namespaces = Namespaces(count, args.listener)
        try:
            results.append(asyncio.run(measure(args, count, namespaces)))
        finally:
            namespaces.destroy()
        if not args.json:
            show(results[-1])
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
