"""Start-up shared by the asyncio test servers: the listening socket and the `READY <port>` handshake.

The scripts run as `python tests/support/servers/X.py` with PYTHONPATH at the repo root (tests/netns_env.PodNetns.spawn
sets it), so they import this module as `tests.support.servers.serving`, as in-process callers do.
"""

from __future__ import annotations

import asyncio
import signal
import socket


def listening_socket(host: str, port: int) -> socket.socket:
    """Binds host ("::" means dual stack: IPv4 and IPv6 on one port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host == "::" else 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def announce_and_wait(port: int) -> None:
    """Prints `READY <port>` (the line the spawner waits for), then returns on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(f"READY {port}", flush=True)
    await stop.wait()
