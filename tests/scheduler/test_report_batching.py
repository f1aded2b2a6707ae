"""Reports of one Attempt that queue up while its last write is under way are written together (issue #23):
a 0-second run's Started and Finished cost one write of its Attempt, in delivery order, and each delivery
is settled only once the write that holds it is."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from nodus_kit.messaging import Delivery
from nodus_kit.storing import ObjectStore
from nodus_scheduler.reporting import Reports
from nodus_schema.attempts import Attempt, AttemptSpec
from nodus_schema.messages import AttemptFinished, AttemptStarted, Report
from nodus_schema.meta import ObjectMeta


def _attempt(ns: str) -> Attempt:
    spec = AttemptSpec(
        job="j",
        index=0,
        attempt=1,
        node="n1",
        offering="l4-x1-us",
        region_class="us",
        rate_micros_per_hour=790_000,
        pricebook_version="v",
    )
    return Attempt(metadata=ObjectMeta(name="j-0-1", namespace=ns), spec=spec)


def _delivery(ns: str, report: Report) -> Delivery[Report]:
    return Delivery(data=report, subject=f"nodus.report.n1.{ns}.j-0-1", headers={}, attempt=1)


async def test_a_started_and_a_finished_delivered_together_are_one_write(nc: NATS, unique: str) -> None:
    attempts = ObjectStore(nc, "attempts", Attempt)
    await attempts.create(_attempt(unique))
    writes: list[Msg] = []

    async def count(msg: Msg) -> None:
        writes.append(msg)

    sub = await nc.subscribe(f"$KV.attempts.{unique}.j-0-1", cb=count)
    reports = Reports(attempts)
    started = AttemptStarted(
        namespace=unique, attempt="j-0-1", node="n1", time="2026-12-02T00:00:00Z", started_ms=1_000
    )
    finished = AttemptFinished(
        namespace=unique,
        attempt="j-0-1",
        node="n1",
        time="2026-12-02T00:00:01Z",
        exit_code=0,
        wall_millis=0,
        reason="Completed",
        started_ms=1_000,
        stopped_ms=1_000,
    )
    try:
        # As the consumer runs a fetched batch: both handlers at once.
        await asyncio.gather(
            reports.handle(_delivery(unique, started)), reports.handle(_delivery(unique, finished))
        )
        await nc.flush()
        stored = await attempts.get(unique, "j-0-1")
        # Both applied, in order: the Started's start time kept, the Finished's phase.
        assert (stored.status.phase, stored.status.start_time) == ("Succeeded", "2026-12-02T00:00:00Z")
        assert len(writes) == 1, f"{len(writes)} writes of the Attempt for two reports delivered together"

        # A redelivery of either changes nothing and writes nothing.
        await reports.handle(_delivery(unique, started))
        await nc.flush()
        assert len(writes) == 1
    finally:
        await sub.unsubscribe()


async def test_a_report_that_comes_after_the_write_is_written_on_its_own(nc: NATS, unique: str) -> None:
    attempts = ObjectStore(nc, "attempts", Attempt)
    await attempts.create(_attempt(unique))
    reports = Reports(attempts)
    started = AttemptStarted(namespace=unique, attempt="j-0-1", node="n1", time="2026-12-02T00:00:00Z")
    await reports.handle(_delivery(unique, started))
    assert (await attempts.get(unique, "j-0-1")).status.phase == "Running"
    finished = AttemptFinished(
        namespace=unique,
        attempt="j-0-1",
        node="n1",
        time="2026-12-02T00:00:09Z",
        exit_code=1,
        wall_millis=9_000,
        reason="Completed",
    )
    await reports.handle(_delivery(unique, finished))
    stored = await attempts.get(unique, "j-0-1")
    assert (stored.status.phase, stored.status.exit_code) == ("Failed", 1)
