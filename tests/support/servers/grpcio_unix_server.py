"""grpcio's own asyncio server, `grpc.aio.server()` with the standard health service, on a unix socket: the
reference the daemon's server (shim/rpc/server.py) is compared with under the same attacks
(tests/hardening/test_socket_abuse.py).

    grpcio_unix_server.py SOCKET_PATH

Prints `READY` once serving; exits on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio


async def serve(path: str) -> None:
    server = grpc.aio.server()
    servicer = health_aio.HealthServicer()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    print("READY", flush=True)
    await stopping.wait()
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
