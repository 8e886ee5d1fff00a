"""gRPC health probe (KEP-1665) as the kubelet 1.32 runs it, without grpcio.

The kubelet dials with grpc-go's WithBlock: it keeps connecting, with grpc's
connection backoff, until a connection is ready or the probe deadline passes;
"ready" means TCP is up and the server's HTTP/2 SETTINGS arrived. Then one
unary /grpc.health.v1.Health/Check on the same deadline. This module is the
I/O around that: sockets from probe_worker.connect, HTTP/2 framing by h2, and
every decision (statuses, texts, backoff) delegated to probe_worker.grpc_rules.
grpcio is never imported here: it would cost each worker threads and memory.

Phases: one "connect" per TCP attempt (recorded by connect()), a "handshake"
per established connection (HTTP/2 preface out, server SETTINGS in), a
"backoff" per wait between attempts, and "check" for the call itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack.exceptions
import hyperframe.exceptions

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker import grpc_rules as rules
from probe_worker.attempt import FAILURE, AttemptContext, Endpoint, Outcome
from probe_worker.connect import ConnectError, close_quietly, connect
from probe_worker.gostrings import errno_text, go_duration, join_host_port

_READ_CHUNK = 16 * 1024
# Jitter for the connection backoff; module level so tests can seed it.
jitter = random.Random()

_MALFORMED = (h2.exceptions.H2Error, hpack.exceptions.HPACKError, hyperframe.exceptions.HyperframeError)


class _Broken(Exception):
    """The connection cannot carry the call; `error` is what grpc-go would report."""

    def __init__(self, error: rules.RpcError) -> None:
        super().__init__(error.message)
        self.error = error


class _Transport:
    """One HTTP/2 client connection over a connected socket, with a read budget."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address
        host, port = sock.getsockname()[:2]
        self.local = join_host_port(host, port)
        self.received = 0
        self.backlog: list[h2.events.Event] = []  # events that arrived with the server's SETTINGS
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_inbound_headers=False
        )  # grpc_rules judges the headers itself, the way grpc-go does
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: rules.MAX_HEADER_LIST_BYTES,
            },
        )
        # Enforced from the first frame, not only once the server acknowledges.
        self.conn.decoder.max_header_list_size = rules.MAX_HEADER_LIST_BYTES

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            try:
                await asyncio.get_running_loop().sock_sendall(self.sock, data)
            except OSError as exc:
                reason = errno_text(exc.errno) if exc.errno else str(exc)
                raise _Broken(rules.connection_error(f"write tcp {self.local}->{self.address}: write: {reason}")) from None

    async def receive(self) -> list[h2.events.Event]:
        budget = rules.MAX_READ_BYTES - self.received
        if budget <= 0:
            raise _Broken(rules.RpcError(
                rules.RESOURCE_EXHAUSTED, f"probe read limit: the server sent more than {rules.MAX_READ_BYTES} bytes"
            ))
        try:
            chunk = await asyncio.get_running_loop().sock_recv(self.sock, min(_READ_CHUNK, budget))
        except OSError as exc:
            reason = errno_text(exc.errno) if exc.errno else str(exc)
            raise _Broken(rules.connection_error(rules.read_error_desc(self.local, self.address, reason))) from None
        if not chunk:
            raise _Broken(rules.connection_error("error reading from server: EOF"))
        self.received += len(chunk)
        try:
            events = self.conn.receive_data(chunk)
        except h2.exceptions.DenialOfServiceError:
            raise _Broken(rules.RpcError(rules.INTERNAL, "peer header list size exceeded limit")) from None
        except _MALFORMED as exc:
            code = int(getattr(exc, "error_code", 1))  # golang.org/x/net/http2 ConnectionError text
            raise _Broken(rules.connection_error(
                f"error reading from server: connection error: {rules.http2_error_name(code)}"
            )) from None
        await self.flush()  # SETTINGS and PING acks
        return events

    async def handshake(self) -> None:
        self.conn.initiate_connection()
        await self.flush()
        events: list[h2.events.Event] = []
        while not events:
            events = await self.receive()
        if not isinstance(events[0], (h2.events.RemoteSettingsChanged, h2.events.SettingsAcknowledged)):
            raise _Broken(rules.connection_error(
                f"initial http2 frame from server is not a settings frame: {type(events[0]).__name__}"
            ))
        self.backlog = events[1:]

    def close(self) -> None:
        """GOAWAY like grpc-go's client close, best effort and without waiting."""
        try:
            self.conn.close_connection(additional_data=b"client transport shutdown")
            self.sock.send(self.conn.data_to_send())
        except (OSError, *_MALFORMED):
            pass
        close_quietly(self.sock)


async def probe(spec: spec_pb.ProbeSpec, endpoint: Endpoint, ctx: AttemptContext) -> Outcome:
    target = join_host_port(endpoint.host, endpoint.port)
    transport, address = await _dial(endpoint, ctx)
    if transport is None:
        return Outcome(FAILURE, rules.dial_timeout_output(target, ctx.timeout_ns), address=address)
    try:
        with ctx.trace.phase("check", rules.CHECK_PATH) as phase:
            result = await _check(transport, target, spec.grpc.service, ctx)
            outcome = rules.check_outcome(result, ctx.timeout_ns)
            phase.detail = outcome.grpc_status
            if isinstance(result, rules.RpcError):
                phase.error = result.text()
    finally:
        transport.close()
    outcome.address = transport.address
    return outcome.bounded()


async def _dial(endpoint: Endpoint, ctx: AttemptContext) -> tuple[_Transport | None, str]:
    """grpc.DialContext(WithBlock): (ready transport, its address) or (None, last address) at the deadline."""
    loop = asyncio.get_running_loop()
    last_address = ""
    retries = 0
    while True:
        backoff = rules.backoff_delay(retries, jitter.random)
        window_end = loop.time() + rules.connect_window(backoff)
        attempt_ctx = dataclasses.replace(ctx, deadline=min(ctx.deadline, window_end))
        transport, address = await _connect_once(endpoint, attempt_ctx)
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


async def _connect_once(endpoint: Endpoint, ctx: AttemptContext) -> tuple[_Transport | None, str]:
    try:
        sock, address = await connect(endpoint, ctx)
    except ConnectError:
        return None, ""  # connect() recorded the phase and its error
    transport = _Transport(sock, address)
    try:
        with ctx.trace.phase("handshake", address) as phase:
            try:
                async with asyncio.timeout_at(ctx.deadline):
                    await transport.handshake()
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


async def _check(transport: _Transport, authority: str, service: str, ctx: AttemptContext) -> bytes | rules.RpcError:
    """One unary Health/Check on a ready connection, bounded by the probe deadline."""
    loop = asyncio.get_running_loop()
    conn = transport.conn
    call = rules.UnaryCall()
    stream_id = conn.get_next_available_stream_id()
    unsent: bytes | None = rules.check_request(service)
    events, transport.backlog = transport.backlog, []
    remaining_ns = max(0, int((ctx.deadline - loop.time()) * 1e9))
    try:
        conn.send_headers(stream_id, rules.request_headers(authority, ctx.user_agent, remaining_ns))
    except _MALFORMED:
        unsent = None  # a GOAWAY came with the SETTINGS: the backlog's events decide
    try:
        async with asyncio.timeout_at(ctx.deadline):
            while True:
                unsent = _send_body(conn, stream_id, unsent)
                await transport.flush()
                for event in events:
                    _dispatch(event, call, stream_id, deadline_passed=loop.time() >= ctx.deadline)
                if call.result is not None:
                    return call.result
                events = await transport.receive()
    except TimeoutError:
        call.on_error(rules.DEADLINE)
    except _Broken as exc:
        call.on_error(exc.error)
    assert call.result is not None
    return call.result


def _send_body(conn: h2.connection.H2Connection, stream_id: int, unsent: bytes | None) -> bytes | None:
    """Sends what flow control allows; returns the rest, None once END_STREAM is out."""
    if unsent is None:
        return None
    try:
        while True:
            room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            if unsent and room <= 0:
                return unsent  # wait for a WINDOW_UPDATE
            chunk, unsent = unsent[:room], unsent[room:]
            conn.send_data(stream_id, chunk, end_stream=not unsent)
            if not unsent:
                return None
    except _MALFORMED:
        return None  # the server already ended or reset the stream; its events decide


def _dispatch(event: h2.events.Event, call: rules.UnaryCall, stream_id: int, deadline_passed: bool) -> None:
    if isinstance(event, h2.events.ConnectionTerminated):
        # h2 reads nothing after a GOAWAY, so a call still open here cannot finish.
        call.on_error(rules.connection_error("the connection is draining"))
        return
    if getattr(event, "stream_id", None) != stream_id:
        return
    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
        call.on_headers(event.headers, end_stream=event.stream_ended is not None)
    elif isinstance(event, h2.events.DataReceived):
        call.on_data(event.data, end_stream=event.stream_ended is not None)
    elif isinstance(event, h2.events.StreamReset):
        call.on_reset(int(event.error_code), deadline_passed)
