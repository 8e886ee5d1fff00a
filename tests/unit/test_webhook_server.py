"""The webhook as the kube-apiserver meets it: `probe-shim webhook serve` (a real process, real TLS with the
certificates `probe-shim webhook certs` writes, verified against its CA for the Service's DNS name), AdmissionReview
v1 bodies POSTed over kept-alive HTTPS connections, and hostile clients, each cut within a bound while the webhook
keeps serving others. Only loopback."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import jsonpatch
import psutil
import pytest

from tests.support.webhook_env import (
    HANDSHAKE_TIMEOUT_S, REQUEST_TIMEOUT_S, SERVICE_NAME, ServiceConnection, Webhook, certs, post, review,
)
from tests.support.netns_env import REPO_ROOT
from tests.support.webhook_pods import web_pod

@pytest.fixture
def webhook(tmp_path):
    server = Webhook(tmp_path)
    yield server
    assert server.stop() == 0, server.logs()[-3000:]


def test_an_admission_over_tls_answers_with_the_converting_patch(webhook):
    conn = webhook.connection()
    pod = web_pod()
    status, answer = post(conn, json.dumps(review(pod)).encode())
    assert status == 200 and answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review(pod)["request"]["uid"] and response["allowed"] is True
    mutated = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert mutated["spec"]["containers"][0]["readinessProbe"]["exec"]["command"][0] == "cri-probe-shim"
    # The same kept-alive connection serves the next one, as the API server reuses it.
    status, again = post(conn, json.dumps(review(mutated)).encode())
    assert status == 200 and "patch" not in again["response"]
    conn.close()
    assert conn.sock is None
    metrics = webhook.get("/metrics")[1].decode()
    assert 'probe_shim_webhook_admissions_total{dry_run="false",result="converted"} 1.0' in metrics
    assert 'probe_shim_webhook_admissions_total{dry_run="false",result="unchanged"} 1.0' in metrics
    assert webhook.get("/healthz") == (200, b"ok\n")
    logged = [json.loads(line) for line in webhook.logs().splitlines() if '"msg": "admission"' in line]
    assert [(e["uid"], e["result"]) for e in logged] == [(response["uid"], "converted"),
                                                         (response["uid"], "unchanged")]


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_below_1_2_and_an_unknown_ca_are_refused(webhook, tmp_path):
    old = webhook.context()
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.minimum_version = ssl.TLSVersion.TLSv1
    with pytest.raises(ssl.SSLError):
        ServiceConnection(SERVICE_NAME, webhook.port, context=old, timeout=5).connect()
    other = certs(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.connection(ca=other / "ca.crt").connect()


@pytest.mark.parametrize("body, message", [
    (b"{\"kind\": ", "the body is not JSON"),
    (b'{"apiVersion": "v1", "kind": "Pod"}', "the body is not an AdmissionReview"),
])
def test_a_body_that_cannot_be_read_gets_a_clear_admission_review(webhook, body, message):
    status, answer = post(webhook.connection(), body)
    assert status == 200
    assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 400
    assert message in answer["response"]["status"]["message"]


def test_a_non_pod_object_is_allowed_unchanged(webhook):
    status, answer = post(webhook.connection(), json.dumps(review(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}, kind="Secret")).encode())
    assert status == 200 and answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def send_as_a_client_still_reading(conn: http.client.HTTPSConnection, data: bytes) -> None:
    """Sends a part of a request's body as a client that still reads the answer when the send fails: a server that
    answers early (413) and closes makes the rest of the body fail, as a reset or a TLS EOF; its answer came before
    its close, so it waits in this end's socket and is read next."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        conn.send(data)


def test_a_10_mib_body_is_refused_before_it_is_read(webhook):
    rss = psutil.Process(webhook.proc.pid).memory_info().rss
    conn = webhook.connection()
    conn.putrequest("POST", "/mutate")
    conn.putheader("Content-Length", str(10 * 1024 * 1024))
    conn.endheaders()
    # A first part of the body; the answer comes from the head alone, often before this part is sent, and then
    # the server's close races this send.
    send_as_a_client_still_reading(conn, b"x" * 65536)
    answer = conn.getresponse()
    assert answer.status == 413 and b"larger than" in answer.read()
    # Chunked, without a length: cut once past the limit, answered 413 while the client still sends.
    chunked = webhook.connection()
    chunked.putrequest("POST", "/mutate")
    chunked.putheader("Transfer-Encoding", "chunked")
    chunked.endheaders()
    chunk = b"x" * (1024 * 1024)
    for _ in range(10):
        send_as_a_client_still_reading(chunked, b"%x\r\n%s\r\n" % (len(chunk), chunk))
    answer = chunked.getresponse()
    assert answer.status == 413 and b"larger than" in answer.read()
    assert psutil.Process(webhook.proc.pid).memory_info().rss - rss < 16 * 1024 * 1024
    assert post(webhook.connection(), json.dumps(review(web_pod())).encode())[0] == 200  # still serving


def test_a_client_sending_a_byte_a_second_is_cut_and_others_are_served(webhook):
    slow = webhook.connection()
    slow.connect()
    body = json.dumps(review(web_pod())).encode()
    head = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    began = time.monotonic()
    cut = False
    for byte in head + body:
        try:
            slow.sock.sendall(bytes([byte]))
        except OSError:
            cut = True
            break
        # Meanwhile another client is answered at once.
        if time.monotonic() - began < 0.5:
            assert post(webhook.connection(), body)[0] == 200
        readable, _, _ = select.select([slow.sock], [], [], 0.25)  # a byte every quarter second
        if readable:
            cut = True
            break
    assert cut
    assert time.monotonic() - began <= REQUEST_TIMEOUT_S + 2.0
    answer = slow.sock.recv(4096)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408")


def test_a_tls_handshake_never_finished_is_cut(webhook):
    stalled = socket.create_connection(("127.0.0.1", webhook.port))
    stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
    began = time.monotonic()
    assert post(webhook.connection(), json.dumps(review(web_pod())).encode())[0] == 200
    readable, _, _ = select.select([stalled], [], [], HANDSHAKE_TIMEOUT_S + 2)
    assert readable and stalled.recv(4096) == b""
    assert time.monotonic() - began <= HANDSHAKE_TIMEOUT_S + 2
    stalled.close()


def test_a_certificate_rotated_on_disk_is_served_to_the_next_client(webhook, tmp_path):
    first = webhook.connection()
    first.connect()
    old_serial = first.sock.getpeercert()["serialNumber"]
    new = certs(tmp_path / "rotated")
    # As a Secret volume updates: the new files appear at once (here: replaced by rename).
    for name in ("tls.key", "tls.crt"):
        shutil.copy(new / name, webhook.dir / f".{name}.new")
        os.replace(webhook.dir / f".{name}.new", webhook.dir / name)
    fresh = webhook.connection(ca=new / "ca.crt")
    fresh.connect()
    assert fresh.sock.getpeercert()["serialNumber"] != old_serial
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.connection().connect()  # the old CA no longer verifies it
    status, _ = post(first, json.dumps(review(web_pod())).encode())
    assert status == 200  # a connection made before keeps its session
    conn = webhook.connection(ca=new / "ca.crt")
    conn.request("GET", "/metrics")
    assert "probe_shim_webhook_certificate_reloads_total 1.0" in conn.getresponse().read().decode()


def test_sigterm_stops_gracefully(tmp_path):
    server = Webhook(tmp_path)
    idle = server.connection()
    idle.connect()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0
    assert idle.sock.recv(1) == b""  # the idle kept-alive connection was closed
    assert "webhook stopped" in server.logs()
    server.stop()


def test_certs_are_for_the_services_names(tmp_path):
    out = certs(tmp_path / "c")
    from cryptography import x509
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert SERVICE_NAME in names and "probe-shim-webhook.probe-shim-system.svc.cluster.local" in names
    assert oct((out / "tls.key").stat().st_mode & 0o777) == "0o600"
    assert base64.b64decode((out / "ca-bundle.txt").read_text()) == (out / "ca.crt").read_bytes()


def test_certs_for_ip_addresses_too_and_a_bad_one_refused(tmp_path):
    out = certs(tmp_path / "c", "--ip", "127.0.0.1", "--ip", "fd00::7")
    from cryptography import x509
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "fd00::7"]
    assert SERVICE_NAME in sans.get_values_for_type(x509.DNSName)
    done = subprocess.run([sys.executable, "-m", "shim.cli", "webhook", "certs", "--out", str(tmp_path / "bad"),
                           "--ip", "node-1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "--ip 'node-1': not an IPv4 or IPv6 address" in done.stderr
    assert not (tmp_path / "bad").exists()
