"""Fixtures of the hardening suite shared by its fault scenarios: fresh pod network namespaces on demand."""

from __future__ import annotations

import pytest

from tests.support.netns_env import PodNetns


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

