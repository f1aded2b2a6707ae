"""Estimates (ADR-031): the scheduler's choice of capacity, the duration bands, the ETag binding, and the
two endpoints answering over the session's real NATS (scheduler, then billing, as the gateway will ask)."""

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
from nodus_kit.keying import Page
from nodus_kit.storing import ObjectStore
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog, pricebook_version_of
from nodus_scheduler.estimating import choose, estimate
from nodus_scheduler.recalling import RunHistory, history_key, run_band, run_seconds_of
from nodus_schema.catalog import Catalog
from nodus_schema.costs import Estimate
from nodus_schema.defaulting import default_job
from nodus_schema.estimating import (
    ESTIMATE_SUBJECT,
    QUOTE_SUBJECT,
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
    bind_estimate,
    duration_band,
    estimate_etag,
    history_band,
    parse_estimate_etag,
    percentile,
    rate_ceiling_micros,
    startup_of,
    valid_until,
    within_rate_bound,
)
from nodus_schema.expanding import cell_job, expand
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Distributed, Job, JobSpec, JobStatus, Placement, Recovery, Resources
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_schema.sweeps import Sweep, SweepMatrix, SweepSpec, SweepStatus, SweepTemplate
from nodus_sweeps.reconciling import _bound

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
SXM = GPURequest(type=["H100-SXM-80G"], exact=True, count=1)
SXM8 = GPURequest(type=["H100-SXM-80G"], exact=True, count=8)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def job(
    gpu: GPURequest | str, *, expected: str | None = "2h", regions: list[str] | None = None, **kw: Any
) -> JobSpec:
    kw.setdefault("placement", Placement(regions=regions if regions is not None else ["us"]))
    kw.setdefault("image", "x")
    return JobSpec(expected_duration=expected, resources=Resources(gpu=gpu), **kw)


def req(spec: JobSpec, **kw: Any) -> EstimateRequest:
    return EstimateRequest(namespace="p", kind="Job", job_spec=spec, **kw)


def codes(e: Estimate) -> list[str | None]:
    return [w.code for w in e.warnings]


def warning(e: Estimate, code: str) -> str:
    (found,) = [w for w in e.warnings if w.code == code]
    return found.message or ""


def finished(
    ns: str,
    name: str,
    wall: int | None,
    *,
    image: str = "x",
    gpu: GPURequest | str = SXM,
    phase: str = "Succeeded",
    at: str = "2026-11-30T04:00:00Z",
    **kw: Any,
) -> Job:
    """A finished Job as the scheduler leaves it in the jobs bucket: phase, wall time, completion time."""
    return Job(
        metadata=ObjectMeta(namespace=ns, name=name),
        spec=JobSpec(image=image, resources=Resources(gpu=gpu), **kw),
        status=JobStatus(phase=phase, wall_seconds=wall, completion_time=at),
    )


def history_of(*jobs: Job) -> RunHistory:
    history = RunHistory()
    history.load(jobs)
    return history


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


def test_a_family_is_ordered_by_the_profile_balanced_by_default(catalog: Catalog) -> None:
    """ADR-0014: Balanced (the default) takes the lowest rate per TFLOPS, Cost the lowest rate, Speed the
    most TFLOPS; the estimate previews what placement would take, not the cheapest offering."""

    def offering(profile: str | None) -> str | None:
        spec = job("H100:1", placement=Placement(regions=["us"], profile=profile))
        choice = choose(spec, catalog, [], set(), NOW)
        return choice.offering.id if choice.offering else None

    assert offering(None) == "h100-sxm-80g-x1-us"  # 2.99/989 < 2.49/756 < 2.79/835
    assert offering("Balanced") == "h100-sxm-80g-x1-us"
    assert offering("Cost") == "h100-pcie-80g-x1-us"  # 2.49 < 2.79 < 2.99
    assert offering("Speed") == "h100-sxm-80g-x1-us"  # 989 TFLOPS


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


def test_a_sweep_group_nothing_offers_blocks_and_the_others_are_priced(catalog: Catalog) -> None:
    sweep = SweepSpec(
        matrix=SweepMatrix(gpu=["L4:1", "B200:1"]),
        template=SweepTemplate(kind="Job", spec=JobSpec(image="x", expected_duration="2h")),
    )
    e = estimate(
        EstimateRequest(namespace="p", kind="Sweep", sweep_spec=sweep), catalog, [], set(), NOW
    ).estimate
    (reason,) = e.blocking_reasons
    assert reason.code == "CapacityUnavailable"
    assert (reason.message or "").startswith(
        "nothing in the price book can run cells B200:1 (from cell 1): 0/32"
    )
    assert e.placement_preview is not None and e.placement_preview.offering == "l4-x1-us"
    assert e.rate_usd_per_hour == "0.79"


# -- startup bands and price book versions ----------------------------------------------------------


def test_startup_bands_are_the_offerings_own(catalog: Catalog) -> None:
    s = startup_of(catalog.offering("mi300x-x8-us"))
    assert s.cold is not None and s.warm is not None
    assert (s.cold.p50, s.cold.p90, s.warm.p50, s.warm.p90) == ("9m0s", "23m0s", "20s", "1m0s")
    older = catalog.at("2026-09-01.1").offering("h100-sxm-80g-x1-us")
    assert older is not None and startup_of(older) == startup_of(None)  # no bands in that book: defaults


def test_the_boot_billed_is_the_offerings_cold_band(catalog: Catalog) -> None:
    reply = estimate(req(job(SXM8, distributed=Distributed(nodes=2))), catalog, [], set(), NOW)
    (slot,) = reply.slots
    assert (slot.boot.p50, slot.boot.p90) == ("4m0s", "10m0s")
    startup = reply.estimate.startup
    assert startup is not None and startup.warm is not None and startup.warm.p90 == "45s"


def test_an_existing_objects_price_book_version_prices_it(catalog: Catalog) -> None:
    e = estimate(req(job(SXM), pricebook_version="2026-09-01.1"), catalog, [], set(), NOW).estimate
    assert (e.pricebook_version, e.rate_usd_per_hour) == ("2026-09-01.1", "3.29")
    assert "PricebookUnknown" not in codes(e)
    assert e.placement_preview is not None
    assert "1/16 offerings in price book 2026-09-01.1 fit" in (e.placement_preview.explain or "")


def test_a_new_create_is_priced_at_the_newest_version(catalog: Catalog) -> None:
    older = catalog.at("2026-09-01.1")  # whichever version the scheduler's catalog object is
    e = estimate(req(job(SXM)), older, [], set(), NOW).estimate
    assert (e.pricebook_version, e.rate_usd_per_hour) == ("2026-11-30.1", "2.99")


def test_an_unknown_version_is_priced_at_the_newest_and_says_so(catalog: Catalog) -> None:
    e = estimate(req(job(SXM), pricebook_version="2020-01-01.1"), catalog, [], set(), NOW).estimate
    assert e.pricebook_version == "2026-11-30.1"
    assert codes(e)[0] == "PricebookUnknown"
    assert warning(e, "PricebookUnknown") == (
        "price book 2020-01-01.1 is not one this scheduler ships (2026-11-30.1, 2026-09-01.1); "
        "priced at the newest, 2026-11-30.1"
    )


# -- the placement preview and interruptible capacity ----------------------------------------------


def test_the_preview_says_what_placement_would_take(catalog: Catalog) -> None:
    nodes = [ready_node("n1", "h100-sxm-80g-x1-us", "us", NOW)]
    e = estimate(req(job(SXM)), catalog, nodes, set(), NOW).estimate
    p = e.placement_preview
    assert p is not None
    assert (p.offering, p.region_class, p.interruptible, p.warm_reuse) == (
        "h100-sxm-80g-x1-us",
        "us",
        False,
        False,
    )
    assert (p.explain or "").startswith(
        "h100-sxm-80g-x1-us (us, on-demand) at 2.99 USD/h on node n1: profile Balanced, interruptible Never"
    )


def test_a_queued_preview_explains_the_price_book_and_the_nodes(catalog: Catalog) -> None:
    e = estimate(req(job("H100:1")), catalog, [], set(), NOW).estimate
    assert e.placement_preview is not None
    assert e.placement_preview.explain == (
        "h100-sxm-80g-x1-us (us, on-demand) at 2.99 USD/h: profile Balanced, interruptible Never; "
        "3/32 offerings in price book 2026-11-30.1 fit; no node is free now "
        "(0/0 nodes: no node agent is registered)"
    )


@pytest.mark.parametrize(
    ("policy", "rate", "interruptible"),
    [
        ("Never", "2.99", False),
        ("Allow", "1.495", True),  # 1.495 + 25 % risk = 1.86875 still ranks before 2.99
        ("Prefer", "1.495", True),
    ],
)
def test_the_interruptible_policy_picks_the_capacity_and_its_rate(
    catalog: Catalog, policy: str, rate: str, interruptible: bool
) -> None:
    spec = job(SXM, placement=Placement(regions=["us"], interruptible=policy))
    reply = estimate(req(spec), catalog, [], set(), NOW)
    e = reply.estimate
    assert e.placement_preview is not None and e.placement_preview.interruptible is interruptible
    assert e.rate_usd_per_hour == rate and reply.slots[0].interruptible is interruptible
    assert ("InterruptibleSelected" in codes(e)) is interruptible


def test_interruptible_selected_says_what_a_reclaim_costs(catalog: Catalog) -> None:
    checkpointed = job(SXM, placement=Placement(regions=["us"], interruptible="Allow"))
    e = estimate(req(checkpointed), catalog, [], set(), NOW).estimate
    assert warning(e, "InterruptibleSelected") == (
        "interruptible capacity was chosen for the Job: h100-sxm-80g-x1-us at 1.495 USD/h (on-demand 2.99 "
        "USD/h); the provider can reclaim it, and a reclaimed run resumes from its latest checkpoint on new "
        "capacity"
    )
    ephemeral = job(
        SXM,
        placement=Placement(regions=["us"], interruptible="Allow"),
        recovery=Recovery(continuity="Ephemeral"),
    )
    e = estimate(req(ephemeral), catalog, [], set(), NOW).estimate
    assert "starts over from the beginning" in warning(e, "InterruptibleSelected")


def test_prefer_takes_a_free_on_demand_node_rather_than_wait(catalog: Catalog) -> None:
    nodes = [ready_node("n1", "h100-sxm-80g-x1-us", "us", NOW)]  # an on-demand node
    spec = job(SXM, placement=Placement(regions=["us"], interruptible="Prefer"))
    e = estimate(req(spec), catalog, nodes, set(), NOW).estimate
    assert e.placement_preview is not None and e.placement_preview.interruptible is False
    assert e.rate_usd_per_hour == "2.99" and "InterruptibleSelected" not in codes(e)


# -- blocking reasons and their fix ------------------------------------------------------------------


def test_capacity_unavailable_names_the_constraints_to_lift(catalog: Catalog) -> None:
    spec = job("H100:1", placement=Placement(max_rate_usd_per_hour="2.00"))
    (reason,) = estimate(req(spec), catalog, [], set(), NOW).estimate.blocking_reasons
    assert reason.message == (
        "nothing in the price book can run the Job: 0/32 offerings in price book 2026-11-30.1: "
        "21 other accelerator, 6 above maxRateUSDPerHour, 5 not 1 GPUs per node"
    )
    assert reason.fix == (
        "Raise spec.placement.maxRateUSDPerHour to at least 2.49 (the cheapest matching capacity); "
        "or set spec.placement.interruptible: Allow (interruptible capacity matches)."
    )


@pytest.mark.parametrize(
    ("gpu", "regions", "fix"),
    [
        ("MI300X:1", ["eu"], "Choose a region class in spec.placement.regions that has it: us."),
        (
            GPURequest(type=["H100-SXM-80G"], exact=True, count=2),
            [],
            "Ask for 1 or 8 GPUs per node in spec.resources.gpu.count.",
        ),
    ],
)
def test_capacity_unavailable_fixes(
    catalog: Catalog, gpu: GPURequest | str, regions: list[str], fix: str
) -> None:
    (reason,) = estimate(req(job(gpu, regions=regions)), catalog, [], set(), NOW).estimate.blocking_reasons
    assert (reason.code, reason.fix) == ("CapacityUnavailable", fix)


def test_a_gpu_nothing_offers_gets_the_general_fix(catalog: Catalog) -> None:
    (reason,) = estimate(req(job("B200:1")), catalog, [], set(), NOW).estimate.blocking_reasons
    assert (
        reason.fix is not None and reason.fix.startswith("Widen placement") and "resources.gpu" in reason.fix
    )


# -- durations: declared, then run history, then the default ------------------------------------


def test_a_runs_time_is_its_wall_time_per_wave() -> None:
    assert run_seconds_of(finished("p", "a", 3600)) == 3600
    assert run_seconds_of(finished("p", "a", 3601, completions=4, parallelism=2)) == 1801  # 2 waves, up
    assert run_seconds_of(finished("p", "a", 3600, completions=3)) == 1200  # parallelism 1: 3 waves
    assert run_seconds_of(finished("p", "a", 3600, phase="Failed")) is None
    assert run_seconds_of(finished("p", "a", None)) is None


def test_percentiles_are_nearest_rank_and_need_three_runs() -> None:
    ten = list(range(1, 11))
    assert (percentile(ten, 50), percentile(ten, 90), percentile([7], 90)) == (5, 9, 7)
    assert history_band([600, 1200]) is None
    assert history_band([1800, 600, 1200]) == (timedelta(seconds=1200), timedelta(seconds=1800))
    with pytest.raises(ValueError, match="needs values"):
        percentile([], 50)


def test_history_is_kept_per_namespace_image_gpu_and_bounded() -> None:
    history = RunHistory(runs_per_key=3, max_keys=2)
    history.load(
        [finished("p", f"a{i}", 100 * (i + 1), at=f"2026-11-30T0{i}:00:00Z") for i in range(5)]
        + [
            finished("q", "other-namespace", 50, at="2026-11-30T05:00:00Z"),
            finished("p", "other-image", 60, image="y", at="2026-11-29T00:00:00Z"),
            finished("p", "other-gpu", 70, gpu="L4:1", at="2026-11-28T00:00:00Z"),
            finished("p", "failed", 9999, phase="Failed", at="2026-11-30T06:00:00Z"),
        ]
    )
    assert history.runs(history_key("p", job(SXM))) == (300, 400, 500)  # the newest three, oldest first
    assert history.runs(history_key("q", job(SXM))) == (50,)
    assert len(history) == 2  # the two kinds whose latest run is the most recent
    assert history.runs(history_key("p", job(SXM, image="y"))) == ()
    # The same request written another way is the same kind of Job.
    spelled = GPURequest(type=["h100-sxm-80g"], exact=True, count=1, interconnect="Any")
    assert history_key("p", job(spelled)) == history_key("p", job(SXM))
    assert history_key("p", JobSpec()) is None  # no image: nothing to match by


def test_the_run_band_is_declared_then_history_then_the_default() -> None:
    history = history_of(*(finished("p", f"r{i}", s) for i, s in enumerate([1800, 2400, 3000])))
    key = history_key("p", job(SXM))
    declared = run_band(job(SXM, expected="2h"), key, history)
    assert (declared.p50, declared.p90, declared.source) == (
        timedelta(hours=2),
        timedelta(hours=3),
        "Declared",
    )
    learned = run_band(job(SXM, expected=None), key, history)
    assert (learned.p50, learned.p90, learned.source, learned.runs) == (
        timedelta(minutes=40),
        timedelta(minutes=50),
        "History",
        3,
    )
    other = run_band(job("L4:1", expected=None), history_key("p", job("L4:1")), history)
    assert (other.p50, other.p90, other.source) == (timedelta(hours=1), timedelta(minutes=90), "Default")


def test_history_prices_a_job_without_an_expected_duration(catalog: Catalog) -> None:
    history = history_of(*(finished("p", f"r{i}", s) for i, s in enumerate([1800, 2400, 3000, 2400])))
    reply = estimate(req(job(SXM, expected=None)), catalog, [], set(), NOW, history=history)
    (slot,) = reply.slots
    assert (slot.run.p50, slot.run.p90) == ("40m0s", "50m0s")
    e = reply.estimate
    assert warning(e, "DurationFromHistory") == (
        "spec.expectedDuration is unset: the run band of the Job is the p50 40m0s and p90 50m0s of the last "
        "4 succeeded similar Jobs (image x and GPU H100-SXM-80G:1:exact in namespace p)"
    )
    assert not {"NoHistory", "DefaultDuration"} & set(codes(e))
    # A declared duration wins over the history.
    declared = estimate(req(job(SXM, expected="2h")), catalog, [], set(), NOW, history=history)
    assert declared.slots[0].run.p50 == "2h0m0s" and "DurationFromHistory" not in codes(declared.estimate)


def test_without_history_the_default_is_assumed_and_both_are_said(catalog: Catalog) -> None:
    history = history_of(finished("p", "r0", 1800), finished("p", "r1", 2400))
    reply = estimate(req(job(SXM, expected=None)), catalog, [], set(), NOW, history=history)
    (slot,) = reply.slots
    assert (slot.run.p50, slot.run.p90) == ("1h0m0s", "1h30m0s")
    e = reply.estimate
    assert codes(e) == ["Queued", "NoHistory", "DefaultDuration"]
    assert warning(e, "NoHistory") == (
        "no run history for the Job: 2 succeeded Jobs with image x and GPU H100-SXM-80G:1:exact in namespace "
        "p recorded a wall time; 3 are needed"
    )
    assert warning(e, "DefaultDuration") == (
        "spec.expectedDuration is unset and there is no run history: costs assume the default 1h0m0s per "
        "index (p90 1h30m0s); set spec.expectedDuration for a tighter estimate"
    )
    without = estimate(req(job(SXM, expected=None)), catalog, [], set(), NOW).estimate
    assert warning(without, "NoHistory") == "no run history for the Job: no run history is kept"


def test_a_timeout_below_the_run_band_caps_it_and_warns(catalog: Catalog) -> None:
    reply = estimate(req(job(SXM, timeout="2h30m")), catalog, [], set(), NOW)
    assert (reply.slots[0].run.p50, reply.slots[0].run.p90) == ("2h0m0s", "2h30m0s")
    assert warning(reply.estimate, "TimeoutBelowDuration") == (
        "spec.timeout 2h30m0s is below the run band's p90 3h0m0s for the Job: a run that long fails with "
        "DeadlineExceeded; costs are capped at the timeout"
    )
    e = estimate(req(job(SXM, timeout="1h")), catalog, [], set(), NOW).estimate
    assert "even the median run (2h0m0s) is longer, so the Job will likely fail" in warning(
        e, "TimeoutBelowDuration"
    )
    roomy = estimate(req(job(SXM, timeout="3h")), catalog, [], set(), NOW).estimate
    assert "TimeoutBelowDuration" not in codes(roomy)


def test_a_sweeps_groups_learn_from_their_own_history(catalog: Catalog) -> None:
    history = history_of(*(finished("p", f"l4-{i}", 600, gpu="L4:1") for i in range(3)))
    sweep = SweepSpec(
        matrix=SweepMatrix(gpu=["L4:1", "A100:1"]),
        template=SweepTemplate(kind="Job", spec=JobSpec(image="x")),
    )
    reply = estimate(
        EstimateRequest(namespace="p", kind="Sweep", sweep_spec=sweep),
        catalog,
        [],
        set(),
        NOW,
        history=history,
    )
    assert [(s.label, s.run.p50) for s in reply.slots] == [("L4:1", "10m0s"), ("A100:1", "1h0m0s")]
    e = reply.estimate
    assert "the run band of cells L4:1 is the p50 10m0s" in warning(e, "DurationFromHistory")
    assert warning(e, "NoHistory").startswith("no run history for cells A100:1: 0 succeeded Jobs")


# -- cold starts ---------------------------------------------------------------------------------------


def test_a_cold_start_is_warned_when_it_is_a_visible_part_of_the_run(catalog: Catalog) -> None:
    short = estimate(req(job(SXM, expected="10m")), catalog, [], set(), NOW).estimate
    assert warning(short, "ColdStart") == (
        "no warm capacity would be reused for the Job: each node starts cold in 2m0s (p50) to 5m0s (p90) on "
        "h100-sxm-80g-x1-us, billed as Boot; its p90 is 50 % of the run's p50 10m0s"
    )
    assert short.placement_preview is not None and short.placement_preview.warm_reuse is False
    edge = estimate(req(job(SXM, expected="50m")), catalog, [], set(), NOW).estimate
    assert "ColdStart" in codes(edge)  # 5m is exactly 10 % of 50m
    long = estimate(req(job(SXM, expected="51m")), catalog, [], set(), NOW).estimate
    assert "ColdStart" not in codes(long)


# -- the Sweep controller: cells are priced at the Sweep's price book ---------------------------------


def test_cell_jobs_carry_the_price_book_version_the_sweep_was_admitted_under(catalog: Catalog) -> None:
    spec = SweepSpec(
        matrix=SweepMatrix(params={"LR": ["0.1", "0.01"]}),
        template=SweepTemplate(kind="Job", spec=JobSpec(image="x")),
    )
    admitted = Estimate(pricebook_version="2026-09-01.1", rate_usd_per_hour="3.29")
    sweep = Sweep(
        metadata=ObjectMeta(name="s", namespace="p", uid="u"),
        spec=spec,
        status=SweepStatus(estimate=admitted),
    )
    cells = [_bound(sweep, default_job(cell_job(sweep, c))) for c in expand(sweep)]
    # Only the version travels: the cell has no estimate of its own to claim.
    assert [c.status.estimate for c in cells] == [Estimate(pricebook_version="2026-09-01.1")] * 2
    assert {pricebook_version_of(c, catalog) for c in cells} == {"2026-09-01.1"}
    # A version the cell already records is kept.
    recorded = msgspec.structs.replace(
        cells[0], status=JobStatus(estimate=Estimate(pricebook_version="2026-11-30.1"))
    )
    assert _bound(sweep, recorded).status.estimate == Estimate(pricebook_version="2026-11-30.1")
    # A Sweep admitted without an estimate records nothing: the scheduler pins the newest.
    bare = Sweep(metadata=ObjectMeta(name="s", namespace="p", uid="u"), spec=spec)
    cell = _bound(bare, default_job(cell_job(bare, expand(bare)[0])))
    assert cell.status.estimate is None and pricebook_version_of(cell, catalog) == "2026-11-30.1"


# -- the history is read from the jobs bucket, once per refresh ------------------------------------


class _Jobs:
    """A jobs store that counts its lists (or fails them)."""

    def __init__(self, jobs: list[Job], fail: bool = False) -> None:
        self.jobs, self.fail, self.lists = jobs, fail, 0

    async def list(self) -> Page[Job]:
        self.lists += 1
        if self.fail:
            raise RuntimeError("bucket unreachable")
        return Page(self.jobs, 0, None, None)


async def test_the_history_is_listed_once_per_refresh_not_per_request() -> None:
    now = [0.0]
    store = _Jobs([finished("p", f"r{i}", 600) for i in range(3)])
    history = RunHistory(store, refresh_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    first = history.maybe_refresh()
    assert first is not None
    await history.ready(1.0)
    assert history.loaded and history.band(history_key("p", job(SXM))) == (timedelta(minutes=10),) * 2
    for _ in range(10):  # requests within the refresh interval read the summary
        assert history.maybe_refresh() is None
    assert store.lists == 1
    now[0] = 61.0
    again = history.maybe_refresh()
    assert again is not None
    await again
    assert store.lists == 2


async def test_a_history_that_cannot_be_read_is_said_and_retried_later() -> None:
    now = [0.0]
    store = _Jobs([], fail=True)
    history = RunHistory(store, refresh_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    task = history.maybe_refresh()
    assert task is not None
    await task
    key = history_key("p", job(SXM))
    assert history.why_none(key) == "run history is not available (bucket unreachable)"
    assert history.maybe_refresh() is None  # not retried per request
    now[0] = 61.0
    assert history.maybe_refresh() is not None


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
    # The first hold is billing's ten-minute window at the rate, whatever the run: 0.4983333… rounded up.
    assert (e.hold_usd, e.concurrent_hold_usd, e.minimum_charge_usd) == ("0.498334", "0.498334", "0.000831")
    assert e.gang_hold_usd is None and e.assembly_bound_usd is None
    assert e.placement_preview is not None
    assert (e.placement_preview.offering, e.placement_preview.region_class) == ("h100-sxm-80g-x1-us", "us")
    assert e.placement_preview.interruptible is False and e.placement_preview.warm_reuse is False
    assert e.startup is not None and e.startup.cold is not None and e.startup.cold.p50 == "2m0s"
    assert e.valid_until is not None


async def test_a_gang_holds_every_member_and_bounds_its_assembly(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    spec = job(SXM8, distributed=Distributed(nodes=2))
    e = (await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))).estimate
    assert (e.topology, e.rate_usd_per_hour) == ("2x8", "23.92")
    # Per node: 2h at 23.92 is 47.84, plus the offering's cold start, 4m (1.594667); two nodes.
    # p90: 3h is 71.76, plus 10m (3.986667); two nodes.
    assert e.cost_usd is not None and (e.cost_usd.p50, e.cost_usd.p90) == ("98.869334", "151.493334")
    assert e.overhead_usd is not None and (e.overhead_usd.p50, e.overhead_usd.p90) == ("3.189334", "7.973334")
    # Each member's first hold is ten minutes at 23.92 (3.986667); the gang holds both; one gang at once.
    assert (e.hold_usd, e.gang_hold_usd, e.concurrent_hold_usd) == ("7.973334", "7.973334", "7.973334")
    assert e.assembly_bound_usd == "35.88"  # 15m (5.98) × 2 nodes × 3 tries
    assert e.minimum_charge_usd == "0.006645"  # 1 s at 23.92 $/h, rounded up


async def test_parallel_indexes_hold_every_slot_that_starts_at_once(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    spec = job(SXM, completions=4, parallelism=2)
    e = (await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))).estimate
    assert e.cost_usd is not None and e.cost_usd.p50 == "24.318668"  # 4 × (5.98 + 0.099667)
    assert (e.hold_usd, e.concurrent_hold_usd) == ("0.498334", "0.996668")  # ten minutes each, two at once
    assert e.gang_hold_usd is None and e.assembly_bound_usd is None


async def test_the_endpoint_learns_durations_from_the_jobs_bucket(nc: NATS, unique: str) -> None:
    jobs = ObjectStore(nc, "jobs", Job)
    for i, wall in enumerate([1800, 2400, 3000]):
        await jobs.create(finished(unique, f"done-{i}", wall))
    await jobs.create(finished(unique, "failed", 60, phase="Failed"))
    subjects = (f"nodus.rpc.{unique}.estimate", f"nodus.rpc.{unique}.quote")
    history = RunHistory(jobs)
    await history.refresh()  # as the endpoint's first load does (here awaited: no timing in the test)
    subs = [
        await serve_estimates(nc, load_catalog(), subject=subjects[0], history=history),
        await serve_quotes(nc, subject=subjects[1]),
    ]
    try:
        unset = job(SXM, expected=None)
        e = (await ask(nc, subjects, EstimateRequest(namespace=unique, kind="Job", job_spec=unset))).estimate
        elsewhere = EstimateRequest(namespace=f"{unique}-other", kind="Job", job_spec=unset)
        other = (await ask(nc, subjects, elsewhere)).estimate
    finally:
        for sub in subs:
            await sub.unsubscribe()
        for name in ["done-0", "done-1", "done-2", "failed"]:
            await jobs.delete(unique, name)
    assert "DurationFromHistory" in codes(e) and "DefaultDuration" not in codes(e)
    # p50 40m at 2.99 (1.993334) + the 2m boot (0.099667); p90 50m (2.491667) + the 5m boot (0.249167).
    assert e.cost_usd is not None and (e.cost_usd.p50, e.cost_usd.p90) == ("2.093001", "2.740834")
    assert e.hold_usd == "0.498334"  # the history moves the cost, not the hold: ten minutes at the rate
    assert {"NoHistory", "DefaultDuration"} <= set(codes(other))
    assert "0 succeeded Jobs with image x" in warning(other, "NoHistory")


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
    # One cell: 30m run (1.495) + 2m boot (0.099667) at p50; hold ten minutes at 2.99 (0.498334).
    assert e.cost_usd is not None and (e.cost_usd.p50, e.cost_usd.p90) == ("4.784001", "7.475001")
    assert e.hold_usd == "0.498334"
    assert e.concurrent_hold_usd == "0.996668"  # maxParallel 2 cells' holds


async def test_a_cap_below_the_hold_runs_with_a_hold_of_the_cap(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    # A cap is a ceiling (ADR-0023): 0.25 is below the ten-minute first hold (0.498334), and is the hold.
    spec = job(SXM, max_cost_usd="0.25")
    e = (await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))).estimate
    assert e.blocking_reasons == []
    assert (e.hold_usd, e.concurrent_hold_usd, e.minimum_charge_usd) == ("0.25", "0.25", "0.000831")
    assert warning(e, "MaxCostLimitsHold") == (
        "spec.maxCostUSD 0.25 is below a full first hold 0.498334 (the funding window at the rate): the "
        "first hold is 0.25, and the object is suspended with MaxCostReached when it is spent"
    )


async def test_a_cap_below_the_minimum_charge_blocks(
    nc: NATS, unique: str, endpoints: tuple[str, str]
) -> None:
    spec = job(SXM, max_cost_usd="0.0008")  # under one billing increment: 1 s at 2.99 is 0.000831
    reply = await ask(nc, endpoints, EstimateRequest(namespace=unique, kind="Job", job_spec=spec))
    (reason,) = reply.estimate.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert reason.message == (
        "spec.maxCostUSD 0.0008 is below the minimum charge 0.000831 of one index (one billing increment "
        "at its rate): not even one slot could start"
    )
    assert reason.fix == (
        "Raise spec.maxCostUSD to at least 0.000831; any cap from there runs until it is spent, then "
        "suspends the object with MaxCostReached."
    )
    # The estimate says what the run would hold, uncapped.
    assert (reply.estimate.hold_usd, reply.estimate.concurrent_hold_usd) == ("0.498334", "0.498334")
    assert "MaxCostLimitsHold" not in codes(reply.estimate)


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
