#!/usr/bin/env python3
"""Latency of one HTTP, TCP and gRPC attempt made by a worker inside a pod netns.

Builds a throwaway network namespace (the same one the tests use), starts real
HTTP, TCP and gRPC health servers in it, starts a real worker process in it and
runs N one-shot attempts of each kind, one after the other. Reports the attempt
duration measured inside the worker and the round trip seen by the caller
(request over the socketpair, attempt, report back), plus the worker's memory.

    python3 bench/probe_latency.py --count 500      # needs root
    python3 bench/probe_latency.py --count 5 --verbose   # the `make run` demo
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from bench.stats import summarize  # noqa: E402
from cri_proto import probe_spec_pb2 as spec_pb  # noqa: E402
from cri_proto import probe_worker_pb2 as worker_pb  # noqa: E402
from tests.netns_env import PodNetns, netns_unavailable_reason  # noqa: E402
from tests.worker_harness import WorkerHarness  # noqa: E402


def specs(http_port: int, tcp_port: int, grpc_port: int) -> dict[str, spec_pb.ProbeSpec]:
    def port(n: int) -> spec_pb.PortRef:
        return spec_pb.PortRef(number=n)

    return {
        "http": spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/ok", port=port(http_port))),
        "tcp": spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=port(tcp_port))),
        "grpc": spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=grpc_port)),
    }


def time_wait_count(netns: str) -> int:
    """TCP sockets in TIME_WAIT inside the pod netns (the probes' and the servers' ends)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-Htan", "state", "time-wait"],
                         check=True, capture_output=True, text=True).stdout
    return len(out.splitlines())


def show(kind: str, attempt: spec_pb.Attempt) -> None:
    result = spec_pb.AttemptResult.Name(attempt.result)
    print(f"{kind:5} {result:15} {attempt.duration_ns / 1e6:7.3f} ms  {attempt.address:22} {attempt.output[:60]!r}")
    for phase in attempt.phases:
        print(f"{'':6}{phase.name:11} +{phase.start_offset_ns / 1e6:7.3f} ms  {phase.duration_ns / 1e6:7.3f} ms  {phase.detail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=500, help="attempts per kind (default 500)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="print each kind's first attempt with its phases")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        print(f"probe_latency: {reason}", file=sys.stderr)
        return 1

    ns = PodNetns.create()
    worker = None
    try:
        http = ns.spawn_python("http_server.py", "--host", "::")
        tcp = ns.spawn_python("tcp_server.py", "--mode", "silent", "--host", "0.0.0.0")
        grpc = ns.spawn_python("grpc_health_server.py", "--host", "::")
        worker = WorkerHarness(worker_pb.WorkerConfig(netns_path=ns.path, pod_ips=ns.pod_ips))
        print(f"netns {ns.name}: pod IPs {', '.join(ns.pod_ips)}; worker pid {worker.ready.pid} "
              f"uid {worker.ready.uid}", file=sys.stderr)
        results: dict[str, dict] = {}
        for kind, spec in specs(http.port, tcp.port, grpc.port).items():
            for i in range(args.warmup):
                first = worker.run_once(spec)
                if i == 0 and args.verbose:
                    show(kind, first)
            inside, round_trip = [], []
            outcomes: dict[str, int] = {}
            for _ in range(args.count):
                t0 = time.perf_counter_ns()
                attempt = worker.run_once(spec)
                round_trip.append((time.perf_counter_ns() - t0) / 1e6)
                inside.append(attempt.duration_ns / 1e6)
                name = spec_pb.AttemptResult.Name(attempt.result)
                outcomes[name] = outcomes.get(name, 0) + 1
            results[kind] = {"attempt_ms": summarize(inside), "round_trip_ms": summarize(round_trip), "results": outcomes}
        results["time_wait_sockets_in_pod"] = time_wait_count(ns.name)
        mem = psutil.Process(worker.ready.pid).memory_full_info()
        results["worker_memory_mib"] = {"rss": round(mem.rss / 2**20, 1), "pss": round(mem.pss / 2**20, 1),
                                        "uss": round(mem.uss / 2**20, 1)}
    finally:
        if worker is not None:
            worker.close()
        ns.destroy()

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"\n{args.count} sequential attempts per kind, worker inside the pod netns (ms)")
    print(f"{'kind':5} {'':11} {'min':>7} {'median':>7} {'p90':>7} {'p99':>7} {'max':>7}  results")
    for kind in ("http", "tcp", "grpc"):
        for label, key in (("attempt", "attempt_ms"), ("round trip", "round_trip_ms")):
            s = results[kind][key]
            tail = results[kind]["results"] if key == "attempt_ms" else ""
            print(f"{kind:5} {label:11} {s['min']:7.3f} {s['median']:7.3f} {s['p90']:7.3f} {s['p99']:7.3f} {s['max']:7.3f}  {tail}")
    m = results["worker_memory_mib"]
    print(f"TIME_WAIT sockets left in the pod netns: {results['time_wait_sockets_in_pod']}")
    print(f"worker memory: RSS {m['rss']} MiB, PSS {m['pss']} MiB, USS {m['uss']} MiB (a fresh interpreter, not a zygote fork)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
