"""What bench/perf_probe_path.py runs in a child interpreter whose sys.path starts with the measured tree: the
engine vs floor attempts (latency), a real worker's CPU per attempt, the worker's loop for callgrind
(instructions), and the daemon's side of an attempt (daemon). Each returns (or the caller prints) its figures;
the measured packages are imported inside the functions, after the tree was put first.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import statistics
import subprocess
import time

from bench.floor import http_once as floor_http
from bench.floor import tcp_once as floor_tcp
from bench.probe_path_rig import POD_IPS, POD_IPV4, periodic_registration, specs

# --- latency: engine vs floor, inside the netns ----------------------------------------------------


async def latency_inside(ports: dict[str, int], count: int, warmup: int) -> dict:
    from cri_proto import probe_spec_pb2 as spec_pb
    from probe_worker.prober import Prober

    prober = Prober(list(POD_IPS), "1.37")
    request = (f"GET /ok HTTP/1.1\r\nHost: {POD_IPV4}:{ports['http']}\r\nUser-Agent: kube-probe/1.37\r\n"
               "Accept: */*\r\nConnection: close\r\n\r\n").encode()
    floors = {"http": lambda: floor_http(POD_IPV4, ports["http"], request), "tcp": lambda: floor_tcp(POD_IPV4, ports["tcp"])}
    out = {}
    for kind, spec in specs(ports).items():
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


# --- worker CPU per attempt -----------------------------------------------------------------------


def worker_inside(netns_path: str, ports: dict[str, int], period_ms: int, seconds: float,
                   kinds: tuple[str, ...]) -> dict:
    """Runs in a fresh interpreter whose sys.path starts with the measured tree (its harness
    starts `python -m probe_worker` from that tree)."""
    import psutil

    from cri_proto import probe_worker_pb2 as worker_pb
    from tests.support.worker_harness import WorkerHarness

    by_kind = specs(ports)
    pod_ips = list(POD_IPS)
    if "netns_path" in inspect.signature(WorkerHarness).parameters:
        worker = WorkerHarness(worker_pb.WorkerConfig(), netns_path, pod_ips=pod_ips)
    else:  # a tree from before pooled workers: the worker entered the netns itself
        worker = WorkerHarness(worker_pb.WorkerConfig(netns_path=netns_path, pod_ips=pod_ips))
    try:
        for kind in kinds:
            worker.add(periodic_registration(by_kind[kind], kind, period_ms))
        process = psutil.Process(worker.ready.pid)

        def drain(seconds: float) -> tuple[int, int]:
            attempts = late = 0
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                attempt = worker.next_event(kinds=("attempt",)).attempt.status.last_attempt
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


# --- the worker's loop, under callgrind ------------------------------------------------------------


async def manager_attempts(ports: dict[str, int], kinds: tuple[str, ...], period_ms: int, count: int,
                            start_now: bool) -> None:
    """Runs the worker's loop (manager, prober, channel) until `count` attempts were reported."""
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

    manager = ProbeManager(Prober(list(POD_IPS), "1.37"), emit)
    by_kind = specs(ports)
    for kind in kinds:
        await manager.add(periodic_registration(by_kind[kind], kind, period_ms, start_now=start_now))
    await done.wait()
    await manager.close()
    ours.close()
    drain.wait()


# --- daemon CPU per attempt -----------------------------------------------------------------------


def daemon_frames(directory, board, sandboxes: int):
    """One encoded attempt report per probe (S sandboxes x HTTP, TCP, gRPC), phases like real attempts."""
    from cri_proto import probe_service_pb2 as service_pb
    from cri_proto import probe_spec_pb2 as spec_pb
    from cri_proto import probe_worker_pb2 as worker_pb
    from probe_api.worker_protocol import encode
    from shim.sandboxes.resolver import SandboxInfo
    from shim.state.registry import _registration

    by_kind = specs({"http": 8080, "tcp": 8081, "grpc": 8082})
    phase_names = {"http": ("connect", "request", "processing", "transfer"), "tcp": ("connect",),
                   "grpc": ("connect", "handshake", "check")}
    frames = []
    now = time.time_ns()
    for s in range(sandboxes):
        sid = f"{s:064x}"
        directory.note(SandboxInfo(id=sid, netns_path="/var/run/netns/x", name=f"pod-{s}",
                                         namespace="default", uid=f"uid-{s}"))
        for kind, spec in by_kind.items():
            probe_id = f"{sid[:16]}-{kind}"
            req = service_pb.RunProbeRequest(pod_sandbox_id=sid, container_name="app", type=spec_pb.READINESS, spec=spec)
            board.put(_registration(req, probe_id, now))
            phases = [spec_pb.Phase(name=name, start_offset_ns=10_000 * i, duration_ns=50_000, detail="198.18.0.2:8080")
                      for i, name in enumerate(phase_names[kind])]
            attempt = spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=now, duration_ns=400_000,
                                      address="198.18.0.2:8080", phases=phases,
                                      http_status_code=200 if kind == "http" else 0,
                                      grpc_serving_status=spec_pb.GRPC_SERVING if kind == "grpc" else 0)
            event = worker_pb.WorkerEvent(attempt=worker_pb.AttemptReport(probe_id=probe_id, status=service_pb.ProbeStatus(
                last_attempt=attempt, state=spec_pb.STATE_SUCCESS, consecutive_successes=5,
                totals=service_pb.AttemptTotals(success=5))))
            frames.append((sid, encode(event)))
    return frames


def daemon_cpu(count: int, sandboxes: int, profile: bool = False) -> dict:
    from cri_proto import probe_worker_pb2 as worker_pb
    from probe_api.worker_protocol import FrameDecoder
    from shim.observe.metrics import ShimMetrics
    from shim.observe.tracing import AttemptTracer
    from shim.sandboxes.directory import SandboxDirectory
    from shim.state.board import StatusBoard
    from shim.state.results import ResultsManager

    board, tracer, metrics = StatusBoard(), AttemptTracer("none"), ShimMetrics()
    directory = SandboxDirectory(source=None)  # identities only: nothing is resolved here
    results = ResultsManager(board=board, tracer=tracer, metrics=metrics, sandboxes=directory)
    frames = daemon_frames(directory, board, sandboxes)

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
