"""The lifecycle hook tests' harness: a recording HTTP server in the pod netns, and RunOnce through the worker.

Shared by tests/system/test_lifecycle_hooks.py and tests/system/test_lifecycle_hook_keep_alive.py."""

from __future__ import annotations

import json
import os
import select
import sys

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION
from tests.support.servers.http_server import server_tls_context

SUCCESS, FAILURE, UNKNOWN = spec_pb.RESULT_SUCCESS, spec_pb.RESULT_FAILURE, spec_pb.RESULT_UNKNOWN
HOOK_UA = f"kube-lifecycle/{KUBELET_VERSION}"   # the worker's default user_agent_version
MISMATCH = "http: server gave HTTP response to HTTPS client"

# An HTTP/1.1 server that keeps connections alive and reports what it sees, one JSON line per event:
#   {"event": "tls", "conn": N, "alpn": ...}      a TLS handshake (--tls), with the ALPN protocol chosen
#   {"event": "non-http", "conn": N}              bytes that are not a request (a ClientHello): answered 400
#   {"event": "request", "conn": N, "head": ...}  a request head, printed before it is answered
# argv: HOST [--tls] [--one-shot]; --one-shot closes the listener when the first connection arrives.
# Routes: /status/N, /redirect?to=URL[&body=N][&close=1|&drop=1] (a body of N bytes; `close` says
# Connection: close, `drop` closes the connection after the response without saying so), /loop,
# /hang, /slow-body (promises 100 bytes, sends 10), /reset, /ssh (an SSH banner), /marker; else 404.
RECORDING_SERVER = r'''
import asyncio, itertools, json, socket, struct, sys, urllib.parse
from tests.support.servers.serving import announce_and_wait, listening_socket

host, flags = sys.argv[1], set(sys.argv[2:])
ids = itertools.count(1)
state = {}

def emit(**event):
    print(json.dumps(event), flush=True)

def response(status, body=b"", headers=()):
    head = [f"HTTP/1.1 {status} Status"] + [f"{k}: {v}" for k, v in headers] + [f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body

async def serve(reader, writer):
    conn = next(ids)
    if "--one-shot" in flags:
        state["server"].close()
    try:
        if "--tls" in flags:
            emit(event="tls", conn=conn, alpn=writer.get_extra_info("ssl_object").selected_alpn_protocol())
        while True:
            first = await reader.read(1)
            if not first:
                return
            if not first.isalpha():
                emit(event="non-http", conn=conn)
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            head = first + await reader.readuntil(b"\r\n\r\n")
            emit(event="request", conn=conn, head=head.decode("latin-1"))
            target = urllib.parse.urlsplit(head.split(b" ")[1].decode("latin-1"))
            query = dict(urllib.parse.parse_qsl(target.query))
            path = target.path
            if path.startswith("/status/"):
                writer.write(response(int(path[8:]), f"status {path[8:]}".encode()))
            elif path == "/redirect":
                headers = [("Location", query["to"])] + ([("Connection", "close")] if "close" in query else [])
                writer.write(response(302, b"m" * int(query.get("body", "5")), headers))
                if "close" in query or "drop" in query:
                    await writer.drain()
                    return
            elif path == "/loop":
                writer.write(response(302, b"loop", [("Location", "/loop")]))
            elif path in ("/hang", "/slow-body"):
                if path == "/slow-body":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                    await writer.drain()
                await reader.read()  # until the client goes away
                return
            elif path == "/reset":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif path == "/ssh":
                writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
            elif path == "/marker":
                writer.write(response(200, b"marker"))
            else:
                writer.write(response(404, b"no such route"))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        pass
    finally:
        writer.transport.abort()

async def main():
    tls = None
    if "--tls" in flags:
        from tests.support.servers.http_server import server_tls_context
        tls = server_tls_context()
    sock = listening_socket(host, 0)
    state["server"] = await asyncio.start_server(serve, sock=sock, ssl=tls)
    await announce_and_wait(sock.getsockname()[1])

asyncio.run(main())
'''


class Recorder:
    """A recording server in the pod netns, and the events it printed."""

    def __init__(self, pod_netns, *flags: str) -> None:
        self.server = pod_netns.spawn([sys.executable, "-c", RECORDING_SERVER, "::", *flags])
        self.port = self.server.port
        self.scheme = spec_pb.HTTPS if "--tls" in flags else spec_pb.HTTP
        self._fd = self.server.proc.stdout.fileno()
        self._buffer = b""

    def _line(self, timeout: float = 10.0) -> str:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                raise TimeoutError("the recording server printed nothing")
            data = os.read(self._fd, 65536)
            if not data:
                raise EOFError("the recording server exited")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def seen(self, worker) -> list[dict]:
        """Every event since the last call: a probe of /marker through the worker closes the list."""
        marker = run_once(worker, http_spec("/marker", self.port, scheme=self.scheme), hook=False, max_tries=1)
        assert marker.result == SUCCESS, marker.output
        events = []
        while True:
            event = json.loads(self._line())
            if event["event"] == "request" and event["head"].startswith("GET /marker "):
                return events
            events.append(event)

    def heads(self, worker) -> list[str]:
        return [e["head"] for e in self.seen(worker) if e["event"] == "request"]


def http_spec(path: str, port: int, headers=(), scheme=spec_pb.HTTP, timeout_ms: int = 2000) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(
            path=path, port=spec_pb.PortRef(number=port), scheme=scheme,
            http_headers=[spec_pb.HTTPHeader(name=n, value=v) for n, v in headers],
        ),
        timeout_ms=timeout_ms,
    )


def run_once(worker, spec: spec_pb.ProbeSpec, *, hook: bool, max_tries: int = 0, timeout: float = 10.0):
    reg = worker_pb.ProbeRegistration(type=spec_pb.READINESS, spec=spec, container=worker_pb.ContainerRef(),
                                      sandbox_id=worker.sandbox_id)
    run = worker_pb.RunOnce(probe=reg, max_tries=max_tries, lifecycle_hook=hook)
    return worker.request(timeout, run_once=run).attempt.status.last_attempt


def hook(worker, spec, **kw):
    return run_once(worker, spec, hook=True, **kw)


def hook_head(target: str, host: str, *extra: str) -> str:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", f"User-Agent: {HOOK_UA}", "Accept: */*", *extra,
             "Accept-Encoding: gzip"]
    return "\r\n".join(lines) + "\r\n\r\n"


def needs_tls():
    if server_tls_context() is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
