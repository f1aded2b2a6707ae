"""ObjectStore against a real nats-server: CAS, list, selectors, watch semantics, restart, 410."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.errors import MaxPayloadError

from nodus_kit import declaring, watching
from nodus_kit.connecting import connect
from nodus_kit.errors import AlreadyExists, Conflict, Expired, Invalid, NotFound
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.natsserver import NatsServer


def job(ns: str, name: str, labels: dict[str, str] | None = None, image: str = "busybox") -> Job:
    return Job(
        metadata=ObjectMeta(name=name, namespace=ns, labels=labels or {}),
        spec=JobSpec(image=image, command=["true"]),
    )


@pytest.fixture
def jobs(nc: NATS) -> ObjectStore[Job]:
    return ObjectStore(nc, "jobs", Job)


async def test_create_get_stamps_uid_time_and_revision(jobs: ObjectStore[Job], unique: str) -> None:
    created = await jobs.create(job(unique, "a"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    got = await jobs.get(unique, "a")
    assert got == created
    assert int(got.metadata.resource_version or 0) > 0


async def test_create_twice_is_already_exists(jobs: ObjectStore[Job], unique: str) -> None:
    await jobs.create(job(unique, "a"))
    with pytest.raises(AlreadyExists):
        await jobs.create(job(unique, "a", image="other"))
    assert (await jobs.get(unique, "a")).spec.image == "busybox"  # the loser changed nothing


async def test_get_missing_is_not_found(jobs: ObjectStore[Job], unique: str) -> None:
    with pytest.raises(NotFound):
        await jobs.get(unique, "nope")


async def test_update_is_compare_and_set(jobs: ObjectStore[Job], unique: str) -> None:
    v1 = await jobs.create(job(unique, "a"))
    v2 = await jobs.update(msgspec.structs.replace(v1, spec=JobSpec(image="v2")))
    assert int(v2.metadata.resource_version or 0) > int(v1.metadata.resource_version or 0)
    with pytest.raises(Conflict):
        await jobs.update(msgspec.structs.replace(v1, spec=JobSpec(image="stale")))
    assert (await jobs.get(unique, "a")).spec.image == "v2"


async def test_two_concurrent_cas_writers_exactly_one_wins(jobs: ObjectStore[Job], unique: str) -> None:
    base = await jobs.create(job(unique, "race"))
    writers = [jobs.update(msgspec.structs.replace(base, spec=JobSpec(image=f"w{i}"))) for i in range(2)]
    results = await asyncio.gather(*writers, return_exceptions=True)
    wins = [r for r in results if isinstance(r, Job)]
    losses = [r for r in results if isinstance(r, Conflict)]
    assert len(wins) == 1 and len(losses) == 1
    assert (await jobs.get(unique, "race")).spec.image == wins[0].spec.image


async def test_many_concurrent_mutators_lose_no_increment(jobs: ObjectStore[Job], unique: str) -> None:
    await jobs.create(msgspec.structs.replace(job(unique, "counter"), spec=JobSpec(backoff_limit=0)))

    def bump(j: Job) -> Job:
        return msgspec.structs.replace(j, spec=JobSpec(backoff_limit=(j.spec.backoff_limit or 0) + 1))

    await asyncio.gather(*(jobs.mutate(unique, "counter", bump) for _ in range(20)))
    assert (await jobs.get(unique, "counter")).spec.backoff_limit == 20


async def test_mutate_over_a_held_copy_loses_no_write_when_the_copy_is_stale(
    jobs: ObjectStore[Job], unique: str
) -> None:
    """``seen`` (an informer's copy) is tried first by compare-and-set: stale, it conflicts and the change
    is made again over a fresh read, so what was written since is kept."""
    created = await jobs.create(msgspec.structs.replace(job(unique, "held"), spec=JobSpec(backoff_limit=0)))

    def bump(j: Job) -> Job:
        return msgspec.structs.replace(j, spec=JobSpec(backoff_limit=(j.spec.backoff_limit or 0) + 1))

    fresh = await jobs.mutate(unique, "held", bump, seen=created)  # current: one write over the copy
    assert fresh.spec.backoff_limit == 1
    stale = await jobs.mutate(unique, "held", bump, seen=created)  # stale: read again, nothing lost
    assert stale.spec.backoff_limit == 2
    assert (await jobs.get(unique, "held")).spec.backoff_limit == 2


async def test_delete_then_recreate_gets_a_new_uid(jobs: ObjectStore[Job], unique: str) -> None:
    first = await jobs.create(job(unique, "a"))
    deleted = await jobs.delete(unique, "a")
    assert deleted.metadata.deletion_timestamp
    with pytest.raises(NotFound):
        await jobs.get(unique, "a")
    again = await jobs.create(job(unique, "a"))
    assert again.metadata.uid != first.metadata.uid


async def test_delete_with_stale_precondition_conflicts(jobs: ObjectStore[Job], unique: str) -> None:
    v1 = await jobs.create(job(unique, "a"))
    await jobs.update(msgspec.structs.replace(v1, spec=JobSpec(image="v2")))
    with pytest.raises(Conflict):
        await jobs.delete(unique, "a", resource_version=v1.metadata.resource_version)
    await jobs.get(unique, "a")  # still there


async def test_list_pages_with_limit_and_continue(jobs: ObjectStore[Job], unique: str) -> None:
    for i in range(7):
        await jobs.create(job(unique, f"j{i}"))
    names: list[str] = []
    token = None
    pages = 0
    while True:
        page = await jobs.list(unique, limit=3, continue_token=token)
        names += [j.metadata.name or "" for j in page.items]
        pages += 1
        if not page.continue_token:
            break
        assert page.remaining == 7 - len(names)
        token = page.continue_token
    assert names == [f"j{i}" for i in range(7)] and pages == 3


async def test_list_filters_by_label_selector(jobs: ObjectStore[Job], unique: str) -> None:
    await jobs.create(job(unique, "a", {"nodus.dev/sweep": "s1", "gpu": "H100"}))
    await jobs.create(job(unique, "b", {"nodus.dev/sweep": "s1", "gpu": "L4"}))
    await jobs.create(job(unique, "c", {"nodus.dev/sweep": "s2"}))
    sel = Selector.parse("nodus.dev/sweep=s1,gpu notin (L4)")
    assert [j.metadata.name for j in (await jobs.list(unique, selector=sel)).items] == ["a"]
    sel = Selector.parse("!gpu")
    assert [j.metadata.name for j in (await jobs.list(unique, selector=sel)).items] == ["c"]


def test_bad_selector_says_what_is_allowed() -> None:
    with pytest.raises(Invalid, match="key in"):
        Selector.parse("a in b")


async def test_bad_continue_token_is_invalid(jobs: ObjectStore[Job], unique: str) -> None:
    with pytest.raises(Invalid, match="list again"):
        await jobs.list(unique, continue_token="garbage!")


async def test_watch_tells_added_modified_deleted(jobs: ObjectStore[Job], unique: str) -> None:
    start = await jobs.last_revision()
    async with jobs.watch(unique, resource_version=start) as w:
        a = await jobs.create(job(unique, "a"))
        await jobs.update(msgspec.structs.replace(a, spec=JobSpec(image="v2")))
        await jobs.delete(unique, "a")
        events = [await w.next(timeout=5) for _ in range(3)]
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1].object.spec.image == "v2"
    assert events[2].object.metadata.deletion_timestamp  # DELETED carries the last state
    assert [e.revision for e in events] == sorted(e.revision for e in events)


async def test_watch_without_revision_starts_with_current_objects(
    jobs: ObjectStore[Job], unique: str
) -> None:
    await jobs.create(job(unique, "a"))
    await jobs.create(job(unique, "b"))
    async with jobs.watch(unique) as w:
        initial = [await w.next(timeout=5) for _ in range(2)]
        await jobs.create(job(unique, "c"))
        later = await w.next(timeout=5)
    assert {(e.type, e.object.metadata.name) for e in initial} == {("ADDED", "a"), ("ADDED", "b")}
    assert (later.type, later.object.metadata.name) == ("ADDED", "c")


async def test_watch_from_list_revision_misses_nothing(jobs: ObjectStore[Job], unique: str) -> None:
    for i in range(3):
        await jobs.create(job(unique, f"before{i}"))
    page = await jobs.list(unique)
    writes = [jobs.create(job(unique, f"after{i}")) for i in range(10)]
    await asyncio.gather(*writes)
    async with jobs.watch(unique, resource_version=page.resource_version) as w:
        seen = {(await w.next(timeout=5)).object.metadata.name for _ in range(10)}
        with pytest.raises(asyncio.TimeoutError):
            await w.next(timeout=0.3)  # nothing from before the list comes again
    assert seen == {f"after{i}" for i in range(10)}


# -- a server of its own: restarts and compaction must not disturb the other tests -------------------
@pytest_asyncio.fixture
async def own_server() -> AsyncIterator[tuple[NatsServer, NATS]]:
    server = NatsServer().start()
    conn = await connect(server.url, "tests-own", nkey_seed=server.harness_seed)
    await declaring.ensure(conn.jetstream())
    yield server, conn
    await conn.close()
    server.close()


@pytest.mark.slow
async def test_watch_resumes_across_server_restart_without_gaps(own_server: tuple[NatsServer, NATS]) -> None:
    server, conn = own_server
    jobs = ObjectStore(conn, "jobs", Job)
    for i in range(5):
        await jobs.create(job("p", f"pre{i}"))
    async with jobs.watch("p", resource_version=await jobs.last_revision()) as w:
        for i in range(5):
            await jobs.create(job("p", f"a{i}"))
        got = [(await w.next(timeout=5)).object.metadata.name for _ in range(3)]
        # A hard crash of the server mid-stream: acked writes survive (sync_interval: always).
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)
        for i in range(5):
            await jobs.create(job("p", f"b{i}"))  # done once the connection is back
        # The watch sees the reconnection and looks for its consumer (gone with the server's memory) at
        # its next wake, not only after two missed heartbeats.
        back_by = asyncio.get_running_loop().time() + watching.MISSED_BEATS * watching.HEARTBEAT_S
        got += [(await w.next(timeout=20)).object.metadata.name for _ in range(7)]
        assert asyncio.get_running_loop().time() < back_by
        with pytest.raises(asyncio.TimeoutError):
            await w.next(timeout=0.5)
    assert got == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]


async def test_expired_revision_is_410(own_server: tuple[NatsServer, NATS]) -> None:
    _, conn = own_server
    jobs = ObjectStore(conn, "jobs", Job)
    old = int((await jobs.create(job("p", "a"))).metadata.resource_version or 0)
    await jobs.delete("p", "a")
    await jobs.create(job("p", "b"))
    assert await jobs.compact(older_than_s=0) == 1  # the delete marker of "a" is gone for good
    with pytest.raises(Expired, match="list again"):
        await jobs.watch("p", resource_version=old).start()
    # From a current revision the watch works, and a list still shows what is live.
    async with jobs.watch("p", resource_version=await jobs.last_revision()):
        pass
    assert [j.metadata.name for j in (await jobs.list("p")).items] == ["b"]


# -- group commit of creates (ADR-0034) ------------------------------------------------------------------
async def _batch_ids(nc: NATS, first: int, last: int) -> list[str | None]:
    js = nc.jetstream()
    return [
        ((await js.get_msg("KV_jobs", seq)).headers or {}).get("Nats-Batch-Id")
        for seq in range(first, last + 1)
    ]


async def test_concurrent_creates_are_committed_together_each_with_its_own_revision(
    jobs: ObjectStore[Job], nc: NATS, unique: str
) -> None:
    created = await asyncio.gather(*(jobs.create(job(unique, f"j{i}")) for i in range(40)))
    revisions = sorted(int(c.metadata.resource_version or 0) for c in created)
    assert len(set(revisions)) == 40 and revisions[-1] - revisions[0] == 39  # consecutive, one each
    for c in created:  # what each caller got is what is stored, under its revision
        assert await jobs.get(unique, c.metadata.name or "") == c
    ids = await _batch_ids(nc, revisions[0], revisions[-1])
    assert None not in ids and len(set(ids)) < 40, ids  # written as atomic batches, not one by one


async def test_a_batch_with_a_taken_name_gives_each_create_its_own_answer(
    jobs: ObjectStore[Job], unique: str
) -> None:
    await jobs.create(job(unique, "taken", image="first"))
    names = ["a", "taken", "b", "c"]
    results = await asyncio.gather(
        *(jobs.create(job(unique, n, image="second")) for n in names), return_exceptions=True
    )
    kinds = dict(zip(names, (type(r).__name__ for r in results), strict=True))
    assert kinds == {"a": "Job", "taken": "AlreadyExists", "b": "Job", "c": "Job"}
    assert (await jobs.get(unique, "taken")).spec.image == "first"  # the refused batch stored nothing
    assert {(await jobs.get(unique, n)).spec.image for n in ("a", "b", "c")} == {"second"}


async def test_one_name_created_many_times_at_once_is_created_once(
    jobs: ObjectStore[Job], unique: str
) -> None:
    results = await asyncio.gather(
        *(jobs.create(job(unique, "same")) for _ in range(6)), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["AlreadyExists"] * 5 + ["Job"]


async def test_a_deleted_name_is_created_again_within_a_batch(jobs: ObjectStore[Job], unique: str) -> None:
    old = await jobs.create(job(unique, "again"))
    await jobs.delete(unique, "again")
    results = await asyncio.gather(jobs.create(job(unique, "again")), jobs.create(job(unique, "other")))
    assert results[0].metadata.uid != old.metadata.uid
    assert await jobs.get(unique, "again") == results[0]


async def test_a_bucket_without_atomic_batches_still_takes_concurrent_creates(nc: NATS, unique: str) -> None:
    # A stream declared before ADR-0034 (no allow_atomic): the first batch is refused as a whole, its
    # creates are made one by one, and the store stops batching for that bucket.
    from nats.js.api import StreamConfig

    bucket = f"plain{unique.replace('-', '')}"[:30]
    await nc.jetstream().add_stream(
        StreamConfig(
            name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], max_msgs_per_subject=1, allow_direct=True
        )
    )
    store = ObjectStore(nc, bucket, Job)
    first = await asyncio.gather(*(store.create(job(unique, f"x{i}")) for i in range(5)))
    second = await asyncio.gather(*(store.create(job(unique, f"y{i}")) for i in range(5)))
    assert len({c.metadata.resource_version for c in [*first, *second]}) == 10
    assert [(await store.get(unique, f"y{i}")).metadata.uid for i in range(5)] == [
        c.metadata.uid for c in second
    ]
    await nc.jetstream().delete_stream(f"KV_{bucket}")


async def test_a_value_too_large_with_its_headers_is_refused_and_the_connection_stays(
    jobs: ObjectStore[Job], nc: NATS, unique: str
) -> None:
    """nats-server bounds headers and payload together; nats-py checks the payload alone, and a write over
    the bound with its headers made the server close the connection (every request in flight on it
    failed). A value that leaves less than HEADER_ROOM is refused before it is sent."""
    small = await jobs.create(job(unique, "a"))

    def padded(pad: str) -> Job:
        meta = msgspec.structs.replace(small.metadata, annotations={"pad": pad})
        return msgspec.structs.replace(small, metadata=meta)

    # 10 bytes under max_payload by itself, over it with the write's headers.
    big = padded("x" * (nc.max_payload - len(msgspec.json.encode(padded(""))) - 10))
    assert len(msgspec.json.encode(big)) < nc.max_payload
    with pytest.raises(MaxPayloadError):
        await jobs.update(big)
    named_b = msgspec.structs.replace(big, metadata=msgspec.structs.replace(big.metadata, name="b"))
    with pytest.raises(MaxPayloadError):
        await jobs.create(named_b)
    assert nc.is_connected
    assert (await jobs.get(unique, "a")) == small  # nothing written, and the store still answers
