"""gRPC health probe (KEP-1665) as the kubelet 1.37 runs it, without grpcio.

The kubelet dials with grpc-go's WithBlock: it keeps connecting, with grpc's
connection backoff, until a connection is ready or the probe deadline passes;
"ready" means TCP is up and the server's HTTP/2 SETTINGS arrived. Then one
unary /grpc.health.v1.Health/Check on the same deadline. This module is the
I/O around that: sockets from probe_worker.connect, the HTTP/2 bytes from
probes/grpc/wire.py, and every decision delegated: the call's result to
probes/grpc/unary_call.py, the request, backoff and outputs to probes/grpc/rules.py.
A connection costs three writes: our preface and SETTINGS; the SETTINGS ack with
the whole request; the GOAWAY (with any ack still owed). grpcio is never imported
here: it would cost each worker threads and memory.

Phases: one "connect" per TCP attempt (recorded by connect()), a "handshake"
per established connection (HTTP/2 preface out, server SETTINGS in), a
"backoff" per wait between attempts, and "check" for the call itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import socket

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import grpc_codes as codes
from probe_api.gostrings import go_duration, join_host_port
from probe_worker.attempt import FAILURE, UNKNOWN, AttemptContext, Endpoint, Outcome
from probe_worker.connect import ConnectError, close_quietly, connect
from probe_worker.go_errors import CONTEXT_DEADLINE, net_op_error
from probe_worker.probes.grpc import rules, unary_call, wire
from probe_worker.tls_stream import GRPC_TLS, Stream, StreamError

_READ_CHUNK = 16 * 1024
# Jitter for the connection backoff; module level so tests can seed it.
jitter = random.Random()
# Distinct (target, user agent, service) a worker keeps requests for: a worker has a handful of probes.
REQUEST_CACHE_SIZE = 64


@functools.lru_cache(maxsize=REQUEST_CACHE_SIZE)
def _request(authority: str, kube_agent: str, service: str, tls: bool) -> wire.Request:
    """Keyed by content, like the prober's plans: building the header block costs as much as a TCP probe."""
    return wire.Request.build(authority, kube_agent, service, tls)


class _Broken(Exception):
    """The connection attempt failed before the server was ready; `error` is what grpc-go would report."""

    def __init__(self, error: unary_call.RpcError) -> None:
        super().__init__(error.message)
        self.error = error


class _Transport:
    """One HTTP/2 client connection carrying one call over a connected socket, with a read budget.

    Until the server is ready, failures raise _Broken (the dial retries); afterwards
    they are the call's error, as in grpc-go once its transport is up.
    """

    def __init__(self, sock: socket.socket, address: str, request: wire.Request, tls: Stream | None = None) -> None:
        """tls: the connection's TLS (grpc.mode TLS), handshaken already; None for plaintext."""
        self.sock = sock
        self.tls = tls
        self.address = address
        host, port = sock.getsockname()[:2]
        self.local = join_host_port(host, port)
        self.received = 0
        self.conn = wire.Connection(request)

    @property
    def call(self) -> unary_call.UnaryCall:
        return self.conn.call

    async def send(self, data: bytes) -> None:
        if self.tls is not None:
            try:
                await self.tls.send(data)
            except StreamError as exc:
                self._fail(unary_call.connection_error(str(exc)))
            return
        try:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)
        except OSError as exc:
            self._fail(unary_call.connection_error(net_op_error("write", self.local, self.address, exc)))

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.send(data)

    async def receive(self, deadline: float) -> None:
        """Reads once and feeds the connection."""
        loop = asyncio.get_running_loop()
        budget = rules.MAX_READ_BYTES - self.received
        if budget <= 0:
            return self._fail(unary_call.RpcError(
                codes.RESOURCE_EXHAUSTED, f"probe read limit: the server sent more than {rules.MAX_READ_BYTES} bytes"
            ))
        try:
            if self.tls is not None:
                chunk = await self.tls.recv(min(_READ_CHUNK, budget))
            else:
                chunk = await loop.sock_recv(self.sock, min(_READ_CHUNK, budget))
        except StreamError as exc:
            return self._fail(unary_call.connection_error(str(exc)))
        except OSError as exc:
            read_error = net_op_error("read", self.local, self.address, exc)
            return self._fail(unary_call.connection_error(f"error reading from server: {read_error}"))
        if not chunk:
            return self._fail(unary_call.connection_error("error reading from server: EOF"))
        self.received += len(chunk)
        try:
            self.conn.receive(chunk, remaining_ns=int((deadline - loop.time()) * 1e9))
        except wire.ConnectionFailed as exc:
            self._fail(exc.error)

    def _fail(self, error: unary_call.RpcError) -> None:
        """Before the server is ready the connection attempt failed; afterwards the call did."""
        if not self.conn.ready:
            raise _Broken(error)
        self.call.on_error(error)

    def close(self) -> None:
        """What is still owed, then a GOAWAY like grpc-go's client close; best effort, without waiting."""
        if self.tls is not None:
            self.tls.send_nowait(self.conn.data_to_send() + wire.GOAWAY)
            self.tls.close()
            return
        try:
            self.sock.send(self.conn.data_to_send() + wire.GOAWAY)
        except OSError:
            pass
        close_quietly(self.sock)


# core/v1 LifecycleHandler has exec, httpGet, tcpSocket and sleep: nothing the kubelet could run as a gRPC hook.
NO_HOOK = "a lifecycle hook has no gRPC handler: it is http_get or tcp_socket"


async def probe(spec: spec_pb.ProbeSpec, endpoint: Endpoint, ctx: AttemptContext) -> Outcome:
    if ctx.lifecycle_hook:  # the worker rejects such a RunOnce; never dial for one that got this far
        return Outcome(UNKNOWN, NO_HOOK)
    target = join_host_port(endpoint.host, endpoint.port)
    tls = spec.grpc.mode == spec_pb.TLS
    request = _request(target, ctx.user_agent, spec.grpc.service, tls)
    transport, address = await _dial(endpoint, request, ctx, tls)
    if transport is None:
        return Outcome(FAILURE, rules.dial_timeout_output(target, ctx.timeout_ns), address=address)
    try:
        with ctx.trace.phase("check", rules.CHECK_PATH) as phase:
            result = await _check(transport, ctx)
            outcome = rules.check_outcome(result, ctx.timeout_ns)
            phase.detail = outcome.grpc_status
            if isinstance(result, unary_call.RpcError):
                phase.error = result.text()
    finally:
        transport.close()
    outcome.address = transport.address
    return outcome.bounded()


async def _dial(endpoint: Endpoint, request: wire.Request, ctx: AttemptContext,
                tls: bool = False) -> tuple[_Transport | None, str]:
    """grpc.DialContext(WithBlock): (ready transport, its address) or (None, last address) at the deadline."""
    loop = asyncio.get_running_loop()
    last_address = ""
    retries = 0
    while True:
        backoff = rules.backoff_delay(retries, jitter.random)
        window_end = loop.time() + rules.connect_window(backoff)
        # The window (20 s at least) nearly always outlasts the probe: no copy of the context then.
        attempt_ctx = ctx if window_end >= ctx.deadline else dataclasses.replace(ctx, deadline=window_end)
        transport, address = await _connect_once(endpoint, request, attempt_ctx, tls)
        if transport is not None:
            return transport, address
        last_address = address or last_address
        remaining = ctx.deadline - loop.time()
        if remaining <= 0:
            return None, last_address
        # The backoff timer starts when the attempt failed (addrConn.resetTransport).
        with ctx.trace.phase("backoff", go_duration(int(backoff * 1e9))):
            await asyncio.sleep(min(backoff, remaining))
        if loop.time() >= ctx.deadline:
            return None, last_address
        retries += 1


async def _connect_once(endpoint: Endpoint, request: wire.Request, ctx: AttemptContext,
                        tls: bool = False) -> tuple[_Transport | None, str]:
    try:
        sock, address = await connect(endpoint, ctx)
    except ConnectError:
        return None, ""  # connect() recorded the phase and its error
    stream = None
    if tls:
        stream = await _handshake(sock, address, ctx)
        if stream is None:
            return None, address  # like any transport that could not be made: the dial retries
    transport = _Transport(sock, address, request, stream)
    try:
        with ctx.trace.phase("handshake", address) as phase:
            try:
                async with ctx.timeout():
                    await transport.send(wire.OPENING)
                    while not transport.conn.ready:
                        await transport.receive(ctx.deadline)
                return transport, address
            except TimeoutError:
                phase.error = "timed out waiting for server handshake"
            except _Broken as exc:
                phase.error = exc.error.message
    except BaseException:
        transport.close()
        raise
    transport.close()
    return None, address


async def _handshake(sock: socket.socket, address: str, ctx: AttemptContext) -> Stream | None:
    """grpc.mode TLS: the TLS handshake (no verification, ALPN h2, no SNI for the pod IP, as Go sends none for an
    IP address); None, with the phase's error, when it fails or the server selected no ALPN protocol."""
    stream = Stream(sock, address)
    with ctx.trace.phase("tls", address) as phase:
        try:
            async with ctx.timeout():
                phase.detail = await stream.start_tls(GRPC_TLS, None)
            if stream.alpn != "h2":
                phase.error = rules.MISSING_ALPN
        except TimeoutError:
            phase.error = CONTEXT_DEADLINE
        except StreamError as exc:
            phase.error = str(exc)
    if phase.error:
        stream.close()
        return None
    return stream


async def _check(transport: _Transport, ctx: AttemptContext) -> bytes | unary_call.RpcError:
    """The unary Health/Check on a ready connection (its HEADERS are queued), bounded by the probe deadline.

    Whatever the connection owes the server goes out before each wait: the server
    may need a SETTINGS ack or a WINDOW_UPDATE-released DATA frame before it answers.
    """
    call = transport.call
    try:
        async with ctx.timeout():
            while call.result is None:
                await transport.flush()
                if call.result is None:  # the write did not fail
                    await transport.receive(ctx.deadline)
            return call.result  # acks still owed go out with the GOAWAY, in one write
    except TimeoutError:
        call.on_error(unary_call.DEADLINE)
    assert call.result is not None
    return call.result
