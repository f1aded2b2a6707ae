"""A book's committer that is cancelled mid-write (the loop shutting down, a client cancelling a request
under it) never leaves a caller waiting for good: the callers of its batch, and those queued behind it,
are told Unavailable, and the next call starts a new committer that writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import Grant
from nodus_kit.errors import Unavailable

pytestmark = pytest.mark.timeout(60)


async def test_a_cancelled_commit_fails_its_callers_and_the_next_one_writes(nc: NATS) -> None:
    books = Books(nc)
    await books.apply("cancelled", [Grant(grant_id="first", project="cancelled", amount_micros=1)])
    update = books.store.update
    entered, queued, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def cancelled(book: Any) -> Any:
        entered.set()
        await release.wait()  # until the second caller has queued behind this write
        raise asyncio.CancelledError

    async def behind() -> Any:
        queued.set()  # apply queues the caller before its first await: queued once this task waits
        return await books.apply("cancelled", [Grant(grant_id="b", project="cancelled", amount_micros=3)])

    books.store.update = cancelled  # type: ignore[method-assign]
    first = asyncio.create_task(
        books.apply("cancelled", [Grant(grant_id="a", project="cancelled", amount_micros=2)])
    )
    await entered.wait()
    second = asyncio.create_task(behind())
    await queued.wait()
    release.set()
    _, pending = await asyncio.wait({first, second}, timeout=10)
    assert not pending, "a caller waits for good on a committer that is gone"
    for task in (first, second):
        with pytest.raises(Unavailable, match="cancelled"):
            task.result()
    books.store.update = update  # type: ignore[method-assign]
    applied = await asyncio.wait_for(
        books.apply("cancelled", [Grant(grant_id="c", project="cancelled", amount_micros=4)]), 10
    )
    assert applied.results[0] is not None and applied.results[0].ok
    state = await Books(nc).read("cancelled")
    assert state.balances["project:cancelled:available"] == 5, "the first and the last grants, once each"
