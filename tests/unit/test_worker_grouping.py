"""The grouping rules (shim/workers/grouping.py): which worker serves which sandbox. Pure, no process."""

from __future__ import annotations

import random

import pytest

from shim.workers.grouping import (
    POOLED,
    STRICT,
    GroupView,
    choose_group,
    embedded_tenancy,
    new_group_name,
    worker_open_files,
)


def place(tenancies: list[str], *, isolation: str = POOLED, capacity: int = 16) -> dict[str, list[int]]:
    """Applies the rules as the supervisor does, sandbox after sandbox: group name -> sandbox indexes."""
    groups: dict[str, list[int]] = {}
    tenancy_of: dict[str, str] = {}
    for i, tenancy in enumerate(tenancies):
        views = [GroupView(name, tenancy_of[name], len(members)) for name, members in groups.items()]
        name = choose_group(views, tenancy=tenancy, isolation=isolation, capacity=capacity)
        if name is None:
            name = new_group_name(sandbox_id=f"sb{i}", tenancy=tenancy, isolation=isolation, taken=groups)
            groups[name], tenancy_of[name] = [], tenancy
        groups[name].append(i)
    return groups


def test_a_group_never_mixes_namespaces_and_never_exceeds_its_capacity():
    rng = random.Random(4559)
    namespaces = [f"team-{n}" for n in range(10)] + [""]
    for capacity in (1, 2, 7, 16):
        tenancies = [rng.choice(namespaces) for _ in range(250)]
        groups = place(tenancies, capacity=capacity)
        for name, members in groups.items():
            assert len({tenancies[i] for i in members}) == 1, f"{name} mixes namespaces"
            assert 1 <= len(members) <= capacity
        # As few workers as the rule allows: every namespace fills its groups before opening another.
        for namespace in namespaces:
            count = tenancies.count(namespace)
            opened = [n for n, m in groups.items() if tenancies[m[0]] == namespace]
            assert len(opened) == -(-count // capacity)


def test_groups_are_named_after_their_namespace_and_the_embedded_tenancy_is_default():
    groups = place(["team-a", "team-a", "team-b", "", "team-a"], capacity=2)
    assert groups == {"team-a#1": [0, 1], "team-b#1": [2], "default#1": [3], "team-a#2": [4]}


def test_a_freed_name_is_taken_again_and_a_stopping_group_takes_no_one():
    assert new_group_name(sandbox_id="x", tenancy="ns", isolation=POOLED, taken=["ns#2"]) == "ns#1"
    stopping = GroupView("ns#1", "ns", 1, open=False)
    assert choose_group([stopping], tenancy="ns", isolation=POOLED, capacity=16) is None
    assert choose_group([stopping, GroupView("ns#2", "ns", 3)], tenancy="ns", isolation=POOLED, capacity=16) == "ns#2"


def test_strict_mode_gives_every_sandbox_a_group_of_its_own():
    groups = place(["team-a"] * 3, isolation=STRICT)
    assert groups == {"sb0": [0], "sb1": [1], "sb2": [2]}


@pytest.mark.parametrize(("name", "separator", "tenancy"), [
    ("team-a.web-1", ".", "team-a"),
    ("team-a.web.1", ".", "team-a"),  # the first separator ends the namespace
    ("web-1", ".", ""),  # no separator in the name: the one default tenancy
    ("team-a.web-1", "", ""),  # no separator configured: every bare netns is one tenancy
    ("team-a--web", "--", "team-a"),
])
def test_the_embedded_mode_reads_a_namespace_from_the_netns_name_only_when_told(name, separator, tenancy):
    assert embedded_tenancy(name, separator) == tenancy


def test_a_big_group_gets_room_for_its_sockets_and_a_small_one_the_usual_limit():
    assert worker_open_files(1) == worker_open_files(16) == 1024
    assert worker_open_files(256) == 256 * 64
