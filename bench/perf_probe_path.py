#!/usr/bin/env python3
"""CPU and latency of the probe path, for optimizing it: engine vs raw floor, worker and daemon CPU per attempt.

Three measurements, each comparable between two source trees in the same run
(`--tree DIR` runs the measured code from another checkout, e.g. an unmodified
`git archive HEAD`), because on a shared machine only same-run ratios mean much:

  latency  Inside a throwaway pod netns, one process alternates an engine attempt
           (probe_worker.prober.Prober.run, Attempt.duration_ns as the worker
           reports it) with a raw-socket floor attempt (plain asyncio: connect,
           send the kubelet's request, read to EOF; sockets set up like the
           worker's), per kind. Reports medians, engine/floor and CPU per attempt.
  worker   A real worker process in the netns running one HTTP, TCP and gRPC probe
           at a short period: worker CPU (psutil) per attempt, everything included
           (ticker, attempt, report frame).
  daemon   The daemon's side of an attempt in-process: frame decode, then
           ResultsManager.on_event (status board, metrics, trace ids / spans) for
           S sandboxes x 3 probes; CPU per attempt. Stable under
           `valgrind --tool=callgrind` for instruction counts.
  instructions
           The worker's loop in the netns (ProbeManager, Prober, report frames on a
           socketpair) under `valgrind --tool=callgrind`: user-space instructions
           per attempt, per kind (back to back, start_now) and for one sandbox's
           three probes together at --sandbox-period-ms (phases as the worker draws them).
           Counted as (I(3n) - I(n)) / 2n so that start-up and warm-up cancel out;
           immune to the machine's load, blind to the kernel's share.

    python3 bench/perf_probe_path.py latency --count 500        # needs root
    python3 bench/perf_probe_path.py worker --seconds 10
    python3 bench/perf_probe_path.py daemon --count 20000
    python3 bench/perf_probe_path.py instructions --count 100 --tree /tmp/orig   # needs root and valgrind
    python3 bench/perf_probe_path.py all --tree /tmp/orig         # before (tree) vs after (this checkout)
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
KINDS = ("http", "tcp", "grpc")
POD_IPV4 = "198.18.0.2"


def _use_tree(tree: str | None) -> None:
    """Imports the measured packages from `tree` (default: this checkout)."""
    sys.path.insert(0, str(Path(tree).resolve() if tree else REPO_ROOT))


# --- the floor: plain asyncio, what any probe must at least do ------------------------------------


# The same floor as the suite's latency scenario (bench/floor.py), always from this checkout: appended
# to sys.path, so a measured --tree still wins for probe_worker.
sys.path.append(str(REPO_ROOT))
from bench.floor import http_once as floor_http, tcp_once as floor_tcp  # noqa: E402


# --- latency: runs inside the netns ---------------------------------------------------------------


def _specs(ports: dict[str, int]):
    from cri_proto import probe_spec_pb2 as spec_pb

    def port(kind: str):
        return spec_pb.PortRef(number=ports[kind])

    return {
        "http": spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/ok", port=port("http"))),
        "tcp": spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=port("tcp"))),
        "grpc": spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=ports["grpc"])),
    }


async def _inside(ports: dict[str, int], count: int, warmup: int) -> dict:
    from cri_proto import probe_spec_pb2 as spec_pb
    from probe_worker.prober import Prober

    prober = Prober([POD_IPV4, "fd00:5a::2"], "1.32")
    request = (f"GET /ok HTTP/1.1\r\nHost: {POD_IPV4}:{ports['http']}\r\nUser-Agent: kube-probe/1.32\r\n"
               "Accept: */*\r\nConnection: close\r\n\r\n").encode()
    floors = {"http": lambda: floor_http(POD_IPV4, ports["http"], request), "tcp": lambda: floor_tcp(POD_IPV4, ports["tcp"])}
    out = {}
    for kind, spec in _specs(ports).items():
        engine_ms, floor_ms, engine_cpu, floor_cpu = [], [], 0, 0
        for i in range(warmup + count):
            c0 = time.process_time_ns()
            attempt = await prober.run(spec, [])
            c1 = time.process_time_ns()
            if attempt.result != spec_pb.RESULT_SUCCESS:
                raise RuntimeError(f"{kind} attempt failed: {attempt.output}")
            f0 = time.monotonic_ns()
            if kind in floors:
                await floors[kind]()
            f1 = time.monotonic_ns()
            c2 = time.process_time_ns()
            if i >= warmup:
                engine_ms.append(attempt.duration_ns / 1e6)
                floor_ms.append((f1 - f0) / 1e6)
                engine_cpu += c1 - c0
                floor_cpu += c2 - c1
        row = {"engine_ms": statistics.median(engine_ms), "engine_cpu_ms": engine_cpu / count / 1e6}
        if kind in floors:
            row |= {"floor_ms": statistics.median(floor_ms), "floor_cpu_ms": floor_cpu / count / 1e6}
            row["ratio"] = row["engine_ms"] / row["floor_ms"]
        out[kind] = {k: round(v, 3) for k, v in row.items()}
    return out


class _Netns:
    """A throwaway pod netns with HTTP, TCP (accept and close) and gRPC health servers."""

    def __enter__(self) -> "_Netns":
        sys.path.insert(0, str(REPO_ROOT))
        from tests.support.netns_env import PodNetns, listen, netns_unavailable_reason

        reason = netns_unavailable_reason()
        if reason:
            raise SystemExit(f"perf_probe_path: {reason}")
        self.ns = PodNetns.create()
        try:
            self.ports = {
                "http": self.ns.spawn_python("http_server.py", "--host", "::").port,
                "tcp": listen(self.ns).port,
                "grpc": self.ns.spawn_python("grpc_health_server.py", "--host", "::").port,
            }
        except BaseException:
            self.ns.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.ns.destroy()


def latency(trees: list[str | None], count: int, repeat: int) -> dict:
    results: dict[str, list[dict]] = {}
    with _Netns() as env:
        for _ in range(repeat):
            for tree in trees:  # interleaved, so both trees see the same machine load
                argv = [sys.executable, __file__, "_inside", "--ports", json.dumps(env.ports), "--count", str(count)]
                if tree:
                    argv += ["--tree", tree]
                out = subprocess.run(["ip", "netns", "exec", env.ns.name, *argv], capture_output=True, text=True)
                if out.returncode:
                    raise RuntimeError(out.stderr[-2000:])
                results.setdefault(tree or "this", []).append(json.loads(out.stdout))
    return results


# --- worker CPU per attempt -----------------------------------------------------------------------


def _worker_inside(netns_path: str, ports: dict[str, int], period_ms: int, seconds: float,
                   kinds: tuple[str, ...]) -> dict:
    """Runs in a fresh interpreter whose sys.path starts with the measured tree (its harness
    starts `python -m probe_worker` from that tree)."""
    import psutil

    from cri_proto import probe_spec_pb2 as spec_pb
    from cri_proto import probe_worker_pb2 as worker_pb
    from tests.support.worker_harness import WorkerHarness

    specs = _specs(ports)
    pod_ips = [POD_IPV4, "fd00:5a::2"]
    if "netns_path" in inspect.signature(WorkerHarness).parameters:
        worker = WorkerHarness(worker_pb.WorkerConfig(), netns_path, pod_ips=pod_ips)
    else:  # a tree from before pooled workers: the worker entered the netns itself
        worker = WorkerHarness(worker_pb.WorkerConfig(netns_path=netns_path, pod_ips=pod_ips))
    try:
        for kind in kinds:
            spec = spec_pb.ProbeSpec()
            spec.CopyFrom(specs[kind])
            spec.period_ms = period_ms
            worker.add(worker_pb.ProbeRegistration(probe_id=kind, type=spec_pb.READINESS, spec=spec,
                                                   container=worker_pb.ContainerRef(id="c", name="app")))
        process = psutil.Process(worker.ready.pid)

        def drain(seconds: float) -> tuple[int, int]:
            attempts = late = 0
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                attempt = worker.next_event(kinds=("attempt",)).attempt.attempt
                attempts += 1
                due = getattr(attempt, "scheduled_at_unix_ns", 0)  # absent in trees before it existed
                late += bool(due) and attempt.started_at_unix_ns - due > 100_000_000
            return attempts, late

        drain(1.0)  # warm-up
        before = process.cpu_times()
        attempts, late = drain(seconds)
        after = process.cpu_times()
    finally:
        worker.close()
    user, system = after.user - before.user, after.system - before.system
    return {"attempts": attempts, "late": late, "attempts_per_s": round(attempts / seconds, 1),
            "cpu_ms_per_attempt": round((user + system) * 1000 / attempts, 3),
            "user_ms": round(user * 1000 / attempts, 3), "sys_ms": round(system * 1000 / attempts, 3)}


def worker_cpu(trees: list[str | None], period_ms: int, seconds: float, kinds: tuple[str, ...] = KINDS) -> dict:
    out: dict[str, dict] = {}
    with _Netns() as env:
        for tree in trees:
            argv = [sys.executable, __file__, "_worker", "--netns", env.ns.path, "--ports", json.dumps(env.ports),
                    "--period-ms", str(period_ms), "--seconds", str(seconds), "--kinds", ",".join(kinds)]
            if tree:
                argv += ["--tree", tree]
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(res.stderr[-2000:])
            out[tree or "this"] = json.loads(res.stdout)
    return out


# --- instructions per attempt (callgrind) --------------------------------------------------------

# Per kind back to back (the hot cost), then "sandbox": the three kinds together at a period
# long enough that callgrind's slowdown (~50x) does not make their attempts run back to back.
INSTRUCTION_RUNS = {"http": ("http",), "tcp": ("tcp",), "grpc": ("grpc",), "sandbox": KINDS}
BACK_TO_BACK_PERIOD_MS = 10


async def _manager_attempts(ports: dict[str, int], kinds: tuple[str, ...], period_ms: int, count: int,
                            start_now: bool) -> None:
    """Runs the worker's loop (manager, prober, channel) until `count` attempts were reported."""
    from cri_proto import probe_spec_pb2 as spec_pb
    from cri_proto import probe_worker_pb2 as worker_pb
    from probe_worker.channel import AsyncChannel
    from probe_worker.manager import ProbeManager
    from probe_worker.prober import Prober

    ours, theirs = socket.socketpair()
    # The daemon's end is drained by an exec'd program: outside callgrind and without a thread.
    drain = subprocess.Popen(["cat"], stdin=theirs, stdout=subprocess.DEVNULL)
    theirs.close()
    channel = AsyncChannel(ours)
    done = asyncio.Event()
    reported = 0

    async def emit(event) -> None:
        nonlocal reported
        await channel.send(event)
        if event.WhichOneof("msg") == "attempt":
            reported += 1
            if reported == count:
                done.set()

    manager = ProbeManager(Prober([POD_IPV4, "fd00:5a::2"], "1.32"), emit)
    specs = _specs(ports)
    for kind in kinds:
        spec = spec_pb.ProbeSpec()
        spec.CopyFrom(specs[kind])
        spec.period_ms = period_ms
        await manager.add(worker_pb.ProbeRegistration(probe_id=kind, type=spec_pb.READINESS, spec=spec,
                                                      start_now=start_now,
                                                      container=worker_pb.ContainerRef(id="c", name="app")))
    await done.wait()
    await manager.close()
    ours.close()
    drain.wait()


def _callgrind(netns: str, ports: dict[str, int], tree: str | None, run: str, count: int, period_ms: int) -> int:
    argv = ["ip", "netns", "exec", netns, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, __file__, "_cg", "--ports", json.dumps(ports), "--kinds", run,
            "--count", str(count), "--period-ms", str(period_ms)]
    if tree:
        argv += ["--tree", tree]
    # A fixed hash seed: dict and set layouts, hence instruction counts, repeat from run to run.
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    collected = [line for line in res.stderr.splitlines() if "Collected :" in line]
    if res.returncode or not collected:
        raise RuntimeError(res.stderr[-2000:])
    return int(collected[-1].split()[-1])


def instructions(trees: list[str | None], count: int, period_ms: int, runs: tuple[str, ...], repeat: int) -> dict:
    """{tree: {run: median instructions per attempt}}, and each run's repeats under "spread"."""
    samples: dict[str, dict[str, list[int]]] = {}
    with _Netns() as env:
        for run in runs:
            period = BACK_TO_BACK_PERIOD_MS if run in KINDS else period_ms
            for _ in range(repeat):
                for tree in trees:  # interleaved, like the other modes
                    low = _callgrind(env.ns.name, env.ports, tree, run, count, period)
                    high = _callgrind(env.ns.name, env.ports, tree, run, 3 * count, period)
                    samples.setdefault(tree or "this", {}).setdefault(run, []).append(
                        round((high - low) / (2 * count)))
    out: dict[str, dict] = {tree: {run: round(statistics.median(v)) for run, v in by_run.items()}
                            for tree, by_run in samples.items()}
    out["spread"] = samples
    return out


# --- daemon CPU per attempt -----------------------------------------------------------------------


def _daemon_frames(directory, board, sandboxes: int):
    """One encoded attempt report per probe (S sandboxes x HTTP, TCP, gRPC), phases like real attempts."""
    from cri_proto import probe_service_pb2 as service_pb
    from cri_proto import probe_spec_pb2 as spec_pb
    from cri_proto import probe_worker_pb2 as worker_pb
    from probe_api.worker_protocol import encode
    from shim.state.registry import _registration
    from shim.sandboxes.resolver import SandboxInfo

    specs = _specs({"http": 8080, "tcp": 8081, "grpc": 8082})
    phase_names = {"http": ("connect", "request", "processing", "transfer"), "tcp": ("connect",),
                   "grpc": ("connect", "handshake", "check")}
    frames = []
    now = time.time_ns()
    for s in range(sandboxes):
        sid = f"{s:064x}"
        directory.note(SandboxInfo(id=sid, netns_path="/var/run/netns/x", name=f"pod-{s}",
                                         namespace="default", uid=f"uid-{s}"))
        for kind, spec in specs.items():
            probe_id = f"{sid[:16]}-{kind}"
            req = service_pb.RunProbeRequest(pod_sandbox_id=sid, container_name="app", type=spec_pb.READINESS, spec=spec)
            board.put(_registration(req, probe_id, now))
            phases = [spec_pb.Phase(name=name, start_offset_ns=10_000 * i, duration_ns=50_000, detail="198.18.0.2:8080")
                      for i, name in enumerate(phase_names[kind])]
            attempt = spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=now, duration_ns=400_000,
                                      address="198.18.0.2:8080", phases=phases,
                                      http_status_code=200 if kind == "http" else 0,
                                      grpc_serving_status=spec_pb.GRPC_SERVING if kind == "grpc" else 0)
            event = worker_pb.WorkerEvent(attempt=worker_pb.AttemptReport(
                probe_id=probe_id, attempt=attempt, state=spec_pb.STATE_SUCCESS, consecutive_successes=5))
            frames.append((sid, encode(event)))
    return frames


def daemon_cpu(count: int, sandboxes: int, profile: bool = False) -> dict:
    from cri_proto import probe_worker_pb2 as worker_pb
    from probe_api.worker_protocol import FrameDecoder
    from shim.observe.metrics import ShimMetrics
    from shim.state.results import ResultsManager
    from shim.state.board import StatusBoard
    from shim.observe.tracing import AttemptTracer
    from shim.sandboxes.directory import SandboxDirectory

    board, tracer, metrics = StatusBoard(), AttemptTracer("none"), ShimMetrics()
    directory = SandboxDirectory(source=None)  # identities only: nothing is resolved here
    results = ResultsManager(board=board, tracer=tracer, metrics=metrics, sandboxes=directory)
    frames = _daemon_frames(directory, board, sandboxes)

    def run(n: int) -> None:
        # What the supervisor's WorkerConnection.data_received does per frame, then the results manager.
        decoder = FrameDecoder()
        for i in range(n):
            sandbox_id, data = frames[i % len(frames)]
            for payload in decoder.feed(data):
                results.on_event(sandbox_id, worker_pb.WorkerEvent.FromString(payload))

    run(min(count, 2000))  # warm-up: every label set exists
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(run, count)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    c0 = time.process_time_ns()
    run(count)
    cpu_us = (time.process_time_ns() - c0) / count / 1e3
    return {"attempts": count, "sandboxes": sandboxes, "cpu_us_per_attempt": round(cpu_us, 1)}


def daemon_cpu_trees(trees: list[str | None], count: int, sandboxes: int, repeat: int) -> dict:
    out: dict[str, list] = {}
    for _ in range(repeat):
        for tree in trees:
            argv = [sys.executable, __file__, "_daemon", "--count", str(count), "--sandboxes", str(sandboxes)]
            if tree:
                argv += ["--tree", tree]
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(res.stderr[-2000:])
            out.setdefault(tree or "this", []).append(json.loads(res.stdout)["cpu_us_per_attempt"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("latency", "worker", "daemon", "instructions", "all",
                                         "_inside", "_worker", "_daemon", "_cg"))
    parser.add_argument("--tree", action="append", default=[],
                        help="also measure the code of this source tree (repeatable); compared in the same run")
    parser.add_argument("--count", type=int, default=None, help="attempts per kind (latency) or reports (daemon)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="worker: measured seconds")
    parser.add_argument("--period-ms", type=int, default=20, help="worker: probe period")
    parser.add_argument("--sandbox-period-ms", type=int, default=500,
                        help="instructions: period of the three probes run together")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="worker: probe kinds to run; instructions: runs among http,tcp,grpc,sandbox")
    parser.add_argument("--sandboxes", type=int, default=50, help="daemon: sandboxes of 3 probes each")
    parser.add_argument("--profile", action="store_true", help="daemon: print a cProfile of the attempt path")
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--netns", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.what == "_inside":
        _use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(asyncio.run(_inside(json.loads(args.ports), args.count or 500, warmup=30))))
        return 0
    if args.what == "_worker":
        _use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(_worker_inside(args.netns, json.loads(args.ports), args.period_ms, args.seconds,
                                        tuple(args.kinds.split(",")))))
        return 0
    if args.what == "_cg":
        _use_tree(args.tree[0] if args.tree else None)
        kinds = INSTRUCTION_RUNS[args.kinds]
        asyncio.run(_manager_attempts(json.loads(args.ports), kinds, args.period_ms, args.count,
                                      start_now=len(kinds) == 1))
        return 0
    if args.what == "_daemon":
        _use_tree(args.tree[0] if args.tree else None)
        print(json.dumps(daemon_cpu(args.count or 20000, args.sandboxes, args.profile)))
        return 0

    trees: list[str | None] = [*args.tree, None]
    report: dict[str, dict] = {}
    if args.what in ("latency", "all"):
        report["latency"] = latency(trees, args.count or 500, args.repeat)
    if args.what in ("worker", "all"):
        report["worker"] = worker_cpu(trees, args.period_ms, args.seconds, tuple(args.kinds.split(",")))
    if args.what in ("daemon", "all"):
        report["daemon"] = daemon_cpu_trees(trees, args.count or 20000, args.sandboxes, args.repeat)
    if args.what == "instructions":
        runs = tuple(args.kinds.split(",")) if args.kinds != ",".join(KINDS) else tuple(INSTRUCTION_RUNS)
        report["instructions"] = instructions(trees, args.count or 100, args.sandbox_period_ms, runs,
                                             args.repeat)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
