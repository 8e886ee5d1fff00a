"""The daemon's one sandbox directory: fresh and remembered resolutions, identities, the stopped set, and one path
that forgets them (shim/sandboxes/directory.py)."""

from __future__ import annotations

import asyncio

from shim.sandboxes.directory import SandboxDirectory
from shim.sandboxes.resolver import SandboxInfo
from tests.support.sandbox_sources import FakeSource, info, pause  # noqa: F401  (pause: a fixture)


def test_resolve_asks_the_source_every_time_and_resolve_cached_once(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        directory = SandboxDirectory(source)
        await directory.resolve("sb")
        await directory.resolve("sb")
        assert source.calls == ["sb", "sb"]  # RunProbe and a resume ask afresh
        first = await directory.resolve_cached("sb")
        assert await directory.resolve_cached("sb") == first
        assert source.calls == ["sb", "sb", "sb"]  # ExecProbe and the bridge: once while it lives
        directory.close()

    asyncio.run(main())


def test_a_sandbox_stopping_ends_the_remembered_resolution_and_a_stop_is_remembered(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        directory = SandboxDirectory(source)
        await directory.resolve_cached("sb")
        directory.sandbox_stopping("sb", removed=False)
        assert directory.is_stopped("sb")
        await directory.resolve_cached("sb")
        assert source.calls == ["sb", "sb"]
        directory.sandbox_stopping("sb", removed=True)
        await directory.resolve_cached("sb")
        assert source.calls == ["sb", "sb", "sb"]
        directory.close()

    asyncio.run(main())


def test_removal_is_not_a_stop_and_forget_drops_identity_and_mark():
    directory = SandboxDirectory(source=None)
    web = SandboxInfo(id="sb1", netns_path="/var/run/netns/a", name="web-0", namespace="shop", uid="u1")
    directory.note(web)
    directory.sandbox_stopping("sb2", removed=True)
    assert not directory.is_stopped("sb2") and directory.remembered() == {"sb1"}
    directory.sandbox_stopping("sb3", removed=False)
    assert directory.identity("sb1") == web and directory.known() == {"sb1": web}
    assert directory.remembered() == {"sb1", "sb3"}
    directory.forget("sb1")
    directory.forget("sb3")
    assert directory.identity("sb1") is None and not directory.is_stopped("sb3") and directory.remembered() == set()
