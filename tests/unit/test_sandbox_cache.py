"""ExecProbe's sandbox cache: a resolution is reused only while the sandbox's own process lives, within a TTL,
and until the CRI says the sandbox stops. Real child processes stand in for pause processes."""

from __future__ import annotations

import asyncio
import os

import pytest

from shim.sandboxes.cache import ResolvedSandboxes, fresh, open_pidfd, pidfd_exited
from shim.sandboxes.resolver import SandboxInfo, SandboxNotFound, SandboxNotReady
from tests.support.sandbox_sources import FakeSource, info, pause, stop  # noqa: F401  (pause: a fixture)


def test_fresh_needs_a_living_process_and_a_young_resolution():
    assert fresh(resolved_at=100.0, now=105.0, ttl_s=10.0, process_exited=False)
    assert not fresh(resolved_at=100.0, now=110.0, ttl_s=10.0, process_exited=False)
    assert not fresh(resolved_at=100.0, now=100.0, ttl_s=10.0, process_exited=True)
    assert not fresh(resolved_at=100.0, now=99.0, ttl_s=10.0, process_exited=False)  # a clock that went back


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pidfds() -> int:
    """How many pidfds this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
        except OSError:
            pass  # the fd listdir itself used, closed by now
    return count


def test_a_living_sandbox_is_resolved_once(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        cache = ResolvedSandboxes(source)
        first = await cache.resolve("sb")
        assert await cache.resolve("sb") == first and await cache.resolve("sb") == first
        assert source.calls == ["sb"]
        cache.close()

    asyncio.run(main())


def test_the_sandbox_process_exiting_ends_the_reuse_and_frees_its_fd(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        held_before = pidfds()  # the process's other pidfds (an earlier test's) are not the cache's
        cache = ResolvedSandboxes(source)
        await cache.resolve("sb")
        assert len(cache) == 1 and pidfds() - held_before == 1
        stop(proc)
        # Asked right away (before the loop saw the exit): the pidfd itself says the process is gone.
        source.answers["sb"] = SandboxNotReady("pod sandbox sb is not ready")
        with pytest.raises(SandboxNotReady):
            await cache.resolve("sb")
        assert source.calls == ["sb", "sb"] and len(cache) == 0
        assert pidfds() - held_before == 0

    asyncio.run(main())


def test_an_exit_drops_the_entry_without_any_call(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        held_before = pidfds()
        cache = ResolvedSandboxes(source)
        dropped = asyncio.Event()
        on_exit = cache._on_exit

        def observed(*args) -> None:
            on_exit(*args)
            dropped.set()

        cache._on_exit = observed  # the loop's reader callback, observed
        await cache.resolve("sb")
        stop(proc)
        await asyncio.wait_for(dropped.wait(), timeout=10)
        assert len(cache) == 0 and pidfds() - held_before == 0

    asyncio.run(main())


def test_a_resolution_expires_after_the_ttl(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})
    clock = Clock()

    async def main() -> None:
        cache = ResolvedSandboxes(source, ttl_s=10.0, clock=clock)
        await cache.resolve("sb")
        clock.now += 9.9
        await cache.resolve("sb")
        assert source.calls == ["sb"]
        clock.now += 0.2
        await cache.resolve("sb")
        assert source.calls == ["sb", "sb"]
        cache.close()

    asyncio.run(main())


def test_forget_makes_the_next_call_ask_the_runtime(pause):
    proc = pause()
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        held_before = pidfds()
        cache = ResolvedSandboxes(source)
        await cache.resolve("sb")
        cache.forget("sb")
        cache.forget("sb")  # twice, or for an unknown id: nothing happens
        assert pidfds() - held_before == 0
        source.answers["sb"] = SandboxNotFound("pod sandbox sb not found")
        with pytest.raises(SandboxNotFound):
            await cache.resolve("sb")

    asyncio.run(main())


def test_failures_and_sandboxes_without_a_process_are_never_remembered(pause):
    proc = pause()
    source = FakeSource({
        "gone": SandboxNotFound("pod sandbox gone not found"),
        "embedded": SandboxInfo(id="embedded", netns_path="/var/run/netns/embedded"),  # pid 0
        "not-ready": info("not-ready", proc.pid, ready=False),
    })

    async def main() -> None:
        cache = ResolvedSandboxes(source)
        for _ in range(2):
            with pytest.raises(SandboxNotFound):
                await cache.resolve("gone")
            await cache.resolve("embedded")
            await cache.resolve("not-ready")
        assert sorted(source.calls) == ["embedded"] * 2 + ["gone"] * 2 + ["not-ready"] * 2
        assert len(cache) == 0

    asyncio.run(main())


def test_a_process_that_cannot_be_opened_is_not_remembered(pause):
    proc = pause()
    stop(proc)  # reaped: its pid names no process now (nor, this soon, a new one)
    source = FakeSource({"sb": info("sb", proc.pid)})

    async def main() -> None:
        cache = ResolvedSandboxes(source)
        await cache.resolve("sb")
        await cache.resolve("sb")
        assert source.calls == ["sb", "sb"] and len(cache) == 0

    asyncio.run(main())


def test_the_oldest_resolution_makes_room(pause):
    procs = [pause() for _ in range(3)]
    source = FakeSource({f"sb{n}": info(f"sb{n}", p.pid) for n, p in enumerate(procs)})

    async def main() -> None:
        cache = ResolvedSandboxes(source, max_entries=2)
        for n in range(3):
            await cache.resolve(f"sb{n}")
        assert len(cache) == 2
        await cache.resolve("sb2")
        await cache.resolve("sb1")
        await cache.resolve("sb0")  # evicted first: asked again
        assert source.calls == ["sb0", "sb1", "sb2", "sb0"]
        cache.close()

    asyncio.run(main())


def test_pidfd_helpers_follow_one_process(pause):
    proc = pause()
    pidfd = open_pidfd(proc.pid)
    assert pidfd is not None
    try:
        assert not pidfd_exited(pidfd)
        stop(proc)
        assert pidfd_exited(pidfd)
    finally:
        os.close(pidfd)
