"""Estimates and ``spec.completeByTime`` (issue #21): DeadlineAtRisk when the p90 finish lands after it,
DeadlinePassed when it is already past; a hint, never a blocking reason. The pure estimate first, then
both endpoints over the session's real NATS, as the gateway asks them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.deadlining import slot_p90, sweep_p90
from nodus_scheduler.estimating import estimate
from nodus_schema.catalog import Catalog
from nodus_schema.costs import DurationBand, Estimate
from nodus_schema.estimating import EstimateReply, EstimateRequest, QuoteRequest, SlotPlan, startup_of
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec, Placement, Resources
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_schema.quantities import parse_duration
from nodus_schema.sweeps import SweepMatrix, SweepSpec, SweepTemplate

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
SXM = GPURequest(type=["H100-SXM-80G"], exact=True, count=1)
H100_US = "h100-sxm-80g-x1-us"  # cold start p90 5m


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def job(deadline: str | None, **kw: Any) -> JobSpec:
    kw.setdefault("expected_duration", "2h")  # p90 3h
    return JobSpec(
        image="x",
        resources=Resources(gpu=SXM),
        placement=Placement(regions=["us"]),
        complete_by_time=deadline,
        **kw,
    )


def node(name: str, offering: str = H100_US, region: str = "us", now: datetime = NOW) -> Node:
    return Node(
        metadata=ObjectMeta(name=name),
        spec=NodeSpec(offering=offering, region_class=region),
        status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(now - timedelta(seconds=1))),
    )


def estimated(catalog: Catalog, spec: JobSpec, busy: set[str] | None = None) -> Estimate:
    request = EstimateRequest(namespace="p", kind="Job", job_spec=spec)
    return estimate(request, catalog, [node("n1")], busy or set(), NOW).estimate


def warnings(e: Estimate) -> dict[str, str]:
    return {w.code or "": w.message or "" for w in e.warnings}


# -- a Job -----------------------------------------------------------------------------------------------


def test_a_p90_finish_after_the_deadline_is_at_risk_with_the_numbers_and_a_fix(catalog: Catalog) -> None:
    e = estimated(catalog, job("2026-11-30T07:00:00Z"))
    assert e.blocking_reasons == []
    message = warnings(e)["DeadlineAtRisk"]
    # now 05:00 + 5m cold start (p90) + 3h run (1.5 × 2h) = 08:05, 1h5m after 07:00.
    assert message.startswith(
        "the p90 finish of the Job is 2026-11-30T08:05:00Z (now + 3h5m0s: 5m0s start + 3h0m0s run, p90), "
        "1h5m0s after spec.completeByTime 2026-11-30T07:00:00Z. It is a hint: nothing is stopped at it."
    )
    for fix in ("placement.profile: Speed", "lower spec.expectedDuration", "move spec.completeByTime later"):
        assert fix in message
    assert "parallelism" not in message and "no node is free" not in message
    assert list(warnings(e))[-1] == "DeadlineAtRisk"  # after the scheduler's other warnings


def test_a_deadline_the_p90_finish_meets_is_no_warning(catalog: Catalog) -> None:
    assert "DeadlineAtRisk" not in warnings(estimated(catalog, job("2026-11-30T08:05:00Z")))
    assert "DeadlineAtRisk" not in warnings(estimated(catalog, job("2026-12-01T00:00:00Z")))
    assert estimated(catalog, job(None)).warnings == estimated(catalog, job("2030-01-01T00:00:00Z")).warnings


def test_waves_of_indexes_add_up_and_parallelism_is_the_fix(catalog: Catalog) -> None:
    e = estimated(catalog, job("2026-11-30T10:00:00Z", completions=4, parallelism=2))
    message = warnings(e)["DeadlineAtRisk"]
    assert "is 2026-11-30T11:10:00Z (now + 6h10m0s: 2 waves of 5m0s start + 3h0m0s run, p90)" in message
    assert "1h10m0s after spec.completeByTime" in message
    assert "raise spec.parallelism (now 2: 4 indexes run in 2 waves)" in message


def test_without_an_expected_duration_the_fix_says_to_set_one(catalog: Catalog) -> None:
    e = estimated(catalog, job("2026-11-30T06:00:00Z", expected_duration=None))
    message = warnings(e)["DeadlineAtRisk"]  # the default hour: p90 1h30m
    assert "(now + 1h35m0s: 5m0s start + 1h30m0s run, p90), 35m0s after" in message
    assert "set spec.expectedDuration if you know how long a run takes" in message


def test_waiting_for_capacity_comes_on_top_and_is_said(catalog: Catalog) -> None:
    e = estimated(catalog, job("2026-11-30T07:00:00Z"), busy={"n1"})
    assert "Queued" in warnings(e)
    assert "no node is free now, so time waiting for capacity comes on top" in warnings(e)["DeadlineAtRisk"]


def test_a_deadline_already_past_is_a_warning_never_a_refusal(catalog: Catalog) -> None:
    e = estimated(catalog, job("1970-01-01T00:00:00Z"))
    assert e.blocking_reasons == []
    found = warnings(e)
    assert "DeadlineAtRisk" not in found
    assert found["DeadlinePassed"].startswith(
        "spec.completeByTime 1970-01-01T00:00:00Z is already past (by 498893h0m0s): it is a hint and never "
        "stops the run, so the create is admitted"
    )


def test_nothing_to_run_it_on_is_the_blocking_reasons_answer(catalog: Catalog) -> None:
    spec = msgspec.structs.replace(job("2026-11-30T05:30:00Z"), resources=Resources(gpu="B200:1"))
    e = estimated(catalog, spec)
    assert [b.code for b in e.blocking_reasons] == ["CapacityUnavailable"]
    assert "DeadlineAtRisk" not in warnings(e)
    past = estimated(catalog, msgspec.structs.replace(spec, complete_by_time="2026-11-30T04:00:00Z"))
    assert "DeadlinePassed" in warnings(past)


# -- a Sweep ---------------------------------------------------------------------------------------------


def sweep(deadline: str, max_parallel: int, gpus: list[str], params: list[str]) -> SweepSpec:
    template = JobSpec(image="x", expected_duration="10m", complete_by_time=deadline)  # p90 15m
    return SweepSpec(
        max_parallel=max_parallel,
        matrix=SweepMatrix(gpu=list(gpus), regions=["us"], params={"LR": params}),
        template=SweepTemplate(kind="Job", spec=template),
    )


def test_a_sweeps_last_cell_finishes_after_rounds_of_max_parallel(catalog: Catalog) -> None:
    spec = sweep("2026-11-30T05:20:00Z", 2, ["L4:1"], ["1", "2", "3"])
    reply = estimate(EstimateRequest(namespace="p", kind="Sweep", sweep_spec=spec), catalog, [], set(), NOW)
    cold = startup_of(catalog.offering("l4-x1-us")).cold
    assert cold is not None and cold.p90 is not None
    cell = parse_duration(cold.p90) + timedelta(minutes=15)
    message = warnings(reply.estimate)["DeadlineAtRisk"]
    # 3 cells, 2 at a time: the third starts when the first ends.
    assert f"the p90 finish of the last cell is {format_time(NOW + 2 * cell)}" in message
    assert "3 cells, 2 at a time; cells L4:1/us:" in message
    assert "after spec.template.spec.completeByTime 2026-11-30T05:20:00Z" in message
    assert "raise spec.maxParallel (now 2: 3 cells run in 2 rounds)" in message
    assert "lower spec.template.spec.expectedDuration" in message


def test_a_sweep_within_its_deadline_is_quiet(catalog: Catalog) -> None:
    spec = sweep("2026-11-30T08:00:00Z", 4, ["L4:1", "A100:1"], ["1", "2"])
    reply = estimate(EstimateRequest(namespace="p", kind="Sweep", sweep_spec=spec), catalog, [], set(), NOW)
    assert len(reply.slots) == 2
    assert "DeadlineAtRisk" not in warnings(reply.estimate)


def plan(
    first: int, cells: int, run: str, boot: str = "0s", completions: int = 1, parallelism: int = 1
) -> SlotPlan:
    return SlotPlan(
        label="x",
        first_cell=first,
        cells=cells,
        completions=completions,
        parallelism=parallelism,
        run=DurationBand(p50=run, p90=run),
        boot=DurationBand(p50=boot, p90=boot),
    )


def test_cells_take_the_next_free_slot_in_cell_order() -> None:
    h = timedelta(hours=1)
    # One long cell, then three short ones on the other slot: the long one ends last.
    assert sweep_p90([plan(0, 1, "10h"), plan(1, 3, "1h")], 2) == 10 * h
    # Short cells first: the long one starts when the first short one ends.
    assert sweep_p90([plan(2, 1, "10h"), plan(0, 2, "1h")], 2) == 11 * h
    assert sweep_p90([plan(0, 5, "1h", "6m")], 2) == 3 * timedelta(minutes=66)
    assert sweep_p90([plan(0, 3, "1h")], 8) == h
    assert slot_p90(plan(0, 1, "1h", "5m", completions=5, parallelism=2)) == 3 * timedelta(minutes=65)


# -- both endpoints over NATS ------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def endpoints(nc: NATS, unique: str) -> AsyncIterator[tuple[str, str]]:
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


async def test_the_endpoints_warn_of_a_deadline_at_risk(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    nodes = ObjectStore(nc, "nodes", Node)
    now = datetime.now(UTC)
    await nodes.create(node(unique, now=now))
    try:
        deadline = format_time(now + timedelta(hours=1))
        reply = await ask(
            nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=job(deadline))
        )
        past = await ask(
            nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=job("2020-01-01T00:00:00Z"))
        )
    finally:
        await nodes.delete(None, unique)
    e = reply.estimate
    assert e.blocking_reasons == [] and e.cost_usd is not None  # priced as any other create
    assert [w.code for w in e.warnings] == ["DeadlineAtRisk", "BalanceNotChecked"]  # billing's come after
    assert f"after spec.completeByTime {deadline}" in warnings(e)["DeadlineAtRisk"]
    assert past.estimate.blocking_reasons == [] and "DeadlinePassed" in warnings(past.estimate)
