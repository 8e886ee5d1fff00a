"""TCP connection set-up shared by every probe kind.

Races the candidate addresses Happy-Eyeballs style (RFC 8305): the first starts at
once, each next one after `happy_eyeballs_delay` or as soon as the previous one
fails; the first established connection wins and the others are closed. Sockets
come from the attempt's socket source (probe_worker.socket_source: the netns broker
in a worker), with SO_LINGER {on, 0}: closing sends RST and leaves no TIME_WAIT, so
hundreds of probes per second against one pod do not pile up sockets (the kubelet
sets SO_LINGER for the same reason), and close() never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import select
import socket

from probe_api.gostrings import join_host_port
from probe_worker.attempt import AttemptContext, Endpoint
from probe_worker.go_errors import dial_error, lookup_error
from probe_worker.socket_source import OpenSocket, new_local_socket


class ConnectError(Exception):
    """Connection failed; str() is the Go dial error the kubelet would print."""

    def __init__(self, text: str, timed_out: bool = False) -> None:
        super().__init__(text)
        self.timed_out = timed_out


async def _local_socket(family: int) -> socket.socket:
    return new_local_socket(family)


def close_quietly(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


async def connect(endpoint: Endpoint, ctx: AttemptContext) -> tuple[socket.socket, str]:
    """Returns a connected non-blocking socket and the "ip:port" it reached.

    Raises ConnectError with kubelet-style text; never outlives ctx.deadline.
    """
    addresses = list(endpoint.addresses)
    if not addresses:
        addresses = await _resolve(endpoint, ctx)
    label = join_host_port(addresses[0], endpoint.port)
    with ctx.trace.phase("connect", label) as phase:
        try:
            async with ctx.timeout():
                sock, address = await _race(addresses, endpoint.port, ctx.happy_eyeballs_delay,
                                            ctx.open_socket or _local_socket)
        except TimeoutError:
            phase.error = "i/o timeout"
            raise ConnectError(dial_error(label, None, timed_out=True), timed_out=True) from None
        except OSError as exc:
            phase.error = dial_error(getattr(exc, "address", label), exc)
            raise ConnectError(phase.error) from None
        phase.detail = address
    return sock, address


async def _resolve(endpoint: Endpoint, ctx: AttemptContext) -> list[str]:
    with ctx.trace.phase("resolve", endpoint.host) as phase:
        try:
            # In the loop, not in an executor: a worker starts no thread, and it has no network of its own (an
            # empty netns, inet sockets refused), so a lookup reads the node's /etc/hosts and answers at once;
            # a name that would need DNS fails at once too.
            infos = socket.getaddrinfo(endpoint.host, endpoint.port, family=endpoint.family_filter,
                                       type=socket.SOCK_STREAM)
        except OSError as exc:
            phase.error = str(exc)
            raise ConnectError(lookup_error(endpoint.host, str(exc.strerror or exc))) from None
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        if sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    return _interleave(addresses)


def _interleave(addresses: list[str]) -> list[str]:
    """RFC 8305 section 4: alternate families, keeping the resolver's first choice first."""
    if not addresses:
        return addresses
    first_v6 = ":" in addresses[0]
    same = [a for a in addresses if (":" in a) == first_v6]
    other = [a for a in addresses if (":" in a) != first_v6]
    out: list[str] = []
    for i in range(max(len(same), len(other))):
        out.extend(x[i] for x in (same, other) if i < len(x))
    return out


async def _connect_one(address: str, port: int, open_socket: OpenSocket) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        sock = await open_socket(family)
    except OSError as exc:  # no socket to be had (the broker's reason): this address fails like a dial
        exc.address = join_host_port(address, port)  # type: ignore[attr-defined]
        raise
    try:
        await _sock_connect(sock, (address, port))
    except BaseException as exc:
        close_quietly(sock)
        if isinstance(exc, OSError):
            exc.address = join_host_port(address, port)  # type: ignore[attr-defined]
        raise
    return sock


async def _sock_connect(sock: socket.socket, address: tuple[str, int]) -> None:
    """loop.sock_connect, but without waiting when there is nothing to wait for.

    Inside a pod netns the peer is across a veth pair, and the kernel usually completes
    the whole handshake (or gets the refusal) within connect() itself, which still says
    EINPROGRESS. A zero-timeout poll finds that out, and spares the event loop turn and
    the writer registration asyncio would spend on it: a third of a TCP probe's cost.
    """
    try:
        sock.connect(address)
        return
    except (BlockingIOError, InterruptedError):
        pass
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    if poller.poll(0):
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:  # what asyncio raises for a failed connect
            raise OSError(error, f"Connect call failed {address}")
        return
    # Still in progress: asyncio waits for it (connect() again says EALREADY).
    await asyncio.get_running_loop().sock_connect(sock, address)


async def _race(addresses: list[str], port: int, delay: float,
                open_socket: OpenSocket) -> tuple[socket.socket, str]:
    if len(addresses) == 1:
        return await _connect_one(addresses[0], port, open_socket), join_host_port(addresses[0], port)

    pending: dict[asyncio.Task[socket.socket], str] = {}
    first_error: OSError | None = None
    winner: tuple[socket.socket, str] | None = None
    queue = list(addresses)
    try:
        while winner is None and (queue or pending):
            if queue:
                address = queue.pop(0)
                pending[asyncio.create_task(_connect_one(address, port, open_socket))] = address
            # Wait for a result, but no longer than the attempt delay if more addresses remain.
            done, _ = await asyncio.wait(
                pending, timeout=delay if queue else None, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                address = pending.pop(task)
                exc = task.exception()
                if exc is None:
                    if winner is None:
                        winner = (task.result(), join_host_port(address, port))
                    else:
                        close_quietly(task.result())
                elif first_error is None and isinstance(exc, OSError):
                    first_error = exc
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            try:
                close_quietly(await task)
            except BaseException:
                pass
    if winner is None:
        raise first_error or OSError("no address to connect to")
    return winner
