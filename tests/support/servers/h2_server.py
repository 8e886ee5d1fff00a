"""An HTTP/2 server for probe tests (h2's server side), with well-behaved routes and hostile ones.

    python tests/support/servers/h2_server.py --mode h2|dual|h2c [--host ::] [--port 0]

  h2    TLS, ALPN h2 only, as a server behind Envoy or a TLS gRPC server: a client that does not offer h2 is
        refused in the handshake (no_application_protocol).
  dual  TLS, ALPN h2 and http/1.1: HTTP/2 when the client offers it, else HTTP/1.1.
  h2c   cleartext HTTP/2 with prior knowledge only: anything else gets an HTTP/1.1 505 and a close, as Go's
        server does without h2c.
Prints `READY <port>` once listening, exits on SIGTERM (tests/netns_env spawns it inside a pod netns).

Routes (query parameters in brackets):
  /ok            200, body "ok"
  /echo          200, a JSON body: {"protocol": "h2"|"http/1.1", "headers": [[name, value], ...]}, the request's
                 fields as received (pseudo-headers first, in order) or its HTTP/1.1 head lines
  /status/N      status N
  /redirect      302 to TO [to=TO]
  /count         the number of requests this server got before this one
  /refuse        REFUSED_STREAM for the first N requests to this route, then 200 "ok" [n=N]
  /reset         RST_STREAM with CODE before any response [code=CODE]
  /reset-body    200 with content-length 100, 10 bytes, then RST_STREAM INTERNAL_ERROR
  /goaway        GOAWAY(LAST, CODE, "bye") and a close, without answering [last=LAST, code=CODE]
  /goaway-late   GOAWAY(1, NO_ERROR) (the stream is spared), then a close without answering it
  /cut-body      200 with content-length 100, 10 bytes, then the connection closes
  /long-body     200 with content-length 5, then 10 bytes
  /trickle       200 with content-length 100, 10 bytes, then nothing more
  /no-status     a response header block without :status
  /bad-status    :status "abc"
  /upper         a response with an upper-case header name
  /big-body      200 with 20 KiB of "x"
  /info          a 100 Continue, then 200 "ok"
  /hang          no response
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import urllib.parse

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from tests.support.servers.http_server import server_tls_context  # noqa: E402
from tests.support.servers.serving import announce_and_wait, listening_socket  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Server:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self.refused: dict[str, int] = {}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
                await self.http1(reader, writer)
                return
            if ssl_object is None:
                first = await reader.readexactly(len(PREFACE))
                if first != PREFACE:
                    writer.write(b"HTTP/1.1 505 HTTP Version Not Supported\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    return
                await self.http2(reader, writer, first)
            else:
                await self.http2(reader, writer, b"")
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()

    async def http1(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        body = b"ok"
        if urllib.parse.urlsplit(path).path == "/echo":
            body = json.dumps({"protocol": "http/1.1", "headers": [line.split(": ", 1) for line in lines[1:] if line]})
            body = body.encode()
        self.requests += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def http2(self, reader, writer, already: bytes) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None, validate_inbound_headers=False,
                                           normalize_inbound_headers=False,
                                           validate_outbound_headers=False, normalize_outbound_headers=False)
        conn = h2.connection.H2Connection(config=config)
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        data = already
        while True:
            if not data:
                data = await reader.read(65536)
                if not data:
                    return
            events = conn.receive_data(data)
            data = b""
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    if await self.respond(conn, writer, event.stream_id, event.headers) == "close":
                        writer.write(conn.data_to_send())
                        await writer.drain()
                        return
            writer.write(conn.data_to_send())
            await writer.drain()

    async def respond(self, conn, writer, stream_id: int, headers: list[tuple[bytes, bytes]]) -> str | None:
        fields = dict(headers)
        url = urllib.parse.urlsplit(fields.get(b":path", b"/").decode("latin-1"))
        query = dict(urllib.parse.parse_qsl(url.query))
        route = url.path
        count, self.requests = self.requests, self.requests + 1

        def answer(status: int | bytes, body: bytes = b"", extra=(), length: int | None = None, end=True) -> None:
            out = [(b":status", str(status).encode() if isinstance(status, int) else status),
                   (b"content-length", str(len(body) if length is None else length).encode()), *extra]
            conn.send_headers(stream_id, out)
            chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)] or [b""]  # the client's frame size
            for index, chunk in enumerate(chunks):
                conn.send_data(stream_id, chunk, end_stream=end and index == len(chunks) - 1)

        if route == "/ok":
            answer(200, b"ok")
        elif route == "/echo":
            answer(200, json.dumps({"protocol": "h2", "headers": [[n.decode("latin-1"), v.decode("latin-1")]
                                                                  for n, v in headers]}).encode())
        elif route.startswith("/status/"):
            answer(int(route.rsplit("/", 1)[1]), b"status")
        elif route == "/redirect":
            answer(302, b"", [(b"location", query.get("to", "/ok").encode())])
        elif route == "/count":
            answer(200, str(count).encode())
        elif route == "/refuse":
            refused = self.refused.get(route, 0)
            if refused < int(query.get("n", "1")):
                self.refused[route] = refused + 1
                conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                answer(200, b"ok")
        elif route == "/reset":
            conn.reset_stream(stream_id, int(query.get("code", "2")))
        elif route == "/reset-body":
            answer(200, b"x" * 10, length=100, end=False)
            writer.write(conn.data_to_send())
            await writer.drain()
            conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        elif route == "/goaway":
            conn.close_connection(int(query.get("code", "0")), b"bye", last_stream_id=int(query.get("last", "0")))
            return "close"
        elif route == "/goaway-late":
            conn.close_connection(0, b"", last_stream_id=stream_id)
            return "close"
        elif route == "/cut-body":
            answer(200, b"x" * 10, length=100, end=False)
            return "close"
        elif route == "/trickle":
            answer(200, b"x" * 10, length=100, end=False)
        elif route == "/long-body":
            answer(200, b"x" * 10, length=5)
        elif route == "/no-status":
            conn.send_headers(stream_id, [(b"content-length", b"0")], end_stream=True)
        elif route == "/bad-status":
            conn.send_headers(stream_id, [(b":status", b"abc")], end_stream=True)
        elif route == "/upper":
            conn.send_headers(stream_id, [(b":status", b"200"), (b"X-Upper", b"1")], end_stream=True)
        elif route == "/big-body":
            answer(200, b"x" * (20 << 10))
        elif route == "/info":
            conn.send_headers(stream_id, [(b":status", b"100")])
            answer(200, b"ok")
        elif route == "/hang":
            pass
        else:
            answer(404, b"not found")
        return None


async def main_async(args: argparse.Namespace) -> int:
    tls = None
    if args.mode != "h2c":
        tls = server_tls_context(("h2",) if args.mode == "h2" else ("h2", "http/1.1"))
        if tls is None:
            print("NO-TLS neither the cryptography package nor the openssl CLI is available", flush=True)
            return 3
    server = Server(args.mode)
    sock = listening_socket(args.host, args.port)
    listener = await asyncio.start_server(server.serve, sock=sock, ssl=tls)
    await announce_and_wait(sock.getsockname()[1])
    listener.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("h2", "dual", "h2c"), required=True)
    parser.add_argument("--host", default="::", help='bind address; "::" is dual stack')
    parser.add_argument("--port", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
