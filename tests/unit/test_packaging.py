"""The wheel holds every package of the project: a package missing from pyproject's list imports in a checkout
(and in an editable install) but not from an installed wheel, as on a node installed per the README."""

from __future__ import annotations

import tomllib

from tests.support.netns_env import REPO_ROOT

TOP_LEVEL = ("cri_proto", "probe_api", "probe_worker", "probe_zygote", "probectl", "shim")


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for top in TOP_LEVEL for init in (REPO_ROOT / top).rglob("__init__.py")
    }
    assert found == listed
