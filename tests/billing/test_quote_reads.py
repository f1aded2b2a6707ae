"""Quotes read only what they read of a book, and share those reads (issue #23): a burst of quotes for one
project costs two reads of its book, each quote is answered from a read that started after it arrived, and
the glance of a book answers what the whole book answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import Grant
from nodus_billing.quoting import QuoteReads
from nodus_billing.standing import State, available


class _Reads(QuoteReads):
    """Reads that wait until released, and say which read (by its number) answered."""

    def __init__(self, nc: NATS) -> None:
        super().__init__(Books(nc))
        self.started = 0
        self.release: list[asyncio.Event] = []

    async def _glance(self, project: str) -> Any:
        self.started += 1
        number = self.started
        gate = asyncio.Event()
        self.release.append(gate)
        await gate.wait()
        if project == "broken":
            raise RuntimeError("bucket unreachable")
        return number


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)  # let the tasks reach their awaits (no timing: a fixed number of turns)


async def test_a_burst_costs_two_reads_and_no_quote_shares_a_read_that_started_before_it(nc: NATS) -> None:
    books = reads = _Reads(nc)
    first = asyncio.create_task(reads.read("p"))
    await _settle()
    assert books.started == 1
    burst = [asyncio.create_task(reads.read("p")) for _ in range(10)]  # while read 1 is in flight
    await _settle()
    assert books.started == 1  # they wait for the next read, not read 1
    books.release[0].set()
    await _settle()
    assert await first == 1 and books.started == 2
    books.release[1].set()
    assert await asyncio.gather(*burst) == [2] * 10
    assert reads.reads == 2


async def test_projects_do_not_share_and_a_failed_read_fails_its_waiters_only(nc: NATS) -> None:
    books = reads = _Reads(nc)
    broken = [asyncio.create_task(reads.read("broken")) for _ in range(3)]
    fine = asyncio.create_task(reads.read("p"))
    await _settle()
    assert books.started == 2
    for gate in books.release:
        gate.set()
    await _settle()
    books.release[-1].set()  # the broken project's waiters' shared read
    results = await asyncio.gather(*broken, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert await fine == 2 and books.started == 3  # broken: read 1, then read 3 for the two that waited
    again = asyncio.create_task(reads.read("broken"))
    await _settle()
    books.release[-1].set()
    with pytest.raises(RuntimeError):
        await again


async def test_the_glance_answers_what_the_whole_book_answers(nc: NATS, unique: str) -> None:
    books = Books(nc, starting_micros=7_000_000)
    reads = QuoteReads(books)
    opening = await reads.read(unique)  # no book yet: the whole read, with the starting credits
    assert available(opening, unique) == 7_000_000
    await books.apply(
        unique, [Grant(grant_id=f"g{i}", project=unique, amount_micros=1_000) for i in range(50)]
    )
    whole, glance = await books.read(unique), await reads.read(unique)
    assert glance == State(budgets=whole.budgets, holds=whole.holds, balances=whole.balances)
    assert available(glance, unique) == available(whole, unique) == 7_050_000
    assert whole.ledger and not glance.ledger  # the bulk of the book is not read
    assert await reads.read(unique, whole=True) == whole


async def test_an_opening_state_is_kept_and_never_changed_by_a_commit(nc: NATS, unique: str) -> None:
    books = Books(nc, starting_micros=7_000_000)
    opening = await books.read(unique)  # no book yet: the opening state, kept for the next read
    assert await books.read(unique) is opening
    await books.apply(unique, [Grant(grant_id="g", project=unique, amount_micros=1_000)])
    assert available(opening, unique) == 7_000_000  # the commit applied to a copy
    assert available(await books.read(unique), unique) == 7_001_000
    assert available(books.opening(unique), unique) == 7_000_000  # what a project without its book opens
