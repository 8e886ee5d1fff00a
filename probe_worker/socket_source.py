"""Where a worker's probe sockets come from: the netns broker, through a small pool per sandbox and family.

A worker sits in an empty network namespace of its own, so a socket it made itself would reach nothing (and its
seccomp filter refuses to make one). Every TCP socket a probe connects is made by the broker inside the sandbox's
netns (a socket keeps the netns it was made in) and passed here over the worker's SOCK_SEQPACKET broker channel
with SCM_RIGHTS (cri_proto/probe_worker.proto: SocketRequest / SocketReply).

The broker stays off the probe's critical path: each (sandbox, family) keeps a few ready sockets, and a refill of
a batch is asked for when the pool runs low, so an attempt nearly always takes a socket that is already here.
Only a sandbox's first attempt of a family waits for one round trip to the broker.

`LocalSockets` makes the sockets in-process instead, in the caller's own netns: for code that runs the worker's
loop where it already is (the zygote's warm-up on loopback, unit tests).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import socket
import struct
from collections.abc import Awaitable, Callable

from cri_proto import probe_worker_pb2 as worker_pb

# A sandbox's probes take one socket per try (more for redirects and Happy Eyeballs races): a pool refilled by a
# batch when it falls below LOW_WATER serves a period's attempts of a few probes with no wait. Each refill wakes
# the broker (a setns there and back) and the worker, so the batch follows the sandbox's use: it doubles while the
# pool lasts less than FAST_S and halves once it lasted SLOW_S, between MIN_BATCH and MAX_BATCH. A busy sandbox
# then costs the broker a refill every few seconds, and an idle one holds few unconnected sockets.
BATCH = 8  # a sandbox's first batch
MIN_BATCH = 4
MAX_BATCH = 16  # the broker's own bound on one request
LOW_WATER = 2
FAST_S = 4.0
SLOW_S = 30.0
MAX_PACKET = 4096
REQUEST_TIMEOUT_S = 5.0  # the broker answers from memory and one setns: a bound, not a wait

_LINGER_RST = struct.pack("ii", 1, 0)

OpenSocket = Callable[[int], Awaitable[socket.socket]]


def next_batch(previous: int | None, since_previous_s: float) -> int:
    """How many sockets to ask for, given the last batch of this pool and how long ago it was asked for."""
    if previous is None:
        return BATCH
    if since_previous_s < FAST_S:
        return min(MAX_BATCH, previous * 2)
    if since_previous_s >= SLOW_S:
        return max(MIN_BATCH, previous // 2)
    return previous


class BrokerUnavailable(OSError):
    """No socket could be had: the broker refused (str() says why), did not answer, or is gone."""


def configure(sock: socket.socket) -> socket.socket:
    """The options every probe socket carries, wherever it was made (the broker sets the same)."""
    sock.setblocking(False)
    # RST on close and no TIME_WAIT: hundreds of probes per second do not pile up sockets (the kubelet's reason).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def new_local_socket(family: int) -> socket.socket:
    return configure(socket.socket(family, socket.SOCK_STREAM))


class LocalSockets:
    """Sockets made here, in this process's own netns: the warm-up and tests, never a pooled worker."""

    def opener(self, sandbox_id: str) -> OpenSocket:
        async def open_socket(family: int) -> socket.socket:
            return new_local_socket(family)

        return open_socket

    def forget(self, sandbox_id: str) -> None:
        pass

    def close(self) -> None:
        pass


class BrokerSockets:
    """The worker's side of the broker channel: pools of ready sockets per (sandbox, family)."""

    def __init__(self, sock: socket.socket, on_lost: Callable[[str], None] | None = None,
                 on_control: Callable[[socket.socket], None] | None = None) -> None:
        """on_control: a new daemon's socket, which the broker passes on after the daemon that ran this worker went
        away and a new one adopted it (SocketReply with `control`); closed when nobody takes it."""
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._replies: dict[int, asyncio.Future[list[socket.socket]]] = {}
        self._families: dict[int, int] = {}  # the family each request in flight asked for
        self._pools: dict[tuple[str, int], collections.deque[socket.socket]] = {}
        self._refills: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._batches: dict[tuple[str, int], tuple[int, float]] = {}  # the last batch asked for, and when
        self._on_lost = on_lost
        self._on_control = on_control
        self.lost: str = ""  # why the channel is gone; "" while it works
        self._loop.add_reader(sock.fileno(), self._on_readable)

    def opener(self, sandbox_id: str) -> OpenSocket:
        async def open_socket(family: int) -> socket.socket:
            return await self.take(sandbox_id, family)

        return open_socket

    async def take(self, sandbox_id: str, family: int) -> socket.socket:
        """A fresh socket in the sandbox's netns; BrokerUnavailable when none can be had."""
        key = (sandbox_id, family)
        pool = self._pools.setdefault(key, collections.deque())
        while not pool:
            await self._refill(key)
        sock = pool.popleft()
        if len(pool) < LOW_WATER and not self._refilling(key):
            # Ahead of need, so that the next attempt does not wait for the broker.
            self._start_refill(key).add_done_callback(_retrieve)
        return sock

    def forget(self, sandbox_id: str) -> None:
        """The sandbox left this worker: its ready sockets are closed."""
        for key in [k for k in self._pools if k[0] == sandbox_id]:
            self._batches.pop(key, None)
            for sock in self._pools.pop(key):
                sock.close()

    def close(self) -> None:
        self._lose("closed")
        for key in list(self._pools):
            for sock in self._pools.pop(key):
                sock.close()

    # --- internals ---------------------------------------------------------------------------------------

    def _refilling(self, key: tuple[str, int]) -> bool:
        refill = self._refills.get(key)
        return refill is not None and not refill.done()

    async def _refill(self, key: tuple[str, int]) -> None:
        # A finished refill stays in the map until its done-callback runs, which needs a turn of the loop;
        # awaiting it again would not yield, and take() would spin without ever giving the loop that turn.
        refill = self._refills[key] if self._refilling(key) else self._start_refill(key)
        await asyncio.shield(refill)

    def _start_refill(self, key: tuple[str, int]) -> asyncio.Future[None]:
        refill = asyncio.ensure_future(self._ask(key))
        self._refills[key] = refill

        def forget(done: asyncio.Future[None]) -> None:
            if self._refills.get(key) is done:
                del self._refills[key]

        refill.add_done_callback(forget)
        return refill

    async def _ask(self, key: tuple[str, int]) -> None:
        if self.lost:
            raise BrokerUnavailable(f"the netns broker is gone: {self.lost}")
        seq = next(self._seq)
        reply = self._replies[seq] = self._loop.create_future()
        self._families[seq] = key[1]
        now = self._loop.time()
        previous, asked_at = self._batches.get(key, (None, now))
        count = next_batch(previous, now - asked_at)
        self._batches[key] = (count, now)
        request = worker_pb.SocketRequest(seq=seq, sandbox_id=key[0], family=key[1], count=count)
        # A timer on the future rather than wait_for(): no task per refill.
        timer = self._loop.call_later(REQUEST_TIMEOUT_S, _expire, reply)
        try:
            self._sock.send(request.SerializeToString())
            sockets = await reply
        except BrokerUnavailable:
            raise  # the broker's own refusal (or the loss, already recorded): the channel still stands
        except (BlockingIOError, TimeoutError):
            raise BrokerUnavailable("the netns broker did not answer") from None
        except OSError as exc:
            self._lose(f"broker channel: {exc.strerror or exc}")
            raise BrokerUnavailable(f"the netns broker is gone: {self.lost}") from None
        finally:
            timer.cancel()
            self._replies.pop(seq, None)
            self._families.pop(seq, None)
        pool = self._pools.get(key)
        if pool is None:  # the sandbox was removed meanwhile
            for sock in sockets:
                sock.close()
            return
        pool.extend(sockets)

    def _on_readable(self) -> None:
        while not self.lost:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, MAX_PACKET, MAX_BATCH)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lose(f"broker channel: {exc.strerror or exc}")
                return
            if not data and not fds:
                self._lose("the broker closed its end")
                return
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError("truncated packet")
                reply = worker_pb.SocketReply.FromString(data)
            except Exception as exc:  # noqa: BLE001  a broken broker is a lost broker
                _close_fds(fds)
                self._lose(f"protocol error from the broker: {exc}")
                return
            if reply.control and not reply.seq:
                if len(fds) == 1 and self._on_control is not None:
                    self._on_control(socket.socket(fileno=fds[0]))
                else:
                    _close_fds(fds)
                continue
            waiter = self._replies.get(reply.seq)
            family = self._families.get(reply.seq)
            if waiter is None or waiter.done() or family is None:
                _close_fds(fds)
            elif reply.error:
                _close_fds(fds)
                waiter.set_exception(BrokerUnavailable(reply.error))
            else:
                waiter.set_result([_probe_socket(fd, family) for fd in fds])

    def _lose(self, reason: str) -> None:
        if self.lost:
            return
        self.lost = reason
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for waiter in self._replies.values():
            if not waiter.done():
                waiter.set_exception(BrokerUnavailable(f"the netns broker is gone: {reason}"))
        if self._on_lost is not None:
            self._on_lost(reason)


def _probe_socket(fd: int, family: int) -> socket.socket:
    """A socket object for a probe socket the broker made: family, type and protocol as the broker made it
    (asking the kernel costs three system calls a socket), SOCK_NONBLOCK as Python's view of the O_NONBLOCK the
    broker set (setblocking would cost a fourth)."""
    return socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, socket.IPPROTO_TCP, fileno=fd)


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _retrieve(future: asyncio.Future[None]) -> None:
    """A background refill's error is not lost silently: the next take() asks again and raises it."""
    if not future.cancelled():
        future.exception()


def _expire(reply: asyncio.Future[list[socket.socket]]) -> None:
    if not reply.done():
        reply.set_exception(TimeoutError())
