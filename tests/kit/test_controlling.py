"""The work queue's semantics and a controller reconciling real store events."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit.controlling import Controller, Key
from nodus_kit.errors import Conflict, Invalid
from nodus_kit.informing import Informer
from nodus_kit.queueing import ShutDown, WorkQueue
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.waiting import eventually


async def test_queue_dedups_waiting_keys() -> None:
    q: WorkQueue[str] = WorkQueue()
    for k in ("a", "b", "a", "a"):
        q.add(k)
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_key_added_while_processing_comes_back_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")  # changed while a worker holds it: must not be handed to a second worker now
    assert len(q) == 0
    q.done(key)
    assert await asyncio.wait_for(q.get(), 1) == "a"


async def test_rate_limited_backoff_grows_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [q.add_rate_limited("a") for _ in range(4)]
    # Jittered (nodus_kit.backingoff): each at most its exponential, capped.
    assert all(0 <= d <= c for d, c in zip(delays, [0.01, 0.02, 0.04, 0.04], strict=True))
    assert q.failures("a") == 4
    q.forget("a")
    assert q.failures("a") == 0
    assert await asyncio.wait_for(q.get(), 1) == "a"  # the timers fired once: still one entry


async def test_shutdown_drains_then_stops_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await q.shut_down()
    assert await q.get() == "a"
    with pytest.raises(ShutDown):
        await q.get()


def _job(ns: str, name: str) -> Job:
    return Job(metadata=ObjectMeta(name=name, namespace=ns), spec=JobSpec(image="busybox"))


async def test_controller_reconciles_each_change_and_retries_failures(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    seen: list[Key] = []
    flaky = {"b": 2}

    async def reconcile(key: Key) -> float | None:
        ns, name = key
        if ns != unique:
            return None
        if flaky.get(name, 0) > 0:
            flaky[name] -= 1
            raise Conflict("lost a race")  # retryable: comes back with backoff
        seen.append(key)
        return None

    ctl = Controller("test", reconcile, Informer(jobs, namespace=unique), workers=2, resync_s=3600)
    ctl.queue.base_delay = 0.01
    task = asyncio.create_task(ctl.run())
    try:
        await jobs.create(_job(unique, "a"))
        await jobs.create(_job(unique, "b"))
        await eventually(lambda: {k[1] for k in seen} == {"a", "b"}, message=f"seen {seen}")
        assert ctl.failures == 2 and flaky["b"] == 0
    finally:
        await ctl.stop()
        await task
        await ctl.for_.stop()


async def test_controller_drops_permanent_errors_until_the_object_changes(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    calls: list[str] = []

    async def reconcile(key: Key) -> float | None:
        calls.append(key[1])
        raise Invalid("cannot work with this")

    ctl = Controller("test", reconcile, Informer(jobs, namespace=unique), workers=1, resync_s=3600)
    ctl.queue.base_delay = 0.05
    task = asyncio.create_task(ctl.run())
    try:
        created = await jobs.create(_job(unique, "a"))
        await eventually(lambda: calls, message="never reconciled")
        # A list racing the create may announce it twice; what matters is that no backoff retries follow.
        await asyncio.sleep(0.6)  # the behaviour under test: nothing happens in this window
        settled = len(calls)
        assert settled <= 2 and ctl.queue.failures((unique, "a")) == 0
        await asyncio.sleep(0.6)
        assert len(calls) == settled  # a retrying controller would have run again by now (0.05 s backoff)
        await jobs.update(msgspec.structs.replace(created, spec=JobSpec(image="fixed")))
        await eventually(lambda: len(calls) > settled, message="a change must trigger a new reconcile")
    finally:
        await ctl.stop()
        await task
        await ctl.for_.stop()


async def test_resync_finds_what_no_event_announced(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    await jobs.create(_job(unique, "old"))
    count = 0

    async def reconcile(key: Key) -> float | None:
        nonlocal count
        if key == (unique, "old"):
            count += 1
        return None

    ctl = Controller("test", reconcile, Informer(jobs, namespace=unique), workers=1, resync_s=0.2)
    task = asyncio.create_task(ctl.run())
    try:
        await eventually(lambda: count >= 3, message="resync did not re-queue the object")
    finally:
        await ctl.stop()
        await task
        await ctl.for_.stop()


async def test_orphans_are_queued_at_start_and_at_every_resync(nc: NATS, unique: str) -> None:
    """Keys of objects gone from the informer that left work behind (``orphans``): walked from memory
    with the objects not settled, so a gone object's work survives a crash and a new leader."""
    jobs = ObjectStore(nc, "jobs", Job)
    seen: list[Key] = []
    left = [(unique, "gone")]

    async def reconcile(key: Key) -> float | None:
        seen.append(key)
        return None

    ctl = Controller(
        "test", reconcile, Informer(jobs, namespace=unique), orphans=lambda: left, workers=1, resync_s=0.2
    )
    task = asyncio.create_task(ctl.run())
    try:
        await eventually(lambda: seen.count((unique, "gone")) >= 2, message="the orphan was not queued again")
        left.clear()  # its work done: the walks stop queueing it
        done, resyncs = len(seen), ctl.resyncs
        await eventually(lambda: ctl.resyncs >= resyncs + 2, message="no resync")
        assert len(seen) <= done + 1, "queued again after it was no orphan any more"
    finally:
        await ctl.stop()
        await task
        await ctl.for_.stop()


async def test_a_run_cancelled_during_its_grace_leaves_no_reconcile_running(nc: NATS, unique: str) -> None:
    """A lost lease cancels the leader's task, maybe twice (once to stop, once more while it drains):
    run() must not return while a worker still reconciles, or two leaders would write at once."""
    jobs = ObjectStore(nc, "jobs", Job)
    began, ended = asyncio.Event(), asyncio.Event()

    async def reconcile(key: Key) -> float | None:
        if key[0] != unique:
            return None
        began.set()
        try:
            await asyncio.Event().wait()  # a reconcile that would never finish by itself
        finally:
            ended.set()
        return None

    ctl = Controller("test", reconcile, Informer(jobs, namespace=unique), workers=1, stop_grace_s=3600)
    task = asyncio.create_task(ctl.run())
    await jobs.create(_job(unique, "a"))
    await asyncio.wait_for(began.wait(), 10)
    task.cancel()  # run() enters its wind-down and waits for the worker, with an hour of grace
    await eventually(lambda: ctl.queue.is_shut_down, message="run() did not begin to wind down")
    task.cancel()  # cancelled again during the grace
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert ended.is_set(), "the worker was still reconciling after run() ended"
    await ctl.for_.stop()


async def test_a_settled_object_leaves_the_queue_even_when_its_reconcile_asks_to_look_again(
    nc: NATS, unique: str
) -> None:
    """Settled objects cost nothing while idle: neither the resync nor their own periodic check (a
    Suspended Job's) queues them again until they change."""
    jobs = ObjectStore(nc, "jobs", Job)
    await jobs.create(_job(unique, "resting"))
    await jobs.create(_job(unique, "busy"))
    calls: dict[str, int] = {"resting": 0, "busy": 0}
    resting = asyncio.Event()

    async def reconcile(key: Key) -> float | None:
        calls[key[1]] += 1
        if calls["resting"] >= 3:
            resting.set()
        return 0.05  # every reconcile asks to look again soon

    ctl = Controller(
        "test",
        reconcile,
        Informer(jobs, namespace=unique),
        settled=lambda job: resting.is_set() and job.metadata.name == "resting",
        workers=1,
        resync_s=0.1,
    )
    task = asyncio.create_task(ctl.run())
    try:
        await asyncio.wait_for(resting.wait(), 10)
        # A look asked for before it settled may still come once; after that, none.
        mark = calls["busy"]
        await eventually(lambda: calls["busy"] >= mark + 3, message="the unsettled object is looked at")
        before = calls["resting"]
        await eventually(lambda: calls["busy"] >= mark + 20, message="the unsettled object is looked at")
        assert calls["resting"] == before  # settled: its own 0.05 s requests and the resync left it out
    finally:
        await ctl.stop()
        await task
        await ctl.for_.stop()
