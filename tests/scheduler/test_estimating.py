"""Estimates (ADR-031): the scheduler's choice of capacity, the duration bands, the ETag binding, and the
two endpoints answering over the session's real NATS (scheduler, then billing, as the gateway will ask)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimating import choose, estimate, serve_estimates
from nodus_schema.catalog import Catalog
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    QUOTE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
    bind_estimate,
    duration_band,
    estimate_etag,
    parse_estimate_etag,
    rate_ceiling_micros,
    startup_of,
    valid_until,
    within_rate_bound,
)
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Distributed, JobSpec, Placement, Resources
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_schema.sweeps import SweepMatrix, SweepSpec, SweepTemplate

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
SXM = GPURequest(type=["H100-SXM-80G"], exact=True, count=1)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def job(
    gpu: GPURequest | str, *, expected: str | None = "2h", regions: list[str] | None = None, **kw: Any
) -> JobSpec:
    return JobSpec(
        image="x",
        expected_duration=expected,
        resources=Resources(gpu=gpu),
        placement=Placement(regions=regions if regions is not None else ["us"]),
        **kw,
    )


def ready_node(name: str, offering: str, region: str, now: datetime) -> Node:
    return Node(
        metadata=ObjectMeta(name=name),
        spec=NodeSpec(offering=offering, region_class=region),
        status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(now - timedelta(seconds=1))),
    )


# -- durations, startup, validity -----------------------------------------------------------------


def test_duration_band_is_expected_then_half_again() -> None:
    assert duration_band("2h") == (timedelta(hours=2), timedelta(hours=3), False)
    assert duration_band("1h30m") == (timedelta(minutes=90), timedelta(minutes=135), False)


def test_duration_band_defaults_to_an_hour_and_says_so() -> None:
    assert duration_band(None) == (timedelta(hours=1), timedelta(minutes=90), True)


def test_timeout_caps_both_bands() -> None:
    assert duration_band("2h", "2h30m") == (timedelta(hours=2), timedelta(minutes=150), False)


def test_startup_defaults_are_go_durations() -> None:
    s = startup_of(None)
    assert (s.cold and s.cold.p50, s.cold and s.cold.p90) == ("2m0s", "5m0s")
    assert (s.warm and s.warm.p50, s.warm and s.warm.p90) == ("10s", "30s")


def test_valid_until_is_fifteen_minutes_on() -> None:
    assert valid_until(NOW) == "2026-11-30T05:15:00Z"


# -- choice of capacity ---------------------------------------------------------------------------


def test_a_free_node_is_placed_now(catalog: Catalog) -> None:
    nodes = [ready_node("n1", "h100-sxm-80g-x1-us", "us", NOW)]
    choice = choose(job(SXM), catalog, nodes, set(), NOW)
    assert choice.offering is not None and choice.offering.id == "h100-sxm-80g-x1-us"
    assert choice.queued is None and "node n1" in choice.explain


def test_no_free_node_is_a_queued_warning_not_a_blocking_reason(catalog: Catalog) -> None:
    nodes = [ready_node("n1", "h100-sxm-80g-x1-us", "us", NOW)]
    reply = estimate(
        EstimateRequest(namespace="p", kind="Job", job_spec=job(SXM)), catalog, nodes, {"n1"}, NOW
    )
    e = reply.estimate
    assert e.blocking_reasons == []
    assert [w.code for w in e.warnings] == ["Queued"]
    assert "1 busy" in (e.warnings[0].message or "")
    assert e.rate_usd_per_hour == "2.99"
    assert e.placement_preview is not None and e.placement_preview.offering == "h100-sxm-80g-x1-us"


def test_a_family_takes_the_cheapest_matching_offering(catalog: Catalog) -> None:
    choice = choose(job("H100:1"), catalog, [], set(), NOW)
    assert choice.offering is not None and choice.offering.id == "h100-pcie-80g-x1-us"  # 2.49 < 2.79 < 2.99


def test_max_rate_filters_the_price_book(catalog: Catalog) -> None:
    spec = job("H100:1", regions=[])
    spec.placement = Placement(max_rate_usd_per_hour="2.00")
    choice = choose(spec, catalog, [], set(), NOW)
    assert choice.offering is None
    assert "6 above maxRateUSDPerHour" in choice.explain


def test_a_gang_has_a_topology_and_a_plan_per_node(catalog: Catalog) -> None:
    spec = job(GPURequest(type=["H100-SXM-80G"], exact=True, count=8), distributed=Distributed(nodes=2))
    reply = estimate(EstimateRequest(namespace="p", kind="Job", job_spec=spec), catalog, [], set(), NOW)
    assert reply.estimate.topology == "2x8"
    (slot,) = reply.slots
    assert (slot.offering, slot.nodes, slot.assembly_timeout, slot.assembly_tries) == (
        "h100-sxm-80g-x8-us",
        2,
        "15m0s",
        3,
    )


def test_a_sweep_has_one_slot_per_gpu_and_region(catalog: Catalog) -> None:
    sweep = SweepSpec(
        matrix=SweepMatrix(gpu=["L4:1", "A100:1"], regions=["us", "eu"], params={"LR": ["1", "2"]}),
        template=SweepTemplate(kind="Job", spec=JobSpec(image="x", expected_duration="10m")),
    )
    reply = estimate(EstimateRequest(namespace="p", kind="Sweep", sweep_spec=sweep), catalog, [], set(), NOW)
    got = [(s.label, s.cells, s.first_cell, s.offering) for s in reply.slots]
    assert got == [
        ("L4:1/us", 2, 0, "l4-x1-us"),
        ("L4:1/eu", 2, 2, "l4-x1-eu"),
        ("A100:1/us", 2, 4, "a100-sxm-40g-x1-us"),
        ("A100:1/eu", 2, 6, "a100-sxm-40g-x1-eu"),
    ]
    assert reply.estimate.rate_usd_per_hour == "1.419"  # the dearest cell's: it bounds every cell


# -- the ETag ---------------------------------------------------------------------------------------


def test_etag_binds_the_rate_and_the_exact_spec(catalog: Catalog) -> None:
    spec = job(SXM)
    e = estimate(EstimateRequest(namespace="p", kind="Job", job_spec=spec), catalog, [], set(), NOW).estimate
    tag = estimate_etag(e, spec)
    assert tag == estimate_etag(e, job(SXM))  # stable for an equal spec
    assert tag.startswith('"e1:2990000:2026-11-30.1:') and tag.endswith('"')
    binding = bind_estimate(tag, job(SXM))
    assert binding is not None and binding.rate_micros_per_hour == 2_990_000
    assert bind_estimate(tag, job(SXM, expected="3h")) is None  # the spec changed: 412
    assert bind_estimate('W/"x"', spec) is None and parse_estimate_etag('"abc"') is None


def test_the_bound_rate_allows_ten_percent_more() -> None:
    assert rate_ceiling_micros(2_990_000) == 3_289_000
    assert within_rate_bound(2_990_000, 3_289_000)  # h100-sxm-80g-x1-eu is exactly +10 %
    assert not within_rate_bound(2_990_000, 3_289_001)


# -- both endpoints over NATS, as the gateway will call them --------------------------------------


@pytest_asyncio.fixture
async def endpoints(nc: NATS, unique: str) -> AsyncIterator[tuple[str, str]]:
    """The scheduler's and billing's endpoints, served in-process on per-test subjects."""
    est, quo = f"nodus.rpc.{unique}.estimate", f"nodus.rpc.{unique}.quote"
    subs = [await serve_estimates(nc, load_catalog(), subject=est), await serve_quotes(nc, subject=quo)]
    yield est, quo
    for sub in subs:
        await sub.unsubscribe()


async def ask(nc: NATS, subjects: tuple[str, str], request: EstimateRequest) -> EstimateReply:
    scheduled = await messaging.request(nc, subjects[0], request, EstimateReply, timeout=5)
    return await messaging.request(
        nc, subjects[1], QuoteRequest(request=request, scheduled=scheduled), EstimateReply
    )


def test_the_real_subjects() -> None:
    assert (ESTIMATE_SUBJECT, QUOTE_SUBJECT) == ("nodus.rpc.scheduler.estimate", "nodus.rpc.billing.quote")


async def test_a_job_that_fits(nc: NATS, unique: str, endpoints: tuple[str, str]) -> None:
    nodes = ObjectStore(nc, "nodes", Node)
    await nodes.create(ready_node(unique, "h100-sxm-80g-x1-us", "us", datetime.now(UTC)))
    try:
        reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=job(SXM)))
    finally:
        await nodes.delete(None, unique)
    e = reply.estimate
    assert e.blocking_reasons == []
    assert [w.code for w in e.warnings] == ["BalanceNotChecked"]
    assert (e.rate_usd_per_hour, e.pricebook_version) == ("2.99", "2026-11-30.1")
    # 2h at 2.99 is 5.98, plus the 2m boot (0.099667); p90: 3h is 8.97, plus the 5m boot (0.249167).
    assert e.cost_usd is not None and (e.cost_usd.p50, e.cost_usd.p90) == ("6.079667", "9.219167")
    assert e.overhead_usd is not None and (e.overhead_usd.p50, e.overhead_usd.p90) == ("0.099667", "0.249167")
    assert (e.hold_usd, e.concurrent_hold_usd, e.minimum_charge_usd) == ("2.99", "2.99", "0.000831")
    assert e.gang_hold_usd is None and e.assembly_bound_usd is None
    assert e.placement_preview is not None
    assert (e.placement_preview.offering, e.placement_preview.region_class) == ("h100-sxm-80g-x1-us", "us")
    assert e.placement_preview.interruptible is False and e.placement_preview.warm_reuse is False
    assert e.startup is not None and e.startup.cold is not None and e.startup.cold.p50 == "2m0s"
    assert e.valid_until is not None


async def test_a_gpu_nothing_offers_is_blocked(nc: NATS, unique: str, endpoints: tuple[str, str]) -> None:
    reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=job("B200:1")))
    e = reply.estimate
    (reason,) = e.blocking_reasons
    assert reason.code == "CapacityUnavailable"
    assert "0/32 offerings in price book 2026-11-30.1: 32 other accelerator" in (reason.message or "")
    assert reason.fix and "resources.gpu" in reason.fix
    assert e.cost_usd is None and e.hold_usd is None and e.rate_usd_per_hour is None


async def test_a_sweep_of_three_cells_holds_two_at_once(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    sweep = SweepSpec(
        matrix=SweepMatrix(params={"LR": ["0.1", "0.01", "0.001"]}),
        max_parallel=2,
        template=SweepTemplate(kind="Job", spec=job(SXM, expected="30m")),
    )
    reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Sweep", sweep_spec=sweep))
    e = reply.estimate
    assert e.blocking_reasons == []
    # One cell: 30m run (1.495) + 2m boot (0.099667) at p50; hold min(50m at p90 = 2.491667, 1h = 2.99).
    assert e.cost_usd is not None and (e.cost_usd.p50, e.cost_usd.p90) == ("4.784001", "7.475001")
    assert e.hold_usd == "2.491667"
    assert e.concurrent_hold_usd == "4.983334"  # maxParallel 2 cells' holds


async def test_a_cap_below_the_hold_blocks(nc: NATS, unique: str, endpoints: tuple[str, str]) -> None:
    spec = job(SXM, max_cost_usd="1.00")
    reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))
    (reason,) = reply.estimate.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert reason.message == (
        "spec.maxCostUSD 1.00 is below the first hold 2.99 of one index: not even one slot could start"
    )
    assert reason.fix and reason.fix.startswith("Raise spec.maxCostUSD to at least 2.99")


async def test_a_cap_the_run_will_reach_is_a_warning(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    spec = job(SXM, max_cost_usd="5.00")
    reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))
    assert reply.estimate.blocking_reasons == []
    codes = [w.code for w in reply.estimate.warnings]
    assert "MaxCostBelowEstimate" in codes and codes[-1] == "BalanceNotChecked"


async def test_a_request_without_its_spec_is_invalid(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    from nodus_kit import errors

    with pytest.raises(errors.Invalid, match="needs its spec"):
        await messaging.request(
            nc, endpoints[0], EstimateRequest(namespace=unique, kind="Sweep"), EstimateReply
        )
