"""Cancelling tasks so that they really end, on Python 3.11.

Python 3.11's ``asyncio.wait_for`` can swallow a cancellation that lands just as its timeout fires
(gh-86296, fixed in 3.12), and nats-py waits for messages with ``wait_for``. A task cancelled at that
moment carries on as if nothing happened, and whoever awaits it after ``cancel()`` waits for ever: a
service's stop, or a test's teardown, hangs. :func:`cancel_and_wait` cancels again until the task is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any, Final

RECANCEL_S: Final = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task and wait until each has ended, cancelling again any that swallowed it."""
    every = list(tasks)
    pending = {t for t in every if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in every:
        if not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()  # retrieved, so no "exception was never retrieved" at exit


def cancel_swallowed() -> bool:
    """Whether the running task was asked to cancel and the request was swallowed on its way (see the
    module): a retry loop that catches ``Exception`` checks this before it tries again, and ends with
    ``CancelledError`` instead of retrying for ever. Python 3.11 counts the requests a task has not
    acknowledged (``Task.cancelling``); a cancellation delivered as such never reaches ``except
    Exception``."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
