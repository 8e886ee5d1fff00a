"""Fixtures of the probectl system tests: probectl's main(argv) in-process against the test daemon (tests/conftest.py),
and an HTTP server, a gRPC health server and a TCP listener in the pod netns."""

from __future__ import annotations

import pytest

from probectl import cli
from tests.support.netns_env import listen
from tests.support.probectl_runs import Result


@pytest.fixture
def probectl(daemon, capsys):
    """main(argv) in-process against the test daemon, with its output captured."""
    def run(*args: str) -> Result:
        capsys.readouterr()
        rc = cli.main(["-r", f"unix://{daemon.socket_path}", *args])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)
    return run


@pytest.fixture
def servers(pod_netns):
    """An HTTP server, a gRPC health server and a TCP listener in the pod netns."""
    return {
        "http": pod_netns.spawn_python("http_server.py", "--port", "0"),
        "grpc": pod_netns.spawn_python("grpc_health_server.py", "--port", "0"),
        "tcp": listen(pod_netns),
    }
