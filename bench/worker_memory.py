#!/usr/bin/env python3
"""Memory per sandbox: the real daemon, N sandboxes, 3 live probes each (HTTP, TCP, gRPC at 1 s).

Issue 6's figure: PSS per extra sandbox = (total PSS of daemon + zygote + workers at N
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

Importable (bench/suite.py): `memory_of(pid)` / `memory_of_all(pids)` read smaps_rollup,
`shim_processes(daemon_pid)` finds the zygote and the workers, `shim_memory(daemon_pid)`
returns every PSS figure of one moment, `per_extra_sandbox(at_n, at_n0)` the issue's
ratio and `private_by_mapping(pid)` where a process's private pages are.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

MIB = 1 << 20
POD_IP = "198.18.0.2"  # benchmarking range (RFC 2544); on each namespace's own loopback
HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 8081, 8082
CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 60.0


# --- measuring (importable) ----------------------------------------------------------------

@dataclass(frozen=True)
class Memory:
    """One process's memory from /proc/PID/smaps_rollup, in bytes."""

    pid: int
    rss: int
    pss: int
    pss_anon: int
    pss_file: int
    private: int  # Private_Clean + Private_Dirty (what USS counts)

    @property
    def shared_pss(self) -> int:
        return self.pss - self.private


_ROLLUP_FIELDS = {"Rss": "rss", "Pss": "pss", "Pss_Anon": "pss_anon", "Pss_File": "pss_file"}


def memory_of(pid: int) -> Memory:
    values = {"rss": 0, "pss": 0, "pss_anon": 0, "pss_file": 0, "private": 0}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in _ROLLUP_FIELDS:
                values[_ROLLUP_FIELDS[key]] = int(rest.split()[0]) * 1024
            elif key in ("Private_Clean", "Private_Dirty"):
                values["private"] += int(rest.split()[0]) * 1024
    return Memory(pid=pid, **values)


def memory_of_all(pids: Iterable[int]) -> dict[int, Memory]:
    """Processes that exited meanwhile are left out."""
    found = {}
    for pid in pids:
        try:
            found[pid] = memory_of(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


@dataclass(frozen=True)
class ShimProcesses:
    daemon: int
    zygote: int | None
    workers: tuple[int, ...]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except FileNotFoundError:
        return []


def shim_processes(daemon_pid: int) -> ShimProcesses:
    """The daemon's zygote (its `-m probe_zygote.main` child) and the workers: the zygote's children, and
    the daemon's other children (workers it adopted when a zygote died)."""
    children = _children(daemon_pid)
    zygote = next((pid for pid in children if "probe_zygote" in _cmdline(pid)), None)
    adopted = [pid for pid in children if pid != zygote]
    workers = tuple(sorted((_children(zygote) if zygote else []) + adopted))
    return ShimProcesses(daemon_pid, zygote, workers)


@dataclass(frozen=True)
class ShimMemory:
    """PSS of every part of one daemon at one moment, in bytes."""

    daemon: Memory
    zygote: Memory | None
    workers: tuple[Memory, ...]

    @property
    def total_pss(self) -> int:
        return self.daemon.pss + (self.zygote.pss if self.zygote else 0) + sum(w.pss for w in self.workers)

    def summary_mib(self) -> dict[str, float]:
        pss = [w.pss for w in self.workers] or [0]
        private = [w.private for w in self.workers] or [0]
        return {
            "workers": len(self.workers),
            "daemon_pss_mib": round(self.daemon.pss / MIB, 2),
            "daemon_rss_mib": round(self.daemon.rss / MIB, 2),
            "zygote_pss_mib": round(self.zygote.pss / MIB, 2) if self.zygote else 0.0,
            "worker_pss_mean_mib": round(statistics.mean(pss) / MIB, 3),
            "worker_pss_max_mib": round(max(pss) / MIB, 3),
            "worker_private_mean_mib": round(statistics.mean(private) / MIB, 3),
            "total_pss_mib": round(self.total_pss / MIB, 2),
        }


def shim_memory(daemon_pid: int) -> ShimMemory:
    procs = shim_processes(daemon_pid)
    found = memory_of_all([procs.daemon, *([procs.zygote] if procs.zygote else []), *procs.workers])
    return ShimMemory(daemon=found[procs.daemon], zygote=found.get(procs.zygote),
                      workers=tuple(found[pid] for pid in procs.workers if pid in found))


def per_extra_sandbox(at_n: ShimMemory, at_n0: ShimMemory) -> float:
    """(total PSS at N - at N0) / (N - N0), in bytes, N counted as live workers."""
    extra = len(at_n.workers) - len(at_n0.workers)
    if extra <= 0:
        raise ValueError("the second measurement must have more workers than the first")
    return (at_n.total_pss - at_n0.total_pss) / extra


def mapping_kind(name: str, executable: bool) -> str:
    """A label for one /proc/PID/smaps mapping (pure)."""
    if name in ("[heap]", "[stack]", "[vvar]", "[vdso]", "[vsyscall]"):
        return name
    if not name:
        return "anonymous (pymalloc arenas, malloc mmaps, thread stacks)"
    if name.startswith("/memfd:") or name.startswith("/dev/"):
        return "other"
    base = os.path.basename(name)
    if base.startswith("python") or base.startswith("libpython"):
        return f"{base} ({'text' if executable else 'data'})"
    return f"other files ({'text' if executable else 'data'})"


def private_by_mapping(pid: int) -> dict[str, int]:
    """Private bytes (clean + dirty) of a process, summed by kind of mapping, largest first."""
    totals: dict[str, int] = {}
    kind = ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if not line[0].isupper():  # a mapping's header line ("start-end perms offset dev inode name")
                perms = fields[1]
                kind = mapping_kind(fields[5] if len(fields) > 5 else "", "x" in perms)
            elif fields[0] in ("Private_Clean:", "Private_Dirty:"):
                totals[kind] = totals.get(kind, 0) + int(fields[1]) * 1024
    return dict(sorted(((k, v) for k, v in totals.items() if v), key=lambda kv: -kv[1]))


# --- the sandboxes and their targets ------------------------------------------------------

class Namespaces:
    """Loopback-only netns named like the tests' (cps-bench-PID-i), so a stale sweep finds them."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def grow(self, count: int) -> list[str]:
        added = []
        while len(self.names) < count:
            name = f"cps-bench-{os.getpid()}-{len(self.names)}"
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            self.names.append(name)
            added.append(name)
            for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{POD_IP}/32", "dev", "lo"]):
                subprocess.run(["ip", "-n", name, *cmd], check=True, capture_output=True)
        return added

    def destroy(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.names.clear()


def _setns(fd: int) -> None:
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


def serve_targets() -> None:
    """Target process: reads namespace names on stdin, one a line; after each blank line it
    listens in the new ones and prints READY. HTTP and TCP on asyncio, gRPC health on grpcio."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    class Http(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.head = transport, b""

        def data_received(self, data):
            self.head += data
            if b"\r\n\r\n" in self.head:
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                self.transport.close()

    class Tcp(asyncio.Protocol):
        def connection_made(self, transport):
            transport.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        servers = []  # grpcio binds a port (in this thread's netns) when it is added, none once started
        pending: list[str] = []
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip():
                pending.append(line.strip())
                continue
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
            for name in pending:
                fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
                try:
                    _setns(fd)
                    for protocol, port in ((Http, HTTP_PORT), (Tcp, TCP_PORT)):
                        await loop.create_server(protocol, sock=socket.create_server(("0.0.0.0", port), backlog=1024))
                    if server.add_insecure_port(f"0.0.0.0:{GRPC_PORT}") != GRPC_PORT:
                        raise OSError(f"grpc could not listen in {name}")
                finally:
                    _setns(home)
                    os.close(fd)
            server.start()
            servers.append(server)
            pending.clear()
            print("READY", flush=True)

    asyncio.run(main())


class Targets:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-targets"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)

    def add(self, names: list[str]) -> None:
        self.proc.stdin.write("".join(f"{n}\n" for n in names) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the target process failed (see its stderr)")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# --- the daemon ------------------------------------------------------------------------------

class Daemon:
    """`probe-shim serve` in embedded mode in a private directory, and a client to it."""

    def __init__(self, workdir: str, env: dict[str, str] | None = None) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from cri_proto import probe_service_pb2_grpc as service_grpc

        sock = f"{workdir}/shim.sock"
        self.log = open(f"{workdir}/daemon.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none", "--listen", f"unix://{sock}",
             "--state-dir", f"{workdir}/state", "--metrics-listen", "127.0.0.1:0"],
            cwd=REPO_ROOT, env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), (env or {}).get("PYTHONPATH", "")) if p)},
            stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"unix://{sock}", options=[("grpc.use_local_subchannel_pool", 1)])
        health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S,
                                                       wait_for_ready=True)
        self.stub = service_grpc.ProbeServiceStub(self.channel)

    def run_probes(self, sandbox: str, kinds: Iterable[str] = ("http", "tcp", "grpc"), period_ms: int = 1000) -> list[str]:
        from cri_proto import probe_service_pb2 as service_pb
        from cri_proto import probe_spec_pb2 as spec_pb

        handlers = {
            "http": {"http_get": spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(number=HTTP_PORT))},
            "tcp": {"tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=TCP_PORT))},
            "grpc": {"grpc": spec_pb.GRPCAction(port=GRPC_PORT)},
        }
        return [self.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=sandbox, container_name=kind, type=spec_pb.READINESS,
            spec=spec_pb.ProbeSpec(period_ms=period_ms, timeout_ms=1000, **handler)), timeout=30).probe_id
            for kind, handler in handlers.items() if kind in kinds]

    def wait_for_successes(self, probe_ids: set[str], successes: int, timeout_s: float) -> int:
        """Until every probe in probe_ids has `successes` successful attempts (polling: a bench, not a
        test); returns how many of their attempts did not succeed (a loaded machine times some out)."""
        from cri_proto import probe_service_pb2 as service_pb

        deadline = time.monotonic() + timeout_s
        while True:
            probes = [p for p in self.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=30).probes
                      if p.probe_id in probe_ids]
            behind = [p for p in probes if p.status.totals.success < successes]
            if not behind:
                return sum(p.status.totals.warning + p.status.totals.failure + p.status.totals.unknown for p in probes)
            if time.monotonic() > deadline:
                p = behind[0]
                raise TimeoutError(f"{len(behind)} probes still below {successes} successes, e.g. {p.container_name} "
                                   f"in {p.pod_sandbox_id}: {p.status.last_attempt.output}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


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
    parser.add_argument("--serve-targets", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_targets:
        serve_targets()
        return 0
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
