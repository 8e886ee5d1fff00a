"""The wheel holds every package of the project: a package missing from pyproject's list imports in a checkout
(and in an editable install) but not from an installed wheel, as on a node installed per docs/install.md."""

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


def test_the_version_is_written_once_and_installed_as_written():
    """probe_api/defaults.py SHIM_VERSION is the one source: pyproject reads it, the installed metadata says it."""
    import importlib.metadata

    from probe_api.defaults import SHIM_VERSION

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "probe_api.defaults.SHIM_VERSION"}
    assert importlib.metadata.version("cri-probe-shim") == SHIM_VERSION
