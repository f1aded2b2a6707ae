"""Watch delivery (issue #23): a buffer the subscription's callback fills and the reader empties, bounded
for a reader that falls behind; the stream sequence read from the reply subject; the watch's own ordered
consumer (flow control answered, a lost consumer made again)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo, DeliverPolicy

from nodus_kit import watching
from nodus_kit.storing import ObjectStore
from nodus_kit.watching import WatchClosed, sequences
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta


def job(ns: str, name: str) -> Job:
    return Job(metadata=ObjectMeta(name=name, namespace=ns), spec=JobSpec(image="busybox", command=["true"]))


@pytest.fixture
def jobs(nc: NATS) -> ObjectStore[Job]:
    return ObjectStore(nc, "jobs", Job)


@pytest.mark.parametrize("bound", ["MAX_BUFFERED", "MAX_BUFFERED_BYTES"])
async def test_a_reader_behind_a_full_buffer_still_gets_every_event_once_in_order(
    jobs: ObjectStore[Job], unique: str, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    # A buffer of one message (or byte): every burst of the consumer overflows it, so the watch drops its
    # consumer again and again and re-creates it from the last event it handed out.
    monkeypatch.setattr(watching, bound, 1)
    before = await jobs.create(job(unique, "before"))  # so the watch starts after a revision, not at 0
    start = int(before.metadata.resource_version or 0)
    created = await asyncio.gather(*(jobs.create(job(unique, f"j{i}")) for i in range(40)))
    await jobs.delete(unique, "j7")  # the bucket keeps one revision a key: j7's create is gone
    async with jobs.watch(unique, resource_version=start) as w:
        events = [await w.next(timeout=5) for _ in range(40)]
        with pytest.raises(asyncio.TimeoutError):
            await w.next(timeout=0.3)  # nothing twice
        assert w.resumes >= 1
    revisions = [e.revision for e in events]
    assert revisions == sorted(set(revisions))
    assert [(e.type, e.object.metadata.name) for e in events] == [
        *(("ADDED", c.metadata.name) for c in created if c.metadata.name != "j7"),
        ("DELETED", "j7"),
    ]
    assert all(e.object.metadata.resource_version == str(e.revision) for e in events)


async def test_stop_ends_a_waiting_reader_at_once(jobs: ObjectStore[Job], unique: str) -> None:
    w = await jobs.watch(unique, resource_version=await jobs.last_revision()).start()
    reader = asyncio.create_task(w.next())  # no timeout: waits for a change that never comes
    await asyncio.sleep(0)  # let it start waiting
    await w.stop()
    with pytest.raises(WatchClosed):
        await asyncio.wait_for(reader, 1.0)  # not the heartbeat's 3 s


async def test_after_stop_async_iteration_ends(jobs: ObjectStore[Job], unique: str) -> None:
    async with jobs.watch(unique, resource_version=await jobs.last_revision()) as w:
        await jobs.create(job(unique, "a"))
        seen = []
        async for event in w:
            seen.append(event.object.metadata.name)
            await w.stop()
    assert seen == ["a"]


def test_the_sequences_from_either_form_of_reply_subject() -> None:
    v1 = "$JS.ACK.KV_jobs.c1.1.4567.12.1733150000123456789.3"
    v2 = "$JS.ACK.hub.ACCHASH.KV_jobs.c1.1.4567.12.1733150000123456789.3.rand"
    for reply in (v1, v2):
        msg = Msg(_client=None, subject="$KV.jobs.p.a", reply=reply)  # type: ignore[arg-type]
        assert sequences(msg) == (4567, 12)
        assert (msg.metadata.sequence.stream, msg.metadata.sequence.consumer) == (4567, 12)


async def test_a_consumer_lost_under_a_watch_is_made_again_from_the_last_event(
    jobs: ObjectStore[Job], nc: NATS, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server forgets the consumer (as a server that restarted would): its heartbeats stop, and the
    # watch, after two missed beats, makes a new one from the sequence after the last event it read.
    monkeypatch.setattr(watching, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(watching, "WAKE_S", 0.2)
    js = nc.jetstream()
    start = int((await jobs.create(job(unique, "before"))).metadata.resource_version or 0)
    async with jobs.watch(unique, resource_version=start) as w:
        await jobs.create(job(unique, "a"))
        assert (await w.next(timeout=5)).object.metadata.name == "a"
        mine = [c.name for c in await _consumers_of(w, jobs)]
        assert len(mine) == 1
        await js.delete_consumer(jobs.stream, mine[0])
        await jobs.create(job(unique, "b"))
        await jobs.create(job(unique, "c"))
        names = [(await w.next(timeout=5)).object.metadata.name for _ in range(2)]
        with pytest.raises(asyncio.TimeoutError):
            await w.next(timeout=0.5)  # nothing twice
        assert w.resumes == 1
    assert names == ["b", "c"]


async def test_a_heartbeat_naming_a_message_never_received_resumes_from_the_last_event(
    jobs: ObjectStore[Job], nc: NATS, unique: str
) -> None:
    # A heartbeat says which consumer sequence the server delivered last; one the watch never got (a
    # message lost on the way) makes it resume from the last event it handed out, so nothing is missed.
    start = int((await jobs.create(job(unique, "before"))).metadata.resource_version or 0)
    async with jobs.watch(unique, resource_version=start) as w:
        await jobs.create(job(unique, "a"))
        assert (await w.next(timeout=5)).object.metadata.name == "a"
        inbox = (await _consumers_of(w, jobs))[0].config.deliver_subject
        assert inbox is not None
        beat = {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "3"}
        await nc.publish(inbox, b"", headers=beat)  # the server says it sent 3; the watch got 1
        await jobs.create(job(unique, "b"))
        assert (await w.next(timeout=5)).object.metadata.name == "b"
        with pytest.raises(asyncio.TimeoutError):
            await w.next(timeout=0.3)  # nothing twice
        assert w.resumes == 1


async def test_a_watch_answers_flow_control_so_a_large_backlog_keeps_coming(
    jobs: ObjectStore[Job], nc: NATS, unique: str
) -> None:
    # 6 MB of changes: the server asks for flow control after the first MB and stops sending to a
    # consumer that does not answer (nats-py's ordered consumer answered from a task of its own).
    start = int((await jobs.create(job(unique, "before"))).metadata.resource_version or 0)
    blob = "x" * (96 * 1024)
    try:
        await asyncio.gather(*(jobs.create(_with_note(job(unique, f"j{i}"), blob)) for i in range(64)))
        async with jobs.watch(unique, resource_version=start) as w:
            # Within less than a heartbeat each: a consumer stalled on an unanswered request would go on
            # only when its next heartbeat (which names the request again) is answered.
            seen = [
                (await w.next(timeout=watching.HEARTBEAT_S * 0.75)).object.metadata.name for _ in range(64)
            ]
            assert w.resumes == 0
        assert len(set(seen)) == 64
    finally:
        # Out of the session's bucket: a later test's list of every namespace would read these 6 MB.
        await nc.jetstream().purge_stream(jobs.stream, subject=f"{jobs.prefix}{unique}.>")


async def _consumers_of(w: watching.Watch[Job], jobs: ObjectStore[Job]) -> list[ConsumerInfo]:
    """The watch's own consumers on the server: its subject, from the sequence after its start."""
    return [
        c
        for c in await jobs.js.consumers_info(jobs.stream)
        if c.config.filter_subject == w.subject and c.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
    ]


def _with_note(j: Job, note: str) -> Job:
    j.metadata.annotations["note"] = note
    return j
