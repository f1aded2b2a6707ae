"""The meter's rest rule (issue #19): a Job with nothing held, nothing running and no block costs no book
read per resync, and a hold placed for it all the same is still metered and released.

The rig's billing service (its own nats-server, resync every second) without the scheduler: the Job's
phase is written here as the scheduler would write it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from nodus_billing.books import Books
from nodus_billing.metering import job_ref
from nodus_billing.service import BillingService
from nodus_kit import messaging
from nodus_schema.billing import HOLD_SUBJECT, HoldReply, HoldRequest
from nodus_schema.costs import opening_cost
from nodus_schema.jobs import Job
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

TERMS = {"NODUS_METER_TICK_S": "0.5", "NODUS_ORPHAN_HOLD_S": "2", "NODUS_STARTING_CREDITS_USD": "1"}
RATE = 790_000  # l4-x1-us, µ$/h
RESYNCS_S = 3.5
"""Three resyncs of the rig's billing (NODUS_RESYNC_S=1), and half of one more: the deadline's unit."""


async def _hold(rig: Any, job: Job, attempt: str) -> HoldReply:
    """A hold for the Job's run ``attempt``, asked as the scheduler asks it (funding ten minutes ahead)."""
    ask = HoldRequest(
        namespace="t",
        job=job.metadata.name or "",
        job_uid=job.metadata.uid or "",
        attempt=attempt,
        rate_micros_per_hour=RATE,
        window_millis=600_000,
    )
    return await messaging.request(rig.nc, HOLD_SUBJECT, ask, HoldReply)


def _suspend(job: Job) -> Job:
    return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, phase="Suspended"))


async def test_a_suspended_job_at_rest_reads_no_book_and_a_hold_for_it_is_still_released(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(funding=True, scheduler=False) as rig:
        billing: BillingService = await rig.start_billing(**TERMS)
        created = await rig.submit("idle")
        await rig.jobs.mutate("t", "idle", _suspend)
        metering = billing.metering

        def at_rest() -> Job:
            job = billing.views.jobs.get("t", "idle")
            assert job is not None and job.status.phase == "Suspended" and job.status.cost is not None
            assert metering.settled(job), "a Suspended Job with nothing held must be settled"
            return job

        job = await eventually(at_rest, deadline_s=20, message="the Suspended Job never came to rest")
        reads, read_book = 0, metering.books.read

        async def counted_read(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await read_book(*args, **kwargs)

        metering.books.read = counted_read  # type: ignore[method-assign]
        try:
            walks = billing.meter.resyncs + 3
            await eventually(lambda: billing.meter.resyncs >= walks, deadline_s=RESYNCS_S * 4)
            assert reads == 0, f"{reads} book reads for a Job at rest"
        finally:
            metering.books.read = read_book  # type: ignore[method-assign]

        # A hold placed for it anyway (a scheduler that decided before the suspend): no longer at rest, and
        # its Attempt never comes, so the meter releases it past the orphan grace, long before its funding
        # (ten minutes) runs out and the expiry loop would look.
        reply = await _hold(rig, created, "idle-never-created")
        assert reply.ok and reply.hold_micros > 0
        await eventually(
            lambda: not metering.settled(billing.views.jobs.get("t", "idle") or job),
            deadline_s=10,
            message="an open hold must take the Job out of rest",
        )

        async def released() -> bool:
            state = await Books(rig.nc).read("t")
            assert state.holds["idle-never-created"].status == "Released"
            assert state.balances["project:t:available"] == 1_000_000, "all of it back"
            return True

        await eventually(released, deadline_s=20, message="the orphan hold of a Job at rest is released")
        final = await eventually(at_rest, deadline_s=20, message="the Job never came back to rest")
        assert final.status.cost is not None and final.status.cost.held_usd == "0.00"


async def test_a_deleted_job_with_nothing_held_or_running_reads_no_book(make_rig: Callable[..., Any]) -> None:
    """Attempts of deleted Jobs stay (only a TTL deletes them), and every resync queues their Jobs: such a
    Job, with nothing of it held or running, is done with from memory."""
    async with make_rig(funding=True, scheduler=False) as rig:
        billing: BillingService = await rig.start_billing(**TERMS)
        metering = billing.metering
        await eventually(billing.views.synced, deadline_s=20, message="billing's views never listed")
        reads, read_book = 0, metering.books.read

        async def counted_read(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await read_book(*args, **kwargs)

        metering.books.read = counted_read  # type: ignore[method-assign]
        try:
            for _ in range(5):
                assert await metering.reconcile(("t", "gone")) is None
        finally:
            metering.books.read = read_book  # type: ignore[method-assign]
        assert reads == 0


async def test_a_job_that_never_ran_stays_out_of_the_book_until_its_first_hold(
    make_rig: Callable[..., Any],
) -> None:
    """The book is one message written whole at every commit: Jobs that never run (Suspended, waiting for
    capacity) must not make it grow. The meter writes such a Job's opening cost without a commit; the hold
    endpoint puts the Job with its first hold, in that hold's commit."""
    async with make_rig(funding=True, scheduler=False) as rig:
        billing: BillingService = await rig.start_billing(**TERMS)
        created = await rig.submit("idle")
        await rig.jobs.mutate("t", "idle", _suspend)
        ref = job_ref("idle", created.metadata.uid)

        def costed() -> Job:
            job = billing.views.jobs.get("t", "idle")
            assert job is not None and job.status.phase == "Suspended" and job.status.cost is not None
            return job

        job = await eventually(costed, deadline_s=20, message="billing never wrote the Job's cost")
        assert job.status.cost == opening_cost(job.spec.max_cost_usd)
        assert billing.metering.books.commits == 0, "nothing to commit for a Job that never ran"
        assert ref not in (await Books(rig.nc).read("t")).jobs

        reply = await _hold(rig, created, "idle-a1")
        assert reply.ok and reply.hold_micros > 0
        state = await Books(rig.nc).read("t")
        assert ref in state.jobs and state.holds["idle-a1"].job == ref
