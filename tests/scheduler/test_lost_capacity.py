"""Lost capacity is not the customer's cost (issue #18): a node that vanishes mid-run is charged as Running
only until its last heartbeat; the run's Boot and the time from the last heartbeat to the loss are
covered by Nodus, listed in coveredByNodus and in the usage row's coveredUSD; the replacement's start is
Restore; status.recovery sums what the recovery cost; the lost run does not count against backoffLimit.

The scheduler's rig with the real billing service; a node goes silent (killed: no more heartbeats or
reports) and is found lost after the heartbeat grace (15 s), so this is slow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodus_billing.archiving import Archive
from nodus_billing.books import Books
from nodus_kit import messaging
from nodus_schema.billing import USAGE_SUBJECT, UsageReply, UsageRequest
from nodus_schema.jobs import Job
from nodus_schema.ledger import charge_micros
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import parse_time
from nodus_schema.quantities import usd_to_micros
from nodus_testing.waiting import eventually

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

TERMS = {"NODUS_METER_TICK_S": "0.5"}


async def test_a_run_lost_with_its_node_is_charged_until_its_last_heartbeat_and_nodus_covers_the_rest(
    make_rig: Callable[..., Any],
) -> None:
    def first_hangs(start: StartAttempt) -> tuple[float | None, int]:
        return (None, 0) if start.attempt_no == 1 else (1.0, 0)

    async with make_rig(first_hangs, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("spot", backoffLimit=0, recovery={"continuity": "Checkpointed"})

        async def running() -> Any:
            runs = [a for a in await rig.attempts_of("spot") if a.status.phase == "Running"]
            assert runs and runs[0].status.start_time
            return runs[0]

        first = await eventually(running, deadline_s=20, message="the first run starts")
        rig.fleet.go_silent(first.spec.node)  # the agent is killed: no NotReady, no report, no beat

        async def done() -> Job:
            job = await rig.job("spot")
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final, job.status
            return job

        job = await eventually(done, deadline_s=60, message="the replacement succeeds, cost final")
        lost = await rig.attempts.get("t", first.metadata.name or "")
        assert lost.status.phase == "Lost" and lost.status.billing_stop_ms is not None
        finished = int(parse_time(lost.status.finish_time or "").timestamp() * 1000)
        assert finished - lost.status.billing_stop_ms >= 14_000, "the loss is seen a heartbeat grace later"

        state = await Books(rig.nc).read("t")
        hold = (await Archive(rig.nc).runs("t", state))[first.metadata.name or ""]  # filed or not (#23)
        assert hold.usage is not None
        rate = first.spec.rate_micros_per_hour
        program = int(parse_time(lost.status.start_time or "").timestamp() * 1000)
        ran = max(0, lost.status.billing_stop_ms - program)
        # Charged: Running until the last heartbeat, rounded up once; never the gap to the loss.
        assert set(hold.usage.segments) <= {"Running"}
        assert hold.charged_micros == sum(hold.usage.segments.values())
        assert hold.charged_micros <= charge_micros(rate, -(-ran // 1000) * 1000)
        assert hold.usage.covered.get("Teardown", 0) >= charge_micros(rate, 14_000)

        cost = job.status.cost
        assert cost.by_segment is not None and "Teardown" in cost.by_segment.covered_by_nodus
        assert cost.by_segment.restore_usd is not None, "the replacement's start is Restore"

        recovery = job.status.recovery
        assert recovery is not None and recovery.lost_runs == 1
        assert usd_to_micros(recovery.covered_usd or "0") == sum(hold.usage.covered.values())
        assert usd_to_micros(recovery.recovery_usd or "0") == usd_to_micros(
            recovery.lost_usd or "0"
        ) + usd_to_micros(recovery.restore_usd or "0")
        assert recovery.runs[0].lost_seconds * 1000 <= ran + 1000

        # The usage row of the lost run says what Nodus covered.
        reply = await messaging.request(
            rig.nc, USAGE_SUBJECT, UsageRequest(project="t"), UsageReply, timeout=10
        )
        (row,) = [r for r in reply.rows if r.attempt == first.metadata.name]
        assert row.covered_micros == sum(hold.usage.covered.values()) > 0

        # A lost node is never the Job's failure: backoffLimit 0 and still Succeeded.
        assert job.status.failed in (None, 0)
