"""shim/http1_server.py against hostile clients, on loopback: each bound is shown by the server's own answer (a 4xx,
an EOF, a cut), with bounds small enough that no test waits long."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket

import pytest

from shim import http1_server
from shim.http1_server import Bounds, Http1Server, Request, Response

BOUNDS = Bounds(max_connections=4, max_head_bytes=1024, max_body_bytes=4096, request_timeout_s=5.0,
                write_timeout_s=5.0, idle_timeout_s=5.0, keep_alive=True, timeout_status=408, stop_grace_s=5.0)


async def echo(request: Request) -> Response:
    return Response(200, [("content-type", "text/plain")], b"%s %s %d\n" % (
        request.method.encode(), request.target.encode(), len(request.body)))


class Refusals(list):
    """The refusals a server reported, in order; seen() awaits one."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def append(self, reason: str) -> None:
        super().append(reason)
        self._changed.set()

    async def seen(self, reason: str) -> None:
        async with asyncio.timeout(10):
            while reason not in self:
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def running(handler=echo, **bounds):
    """A server on 127.0.0.1 with BOUNDS changed by `bounds`; yields it and the refusals it reported."""
    refused = Refusals()
    server = Http1Server(handler, dataclasses.replace(BOUNDS, **bounds), on_refused=refused.append)
    await server.start("127.0.0.1", 0)
    try:
        yield server, refused
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)


async def connect(server: Http1Server, **sockopts) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    for option, value in sockopts.items():
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, option), value)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.addresses[0][1]))
    return await asyncio.open_connection(sock=sock)


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """One response (Content-Length framed): status, headers, body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), 10)
    return int(status.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What is left before the server's EOF (a reset counts as EOF: the server left bytes unread)."""
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


async def until(condition) -> None:
    """Until the server's own state shows it (it has no event for these): at most 10 s."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def post(length: int, *, path: str = "/", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (path.encode(), length, extra)


def test_a_request_within_the_bounds_is_answered_and_its_connection_kept():
    async def main():
        async with running() as (server, refused):
            reader, writer = await connect(server)
            writer.write(post(4096) + b"x" * 4096)
            assert await answer(reader) == (200, {b"content-type": b"text/plain", b"content-length": b"12"},
                                            b"POST / 4096\n")
            # Kept alive, and two pipelined requests in one write are answered in order.
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(reader))[2] == b"GET /a 0\n" and (await answer(reader))[2] == b"GET /b 0\n"
            writer.close()
            assert refused == []
    asyncio.run(main())


@pytest.mark.parametrize("in_pieces", [False, True])
def test_a_head_over_the_bound_is_answered_431_and_closed(in_pieces):
    async def main():
        async with running() as (server, refused):
            reader, writer = await connect(server)
            head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 2048 + b"\r\n\r\n"
            for piece in ([head[i:i + 100] for i in range(0, len(head), 100)] if in_pieces else [head]):
                writer.write(piece)
                await writer.drain()
            status, headers, body = await answer(reader)
            assert status == 431 and headers[b"connection"] == b"close" and b"larger than 1024" in body
            assert await closed(reader) == b"" and refused == [http1_server.BAD_REQUEST]
    asyncio.run(main())


def test_not_http_is_answered_400():
    async def main():
        async with running() as (server, refused):
            reader, writer = await connect(server)
            writer.write(b"this is not http\r\n\r\n")
            assert (await answer(reader))[0] == 400 and await closed(reader) == b""
            assert refused == [http1_server.BAD_REQUEST]
    asyncio.run(main())


def test_a_content_length_over_the_bound_is_answered_413_from_the_head_alone():
    called = []

    async def handler(request):
        called.append(request)
        return Response(200)

    async def main():
        async with running(handler) as (server, refused):
            reader, writer = await connect(server)
            writer.write(post(10 * 1024 * 1024))  # not a byte of the body
            status, headers, body = await answer(reader)
            assert status == 413 and headers[b"connection"] == b"close" and b"larger than 4096" in body
            assert await closed(reader) == b""
            assert refused == [http1_server.BODY_TOO_LARGE] and called == []
    asyncio.run(main())


def test_a_body_sent_past_the_bound_is_cut_with_413():
    """Content-Length within the bound on a chunked body the server cannot size: it reads to the bound, then
    answers 413, and the client still sending sees that answer (the close drains what it sent meanwhile)."""
    async def main():
        async with running() as (server, refused):
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"x" * 1000
            for _ in range(8):
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            status, _, body = await answer(reader)
            assert status == 413 and b"larger than 4096" in body
            assert await closed(reader) == b"" and refused == [http1_server.BODY_TOO_LARGE]
    asyncio.run(main())


def test_a_request_not_read_in_time_is_answered_408_however_it_drips():
    """The request timeout runs from the first byte: a client that keeps sending, a byte at a time, is answered
    408 before it has sent its request."""
    async def main():
        async with running(request_timeout_s=0.5) as (server, refused):
            reader, writer = await connect(server)
            request = post(100) + b"x" * 100
            reading = asyncio.ensure_future(answer(reader))
            sent = 0
            while not reading.done() and sent < len(request):
                writer.write(request[sent:sent + 1])
                sent += 1
                await asyncio.wait([reading], timeout=0.02)  # the client's pace, a byte every 20 ms at most
            status, headers, _ = await reading
            assert status == 408 and headers[b"connection"] == b"close" and sent < len(request)
            assert await closed(reader) == b"" and refused == [http1_server.REQUEST_TIMEOUT]
    asyncio.run(main())


def test_a_request_not_read_in_time_is_cut_unanswered_without_a_timeout_status():
    async def main():
        async with running(request_timeout_s=0.3, timeout_status=None, idle_timeout_s=None,
                           keep_alive=False) as (server, refused):
            reader, writer = await connect(server)
            writer.write(b"G")  # then nothing
            assert await closed(reader) == b"" and refused == [http1_server.REQUEST_TIMEOUT]
            # Without an idle timeout the request timeout runs from the connection's start: silence is cut too.
            reader, writer = await connect(server)
            assert await closed(reader) == b""
    asyncio.run(main())


def test_a_kept_alive_connection_idle_past_the_idle_timeout_is_closed():
    async def main():
        async with running(idle_timeout_s=0.3) as (server, refused):
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(reader))[0] == 200
            assert await closed(reader) == b""  # no next request: closed, unanswered
            assert refused == []  # the end of keep-alive, not a refusal
            await until(lambda: server.connections == 0)
    asyncio.run(main())


@pytest.mark.parametrize("half", [b"GET / HT", post(100) + b"x" * 50])
def test_a_half_request_then_eof_ends_the_connection_unanswered(half):
    async def main():
        async with running() as (server, refused):
            reader, writer = await connect(server)
            writer.write(half)
            writer.write_eof()
            assert await closed(reader) == b"" and refused == []
            await until(lambda: server.connections == 0)
    asyncio.run(main())


def test_connections_over_the_cap_are_closed_at_once_and_a_freed_place_is_served():
    async def main():
        async with running(max_connections=2) as (server, refused):
            held = [await connect(server) for _ in range(2)]
            for _, writer in held:
                writer.write(b"GET / HT")  # half a head, then silence (the timeouts are far away)
            await until(lambda: server.connections == 2)
            extra_reader, _ = await connect(server)
            assert await closed(extra_reader) == b"" and refused == [http1_server.TOO_MANY_CONNECTIONS]
            held[0][1].close()
            await until(lambda: server.connections == 1)
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(reader))[0] == 200
            held[1][1].close()  # or the stop would give its request in flight the grace
    asyncio.run(main())


def test_a_flood_of_connections_holds_no_more_than_the_cap():
    most = []
    server = None

    async def handler(request):
        most.append(server.connections)
        return await echo(request)

    async def one(server):
        try:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return (await answer(reader))[0]
        except (ConnectionError, asyncio.IncompleteReadError):
            return None  # closed at once, over the cap

    async def main():
        nonlocal server
        async with running(handler, max_connections=4) as (server, refused):
            results = await asyncio.gather(*(one(server) for _ in range(64)))
            assert set(results) <= {200, None} and 200 in results
            assert max(most) <= 4 and refused.count(http1_server.TOO_MANY_CONNECTIONS) == results.count(None)
            await until(lambda: server.connections == 0)
            assert await one(server) == 200  # still serving
    asyncio.run(main())


def test_a_client_that_never_reads_its_answer_is_cut_at_the_write_timeout():
    """The answer's unsent bytes are dropped with the connection: held for a client that never reads, they
    would keep the socket and the memory for ever."""
    big = b"x" * (32 * 1024 * 1024)

    async def handler(request):
        return Response(200, [], big)

    async def main():
        async with running(handler, write_timeout_s=0.3) as (server, refused):
            reader, writer = await connect(server, SO_RCVBUF=4096)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await refused.seen(http1_server.WRITE_TIMEOUT)
            assert refused == [http1_server.WRITE_TIMEOUT]
            await until(lambda: server.connections == 0)
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
                    received += len(chunk)
            assert received < len(big)  # cut, not delivered late
    asyncio.run(main())


def test_a_body_never_read_is_answered_from_the_head_and_drained_at_the_close():
    """max_body_bytes=None: the body is not read; the answer says close, and the close drains what the client
    sends meanwhile (up to linger_bytes) so that its answer is not destroyed by a reset."""
    async def main():
        async with running(max_body_bytes=None, idle_timeout_s=None, keep_alive=False) as (server, refused):
            reader, writer = await connect(server)
            writer.write(post(200_000) + b"x" * 200_000)
            status, headers, body = await answer(reader)
            assert (status, body, headers[b"connection"]) == (200, b"POST / 0\n", b"close")
            assert await closed(reader) == b""
    asyncio.run(main())


def test_close_ends_idle_connections_at_once_and_lets_a_request_in_flight_finish():
    async def main():
        go = asyncio.Event()
        started = asyncio.Event()

        async def handler(request):
            if request.path == "/slow":
                started.set()
                await go.wait()
            return await echo(request)

        async with running(handler) as (server, _):
            port = server.addresses[0][1]
            idle_reader, idle_writer = await connect(server)
            idle_writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await answer(idle_reader))[0] == 200
            busy_reader, busy_writer = await connect(server)
            busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await started.wait()
            server.close()
            assert await closed(idle_reader) == b""
            stopped = asyncio.ensure_future(server.wait_closed())
            go.set()
            status, headers, _ = await answer(busy_reader)
            assert status == 200 and headers[b"connection"] == b"close"
            await asyncio.wait_for(stopped, 10)
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", port)  # no longer listening
    asyncio.run(main())


def test_close_cancels_a_request_in_flight_past_the_grace():
    async def main():
        started = asyncio.Event()

        async def handler(request):
            started.set()
            await asyncio.Event().wait()  # never answers

        async with running(handler, stop_grace_s=0.2) as (server, _):
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await started.wait()
            server.close()
            await asyncio.wait_for(server.wait_closed(), 10)
            assert await closed(reader) == b"" and server.connections == 0
    asyncio.run(main())


def test_a_handler_that_fails_is_answered_500():
    async def handler(request):
        raise RuntimeError("a bug")

    async def main():
        async with running(handler) as (server, _):
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await answer(reader)
            assert status == 500 and headers[b"connection"] == b"close"
    asyncio.run(main())
