"""The TCP socket probe executor, in-process on loopback (through a real worker in a pod netns:
tests/system/test_tcp_probe_in_pod.py)."""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
from pathlib import Path

from probe_worker.attempt import FAILURE, SUCCESS, AttemptContext, Endpoint
from probe_worker.probes import tcp as tcp_probe
from tests.support.tcp_probe_specs import tcp_spec

SERVERS = Path(__file__).resolve().parents[1] / "support" / "servers"


def probe_once(endpoint: Endpoint, timeout: float = 1.0):
    async def go():
        loop = asyncio.get_running_loop()
        ctx = AttemptContext(deadline=loop.time() + timeout, timeout_ns=int(timeout * 1e9), user_agent="kube-probe/1.37")
        started = loop.time()
        outcome = await tcp_probe.probe(tcp_spec(endpoint.port), endpoint, ctx)
        return outcome, loop.time() - started

    return asyncio.run(go())


def listener(family: int, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, 0))
    sock.listen(16)
    return sock


def test_open_port_succeeds_and_closes_without_sending():
    server = listener(socket.AF_INET, "127.0.0.1")
    port = server.getsockname()[1]
    try:
        outcome, _ = probe_once(Endpoint("127.0.0.1", ("127.0.0.1",), port))
        conn, _ = server.accept()
        conn.settimeout(5)
        try:
            # The probe closed at once with nothing sent: EOF or RST, never data.
            data = conn.recv(1)
        except ConnectionResetError:
            data = b""
        conn.close()
    finally:
        server.close()
    assert (outcome.result, outcome.output, outcome.address) == (SUCCESS, "", f"127.0.0.1:{port}")
    assert data == b""


def test_refused_port_is_the_go_dial_error():
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))  # bound, never listening: refuses
    port = blocker.getsockname()[1]
    try:
        outcome, _ = probe_once(Endpoint("127.0.0.1", ("127.0.0.1",), port))
    finally:
        blocker.close()
    assert (outcome.result, outcome.output, outcome.address) == (
        FAILURE, f"dial tcp 127.0.0.1:{port}: connect: connection refused", ""
    )


def test_dropped_syn_is_an_io_timeout_within_the_probe_timeout():
    server = subprocess.Popen(
        [sys.executable, str(SERVERS / "tcp_server.py"), "--host", "127.0.0.1", "--mode", "full-backlog"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        ready, _, _ = select.select([server.stdout], [], [], 15)
        line = server.stdout.readline() if ready else ""
        assert line.startswith("READY"), line
        port = int(line.split()[1])
        outcome, elapsed = probe_once(Endpoint("127.0.0.1", ("127.0.0.1",), port), timeout=0.5)
    finally:
        server.terminate()
        server.wait(timeout=5)
    assert (outcome.result, outcome.output) == (FAILURE, f"dial tcp 127.0.0.1:{port}: i/o timeout")
    assert 0.4 < elapsed < 1.5


def test_any_family_reaches_an_ipv6_only_listener():
    server = listener(socket.AF_INET6, "::1")
    port = server.getsockname()[1]
    try:
        # ANY: the primary (IPv4) first, IPv6 raced after it is refused.
        outcome, _ = probe_once(Endpoint("127.0.0.1", ("127.0.0.1", "::1"), port))
    finally:
        server.close()
    assert (outcome.result, outcome.address) == (SUCCESS, f"[::1]:{port}")


def test_ipv6_refused_brackets_the_address():
    blocker = socket.socket(socket.AF_INET6)
    blocker.bind(("::1", 0))
    port = blocker.getsockname()[1]
    try:
        outcome, _ = probe_once(Endpoint("::1", ("::1",), port))
    finally:
        blocker.close()
    assert outcome.output == f"dial tcp [::1]:{port}: connect: connection refused"
