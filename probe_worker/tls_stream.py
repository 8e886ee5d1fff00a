"""A probe's connection: a connected non-blocking socket, optionally wrapped in TLS by memory BIOs.

TLS runs through ssl.MemoryBIO over the raw socket, so there is no transport to wind down: closing is the socket's
RST close (SO_LINGER {1, 0}), immediate whatever the peer does. Every failure is a StreamError whose text is Go's
(probe_worker.go_errors words them); the TLS contexts are the kubelet's client settings. Only one of them verifies
the server (an h2c probe's redirect to https), in Go's order (probe_worker.cert_verify).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import socket
import ssl

from probe_api.gostrings import join_host_port
from probe_worker import cert_verify
from probe_worker.connect import close_quietly
from probe_worker.go_errors import first_record_error, net_op_error, tls_error_text

RECV_SIZE = 64 * 1024


def default_tls_context(alpn: bool = True) -> ssl.SSLContext:
    """The kubelet's client TLS: InsecureSkipVerify, TLS >= 1.2 (Go's client minimum).

    The probe client offers h2 and http/1.1 (utilnet.SetTransportDefaults configures HTTP/2 on its transport);
    alpn=False is the lifecycle client's: a plain http.Transport given a TLSClientConfig does not attempt
    HTTP/2, so its ClientHello offers no ALPN at all.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if alpn:
        ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def grpc_tls_context() -> ssl.SSLContext:
    """grpc.mode TLS (KEP-4939): credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}), which offers ALPN h2
    only (AppendH2ToNextProtos) on Go's TLS >= 1.2 client."""
    ctx = default_tls_context(alpn=False)
    ctx.set_alpn_protocols(["h2"])
    return ctx


# Built at import: after the worker drops privileges it may not read the CA paths.
DEFAULT_TLS = default_tls_context()
LIFECYCLE_TLS = default_tls_context(alpn=False)
GRPC_TLS = grpc_tls_context()


@functools.cache
def verifying_tls_context() -> ssl.SSLContext:
    """Go's default tls.Config, as kubelet 1.37's h2c transport dials https (a redirect): the node's roots, TLS >=
    1.2, and no ALPN (its Protocols are unencrypted HTTP/2 alone, so adjustNextProtos drops h2 and http/1.1).

    OpenSSL judges the chain; the name is cert_verify's, after the leaf's own checks, as Go orders them. Built on
    first use, as Go loads the system roots on its first verification: the bundle is world-readable, and no other
    probe needs it (nothing but a redirect of an alpha feature's probe gets here)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_default_certs()
    return ctx


def _leaf_error(chain: list | None, host: str) -> str | None:
    """What Go says of the server's certificate before it looks at the chain (None: nothing). `chain` is ssl's
    (_ssl.Certificate objects, the server's first); OpenSSL keeps it after a failed verification too."""
    if not chain:
        return None
    return cert_verify.leaf_error(chain[0].get_info(), host, datetime.datetime.now().astimezone())


class StreamError(Exception):
    """A socket or TLS failure; str() is Go's error text for it."""


class Stream:
    """A connected non-blocking socket, optionally wrapped in TLS by memory BIOs."""

    def __init__(self, sock: socket.socket, remote: str) -> None:
        self.sock = sock
        self.remote = remote
        self.loop = asyncio.get_running_loop()
        self.tls: ssl.SSLObject | None = None

    @functools.cached_property
    def local(self) -> str:
        """Our "ip:port", for error texts only: looked up when one is written (the socket
        keeps its address after a reset), not on every connection."""
        host, port = self.sock.getsockname()[:2]
        return join_host_port(host, port)

    async def start_tls(self, context: ssl.SSLContext, server_hostname: str | None, verify_host: str = "") -> str:
        """Handshakes; returns the negotiated version. Raises StreamError with Go's text.

        verify_host: the server's certificate must be valid for it (`context` verifies the chain)."""
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        tls = context.wrap_bio(self._incoming, self._outgoing, server_side=False, server_hostname=server_hostname)
        header = b""
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                raise StreamError("EOF") from None
            except ssl.SSLCertVerificationError:
                raise StreamError(cert_verify.VERIFY_FAILED + (
                    _leaf_error(tls._sslobj.get_unverified_chain(), verify_host)
                    or cert_verify.UNKNOWN_AUTHORITY)) from None
            except ssl.SSLError as exc:
                raise StreamError(tls_error_text(exc.reason or "")) from None
            await self._flush()
            data = await self._recv_raw()
            if len(header) < 5:
                header += data[:5 - len(header)]
                problem = first_record_error(header, eof=not data)
                if problem:
                    raise StreamError(problem)
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        if verify_host:
            problem = _leaf_error(tls._sslobj.get_verified_chain(), verify_host)
            if problem:
                raise StreamError(cert_verify.VERIFY_FAILED + problem)
        await self._flush()
        self.tls = tls
        return tls.version() or ""

    @property
    def alpn(self) -> str | None:
        """The protocol the server picked by ALPN (None: plain TCP, or no ALPN)."""
        return self.tls.selected_alpn_protocol() if self.tls is not None else None

    async def send(self, data: bytes) -> None:
        if self.tls is None:
            await self._send_raw(data)
            return
        self.tls.write(data)
        await self._flush()

    async def recv(self, limit: int = RECV_SIZE) -> bytes:
        """Up to `limit` bytes (at least one), or b"" at end of stream."""
        if self.tls is None:
            return await self._recv_raw(limit)
        while True:
            try:
                return self.tls.read(limit)
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            except ssl.SSLError as exc:
                text = tls_error_text(exc.reason or "")
                if text == "EOF":
                    return b""
                raise StreamError(text) from None
            await self._flush()
            data = await self._recv_raw()
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            await self._send_raw(pending)

    async def _send_raw(self, data: bytes) -> None:
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError as exc:
            raise StreamError(net_op_error("write", self.local, self.remote, exc)) from None

    async def _recv_raw(self, limit: int = RECV_SIZE) -> bytes:
        try:
            return await self.loop.sock_recv(self.sock, limit)
        except OSError as exc:
            raise StreamError(net_op_error("read", self.local, self.remote, exc)) from None

    def send_nowait(self, data: bytes) -> None:
        """Best effort, never waits: what the socket takes now of `data` (a goodbye before the close)."""
        if self.tls is not None:
            self.tls.write(data)
            data = self._outgoing.read()
        try:
            self.sock.send(data)
        except OSError:
            pass

    def close(self) -> None:
        close_quietly(self.sock)  # SO_LINGER {1, 0}: RST, never blocks
