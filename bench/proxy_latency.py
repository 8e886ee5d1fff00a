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

bench/suite.py reuses `ContainerdRig`, `proxy_overhead`, `interleaved` and the call builders.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from bench.stats import summarize  # noqa: E402
from cri_proto import cri_runtime_v1_pb2 as cri_pb  # noqa: E402
from cri_proto import probe_service_pb2 as service_pb  # noqa: E402
from cri_proto import probe_service_pb2_grpc as service_grpc  # noqa: E402
from cri_proto import probe_spec_pb2 as spec_pb  # noqa: E402

RUNTIME = "/runtime.v1.RuntimeService"
KUBELET_TIMEOUT_S = 120.0  # kubelet's default --runtime-request-timeout (2m)
READY_TIMEOUT_S = 15.0
HEALTHZ_PATH = "/healthz"   # the busybox httpd of the test image
SERVER_PATH = "/ok"         # tests/support/servers/http_server.py
PROBE_TIMEOUT_MS = 1000
WARM_PROBE_PERIOD_MS = 10_000  # the probe that keeps the worker up: rare enough not to disturb the measurement
# grpc's own default (EventEngine endpoints on), for a shim to compare with (see shim/grpc_tuning.py). The
# operator's GRPC_EXPERIMENTS wins over the daemon's tuning, so this re-enables what the daemon turns off.
GRPC_DEFAULTS_ENV = {"GRPC_EXPERIMENTS": "event_engine_client,event_engine_listener"}

Call = Callable[[], object]


# ---------------------------------------------------------------- measuring (pure apart from the calls)


def timed(call: Call) -> float:
    begin = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - begin) / 1e6


def interleaved(calls: dict[str, Call], count: int, warmup: int = 0, block: int = 1) -> dict[str, list[float]]:
    """Milliseconds of `count` calls of each path, taken in turns of `block` calls after a warm-up. Each turn
    starts one path further (a b c, b c a, c a b, ...): no path always runs right after the same other one.

    block > 1 is for paths whose cost lingers after they return (an ExecSync leaves containerd and runc
    reaping the exec for milliseconds): one call in `block` follows another path, so each path's median is
    its own cost, while slow drift of the machine still hits every path alike."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    names = list(calls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(-(-count // block)):
        for i in range(len(names)):
            name = names[(turn + i) % len(names)]
            for _ in range(min(block, count - len(out[name]))):
                out[name].append(timed(calls[name]))
    return out


def compare(base_ms: list[float], other_ms: list[float]) -> dict:
    """Summaries of both paths, the difference of medians and the median of paired (neighbouring) differences."""
    base, other = summarize(base_ms), summarize(other_ms)
    paired = [o - b for b, o in zip(base_ms, other_ms)]
    return {
        "base": base, "other": other,
        "added_median_ms": round(other["median"] - base["median"], 3),
        "added_paired_median_ms": round(statistics.median(paired), 3),
        "ratio_median": round(other["median"] / base["median"], 2) if base["median"] else None,
    }


# ---------------------------------------------------------------- the calls


def cri_call(channel: grpc.Channel, method: str, request: bytes) -> Call:
    """A raw unary CRI call (bytes in, bytes out: nothing is decoded in the loop) with the kubelet's deadline."""
    stub = channel.unary_unary(f"{RUNTIME}/{method}")
    return lambda: stub(request, timeout=KUBELET_TIMEOUT_S)


def exec_probe_call(channel: grpc.Channel, sandbox_id: str, spec: spec_pb.ProbeSpec,
                    attempts_ms: list[float] | None = None) -> Call:
    """One ExecProbe on a persistent channel; a failed attempt aborts the benchmark. With `attempts_ms`, each
    attempt's own duration (measured by the worker) is appended to it."""
    stub = service_grpc.ProbeServiceStub(channel)
    request = service_pb.ExecProbeRequest(pod_sandbox_id=sandbox_id, spec=spec)

    def call() -> service_pb.ExecProbeResponse:
        response = stub.ExecProbe(request, timeout=10)
        if response.attempt.result != spec_pb.RESULT_SUCCESS:
            raise RuntimeError(f"ExecProbe failed: {response.attempt.output}")
        if attempts_ms is not None:
            attempts_ms.append(response.attempt.duration_ns / 1e6)
        return response

    return call


def exec_sync_call(channel: grpc.Channel, container_id: str, argv: list[str]) -> Call:
    stub = channel.unary_unary(f"{RUNTIME}/ExecSync", request_serializer=cri_pb.ExecSyncRequest.SerializeToString,
                               response_deserializer=cri_pb.ExecSyncResponse.FromString)
    request = cri_pb.ExecSyncRequest(container_id=container_id, cmd=argv, timeout=1)

    def call() -> cri_pb.ExecSyncResponse:
        response = stub(request, timeout=30)
        if response.exit_code != 0:
            raise RuntimeError(f"ExecSync exit {response.exit_code}: {response.stderr!r}")
        return response

    return call


def subprocess_call(argv: list[str]) -> Call:
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


def http_probe_spec(port: int, path: str = HEALTHZ_PATH) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=port)),
        target=spec_pb.LOOPBACK, timeout_ms=PROBE_TIMEOUT_MS,
    )


def wget_argv(port: int, path: str = HEALTHZ_PATH) -> list[str]:
    # No -T: busybox-static's wget crashes (SIGSEGV) with it here; ExecSync and subprocess timeouts bound it.
    return ["busybox", "wget", "-q", "-O", "-", f"http://127.0.0.1:{port}{path}"]


def curl_argv(port: int, path: str = HEALTHZ_PATH) -> list[str]:
    return ["curl", "-sf", "-m", "1", "-o", "/dev/null", f"http://127.0.0.1:{port}{path}"]


# ---------------------------------------------------------------- the measurements


def proxy_overhead(direct: grpc.Channel, proxied: grpc.Channel, count: int, warmup: int = 200,
                   others: dict[str, grpc.Channel] | None = None) -> dict:
    """Version and ListPodSandbox, direct vs through the shim, interleaved call by call. `others`: more shims
    measured in the same turns, each compared with the same direct calls (under "others")."""
    results = {}
    for method, request in (("Version", cri_pb.VersionRequest(version="v1")),
                            ("ListPodSandbox", cri_pb.ListPodSandboxRequest())):
        raw = request.SerializeToString()
        calls = {"direct": cri_call(direct, method, raw), "proxy": cri_call(proxied, method, raw)}
        calls.update({name: cri_call(channel, method, raw) for name, channel in (others or {}).items()})
        times = interleaved(calls, count, warmup)
        results[method] = compare(times["direct"], times["proxy"])
        if others:
            results[method]["others"] = {name: compare(times["direct"], times[name]) for name in others}
    return results


def exec_comparison(rig: "ContainerdRig", count: int, slow_count: int, target: str = "server",
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


# ---------------------------------------------------------------- containerd, pods and the shim


@dataclass
class ContainerdRig:
    """A private containerd with `pod_count` pod sandboxes (busybox httpd on the pod's 127.0.0.1:8080 in each),
    tests/support/servers/http_server.py on 127.0.0.1:`server_port` in the first pod's netns, and a shim daemon in front
    of containerd with one probe registered in the first pod (its worker stays up), started with `shim_env`
    added to the environment. `shim_envs`: more shims, each with its own extra environment (`others`, by name)."""
    pod_count: int = 3
    shim_env: dict[str, str] = field(default_factory=dict)
    shim_envs: dict[str, dict[str, str]] = field(default_factory=dict)
    env: object = None
    shim: object = None
    others: dict = field(default_factory=dict)
    pods: list = field(default_factory=list)
    direct: grpc.Channel | None = None
    busybox: str = ""
    http_port: int = 0     # busybox httpd in the "http" container of every pod
    server_port: int = 0   # tests/support/servers/http_server.py in the first pod's netns
    _server: subprocess.Popen | None = None
    _workdirs: list[Path] = field(default_factory=list)

    def __enter__(self) -> "ContainerdRig":
        from tests.support.containerd_env import HTTP_PORT, ContainerdEnv, CriClient, Kubelet, cri_channel, \
            sweep_stale_sessions, unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise SystemExit(f"containerd benchmark unavailable: {reason}")
        sweep_stale_sessions()
        self.http_port = HTTP_PORT
        self.env = ContainerdEnv.create()
        try:
            self.env.start()
            self.busybox = self.env.busybox
            self.direct = cri_channel(self.env.endpoint)
            kubelet = Kubelet(CriClient(self.direct), self.env)
            for n in range(self.pod_count):
                pod = kubelet.run_pod(f"bench-{n}")
                kubelet.start_container(pod, "http", self.env.images.http)
                self.pods.append(pod)
            self._server, ready = start(["nsenter", f"--net={self.pods[0].netns_path}", sys.executable,
                                         "tests/support/servers/http_server.py", "--host", "127.0.0.1", "--port", "0"])
            self.server_port = int(ready.split()[1])
            self.shim = self._start_shim(self.shim_env)
            for name, extra in self.shim_envs.items():
                self.others[name] = self._start_shim(extra)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start_shim(self, extra_env: dict[str, str]):
        from tests.support.daemon_env import DaemonProcess

        workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
        self._workdirs.append(workdir)
        daemon = DaemonProcess(workdir, ["--runtime-endpoint", self.env.endpoint])
        with patched_environ(extra_env):  # DaemonProcess passes this process's environment on
            daemon.start()
        spec = http_probe_spec(self.server_port, SERVER_PATH)
        spec.period_ms = WARM_PROBE_PERIOD_MS
        service_grpc.ProbeServiceStub(daemon.channel).RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=self.pods[0].id, container_name="http", type=spec_pb.READINESS, spec=spec), timeout=60)
        return daemon

    def __exit__(self, *exc_info: object) -> None:
        for daemon in [self.shim, *self.others.values()]:
            if daemon is not None and daemon.proc is not None:
                daemon.stop()
        if self._server is not None:
            stop(self._server)
        if self.direct is not None:
            self.direct.close()
        if self.env is not None:
            errors = self.env.stop()
            if errors:
                print(f"containerd teardown: {errors}", file=sys.stderr)
        for workdir in self._workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def patched_environ(extra: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------- --fake: the proxy alone, before a fake runtime


async def serve_proxy(listen: str, upstream_endpoint: str) -> None:
    from shim.cri.proxy import SERVER_OPTIONS, cri_proxy_handler, upstream_channel

    upstream = upstream_channel(upstream_endpoint)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((cri_proxy_handler(upstream),))
    server.add_insecure_port(f"unix:{listen}")
    await server.start()
    stop_event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop_event.set)
    print(f"READY {listen}", flush=True)
    await stop_event.wait()
    await server.stop(None)
    await upstream.close()


def start(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Starts a server process and waits (bounded) for its READY line; returns the process and that line."""
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=env)
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
    return proc, line


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def fake_rig() -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    """(direct, proxied) channels: tests/support/fake_cri.py, and this module's proxy process in front of it (with the
    daemon's gRPC tuning, shim/grpc_tuning.py, applied as the daemon applies it)."""
    from shim import grpc_tuning

    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    runtime_sock, proxy_sock = workdir / "cri.sock", workdir / "proxy.sock"
    procs: list[subprocess.Popen] = []
    proxy_env = dict(os.environ)
    grpc_tuning.apply(proxy_env)
    try:
        procs.append(start([sys.executable, "-m", "tests.support.fake_cri", "--socket", str(runtime_sock)])[0])
        procs.append(start([sys.executable, str(Path(__file__).resolve()), "--serve-proxy", "--listen",
                            str(proxy_sock), "--upstream", f"unix://{runtime_sock}"], env=proxy_env)[0])
        with grpc.insecure_channel(f"unix:{runtime_sock}") as direct, \
                grpc.insecure_channel(f"unix:{proxy_sock}") as proxied:
            yield direct, proxied
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- report


def run(fake: bool, count: int, exec_count: int, pods: int, warmup: int, target: str, ab_grpc: bool,
        apply_tuning: bool) -> dict:
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    if fake:
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
    parser.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--listen", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        asyncio.run(serve_proxy(args.listen, args.upstream))
        return 0
    results = run(args.fake, args.count, args.exec_count, args.pods, args.warmup, args.target, args.ab_grpc_defaults,
                  args.apply_grpc_tuning)
    if args.json:
        print(json.dumps(results))
    else:
        print_table(results, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
