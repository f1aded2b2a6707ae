"""A cap is a ceiling, not a deposit, and the estimate's hold is the real hold (issue #18, ADR-0023).

The real billing service on its default terms (a ten-minute window, a one-minute stop margin): a cap far
below the window runs until it is spent, is suspended with MaxCostReached, never spends more than the cap,
and resumes when it is raised. Every offering of the price book is quoted through the scheduler's and
billing's real endpoints, and billing's real hold for the same Job is compared with the quote.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.billing import HOLD_SUBJECT, HoldReply, HoldRequest
from nodus_schema.catalog import Offering
from nodus_schema.costs import Estimate
from nodus_schema.defaulting import default_job
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    QUOTE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
)
from nodus_schema.gpus import GPURequest
from nodus_schema.holds import hold_micros, minimum_hold_micros
from nodus_schema.jobs import Job, JobSpec, Placement, Resources
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.sweeps import Sweep, SweepSpec, SweepTemplate
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

RATE = 790_000  # l4-x1-us, the rig's nodes, µ$/h


def forever(_: StartAttempt) -> tuple[float | None, int]:
    return (None, 0)


async def test_a_cap_far_below_the_window_runs_until_spent_then_suspends_and_resumes_when_raised(
    make_rig: Callable[..., Any],
) -> None:
    """Billing's default window and stop margin: before #18 a cap under two minutes of the rate (the
    least a hold could be) never started. $0.002 at $0.79/h funds ~9 s."""
    async with make_rig(forever, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", NODUS_METER_TICK_S="0.5")
        cap = usd_to_micros("0.002")
        await rig.submit("small", maxCostUSD="0.002", recovery={"continuity": "Checkpointed"})

        async def held() -> Any:
            job = await rig.job("small")
            assert len(await rig.attempts_of("small")) == 1, job.status
            assert job.status.cost and usd_to_micros(job.status.cost.held_usd or "0") > 0
            return job

        job = await eventually(held, deadline_s=20, message="the small cap is funded and the run starts")
        assert usd_to_micros(job.status.cost.held_usd or "0") == cap, "the first hold is the whole cap"

        async def suspended() -> Job:
            job = await rig.job("small")
            assert job.status.phase == "Suspended" and job.status.reason == "MaxCostReached", job.status
            return job

        job = await eventually(suspended, deadline_s=40, message="suspended with MaxCostReached")
        assert "maxCostUSD" in (job.status.message or "")

        async def settled() -> int:
            j = await rig.job("small")
            assert j.status.cost and j.status.cost.held_usd == "0.00"
            return usd_to_micros(j.status.cost.total_usd or "0")

        spent = await eventually(settled, deadline_s=20, message="the stopped run is captured")
        assert spent <= cap, "never above the cap"
        # It ran most of what the cap funds (its stop margin is a fifth of a small hold, not a minute).
        assert spent >= cap * 6 // 10, (spent, cap)

        # Raised by 2 × the first cap: room for ~18 s more, above the ten increments a resume needs.
        await rig.set_spec("small", max_cost_usd="0.006")

        async def resumed() -> bool:
            job = await rig.job("small")
            return job.status.phase in ("Running", "Provisioning") and len(await rig.attempts_of("small")) > 1

        await eventually(resumed, deadline_s=30, message="raising the cap resumes the Job")


def _spec(offering: Offering, cap: int | None = None) -> JobSpec:
    interruptible = "Prefer" if offering.interruptible else "Never"
    return JobSpec(
        image="x",
        expected_duration="1m",
        resources=Resources(
            gpu=GPURequest(type=[offering.variant], exact=True, count=offering.gpus_per_node)
        ),
        placement=Placement(
            offerings=[offering.id], regions=[offering.region_class], interruptible=interruptible
        ),
        max_cost_usd=None if cap is None else micros_to_usd(cap),
    )


async def _estimate(
    nc: Any, project: str, spec: JobSpec | None = None, sweep: SweepSpec | None = None
) -> Estimate:
    """The scheduler's estimate priced by billing, over the real subjects, as the gateway asks."""
    request = EstimateRequest(
        namespace=project, kind="Sweep" if sweep else "Job", job_spec=spec, sweep_spec=sweep
    )
    scheduled = await messaging.request(nc, ESTIMATE_SUBJECT, request, EstimateReply, timeout=10)
    quoted = QuoteRequest(request=request, scheduled=scheduled)
    return (await messaging.request(nc, QUOTE_SUBJECT, quoted, EstimateReply, timeout=10)).estimate


async def _real_hold(nc: Any, job: Job, rate: int, attempt: str) -> HoldReply:
    """The hold billing places for the Job's first Attempt at ``rate``, as the scheduler asks for it."""
    meta = job.metadata
    request = HoldRequest(
        namespace=meta.namespace or "",
        job=meta.name or "",
        job_uid=meta.uid or "",
        attempt=attempt,
        rate_micros_per_hour=rate,
        window_millis=0,
    )
    return await messaging.request(nc, HOLD_SUBJECT, request, HoldReply, timeout=10)


async def test_every_offering_of_the_price_book_holds_what_its_estimate_says(
    make_rig: Callable[..., Any],
) -> None:
    catalog = load_catalog()
    assert len(catalog.offerings) >= 16
    async with make_rig(nodes=0, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="100000")
        compared = 0
        for i, offering in enumerate(catalog.offerings):
            rate = offering.rate_for(offering.interruptible) or offering.rate_micros_per_hour
            # Uncapped (the full window), and a cap of a few seconds (the hold is the cap).
            for cap in (None, 3 * minimum_hold_micros(rate)):
                estimate = await _estimate(rig.nc, "t", _spec(offering, cap))
                assert estimate.blocking_reasons == [], (offering.id, estimate.blocking_reasons)
                assert estimate.rate_usd_per_hour is not None, offering.id
                quoted_rate = usd_to_micros(estimate.rate_usd_per_hour)
                name = f"o{i}-{'capped' if cap else 'free'}"
                job = await rig.jobs.create(
                    default_job(Job(metadata=ObjectMeta(name=name, namespace="t"), spec=_spec(offering, cap)))
                )
                reply = await _real_hold(rig.nc, job, quoted_rate, f"{name}-0")
                assert reply.ok, (offering.id, reply)
                assert estimate.hold_usd == micros_to_usd(reply.hold_micros or 0), (offering.id, cap)
                want = hold_micros(quoted_rate) if cap is None else cap
                assert reply.hold_micros == want, (offering.id, cap)
                compared += 1
        assert compared == 2 * len(catalog.offerings)


async def test_a_sweep_capped_at_its_concurrent_hold_funds_every_slot_that_starts_at_once(
    make_rig: Callable[..., Any],
) -> None:
    """The issue's A10G Sweep: maxParallel 2, maxCostUSD equal to its concurrentHoldUSD. Both cells' real
    first holds are whole; a cap one micro-dollar lower leaves the second one that much smaller."""
    catalog = load_catalog()
    a10g = next(o for o in catalog.offerings if o.id == "a10g-x1-us")
    async with make_rig(nodes=0, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="100")
        sweeps = ObjectStore(rig.nc, "sweeps", Sweep)
        template = SweepTemplate(kind="Job", spec=_spec(a10g))
        plain = SweepSpec(max_parallel=2, template=template, repetitions=4)
        free = await _estimate(rig.nc, "t", sweep=plain)
        concurrent = usd_to_micros(free.concurrent_hold_usd or "0")
        assert concurrent == 2 * hold_micros(a10g.rate_micros_per_hour)
        for name, cap in (("exact", concurrent), ("short", concurrent - 1)):
            spec = SweepSpec(
                max_parallel=2,
                template=template,
                repetitions=4,
                max_cost_usd=micros_to_usd(cap),
            )
            estimate = await _estimate(rig.nc, "t", sweep=spec)
            assert estimate.blocking_reasons == []
            assert usd_to_micros(estimate.concurrent_hold_usd or "0") == cap
            sweep = await sweeps.create(Sweep(metadata=ObjectMeta(name=name, namespace="t"), spec=spec))
            owner = OwnerReference(
                api_version="nodus.dev/v1",
                kind="Sweep",
                name=name,
                uid=sweep.metadata.uid or "",
                controller=True,
            )
            holds = []
            for cell in range(2):
                meta = ObjectMeta(name=f"{name}-{cell}", namespace="t", owner_references=[owner])
                job = await rig.jobs.create(default_job(Job(metadata=meta, spec=_spec(a10g))))
                reply = await _real_hold(
                    rig.nc, job, a10g.rate_micros_per_hour, f"{name}-{cell}-{uuid.uuid4().hex[:4]}"
                )
                assert reply.ok, reply
                holds.append(reply.hold_micros or 0)
            assert sum(holds) == cap, (name, holds)
            full = hold_micros(a10g.rate_micros_per_hour)
            assert holds == ([full, full] if name == "exact" else [full, full - 1])
