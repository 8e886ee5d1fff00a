"""`probe-shim webhook serve` as a test's real process: certificates from `probe-shim webhook certs`, HTTPS to the
Service's DNS name on 127.0.0.1, verified against its CA, as the kube-apiserver reaches a webhook's endpoint."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from tests.support.netns_env import REPO_ROOT

SERVICE_NAME = "probe-shim-webhook.probe-shim-system.svc"
REQUEST_TIMEOUT_S = 1.0
HANDSHAKE_TIMEOUT_S = 1.0
START_TIMEOUT_S = 20


def certs(out: Path, *extra: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "shim.cli", "webhook", "certs", "--out", str(out), *extra],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "ca-bundle.txt").read_text().strip() in done.stdout
    return out


class Webhook:
    def __init__(self, workdir: Path, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, cert_args: tuple[str, ...] = ()) -> None:
        self.dir = certs(workdir / "certs", *cert_args)
        self.port = _free_port()
        self.log = open(workdir / "webhook.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shim.cli", "webhook", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--cert", str(self.dir / "tls.crt"), "--key", str(self.dir / "tls.key"),
             "--namespace", "probe-shim-system", "--request-timeout-s", str(request_timeout_s),
             "--handshake-timeout-s", str(handshake_timeout_s)],
            cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if self.get("/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.logs()
            time.sleep(0.05)  # until it listens: nothing to wait on from outside

    def logs(self) -> str:
        return (Path(self.log.name)).read_text(errors="replace")

    def context(self, ca: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca or self.dir / "ca.crt"))

    def connection(self, ca: Path | None = None) -> http.client.HTTPSConnection:
        return ServiceConnection(SERVICE_NAME, self.port, context=self.context(ca), timeout=10)

    def get(self, path: str, ca: Path | None = None) -> tuple[int, bytes]:
        conn = self.connection(ca)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to the Service's name, reached on 127.0.0.1 (as the API server reaches a Service's endpoint)."""

    def connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        # As Go's net package does for the API server: http.client writes head and body apart, and Nagle would
        # hold the body for the server's delayed ACK (40 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(conn: http.client.HTTPSConnection, body: bytes) -> tuple[int, dict | bytes]:
    conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    return answer.status, json.loads(data) if answer.getheader("content-type") == "application/json" else data



def admit(webhook: Webhook, review: dict) -> dict:
    """The AdmissionReview the webhook answers to `review`."""
    conn = webhook.connection()
    try:
        status, answer = post(conn, json.dumps(review).encode())
    finally:
        conn.close()
    assert status == 200, answer
    return answer


def review(obj: dict, *, operation: str = "CREATE", namespace: str = "shop", dry_run: bool = False,
           kind: str = "Pod") -> dict:
    """An AdmissionReview v1 request as the kube-apiserver sends it (the API reference's fields)."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "name": "", "namespace": namespace, "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "uid": "d1f0", "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }}
