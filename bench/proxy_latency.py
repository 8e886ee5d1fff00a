#!/usr/bin/env python3
"""Latency the transparent CRI proxy adds to a unary CRI call (RuntimeService/Version).

Three processes, as on a node: a fake runtime (tests/fake_cri.py, answering Version with a VersionResponse) on a
unix socket, the proxy (shim/cri_proxy.py in a grpc.aio server, like the daemon's) on another unix socket, and
this process as the client (sync grpcio, one call at a time, each with a deadline as the kubelet sets one).
After a warm-up, N calls go straight to the runtime and N through the proxy, interleaved in blocks so that drift
of the machine affects both alike. Prints min/median/p90/p99/max of each and the difference.

    python3 bench/proxy_latency.py --count 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from bench.stats import summarize  # noqa: E402
from cri_proto import cri_runtime_v1_pb2 as cri_pb  # noqa: E402
from shim.cri_proxy import SERVER_OPTIONS, cri_proxy_handler, upstream_channel  # noqa: E402

VERSION = "/runtime.v1.RuntimeService/Version"
KUBELET_TIMEOUT_S = 120.0  # kubelet's default --runtime-request-timeout (2m)
READY_TIMEOUT_S = 15.0


# ---------------------------------------------------------------- the proxy process


async def serve_proxy(listen: str, upstream_endpoint: str) -> None:
    upstream = upstream_channel(upstream_endpoint)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((cri_proxy_handler(upstream),))
    server.add_insecure_port(f"unix:{listen}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"READY {listen}", flush=True)
    await stop.wait()
    await server.stop(None)
    await upstream.close()


# ---------------------------------------------------------------- the client


def start(argv: list[str]) -> subprocess.Popen:
    """Starts a server process and waits (bounded) for its READY line."""
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(READY_TIMEOUT_S):
            proc.kill()
            raise SystemExit(f"{argv} did not print READY within {READY_TIMEOUT_S}s")
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise SystemExit(f"{argv} failed to start: {line!r}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def timed_calls(call: grpc.UnaryUnaryMultiCallable, request: bytes, count: int, expected: bytes) -> list[float]:
    """Milliseconds of each of `count` sequential calls."""
    out = []
    for _ in range(count):
        begin = time.perf_counter_ns()
        response = call(request, timeout=KUBELET_TIMEOUT_S)
        out.append((time.perf_counter_ns() - begin) / 1e6)
        assert response == expected
    return out


def measure(count: int, warmup: int, block: int) -> dict[str, dict[str, float]]:
    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    runtime_sock, proxy_sock = workdir / "cri.sock", workdir / "proxy.sock"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start([sys.executable, "-m", "tests.fake_cri", "--socket", str(runtime_sock)]))
        procs.append(start([sys.executable, str(Path(__file__).resolve()), "--serve-proxy",
                            "--listen", str(proxy_sock), "--upstream", f"unix://{runtime_sock}"]))
        request = cri_pb.VersionRequest(version="v1").SerializeToString()
        expected = cri_pb.VersionResponse(version="0.1.0", runtime_name="fake-cri", runtime_version="1.0.0",
                                          runtime_api_version="v1").SerializeToString()
        with grpc.insecure_channel(f"unix:{runtime_sock}") as direct_channel, \
                grpc.insecure_channel(f"unix:{proxy_sock}") as proxy_channel:
            direct = direct_channel.unary_unary(VERSION)
            proxied = proxy_channel.unary_unary(VERSION)
            timed_calls(direct, request, warmup, expected)
            timed_calls(proxied, request, warmup, expected)
            direct_ms: list[float] = []
            proxy_ms: list[float] = []
            while len(direct_ms) < count:
                n = min(block, count - len(direct_ms))
                direct_ms += timed_calls(direct, request, n, expected)
                proxy_ms += timed_calls(proxied, request, n, expected)
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    d, p = summarize(direct_ms), summarize(proxy_ms)
    return {"direct": d, "proxy": p, "added": {k: round(p[k] - d[k], 3) for k in ("median", "p90", "p99")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2000, help="measured calls per path (default 2000)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--block", type=int, default=100, help="calls per path before switching path")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--listen", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        asyncio.run(serve_proxy(args.listen, args.upstream))
        return 0

    results = measure(args.count, args.warmup, args.block)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"unary CRI Version, {args.count} sequential calls per path after {args.warmup} warm-up (ms)")
    print(f"{'':8}" + "".join(f"{k:>9}" for k in ("min", "median", "p90", "p99", "max")))
    for name in ("direct", "proxy"):
        print(f"{name:8}" + "".join(f"{v:9.3f}" for v in results[name].values()))
    added = results["added"]
    print(f"added by the proxy: median {added['median']:.3f} ms, p90 {added['p90']:.3f} ms, p99 {added['p99']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
