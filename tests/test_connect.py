"""Happy Eyeballs connect on loopback (allowed traffic), real sockets."""

import asyncio
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
