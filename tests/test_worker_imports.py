"""The worker's import set stays lean: workers are forked from a preloaded zygote, and
grpcio (threads, and channels that may dial from the host netns), the OpenTelemetry SDK
or pyroute2 (unless discovering pod IPs) would be paid for by every sandbox."""

import json
import subprocess
import sys

from tests.netns_env import REPO_ROOT

FORBIDDEN = ("grpc", "grpc_tools", "opentelemetry", "pyroute2", "psutil")


def test_worker_imports_no_heavy_package_and_starts_no_thread():
    code = (
        "import json, sys, threading\n"
        "import probe_worker.main\n"
        "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}),"
        " 'threads': threading.active_count()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    assert [m for m in report["modules"] if m in FORBIDDEN] == []
    assert report["threads"] == 1
    assert {"h11", "h2", "google", "asyncio", "ssl"} <= set(report["modules"])
