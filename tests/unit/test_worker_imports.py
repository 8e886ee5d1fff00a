"""The worker's import set stays lean: workers are forked from a preloaded zygote, and
grpcio (threads, and channels that may dial from the host netns), the OpenTelemetry SDK
or pyroute2 (pod IPs are found with one rtnetlink dump of our own) would be paid for by
every sandbox."""

from tests.support.import_report import import_report

FORBIDDEN = ("grpc", "grpc_tools", "opentelemetry", "pyroute2", "psutil")


def test_worker_imports_no_heavy_package_and_starts_no_thread():
    modules, threads = import_report("probe_worker.main")
    assert modules & set(FORBIDDEN) == set()
    assert threads == 1
    assert {"h11", "h2", "google", "asyncio", "ssl"} <= modules
