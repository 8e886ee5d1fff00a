"""Real network namespaces for tests: a "pod" netns and a peer, joined by a veth pair.

Only addresses inside these namespaces (and loopback) ever carry test traffic.
Everything created here is removed at teardown, even when the test failed.
"""

from __future__ import annotations

import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
POD_IPV4, PEER_IPV4 = "198.18.0.2", "198.18.0.1"
POD_IPV6, PEER_IPV6 = "fd00:5a::2", "fd00:5a::1"
READY_TIMEOUT_S = 15

_counter = itertools.count()


def netns_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command"
    return None


def remove_stale_namespaces() -> list[str]:
    """Deletes test namespaces left by a test run that was killed (its pid is gone)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        parts = name.rsplit(".", 1)[-1].split("-")  # "team-a.cps-pod-PID-N": a tenancy prefix (create())
        if len(parts) == 4 and parts[0] == "cps" and parts[2].isdigit() and not Path(f"/proc/{parts[2]}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(name)
    return removed


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    lines: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@dataclass
class PodNetns:
    name: str
    peer: str
    ipv4: str = POD_IPV4
    ipv6: str = POD_IPV6
    servers: list[ServerProcess] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.name}"

    @property
    def pod_ips(self) -> list[str]:
        return [ip for ip in (self.ipv4, self.ipv6) if ip]

    @classmethod
    def create(cls, with_addresses: bool = True, tenancy: str = "", ipv4: bool = True) -> "PodNetns":
        """tenancy: a Kubernetes-like namespace the name starts with ("team-a.cps-pod-..."), for the daemon's
        embedded_namespace_separator = "."; ipv4=False: an IPv6-only pod (its loopback still has both)."""
        tag = f"{os.getpid()}-{next(_counter)}"
        ns = cls(name=f"{tenancy}.cps-pod-{tag}" if tenancy else f"cps-pod-{tag}", peer=f"cps-peer-{tag}",
                 ipv4=POD_IPV4 if ipv4 else "")
        _ip("netns", "add", ns.name)
        try:
            _ip("netns", "add", ns.peer)
            _ip("-n", ns.name, "link", "set", "lo", "up")
            _ip("-n", ns.peer, "link", "set", "lo", "up")
            if with_addresses:
                ns._wire_veth(tag)
        except BaseException:
            ns.destroy()
            raise
        return ns

    def _wire_veth(self, tag: str) -> None:
        # Created directly inside the pod netns, so nothing ever appears in the host's.
        _ip("-n", self.name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{tag}"[:15], "netns", self.peer)
        for ns, dev, v4, v6 in ((self.name, "eth0", self.ipv4, self.ipv6), (self.peer, f"p{tag}"[:15], PEER_IPV4, PEER_IPV6)):
            if self.ipv4:
                _ip("-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            _ip("-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            _ip("-n", ns, "link", "set", dev, "up")

    def spawn(self, argv: list[str], ready_timeout: float = READY_TIMEOUT_S) -> ServerProcess:
        """Runs argv inside the pod netns and waits for its `READY <port>` line."""
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, env=env, text=True,
        )
        server = ServerProcess(proc=proc, port=0)
        self.servers.append(server)
        deadline = time.monotonic() + ready_timeout
        while True:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, remaining))
            if not ready:
                server.stop()
                raise TimeoutError(f"{argv} printed no READY line within {ready_timeout}s")
            line = proc.stdout.readline()
            if not line:
                server.stop()
                raise RuntimeError(f"{argv} exited early: {proc.stderr.read()[-2000:]}")
            server.lines.append(line)
            if line.startswith("READY"):
                server.port = int(line.split()[1])
                return server

    def spawn_python(self, script: str, *args: str) -> ServerProcess:
        return self.spawn([sys.executable, str(REPO_ROOT / "tests" / "support" / "servers" / script), *args])

    def destroy(self) -> None:
        for server in self.servers:
            server.stop()
        for name in (self.name, self.peer):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


# A listener that accepts and drops connections until SIGTERM; argv: HOST PORT.
LISTENER = (
    "import socket, sys, threading, signal\n"
    "host, port = sys.argv[1], int(sys.argv[2])\n"
    "s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((host, port)); s.listen(128)\n"
    "def loop():\n"
    "    while True:\n"
    "        s.accept()[0].close()\n"
    "threading.Thread(target=loop, daemon=True).start()\n"
    "print('READY', s.getsockname()[1], flush=True)\n"
    "signal.sigwait({signal.SIGTERM})\n"
)


def listen(ns: "PodNetns", host: str = "0.0.0.0", port: int = 0) -> ServerProcess:
    """A TCP listener inside the netns (an IPv6 host binds IPv6 only)."""
    return ns.spawn([sys.executable, "-c", LISTENER, host, str(port)])
