"""A configurable HTTP/1.1 server for probe tests: well-behaved routes and hostile ones.

Runs in-process (`HTTPTestServer`, on the caller's event loop) or as a script
inside a test netns: `python tests/support/servers/http_server.py --host :: --port 0 [--tls | --tls-files CERT KEY]`
prints `READY <port>` once listening and exits on SIGTERM.

Routes (query parameters in brackets):
  /ok                  200, body "ok" [body=TEXT]
  /echo                200, body = the request head exactly as received (request line + headers)
  /status/N            status N, body "status N"
  /body                200 with SIZE bytes of "x" [size=SIZE, chunked=1]
  /redirect            CODE (302) with Location: TO [to=TO, code=CODE]; no `to` means no Location
  /loop                302 to /loop, forever
  /hang                reads the request, never answers
  /slow-body           headers promise 100 bytes, sends 10, then hangs
  /close               closes without a response
  /reset               closes with a TCP reset
  /garbage             answers with bytes that are not HTTP
  /status-line         answers with the status line LINE (URL-quoted) [line=LINE]
  /info                N (1) "100 Continue" responses, then 200 [n=N]
  /big-head            a response head larger than 64 KiB
Anything not starting with an HTTP method (a TLS ClientHello, say) gets a 400, as Go's server does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import urllib.parse

# Run as a script (`python tests/support/servers/X.py`, also under nsenter without PYTHONPATH): the repo root holds `tests`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from tests.support.servers.serving import announce_and_wait, listening_socket  # noqa: E402

HEAD_LIMIT = 64 * 1024
REASONS = {100: "Continue", 200: "OK", 301: "Moved Permanently", 302: "Found", 303: "See Other",
           307: "Temporary Redirect", 308: "Permanent Redirect", 400: "Bad Request", 404: "Not Found",
           500: "Internal Server Error", 503: "Service Unavailable"}


def _response(status: int, body: bytes = b"", headers: list[tuple[str, str]] = (), length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _chunked(body: bytes, size: int = 1000) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def make_self_signed(directory: str) -> tuple[str, str] | None:
    """A throwaway certificate: `cryptography` if installed, else the openssl CLI, else None."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        try:
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=probe-test"],
                check=True, capture_output=True,
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1)).sign(private, hashes.SHA256())
    )
    with open(cert, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key, "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return cert, key


def server_tls_context(alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext | None:
    """A self-signed server context offering `alpn`; None when no certificate can be made here."""
    with tempfile.TemporaryDirectory() as directory:
        files = make_self_signed(directory)
        if files is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*files)
    ctx.set_alpn_protocols(list(alpn))
    return ctx


class HTTPTestServer:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.requests: list[bytes] = []   # every request head received, in order
        self.server_names: list[str | None] = []  # TLS SNI of every handshake
        if tls is not None:
            tls.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
        self.server: asyncio.Server | None = None
        self.port = 0
        self._hangs: set[asyncio.Future] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        sock = listening_socket(host, port)
        self.server = await asyncio.start_server(self._serve, sock=sock, ssl=self.tls)
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        for hang in self._hangs:
            hang.cancel()
        if self.server is not None:
            self.server.close()
            try:
                async with asyncio.timeout(2):
                    await self.server.wait_closed()
            except TimeoutError:
                pass

    async def __aenter__(self) -> "HTTPTestServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _hang(self) -> None:
        forever = asyncio.get_running_loop().create_future()
        self._hangs.add(forever)
        try:
            await forever
        finally:
            self._hangs.discard(forever)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(1)
        if not first:
            return
        if not first.isalpha():
            writer.write(_response(400, b"Client sent a non-HTTP request.\n"))
            await writer.drain()
            return
        head = first + await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query))
        await self._route(url.path, query, head, reader, writer)

    async def _route(self, path: str, query: dict, head: bytes, reader, writer) -> None:
        send = writer.write
        if path == "/ok":
            send(_response(200, query.get("body", "ok").encode()))
        elif path == "/echo" or path.startswith("/echo/"):
            send(_response(200, head))
        elif path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            send(_response(code, f"status {code}".encode()))
        elif path == "/body":
            body = b"x" * int(query.get("size", "0"))
            if query.get("chunked"):
                send(_response(200, _chunked(body), [("Transfer-Encoding", "chunked")], length=False))
            else:
                send(_response(200, body))
        elif path == "/redirect":
            code = int(query.get("code", "302"))
            headers = [("Location", query["to"])] if "to" in query else []
            send(_response(code, f"redirect body {code}".encode(), headers))
        elif path == "/loop":
            send(_response(302, b"loop", [("Location", "/loop")]))
        elif path == "/hang":
            await self._hang()
        elif path == "/slow-body":
            send(_response(200, b"", [("Content-Length", "100")], length=False) + b"0123456789")
            await writer.drain()
            await self._hang()
        elif path == "/cut-body":  # a body cut short: Content-Length 100, 10 bytes, then the connection closes
            send(_response(200, b"", [("Content-Length", "100")], length=False) + b"0123456789")
            await writer.drain()
            writer.close()
        elif path == "/close":
            writer.close()
        elif path == "/reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        elif path == "/garbage":
            send(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage\r\n\r\n")  # an h2c server, say
        elif path == "/status-line":
            send(query["line"].encode("latin-1") + b"\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
        elif path == "/info":
            send(b"HTTP/1.1 100 Continue\r\n\r\n" * int(query.get("n", "1")) + _response(200, b"after info"))
        elif path == "/count":
            send(_response(200, str(len(self.requests)).encode()))  # requests seen, this one included
        elif path == "/big-head":
            send(b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * (HEAD_LIMIT + 10) + b"\r\nContent-Length: 0\r\n\r\n")
        else:
            send(_response(404, b"no such route"))
        await writer.drain()


async def _main(args: argparse.Namespace) -> int:
    tls = None
    if args.tls_files:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(*args.tls_files)
        tls.set_alpn_protocols(["http/1.1"])
    elif args.tls:
        tls = server_tls_context()
        if tls is None:
            print("NO-TLS neither the cryptography package nor the openssl CLI is available", flush=True)
            return 3
    server = HTTPTestServer(tls)
    port = await server.start(args.host, args.port)
    await announce_and_wait(port)
    await server.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="::", help='bind address; "::" is dual stack')
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls", action="store_true", help="serve HTTPS with a self-signed certificate")
    parser.add_argument("--tls-files", nargs=2, metavar=("CERT", "KEY"), help="serve HTTPS with this certificate")
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
