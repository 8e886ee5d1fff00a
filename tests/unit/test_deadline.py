"""probe_worker/deadline.py: an attempt's timeout scopes on one timer behave as asyncio.timeout_at's."""

from __future__ import annotations

import asyncio

import pytest

from probe_worker.deadline import AttemptDeadline

WAIT_S = 5


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


def test_a_scope_suspended_past_the_deadline_raises_timeout_error_and_leaves_the_task_usable():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = AttemptDeadline(loop.time() + 0.05)
        with pytest.raises(TimeoutError):
            async with deadline.scope():
                await asyncio.sleep(WAIT_S)
        assert asyncio.current_task().cancelling() == 0
        await asyncio.sleep(0)  # no cancellation left behind
        deadline.close()
        return loop.time()

    run(main())


def test_sequential_scopes_share_the_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = AttemptDeadline(start + 0.1)
        async with deadline.scope():
            await asyncio.sleep(0.01)  # well within: no TimeoutError
        with pytest.raises(TimeoutError):
            async with deadline.scope():
                await asyncio.sleep(WAIT_S)
        deadline.close()
        return loop.time() - start

    assert 0.1 <= run(main()) < 1


def test_a_deadline_passed_between_scopes_ends_the_next_at_its_first_suspension_only():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = AttemptDeadline(loop.time() + 0.02)
        async with deadline.scope():
            pass  # the timer is armed
        await asyncio.sleep(0.05)  # it fires with no scope open: nothing is cancelled
        async with deadline.scope():
            value = 1  # nothing suspends: as asyncio.timeout_at of a past deadline, it completes
        with pytest.raises(TimeoutError):
            async with deadline.scope():
                await asyncio.sleep(WAIT_S)
        deadline.close()
        return value

    assert run(main()) == 1


def test_a_nested_scope_or_one_of_another_task_is_a_plain_asyncio_timeout():
    async def main():
        loop = asyncio.get_running_loop()
        deadline = AttemptDeadline(loop.time() + 0.05)
        with pytest.raises(TimeoutError):
            async with deadline.scope():
                assert isinstance(deadline.scope(), asyncio.Timeout)
                async with deadline.scope():
                    await asyncio.sleep(WAIT_S)

        async def other() -> object:
            return deadline.scope()

        assert isinstance(await asyncio.create_task(other()), asyncio.Timeout)
        deadline.close()

    run(main())


def test_a_cancellation_from_outside_stays_a_cancellation():
    async def attempt(started: asyncio.Event):
        deadline = AttemptDeadline(asyncio.get_running_loop().time() + WAIT_S)
        try:
            async with deadline.scope():
                started.set()
                await asyncio.sleep(WAIT_S)
        finally:
            deadline.close()

    async def main():
        started = asyncio.Event()
        task = asyncio.create_task(attempt(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
