#!/usr/bin/env python3
"""A complete probectl session in a throwaway network namespace (`make demo`, needs root).

Creates a netns with a veth address, an HTTP server (serving /healthz) on 8080 and a gRPC
health server on 9090 inside it, starts `probe-shim serve --runtime-endpoint none` on a
temporary socket, then runs `probectl apply -f examples/pod.yaml`, `probectl ps` once every
probe has an attempt, and `probectl exec` with its trace waterfall. Everything is removed at
the end.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from probectl import ProbeShimClient  # noqa: E402
from tests.support.daemon_env import DaemonProcess  # noqa: E402
from tests.support.netns_env import PodNetns, netns_unavailable_reason  # noqa: E402

HTTP_SERVER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = b'ok' if self.path == '/healthz' else b'not found'\n"
    "        self.send_response(200 if self.path == '/healthz' else 404)\n"
    "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *args): pass\n"
    "server = http.server.ThreadingHTTPServer(('0.0.0.0', 8080), H)\n"
    "print('READY 8080', flush=True)\n"
    "server.serve_forever()\n"
)


def probectl(socket: str, *args: str) -> None:
    print(f"$ probectl {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "probectl.cli", "-r", f"unix://{socket}", *args], cwd=REPO)


def main() -> int:
    reason = netns_unavailable_reason()
    if reason:
        print(f"demo: {reason}", file=sys.stderr)
        return 1
    ns = PodNetns.create()
    workdir = tempfile.TemporaryDirectory()
    daemon = None
    try:
        ns.spawn([sys.executable, "-c", HTTP_SERVER])
        ns.spawn_python("grpc_health_server.py", "--port", "9090")
        daemon = DaemonProcess(Path(workdir.name)).start()
        print(f"netns {ns.name} ({ns.ipv4}), shim at unix://{daemon.socket_path}\n", flush=True)
        probectl(daemon.socket_path, "apply", "-f", str(REPO / "examples/pod.yaml"), "--pod", ns.name)
        with ProbeShimClient(f"unix://{daemon.socket_path}", timeout_s=10) as client:
            probed: set[str] = set()
            wanted = {p.probe_id for p in client.probes(pod_sandbox_id=ns.name)}
            for event in client.watch(pod_sandbox_id=ns.name, every_attempt=True):
                if event.probe.status.last_attempt.result:
                    probed.add(event.probe.probe_id)
                if probed >= wanted:
                    break
        probectl(daemon.socket_path, "ps")
        probectl(daemon.socket_path, "exec", "--pod", ns.name, "--http-get", ":8080/healthz")
        probectl(daemon.socket_path, "workers")
    finally:
        if daemon is not None:
            daemon.stop()
        ns.destroy()
        workdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
