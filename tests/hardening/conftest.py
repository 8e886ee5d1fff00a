"""Fixtures shared by the hardening suite's modules: fresh pod network namespaces on demand (the fault scenarios), and
a daemon with a pod network namespace and a listener in it for the probe API's tests (one of each per module)."""

from __future__ import annotations

import pytest

from tests.support.daemon_env import DaemonProcess
from tests.support.netns_env import PodNetns, listen


@pytest.fixture
def make_netns():
    """make_netns(n): n fresh pod network namespaces (loopback only), all deleted at teardown."""
    made: list[PodNetns] = []

    def make(count: int) -> list[PodNetns]:
        for _ in range(count):
            made.append(PodNetns.create(with_addresses=False))
        return made[-count:]

    yield make
    for ns in made:
        ns.destroy()


# --- the probe API's daemon (test_api_validation.py, test_api_fuzz.py): one per module ----------------------------

@pytest.fixture(scope="module")
def netns():
    ns = PodNetns.create()
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture(scope="module")
def target_port(netns):
    """A listener in the pod that accepts and closes: TCP probes succeed, HTTP and gRPC ones fail fast."""
    return listen(netns).port


@pytest.fixture(scope="module")
def api_daemon(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("api-daemon")).start()
    yield d
    d.stop()
