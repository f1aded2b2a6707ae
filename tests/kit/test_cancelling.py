"""cancel_and_wait ends a task even when it swallows a cancellation (Python 3.11's wait_for can)."""

from __future__ import annotations

import asyncio

from nodus_kit.cancelling import cancel_and_wait


async def test_a_task_that_swallows_one_cancellation_is_cancelled_again_and_ends() -> None:
    swallowed = 0
    waiting = asyncio.Event()

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                waiting.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # as wait_for does when the cancel lands with its timeout

    task = asyncio.create_task(stubborn())
    await asyncio.wait_for(waiting.wait(), 5)  # it waits where a cancellation lands
    await asyncio.wait_for(cancel_and_wait([task]), 5)
    assert task.cancelled() and swallowed == 1


async def test_finished_and_failed_tasks_are_fine() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def returns() -> None:
        return None

    done = asyncio.create_task(returns())
    failed = asyncio.create_task(fails())
    await asyncio.wait([done, failed])
    await cancel_and_wait([done, failed])  # no error, and the failure counts as retrieved
    assert done.done() and failed.done()
