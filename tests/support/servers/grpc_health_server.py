"""A real grpcio server with the standard health service, as a gRPC probe target.

    grpc_health_server.py [--host H] [--port P] [--status [SERVICE=]STATUS ...]
                          [--no-health] [--slow-ms N] [--tls CERT KEY]

--status SERVING sets the overall ("") service; --status db=NOT_SERVING a named
one (repeatable; default: "" SERVING). Services never set answer NOT_FOUND, as
grpcio-health-checking does. --no-health registers no service at all, so every
call is UNIMPLEMENTED. --slow-ms makes Check sleep before answering. --tls serves over TLS with that
certificate (grpcio's server credentials: ALPN h2, as every TLS gRPC server). Prints
`READY <port>` once listening; exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class SlowHealthServicer(health.HealthServicer):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self._delay_s = delay_s

    def Check(self, request, context):
        # Deliberately ignores the deadline: the probe must bound the wait itself.
        time.sleep(self._delay_s)
        return super().Check(request, context)


def parse_status(text: str) -> tuple[str, int]:
    service, _, status = text.rpartition("=")
    return service, health_pb2.HealthCheckResponse.ServingStatus.Value(status)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="::")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--status", action="append", type=parse_status, default=[])
    parser.add_argument("--no-health", action="store_true")
    parser.add_argument("--slow-ms", type=int, default=0)
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if not args.no_health:
        servicer = SlowHealthServicer(args.slow_ms / 1000) if args.slow_ms else health.HealthServicer()
        for service, status in args.status:
            servicer.set(service, status)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    host = f"[{args.host}]" if ":" in args.host else args.host
    if args.tls:
        with open(args.tls[0], "rb") as cert, open(args.tls[1], "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        port = server.add_secure_port(f"{host}:{args.port}", credentials)
    else:
        port = server.add_insecure_port(f"{host}:{args.port}")
    server.start()

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(f"READY {port}", flush=True)
    stopped.wait()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
