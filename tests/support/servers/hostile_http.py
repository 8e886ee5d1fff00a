"""An HTTP(S) probe target that misbehaves in one chosen way, for the hardening suite.

`python tests/support/servers/hostile_http.py --mode MODE [--host ::] [--port 0]` prints
`READY <port>` once listening and exits on SIGTERM. Every connection gets the
same treatment, whatever the request says:

  healthy              200 "ok": a control for warm-ups and neighbours
  silent               reads the request, never answers
  slowloris            a valid response, one byte per second
  slowloris-body       a valid head promising 100,000 bytes, then the body at one byte per second
  endless-body         a status line (--status, 200) and a body without length that never ends
  endless-chunked      the same with chunked framing: 1 KiB chunks forever
  huge-status-line     a 1 MiB status line (the reason phrase)
  huge-header          one 1 MiB header value
  many-headers         100,000 small headers
  garbage              random bytes that are not HTTP, forever
  banner               an SSH server's greeting line, then waits for the client (a probe on the wrong port)
  http09               an HTTP/0.9 answer: the document alone, no status line, then close
  reset-mid-head       part of a response head, then a TCP reset
  reset-mid-body       a head promising 100,000 bytes, 1,000 of them, then a TCP reset
  redirect-loop        302 to the same path, forever
  redirect-other-host  302 to http://127.0.0.1:<this port>/followed, which would answer 200 "followed"
  tls-garbage          (HTTPS probes) answers the ClientHello with random bytes, forever
  tls-garbage-record   the same after a plausible TLS handshake record header

The server never reads more than the request head, so whatever the client does
it cannot slow the server's own sending except through TCP flow control.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import socket
import struct
import sys
import termios

# Run as a script (`python tests/support/servers/X.py`, also under nsenter without PYTHONPATH): the repo root holds `tests`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from tests.support.servers.serving import announce_and_wait, listening_socket  # noqa: E402

MODES = (
    "healthy", "silent", "slowloris", "slowloris-body", "endless-body", "endless-chunked", "huge-status-line", "huge-header",
    "many-headers", "garbage", "banner", "http09", "reset-mid-head", "reset-mid-body", "redirect-loop",
    "redirect-other-host", "tls-garbage", "tls-garbage-record",
)
MIB = 1 << 20
CHUNK = 64 * 1024
TLS_MODES = ("tls-garbage", "tls-garbage-record")
# Built once: making 100,000 headers per request would make the server, not the client, the bottleneck.
HUGE_HEADS = {
    "huge-status-line": b"HTTP/1.1 200 " + b"A" * MIB + b"\r\nContent-Length: 0\r\n\r\n",
    "huge-header": b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * MIB + b"\r\nContent-Length: 0\r\n\r\n",
    "many-headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(100_000)) + b"\r\n",
}


def response(status: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} Status", *(f"{k}: {v}" for k, v in headers),
             f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Hostile:
    def __init__(self, mode: str, status: int) -> None:
        self.mode = mode
        self.status = status
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target = b""
            if self.mode in TLS_MODES:
                await reader.read(1)  # the ClientHello has started
            else:
                target = (await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)[1]
            await self.behave(target, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # shutting down: the connection just goes
        finally:
            writer.transport.abort()

    async def behave(self, target: bytes, writer: asyncio.StreamWriter) -> None:
        mode, send = self.mode, writer.write
        if mode == "healthy":
            send(response(200, b"ok"))
        elif target == b"/followed":
            send(response(200, b"followed"))
        elif mode == "silent":
            await asyncio.Event().wait()
        elif mode == "slowloris":
            for byte in response(200, b"ok"):
                send(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)  # the server's behaviour under test: 1 byte/s
        elif mode == "slowloris-body":
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while True:
                send(b"x")
                await writer.drain()
                await asyncio.sleep(1)
        elif mode == "endless-body":
            send(f"HTTP/1.1 {self.status} Status\r\nConnection: close\r\n\r\n".encode())
            await endless(writer, lambda: b"x" * CHUNK)
        elif mode == "endless-chunked":
            send(f"HTTP/1.1 {self.status} Status\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
            await endless(writer, lambda: chunk * 64)
        elif mode in HUGE_HEADS:
            send(HUGE_HEADS[mode])
        elif mode == "garbage":
            await endless(writer, lambda: os.urandom(CHUNK))
        elif mode == "banner":
            send(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
        elif mode == "http09":
            send(b"<html><body>up and running</body></html>\n")
        elif mode == "reset-mid-head":
            send(b"HTTP/1.1 200 OK\r\nContent-Le")
            await reset_after_delivery(writer)
        elif mode == "reset-mid-body":
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
            await reset_after_delivery(writer)
        elif mode == "redirect-loop":
            send(response(302, b"again", (("Location", target.decode("latin-1")),)))
        elif mode == "redirect-other-host":
            send(response(302, b"moved", (("Location", f"http://127.0.0.1:{self.port}/followed"),)))
        elif mode == "tls-garbage":
            await endless(writer, lambda: os.urandom(CHUNK), first=b"\x00")  # no TLS record starts with 0
        elif mode == "tls-garbage-record":
            # Handshake record, TLS 1.2, 16 KiB: it passes the record-header check, then is nonsense.
            await endless(writer, lambda: os.urandom(CHUNK), first=b"\x16\x03\x03\x40\x00")
        await writer.drain()
        if mode not in ("http09",):
            await asyncio.Event().wait()  # keep the connection open: the client must decide alone


async def endless(writer: asyncio.StreamWriter, chunk, first: bytes = b"") -> None:
    """Writes until the peer goes away (the caller catches the ConnectionError)."""
    writer.write(first)
    while True:
        writer.write(chunk())
        await writer.drain()


async def reset_after_delivery(writer: asyncio.StreamWriter) -> None:
    """Resets once the client's kernel has acknowledged every byte, so it reads them before the RST."""
    await writer.drain()
    sock = writer.get_extra_info("socket")
    outq = struct.pack("i", 0)
    while struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, outq))[0]:
        await asyncio.sleep(0.001)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    raise ConnectionResetError


async def main_async(args: argparse.Namespace) -> int:
    hostile = Hostile(args.mode, args.status)
    sock = listening_socket(args.host, args.port)
    hostile.port = sock.getsockname()[1]
    server = await asyncio.start_server(hostile.serve, sock=sock, limit=CHUNK)
    await announce_and_wait(hostile.port)
    server.close()
    return 0  # asyncio.run cancels the connections still open


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--status", type=int, default=200, help="status of the endless-body modes")
    parser.add_argument("--host", default="::", help='bind address; "::" is dual stack')
    parser.add_argument("--port", type=int, default=0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
