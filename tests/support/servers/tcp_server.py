"""Plain TCP targets that misbehave in useful ways.

    tcp_server.py [--host H] [--port P] --mode silent|full-backlog|http1

silent: accepts connections and never sends a byte (a gRPC dial waits for the
HTTP/2 SETTINGS that never come). full-backlog: listens with a backlog of 0
and never accepts, then fills that backlog itself, so Linux drops every
further SYN and a client's connect times out for real. http1: a real HTTP/1.1
server (http.server), not speaking HTTP/2. Prints `READY <port>`; exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import http.server
import select
import signal
import socket
import threading


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _loopback_for(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def _listener(host: str, port: int, backlog: int) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def serve_silent(host: str, port: int, stopped: threading.Event) -> None:
    listener = _listener(host, port, 64)
    held: list[socket.socket] = []
    print(f"READY {listener.getsockname()[1]}", flush=True)
    while not stopped.is_set():
        ready, _, _ = select.select([listener], [], [], 0.5)
        if ready:
            conn, _ = listener.accept()
            held.append(conn)  # kept open and silent until exit


def _try_connect(address: tuple[str, int], family: int) -> socket.socket | None:
    """A connected socket, or None when no answer came within 200 ms (the SYN was dropped)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.connect_ex(address)
    _, writable, _ = select.select([], [sock], [], 0.2)
    if writable and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
        return sock
    sock.close()  # an unanswered attempt leaves nothing queued at the listener
    return None


def serve_full_backlog(host: str, port: int, stopped: threading.Event) -> None:
    listener = _listener(host, port, 0)
    address = (_loopback_for(host), listener.getsockname()[1])
    fillers: list[socket.socket] = []
    # Connect until the kernel demonstrably drops SYNs, rather than trusting timing.
    while (filler := _try_connect(address, _family(address[0]))) is not None:
        fillers.append(filler)
        if len(fillers) > 16:
            raise SystemExit("the listen backlog never filled up")
    print(f"READY {address[1]}", flush=True)
    stopped.wait()


class _Http1Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"plain HTTP/1.1, not gRPC\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass  # stderr is a pipe nobody drains


def serve_http1(host: str, port: int, stopped: threading.Event) -> None:
    class Server(http.server.ThreadingHTTPServer):
        address_family = _family(host)

    server = Server((host, port), _Http1Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"READY {server.server_address[1]}", flush=True)
    stopped.wait()
    server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=("silent", "full-backlog", "http1"), required=True)
    args = parser.parse_args()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    {"silent": serve_silent, "full-backlog": serve_full_backlog, "http1": serve_http1}[args.mode](
        args.host, args.port, stopped
    )


if __name__ == "__main__":
    main()
