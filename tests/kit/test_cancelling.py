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


async def test_a_retry_loop_cancelled_once_ends_though_the_cancellation_became_an_error() -> None:
    """What a test's or a process's last ``cancel()`` meets (the event loop cancels leftovers once): a
    watch that retries on ``Exception`` while nats-py turned the cancellation into "connection closed".
    ``cancel_swallowed`` ends the loop; without it the loop retries for ever and the teardown hangs."""
    from nodus_kit.cancelling import cancel_swallowed

    waiting, tries = asyncio.Event(), 0

    async def watch() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("nats: connection closed") from None  # the cancellation, swallowed

    async def follow() -> None:
        nonlocal tries
        while True:
            try:
                tries += 1
                await watch()
            except Exception as e:
                if cancel_swallowed():
                    raise asyncio.CancelledError from e
                await asyncio.sleep(0)

    task = asyncio.create_task(follow())
    await asyncio.wait_for(waiting.wait(), 5)
    task.cancel()  # once, as asyncio.run's and pytest-asyncio's teardown do
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done and task.cancelled() and tries == 1
