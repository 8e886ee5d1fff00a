"""Happy Eyeballs connect on loopback (allowed traffic), real sockets."""

import asyncio
import select
import socket

import pytest

from probe_worker.attempt import AttemptContext, Endpoint
from probe_worker.connect import ConnectError, connect


def _listener(family, host):
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(64)
    return sock


def _free_port(family, host):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def _connect(endpoint, timeout=2.0):
    ctx = AttemptContext(deadline=asyncio.get_running_loop().time() + timeout, timeout_ns=int(timeout * 1e9), user_agent="t")
    sock, address = await connect(endpoint, ctx)
    sock.close()
    return address, ctx.trace.to_proto()


def test_falls_back_to_the_second_family_when_the_first_refuses():
    server = _listener(socket.AF_INET, "127.0.0.1")
    port = server.getsockname()[1]
    try:
        address, phases = asyncio.run(_connect(Endpoint("::1", ("::1", "127.0.0.1"), port)))
    finally:
        server.close()
    assert address == f"127.0.0.1:{port}"
    assert phases[0].name == "connect" and phases[0].detail == address


def test_all_refused_reports_the_first_address_like_go():
    port = _free_port(socket.AF_INET, "127.0.0.1")
    with pytest.raises(ConnectError) as err:
        asyncio.run(_connect(Endpoint("127.0.0.1", ("127.0.0.1", "::1"), port)))
    assert str(err.value) == f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    assert not err.value.timed_out


def test_linger_zero_leaves_no_time_wait():
    server = _listener(socket.AF_INET, "127.0.0.1")
    port = server.getsockname()[1]

    async def many():
        for _ in range(20):
            await _connect(Endpoint("127.0.0.1", ("127.0.0.1",), port))

    try:
        asyncio.run(many())
        accepted = [server.accept()[0] for _ in range(20)]
        for conn in accepted:
            conn.close()
    finally:
        server.close()
    with open("/proc/net/tcp") as f:
        # state 06 is TIME_WAIT; local or remote port in hex
        rows = [line.split() for line in f.readlines()[1:]]
    hexport = f"{port:04X}"
    time_wait = [r for r in rows if r[3] == "06" and (r[1].endswith(hexport) or r[2].endswith(hexport))]
    assert time_wait == []


def _fill_backlog(server):
    """Connections the listener queues but never accepts, until the kernel drops further SYNs."""
    fillers = []
    while len(fillers) < 16:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(server.getsockname())
        _, writable, _ = select.select([], [sock], [], 0.2)
        if not writable:
            sock.close()
            return fillers
        fillers.append(sock)
    raise AssertionError("the listen backlog never filled up")


def test_a_handshake_still_in_progress_after_connect_returns_is_waited_for():
    # Usually the handshake is over when connect() returns (a zero-timeout poll sees it);
    # here the SYN is dropped, so the connect must wait, and succeed on the SYN's retry
    # (1 s later) once the queue has room again.
    server = _listener(socket.AF_INET, "127.0.0.1")
    server.listen(0)
    port = server.getsockname()[1]
    fillers = _fill_backlog(server)

    async def go():
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.create_task(_connect(Endpoint("127.0.0.1", ("127.0.0.1",), port), timeout=5))
        await asyncio.sleep(0)          # the connect ran up to its wait: its SYN was dropped
        assert not task.done()
        server.accept()[0].close()      # room in the queue for the retried SYN
        address, _ = await task
        return address, loop.time() - started

    try:
        address, took = asyncio.run(go())
    finally:
        for sock in fillers:
            sock.close()
        server.close()
    assert address == f"127.0.0.1:{port}"
    assert took >= 0.5  # it waited for the SYN retry, it did not give up or fake a connection
