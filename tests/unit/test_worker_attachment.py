"""A sandbox's attachment to its group's worker (shim/workers/records.py `Member.move`), and the zygote pool's
count of the workers adopted from an earlier daemon's zygote: pure state, no process."""

from __future__ import annotations

import asyncio

import pytest

from shim.workers.backoff import Backoff, BackoffPolicy
from shim.workers.records import Attachment, Member, SandboxTarget
from shim.workers.zygote_pool import ZygotePool


def member() -> Member:
    return Member(target=SandboxTarget("sb1", "/run/netns/a"), group=None, backoff=Backoff(BackoffPolicy()))


async def idle() -> None:
    await asyncio.sleep(3600)


def test_attaching_and_failed_come_with_their_task_and_nothing_else_does():
    async def main():
        m = member()
        with pytest.raises(ValueError):
            m.move(Attachment.ATTACHING)
        task = asyncio.create_task(idle())
        with pytest.raises(ValueError):
            m.move(Attachment.RECONCILING, task=task)
        task.cancel()

    asyncio.run(main())


def test_attached_keeps_the_task_that_replays_the_probes_and_detached_cancels_it():
    async def main():
        m = member()
        task = asyncio.create_task(idle())
        m.move(Attachment.ATTACHING, task=task)
        m.move(Attachment.ATTACHED, netns_inode=7)
        assert (m.attachment, m.task, m.netns_inode, m.attached) == (Attachment.ATTACHED, task, 7, True)
        m.move(Attachment.DETACHED)
        await asyncio.sleep(0)
        assert task.cancelled() and m.task is None and m.netns_inode == 0 and not m.attached

    asyncio.run(main())


def test_a_failed_attachment_says_why_and_its_retry_replaces_the_task_that_failed():
    async def main():
        m = member()

        async def attempt() -> None:
            retry = asyncio.create_task(idle())
            m.move(Attachment.FAILED, task=retry, error="netns gone")  # from the failing task itself
            assert not asyncio.current_task().cancelling()

        first = asyncio.create_task(attempt())
        m.move(Attachment.ATTACHING, task=first)
        await first
        assert (m.attachment, m.error, m.attached) == (Attachment.FAILED, "netns gone", False)
        assert m.task is not first and not m.task.done()
        m.move(Attachment.DETACHED)
        assert m.error == ""
        await asyncio.sleep(0)
        assert m.task is None

    asyncio.run(main())


def test_reconciling_counts_as_attached_until_the_adoption_made_it_attached():
    m = member()
    m.move(Attachment.RECONCILING, netns_inode=9)
    assert m.attached and m.task is None
    m.move(Attachment.ATTACHED, netns_inode=m.netns_inode)
    assert m.attached and m.netns_inode == 9


class FakeZygote:
    def __init__(self) -> None:
        self.closed = 0
        self.pid = 1

    async def close(self) -> None:
        self.closed += 1


def test_an_adopted_zygote_is_stopped_with_the_last_of_its_adopted_workers():
    async def main():
        pool = ZygotePool(factory=None, backoff=BackoffPolicy())
        old, spawner = FakeZygote(), FakeZygote()
        pool._adopted[old] = 2  # as _take_over leaves it: two workers adopted from it
        pool._spawner = spawner
        pool.release(old)
        await asyncio.sleep(0)
        assert old.closed == 0  # one of its workers still runs
        pool.release(spawner)  # the spawner is never stopped for its workers
        pool.release(old)
        await asyncio.sleep(0)
        assert (old.closed, spawner.closed) == (1, 0)
        pool.release(old)  # once only
        await asyncio.sleep(0)
        assert old.closed == 1

    asyncio.run(main())
