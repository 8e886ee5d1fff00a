"""What an h2c probe redirected to https says of the server's certificate: kubelet 1.37's h2c transport has Go's
default tls.Config (pkg/probe/http/http.go h2cTransport), so crypto/x509 Certificate.Verify judges the server.

Expected texts are Go's (crypto/x509 verify.go: isValid, VerifyHostname, HostnameError, UnknownAuthorityError;
crypto/tls: "tls: failed to verify certificate: "). The rules without a server, then the handshake on loopback with
roots the test chooses, then a whole h2c probe whose redirect reaches an https server the roots trust.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker import cert_verify
from probe_worker.attempt import FAILURE, SUCCESS
from probe_worker.probes.http import executor
from probe_worker.tls_stream import Stream, StreamError
from tests.support.certificates import write_certificate
from tests.support.http_probe_harness import run_probe
from tests.support.servers.h2_server import Server as H2Server
from tests.support.servers.http_server import HTTPTestServer
from tests.support.servers.serving import listening_socket

UTC = datetime.timezone.utc
VALID = {"notBefore": "Jan  1 00:00:00 2026 GMT", "notAfter": "Jan  1 00:00:00 2027 GMT"}
NOW = datetime.datetime(2026, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def leaf(*sans: tuple[str, str], cn: str = "probe-test", **fields) -> dict:
    """ssl's certificate dict; no `subjectAltName` key when there is no SAN extension, as ssl gives it."""
    info = {"subject": ((("commonName", cn),),), **VALID, **fields}
    if sans:
        info["subjectAltName"] = sans
    return info


# --- the rules ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("info, host, expected", [
    (leaf(("IP Address", "198.18.0.2")), "198.18.0.2", None),
    (leaf(("IP Address", "FD00:5A:0:0:0:0:0:2\n")), "fd00:5a::2", None),          # OpenSSL's spelling
    (leaf(("IP Address", "198.18.0.2")), "[198.18.0.2]", None),                     # brackets allowed
    (leaf(("IP Address", "0:0:0:0:0:FFFF:C612:2")), "198.18.0.2", None),           # IPv4-mapped is Equal
    (leaf(), "198.18.0.2",
     "x509: cannot validate certificate for 198.18.0.2 because it doesn't contain any IP SANs"),
    (leaf(("DNS", "web.example")), "198.18.0.2",
     "x509: cannot validate certificate for 198.18.0.2 because it doesn't contain any IP SANs"),
    (leaf(("IP Address", "10.0.0.1"), ("IP Address", "FD00:0:0:0:0:0:0:1")), "198.18.0.2",
     "x509: certificate is valid for 10.0.0.1, fd00::1, not 198.18.0.2"),
    (leaf(*[("IP Address", f"10.0.{i // 250}.{i % 250}") for i in range(100)]), "198.18.0.2",
     "x509: certificate is valid for 100 IP SANs, but none matched 198.18.0.2"),
    # no SAN extension at all, and the common name is the host: Go names the legacy field
    (leaf(cn="198.18.0.2"), "198.18.0.2", "x509: certificate relies on legacy Common Name field, use SANs instead"),
    (leaf(("IP Address", "10.0.0.1"), cn="198.18.0.2"), "198.18.0.2",
     "x509: certificate is valid for 10.0.0.1, not 198.18.0.2"),
    # names: a wildcard covers one whole first label, case aside
    (leaf(("DNS", "*.Example.com")), "web.example.com", None),
    (leaf(("DNS", "*.example.com")), "a.web.example.com",
     "x509: certificate is valid for *.example.com, not a.web.example.com"),
    (leaf(("DNS", "web.example.com")), "web.example.com.", None),
    (leaf(("IP Address", "10.0.0.1")), "web.example",
     "x509: certificate is not valid for any names, but wanted to match web.example"),
])
def test_hostname(info, host, expected):
    assert cert_verify.hostname_error(info, host) == expected


def test_validity_comes_before_the_name():
    # isValid runs before VerifyHostname; times as time.RFC3339 prints them: whole seconds, Z or the offset.
    late = NOW.replace(year=2027)
    assert cert_verify.leaf_error(leaf(), "198.18.0.2", late) == (
        "x509: certificate has expired or is not yet valid: current time 2027-06-01T12:00:00Z is after "
        "2027-01-01T00:00:00Z")
    early = datetime.datetime(2025, 12, 31, 18, 0, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))
    assert cert_verify.leaf_error(leaf(), "198.18.0.2", early) == (
        "x509: certificate has expired or is not yet valid: current time 2025-12-31T18:00:00-05:00 is before "
        "2026-01-01T00:00:00Z")
    assert cert_verify.leaf_error(leaf(("IP Address", "198.18.0.2")), "198.18.0.2", NOW) is None


# --- the handshake --------------------------------------------------------------------------------------------


def roots(*certs: str) -> ssl.SSLContext:
    """tls_stream.verifying_tls_context with these roots instead of the node's."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    for cert in certs:
        ctx.load_verify_locations(cert)
    return ctx


async def handshake(files: tuple[str, str], client: ssl.SSLContext) -> str:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*files)

    async def serve(reader, writer):
        try:
            await reader.read(1)
        except (ConnectionError, ssl.SSLError):
            pass
        writer.transport.abort()

    server = await asyncio.start_server(serve, sock=listening_socket("127.0.0.1", 0), ssl=server_ctx)
    try:
        port = server.sockets[0].getsockname()[1]
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        stream = Stream(sock, f"127.0.0.1:{port}")
        try:
            return await stream.start_tls(client, None, "127.0.0.1")
        finally:
            stream.close()
    finally:
        server.close()


@pytest.fixture
def certs(tmp_path):
    now = datetime.datetime.now(UTC)
    return {
        "loopback": write_certificate(tmp_path, "loopback", ip_sans=("127.0.0.1",)),
        "other": write_certificate(tmp_path, "other", ip_sans=("10.0.0.1",)),
        "expired": write_certificate(tmp_path, "expired", ip_sans=("127.0.0.1",),
                                     not_before=now - datetime.timedelta(days=2),
                                     not_after=now - datetime.timedelta(days=1)),
    }


def test_a_trusted_certificate_for_the_address_passes(certs):
    assert asyncio.run(handshake(certs["loopback"], roots(certs["loopback"][0]))).startswith("TLSv1.")


def test_a_trusted_chain_for_another_address_fails_on_the_name(certs):
    with pytest.raises(StreamError) as caught:
        asyncio.run(handshake(certs["other"], roots(certs["other"][0])))
    assert str(caught.value) == (
        "tls: failed to verify certificate: x509: certificate is valid for 10.0.0.1, not 127.0.0.1")


def test_an_unknown_root_is_an_unknown_authority(certs):
    with pytest.raises(StreamError) as caught:
        asyncio.run(handshake(certs["loopback"], roots(certs["other"][0])))
    assert str(caught.value) == "tls: failed to verify certificate: x509: certificate signed by unknown authority"


def test_an_expired_certificate_says_so_before_its_root_is_looked_at(certs):
    with pytest.raises(StreamError) as caught:
        asyncio.run(handshake(certs["expired"], roots()))
    text = str(caught.value)
    assert text.startswith("tls: failed to verify certificate: x509: certificate has expired or is not yet valid: "
                           "current time ")
    assert " is after " in text


# --- an h2c probe's redirect ----------------------------------------------------------------------------------


async def h2c_redirected_to(files: tuple[str, str]):
    """An h2c probe of an h2c server redirecting /go to an https server (ALPN h2 and http/1.1) on loopback."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*files)
    tls.set_alpn_protocols(["h2", "http/1.1"])
    async with HTTPTestServer(tls) as https:
        h2c = await asyncio.start_server(H2Server("h2c").serve, sock=listening_socket("127.0.0.1", 0))
        port = h2c.sockets[0].getsockname()[1]
        try:
            outcome, _, _ = await run_probe(f"/redirect?to=https://127.0.0.1:{https.port}/echo", port,
                                            protocol=spec_pb.HTTP2)
        finally:
            h2c.close()
        return outcome, https


def test_an_h2c_redirect_to_a_trusted_https_server_speaks_http1_without_alpn(certs, monkeypatch):
    monkeypatch.setattr(executor, "verifying_tls_context", lambda: roots(certs["loopback"][0]))
    outcome, https = asyncio.run(h2c_redirected_to(certs["loopback"]))
    # No ALPN offered (the server would have picked h2), so HTTP/1.1; the h2c transport's headers
    # (DisableKeepAlives, DisableCompression), the Referer of the h2c hop.
    assert (outcome.result, outcome.output.splitlines()[:2]) == (
        SUCCESS, ["GET /echo HTTP/1.1", f"Host: 127.0.0.1:{https.port}"])
    assert outcome.output.endswith("Connection: close\r\n\r\n") and "Accept-Encoding" not in outcome.output
    assert https.server_names == [None]  # no SNI for an IP


def test_an_h2c_redirect_to_an_untrusted_https_server_fails(certs, monkeypatch):
    monkeypatch.setattr(executor, "verifying_tls_context", lambda: roots(certs["other"][0]))
    outcome, https = asyncio.run(h2c_redirected_to(certs["loopback"]))
    assert (outcome.result, outcome.output) == (
        FAILURE, f'Get "https://127.0.0.1:{https.port}/echo": tls: failed to verify certificate: x509: certificate '
                 "signed by unknown authority")
