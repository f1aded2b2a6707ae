"""A priced estimate in one round trip (ADR-0031, nodus_scheduler.forwarding), over the session's
nats-server: the scheduler passes its plan on to billing, billing answers the asker; what it answers is
what asking the two in turn answers; a name the catalog does not know is the scheduler's own answer; and
with nobody serving the quote the asker hears Unavailable at once, never a lost request, until billing
serves again."""

from __future__ import annotations

import time

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_kit import errors, measuring, messaging
from nodus_scheduler import forwarding
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.estimating import EstimateReply, EstimateRequest, QuoteRequest
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec, Resources
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def job(gpu: str = "L4") -> JobSpec:
    return JobSpec(
        image="busybox",
        resources=Resources(gpu=GPURequest(type=[gpu], count=1)),
        expected_duration="10m",
        max_cost_usd="5",
    )


def request(ns: str, spec: JobSpec, *, priced: bool) -> EstimateRequest:
    return EstimateRequest(namespace=ns, kind="Job", job_spec=spec, priced=priced)


async def ask(nc: NATS, subject: str, ns: str, spec: JobSpec, *, priced: bool) -> EstimateReply:
    return await messaging.request(nc, subject, request(ns, spec, priced=priced), EstimateReply, timeout=5)


def timeless(reply: EstimateReply) -> EstimateReply:
    """The reply less its validUntil (now + 15 minutes: two answers a moment apart differ in it)."""
    return msgspec.structs.replace(reply, estimate=msgspec.structs.replace(reply.estimate, valid_until=None))


def forwarded(subject: str) -> float:
    sample = measuring.REGISTRY.get_sample_value(
        "nodus_rpc_requests_total", {"endpoint": subject, "outcome": "forwarded"}
    )
    return sample or 0.0


async def test_a_priced_estimate_is_billings_answer_to_the_asker_and_equals_asking_both(
    nc: NATS, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forwarding, "CHECK_S", 60.0)  # the first asks billing; every later one passes on
    est, quo = f"nodus.rpc.{unique}.estimate", f"nodus.rpc.{unique}.quote"
    subs = [
        await serve_estimates(nc, load_catalog(), subject=est, quote_subject=quo),
        await serve_quotes(nc, subject=quo),
    ]
    try:
        first = await ask(nc, est, unique, job(), priced=True)
        assert first.estimate.cost_usd is not None and first.estimate.hold_usd is not None, first
        # The first was the check (relayed); the next ones are passed on and answered by billing.
        before = forwarded(est)
        again = await ask(nc, est, unique, job(), priced=True)
        assert forwarded(est) == before + 1, "passed on to billing, not relayed"
        scheduled = await ask(nc, est, unique, job(), priced=False)
        assert scheduled.estimate.cost_usd is None, "unpriced: the scheduler's plan alone"
        both = await messaging.request(
            nc,
            quo,
            QuoteRequest(request=request(unique, job(), priced=False), scheduled=scheduled),
            EstimateReply,
        )
        assert timeless(again) == timeless(both) == timeless(first)
        assert again.slots == scheduled.slots, "the plan's slots come back with the price"
        # A GPU type the catalog does not know: the scheduler's own answer (billing has nothing to price).
        odd = await ask(nc, est, unique, job("NOPE-9000"), priced=True)
        assert odd.invalid and odd.estimate.cost_usd is None, odd
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def test_with_nobody_serving_the_quote_a_priced_estimate_is_unavailable_at_once(
    nc: NATS, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forwarding, "CHECK_S", 0.2)
    est, quo = f"nodus.rpc.{unique}.estimate", f"nodus.rpc.{unique}.quote"
    sub = await serve_estimates(nc, load_catalog(), subject=est, quote_subject=quo)
    billing = None
    try:
        for _ in range(3):  # the check, then the answers between checks: each at once, none lost
            began = time.monotonic()
            with pytest.raises(errors.Unavailable, match=f"nobody serves {quo}"):
                await ask(nc, est, unique, job(), priced=True)
            assert time.monotonic() - began < 1.0, "no responders, told at once (not a 5 s timeout)"
        billing = await serve_quotes(nc, subject=quo)

        async def priced() -> EstimateReply | None:
            try:
                reply = await ask(nc, est, unique, job(), priced=True)
            except errors.Unavailable:
                return None
            return reply if reply.estimate.cost_usd is not None else None

        await eventually(priced, deadline_s=10, message="billing serves again: the next check finds it")
    finally:
        await sub.unsubscribe()
        if billing is not None:
            await billing.unsubscribe()
