"""Paged lists read the store once per walk (nodus_kit.listing): later pages come from the rows kept for
their continue token, as the first page saw them; a token whose rows are gone reads the store again."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit import listing
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta


def job(ns: str, name: str, labels: dict[str, str] | None = None) -> Job:
    return Job(
        metadata=ObjectMeta(name=name, namespace=ns, labels=labels or {}), spec=JobSpec(image="busybox")
    )


@pytest.fixture
def jobs(nc: NATS) -> ObjectStore[Job]:
    return ObjectStore(nc, "jobs", Job)


async def _walk(jobs: ObjectStore[Job], ns: str, limit: int, **kw: object) -> list[str]:
    names, token = [], None
    while True:
        page = await jobs.list(ns, limit=limit, continue_token=token, **kw)  # type: ignore[arg-type]
        names += [j.metadata.name or "" for j in page.items]
        if not page.continue_token:
            return names
        token = page.continue_token


async def test_later_pages_show_the_first_pages_state(jobs: ObjectStore[Job], unique: str) -> None:
    for i in range(5):
        await jobs.create(job(unique, f"j{i}"))
    first = await jobs.list(unique, limit=2)
    changed = await jobs.get(unique, "j3")
    await jobs.update(msgspec.structs.replace(changed, spec=JobSpec(image="v2")))
    await jobs.delete(unique, "j4")
    await jobs.create(job(unique, "j5"))
    rest = await jobs.list(unique, limit=10, continue_token=first.continue_token)
    # A consistent snapshot at the first page's resourceVersion, as Kubernetes' continue tokens give.
    assert [j.metadata.name for j in rest.items] == ["j2", "j3", "j4"]
    assert rest.items[1].spec.image == "busybox"
    assert rest.resource_version == first.resource_version and rest.continue_token is None


async def test_a_token_whose_rows_are_gone_reads_the_store(
    nc: NATS, jobs: ObjectStore[Job], unique: str
) -> None:
    for i in range(4):
        await jobs.create(job(unique, f"j{i}"))
    first = await jobs.list(unique, limit=2)
    await jobs.delete(unique, "j3")
    other = ObjectStore(nc, "jobs", Job)  # another gateway replica: the rows are not held there
    rest = await other.list(unique, limit=2, continue_token=first.continue_token)
    assert [j.metadata.name for j in rest.items] == ["j2"]


async def test_walks_with_selectors_and_a_repeated_token(jobs: ObjectStore[Job], unique: str) -> None:
    for i in range(9):
        await jobs.create(job(unique, f"j{i}", {"odd": str(i % 2)}))
    odd = Selector.parse("odd=1")
    assert await _walk(jobs, unique, 2, selector=odd) == ["j1", "j3", "j5", "j7"]
    assert await _walk(jobs, unique, 4) == [f"j{i}" for i in range(9)]
    first = await jobs.list(unique, limit=3)
    token = first.continue_token
    # The gateway's filtered lists ask twice with one token (everything after it, then a page).
    everything = await jobs.list(unique, continue_token=token)
    page = await jobs.list(unique, limit=3, continue_token=token)
    assert [j.metadata.name for j in everything.items] == [f"j{i}" for i in range(3, 9)]
    assert [j.metadata.name for j in page.items] == ["j3", "j4", "j5"] and page.remaining == 3


def test_held_rows_are_bounded() -> None:
    held = listing.Held(max_bytes=3 * (10 + listing.ROW_OVERHEAD))
    scope = ("ns", None)
    a: listing.Rows = [(f"a{i}", b"x" * 10, i) for i in range(3)]
    held.put(scope, "ta", a, 1, 7)
    assert held.get(scope, "ta") == listing.Rest(a, 1, 7)
    b: listing.Rows = [(f"b{i}", b"y" * 10, i) for i in range(2)]
    held.put(scope, "tb", b, 1, 8)  # over the bound: the least recently used rows go
    assert held.get(scope, "ta") is None and held.get(scope, "tb") is not None
    held.release(b)
    assert held.get(scope, "tb") is None
