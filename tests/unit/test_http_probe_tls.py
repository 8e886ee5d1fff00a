"""The HTTP probe executor over HTTPS against real loopback servers: no verification, SNI, handshake failures."""

from __future__ import annotations

import asyncio

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE, SUCCESS
from tests.support.http_probe_harness import default_head, phase_names, probe_once, run_probe
from tests.support.servers.http_server import HTTPTestServer, server_tls_context

# --- HTTPS -------------------------------------------------------------------------------------


def tls_server() -> HTTPTestServer:
    ctx = server_tls_context()
    if ctx is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    return HTTPTestServer(ctx)


def test_https_without_verification_and_without_sni_for_an_ip():
    outcome, ctx, _, server = probe_once("/echo", server_factory=tls_server, scheme=spec_pb.HTTPS)
    assert outcome.result == SUCCESS
    assert outcome.output == default_head("/echo", f"127.0.0.1:{server.port}")
    assert phase_names(ctx.trace.phases) == ["connect", "tls", "request", "processing", "transfer"]
    assert ctx.trace.phases[1].detail.startswith("TLSv1.")
    assert server.server_names == [None]


def test_https_sends_sni_for_a_hostname():
    outcome, _, _, server = probe_once(
        "/ok", server_factory=tls_server, scheme=spec_pb.HTTPS, host="localhost", addresses=("127.0.0.1",)
    )
    assert outcome.result == SUCCESS and server.server_names == ["localhost"]


def test_https_to_a_plain_http_server_is_a_scheme_mismatch():
    outcome, _, _, server = probe_once("/ok", scheme=spec_pb.HTTPS)
    assert outcome.output == (
        f'Get "https://127.0.0.1:{server.port}/ok": http: server gave HTTP response to HTTPS client'
    )


def test_https_hang_is_bounded():
    outcome, _, took, server = probe_once("/hang", server_factory=tls_server, scheme=spec_pb.HTTPS, timeout=0.5)
    assert outcome.output == (
        f'Get "https://127.0.0.1:{server.port}/hang": '
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )
    assert took < 0.5 + 1.0


def test_tls_handshake_against_a_silent_server_is_bounded():
    async def go():
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        try:
            return await run_probe("/", port, scheme=spec_pb.HTTPS, timeout=0.5), port
        finally:
            silent.close()

    (outcome, ctx, took), port = asyncio.run(go())
    assert outcome.output == (
        f'Get "https://127.0.0.1:{port}/": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
    )
    assert ctx.trace.phases[-1].name == "tls" and ctx.trace.phases[-1].error
    assert took < 0.5 + 1.0


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"", "EOF"),
        (b"\x15\x03\x03\x00\x02\x02\x28", "remote error: tls: handshake failure"),
        (b"\x15\x03\x03\x00\x02\x02\x46", "remote error: tls: protocol version not supported"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "tls: first record does not look like a TLS handshake"),
    ],
)
def test_tls_handshake_failures_read_like_go(reply, error):
    async def go():
        async def answer(reader, writer):
            await reader.read(1)  # the ClientHello has started
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_probe("/", port, scheme=spec_pb.HTTPS), port
        finally:
            server.close()

    (outcome, ctx, _), port = asyncio.run(go())
    assert (outcome.result, outcome.output) == (FAILURE, f'Get "https://127.0.0.1:{port}/": {error}')
    assert ctx.trace.phases[-1].name == "tls" and ctx.trace.phases[-1].error == error
