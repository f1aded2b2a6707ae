"""A project's book keeps what is open, not its history (issue #23): the runs of a Job whose cost is final are
filed into the ``history`` bucket and its record is folded into the book's totals, while the account and
the usage report say what they said before; deleting the Job then changes none of it.

The rig is the scheduler's (a real nats-server, the real scheduler, a scripted fleet) with the real billing
service in the same process, on short terms; the account and the usage are asked over the bus, as the
gateway asks them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from nodus_billing.accounting import fold
from nodus_billing.archiving import Archive, record_name
from nodus_billing.books import Books
from nodus_billing.holding import PutJob
from nodus_billing.metering import job_ref
from nodus_kit import errors, messaging
from nodus_schema.billing import (
    ACCOUNT_SUBJECT,
    HOLD_SUBJECT,
    USAGE_SUBJECT,
    AccountRequest,
    AccountView,
    HoldReply,
    HoldRequest,
    UsageReply,
    UsageRequest,
)
from nodus_schema.costs import opening_cost
from nodus_schema.jobs import Job
from nodus_schema.quantities import usd_to_micros
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

TERMS = {
    "NODUS_HOLD_WINDOW_S": "4",
    "NODUS_METER_TICK_S": "0.5",
    "NODUS_STOP_MARGIN_S": "1",
    "NODUS_ORPHAN_HOLD_S": "10",
}


async def _usage(rig: Any) -> UsageReply:
    return await messaging.request(rig.nc, USAGE_SUBJECT, UsageRequest(project="t"), UsageReply)


async def _account(rig: Any) -> AccountView:
    return await messaging.request(rig.nc, ACCOUNT_SUBJECT, AccountRequest(project="t"), AccountView)


async def test_a_finished_jobs_runs_are_filed_and_its_record_is_forgotten(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("gone", completions=3, parallelism=3)

        async def final() -> Job:
            job: Job = await rig.job("gone")
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final
            return job

        job = await eventually(final, deadline_s=30, message="the Job succeeds and its cost is final")
        spent = usd_to_micros(job.status.cost.total_usd or "0") if job.status.cost else 0
        ref = job_ref("gone", job.metadata.uid)
        attempts = {a.metadata.name for a in await rig.attempts_of("gone")}

        async def filed() -> Any:
            state = await Books(rig.nc).read("t")
            assert not state.holds, "its runs left the book"
            assert ref not in state.jobs, "and so did its record"
            return state

        state = await eventually(filed, deadline_s=20, message="the finished Job's runs are filed")
        assert state.balances["project:t:filed"] == spent and f"spend:{ref}" not in state.balances
        assert [(r.jobs, sum(r.months.values())) for r in state.forgotten] == [(1, spent)]
        assert state.balances == fold(state.ledger.values()) and sum(state.balances.values()) == 0
        record = await Archive(rig.nc).store.get("t", record_name(ref))
        assert set(record.holds) == attempts and all(h.status == "Captured" for h in record.holds.values())
        before = await _usage(rig)
        account = await _account(rig)
        assert sorted(r.attempt for r in before.rows) == sorted(attempts), "the report reads the history"
        assert account.spent_micros == spent and account.open_holds == 0

        # A hold asked for the ended Job (a scheduler's late request) is refused: none would be metered.
        late = HoldRequest(
            namespace="t",
            job="gone",
            job_uid=job.metadata.uid or "",
            attempt="gone-late",
            rate_micros_per_hour=790_000,
            window_millis=4_000,
        )
        with pytest.raises(errors.Conflict, match="has ended"):
            await messaging.request(rig.nc, HOLD_SUBJECT, late, HoldReply)
        assert ref not in (await Books(rig.nc).read("t")).jobs, "the refusal put nothing in the book"

        await rig.jobs.delete("t", "gone")
        await eventually(
            lambda: rig.billing.views.jobs.get("t", "gone") is None,
            deadline_s=20,
            message="billing sees the Job deleted",
        )
        await rig.billing.metering.reconcile(("t", "gone"))  # the pass of the deletion, done here too
        after = await Books(rig.nc).read("t")
        assert (after.jobs, after.forgotten, after.balances) == (
            state.jobs,
            state.forgotten,
            state.balances,
        ), "nothing of it was left to forget"
        assert await _account(rig) == account, "the account says what it said"
        assert (await _usage(rig)).rows == before.rows, "and so does the usage report"


async def test_a_final_jobs_record_a_book_kept_from_before_is_forgotten(make_rig: Callable[..., Any]) -> None:
    """A book written before final Jobs were forgotten still records them, with nothing left to file: the
    meter looks at such a Job (it is not settled while a book records it) and forgets its record."""
    async with make_rig(funding=True, scheduler=False) as rig:
        billing = await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        job = await rig.submit("old")
        ref = job_ref("old", job.metadata.uid)
        put = PutJob(name=ref, project="t", generation=job.metadata.generation or 1)
        assert (await Books(rig.nc).apply("t", [put])).results[0].ok  # type: ignore[union-attr]

        def final(current: Job) -> Job:
            cost = msgspec.structs.replace(opening_cost(current.spec.max_cost_usd), final=True)
            status = msgspec.structs.replace(current.status, phase="Succeeded", cost=cost)
            return msgspec.structs.replace(current, status=status)

        await rig.jobs.mutate("t", "old", final)

        async def forgotten() -> bool:
            state = await Books(rig.nc).read("t")
            assert ref not in state.jobs, list(state.jobs)
            return True

        await eventually(forgotten, deadline_s=20, message="the final Job's record is forgotten")
        assert billing.metering.settled(await rig.job("old")), "and the Job is settled from then on"
