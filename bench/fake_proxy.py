#!/usr/bin/env python3
"""`bench/proxy_latency.py --fake`: the shim's CRI proxy alone, in its own process, in front of a fake runtime.

What it owns: the proxy process (this file run as a script: the proxy handler of shim/cri/proxy.py on a unix
socket, READY on stdout, SIGTERM ends it) and `fake_rig`, which starts tests/support/fake_cri.py and that proxy
(with the daemon's gRPC tuning, shim/grpc_tuning.py, applied as the daemon applies it) and yields a channel to each.

    python3 bench/fake_proxy.py --listen SOCKET --upstream unix://RUNTIME_SOCKET
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from bench.children import start_server, stop_server  # noqa: E402


async def serve_proxy(listen: str, upstream_endpoint: str) -> None:
    from shim.cri.proxy import cri_proxy_handler, forwarding_channel
    from shim.rpc.server import Server

    upstream = forwarding_channel(upstream_endpoint)
    server = Server()  # the daemon's
    server.add_generic_rpc_handlers((cri_proxy_handler(upstream),))
    server.add_insecure_port(f"unix:{listen}")
    await server.start()
    stop_event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop_event.set)
    print(f"READY {listen}", flush=True)
    await stop_event.wait()
    await server.stop(None)
    await upstream.close()


@contextlib.contextmanager
def fake_rig() -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    """(direct, proxied) channels: tests/support/fake_cri.py, and this module's proxy process in front of it (with the
    daemon's gRPC tuning, shim/grpc_tuning.py, applied as the daemon applies it)."""
    from shim import grpc_tuning

    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    runtime_sock, proxy_sock = workdir / "cri.sock", workdir / "proxy.sock"
    procs: list[subprocess.Popen] = []
    proxy_env = dict(os.environ)
    grpc_tuning.apply(proxy_env)
    try:
        procs.append(start_server([sys.executable, "-m", "tests.support.fake_cri", "--socket", str(runtime_sock)])[0])
        procs.append(start_server([sys.executable, str(Path(__file__).resolve()), "--listen", str(proxy_sock),
                                   "--upstream", f"unix://{runtime_sock}"], env=proxy_env)[0])
        with grpc.insecure_channel(f"unix:{runtime_sock}") as direct, \
                grpc.insecure_channel(f"unix:{proxy_sock}") as proxied:
            yield direct, proxied
    finally:
        for proc in reversed(procs):
            stop_server(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="unix socket path to serve the proxy on")
    parser.add_argument("--upstream", required=True, help="the runtime's endpoint (unix://PATH)")
    args = parser.parse_args()
    asyncio.run(serve_proxy(args.listen, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
