"""The informer: list then watch, a relist that replaces (no ghosts), newer wins, indexes, handlers."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.informing import Informer, by_label
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.waiting import eventually


def _job(ns: str, name: str, **labels: str) -> Job:
    return Job(metadata=ObjectMeta(name=name, namespace=ns, labels=labels), spec=JobSpec(image="busybox"))


async def test_lists_then_follows_changes_with_indexes(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    await jobs.create(_job(unique, "a", team="x"))
    informer = Informer(jobs, namespace=unique, indexers={"team": by_label("team")})
    events: list[tuple[str, str]] = []
    informer.add_handler(lambda e: events.append((e.type, e.object.metadata.name or "")))
    await informer.start()
    try:
        assert await informer.wait_synced(10)
        assert informer.get(unique, "a") is not None  # the list is in before synced is set
        b = await jobs.create(_job(unique, "b", team="x"))
        await eventually(lambda: len(informer.by_index("team", "x")) == 2, message=f"{events}")
        await jobs.update(
            msgspec.structs.replace(b, metadata=msgspec.structs.replace(b.metadata, labels={"team": "y"}))
        )
        await eventually(lambda: [j.metadata.name for j in informer.by_index("team", "y")] == ["b"])
        assert [j.metadata.name for j in informer.by_index("team", "x")] == ["a"]  # moved, not copied
        await jobs.delete(unique, "a")
        await eventually(lambda: informer.get(unique, "a") is None)
        assert informer.index_values("team") == ["y"]
        assert events == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
    finally:
        await informer.stop()


async def test_an_older_event_never_undoes_a_newer_write_or_a_delete(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    first = await jobs.create(_job(unique, "a"))
    second = await jobs.update(first)
    informer = Informer(jobs, namespace=unique)
    assert informer.apply(second)
    assert not informer.apply(first)  # late: the view keeps the newer one
    assert informer.get(unique, "a") == second
    gone = await jobs.delete(unique, "a")
    assert informer.apply(gone, deleted=True)
    assert not informer.apply(second)  # an event from before the delete cannot bring it back
    assert informer.get(unique, "a") is None


async def test_an_object_deleted_while_the_watch_was_down_leaves_no_ghost(nc: NATS, unique: str) -> None:
    """Deleted while nobody watched, its delete marker then compacted away: the relist replaces the view,
    and handlers hear DELETED for what vanished (client-go's Replace)."""
    jobs = ObjectStore(nc, "jobs", Job)
    await jobs.create(_job(unique, "ghost"))
    await jobs.create(_job(unique, "stays"))
    informer = Informer(jobs, namespace=unique)
    deleted: list[Event[Job]] = []
    informer.add_handler(lambda e: deleted.append(e) if e.type == "DELETED" else None)
    await informer.start()
    assert await informer.wait_synced(10)
    await informer.stop()  # the watch is down
    await jobs.delete(unique, "ghost")
    await jobs.compact(older_than_s=0)  # the delete marker is gone from the store's history too
    try:
        await informer.start()
        await eventually(lambda: informer.get(unique, "ghost") is None, message="the ghost stayed")
        assert [e.object.metadata.name for e in deleted] == ["ghost"]
        assert informer.get(unique, "stays") is not None and informer.relists == 2
    finally:
        await informer.stop()


async def test_a_relist_keeps_a_write_newer_than_the_list(nc: NATS, unique: str) -> None:
    """A controller's own write applied while a list was in flight is newer than the list: it stays."""
    jobs = ObjectStore(nc, "jobs", Job)
    informer = Informer(jobs, namespace=unique)
    page = await jobs.list(unique)
    mine = await jobs.create(_job(unique, "mine"))
    informer.apply(mine)
    informer.replace(page.items, page.resource_version)
    assert informer.get(unique, "mine") == mine


async def test_confirm_reads_the_store_only_for_an_object_the_view_lacks(nc: NATS, unique: str) -> None:
    """``confirm``: what the view holds as is; one it has not shown yet (its watch behind another's) from
    the store, taken into the view; None only when the store has none either."""
    jobs = ObjectStore(nc, "jobs", Job)
    shown = await jobs.create(_job(unique, "shown"))
    unseen = await jobs.create(_job(unique, "unseen"))
    informer = Informer(jobs, namespace=unique)  # never started: it shows only what is applied
    events: list[tuple[str, str]] = []
    informer.add_handler(lambda e: events.append((e.type, e.object.metadata.name or "")))
    assert informer.apply(shown)
    await jobs.update(shown)  # newer in the store: a view that holds the object is not read past
    assert await informer.confirm(unique, "shown") == shown
    assert await informer.confirm(unique, "unseen") == unseen
    assert informer.get(unique, "unseen") == unseen
    assert events == [("ADDED", "shown"), ("ADDED", "unseen")]
    assert await informer.confirm(unique, "never") is None
    gone = await jobs.delete(unique, "unseen")
    assert informer.apply(gone, deleted=True)
    assert await informer.confirm(unique, "unseen") is None
