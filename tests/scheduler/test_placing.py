"""Placement (ADR-0009, ADR-0014): one test per matching rule of the reference, the interruptible policies,
the profiles' order, the reason counts, and the capacity index against the per-node wrapper."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodus_scheduler.capacity import CapacityIndex, gone_at
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.placing import (
    REASONS,
    Demand,
    NoPlacement,
    Placement,
    demand_of,
    place,
    place_demand,
    place_in,
    price_book_candidates,
    rate_ceiling_of,
)
from nodus_scheduler.ruling import compress
from nodus_schema.catalog import Catalog, HostShape, Offering, PriceBook, StartupBand, StartupBands, Variant
from nodus_schema.estimating import RATE_CEILING_ANNOTATION, rate_ceiling_micros
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec, Resources
from nodus_schema.jobs import Placement as JobPlacement
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def node(
    name: str,
    offering: str,
    region: str = "us",
    *,
    beat_age_s: int = 1,
    phase: str = "Ready",
    pool: str | None = None,
    interruptible: bool | None = None,
    unschedulable: bool | None = None,
) -> Node:
    return Node(
        metadata=ObjectMeta(name=name),
        spec=NodeSpec(
            offering=offering,
            region_class=region,
            pool=pool,
            interruptible=interruptible,
            unschedulable=unschedulable,
        ),
        status=NodeStatus(phase=phase, last_heartbeat_time=format_time(NOW - timedelta(seconds=beat_age_s))),
    )


def spec(
    gpu: GPURequest | str | None,
    regions: list[str] | None = None,
    *,
    cpu: str | None = None,
    memory: str | None = None,
    disk: str | None = None,
    **placement: Any,
) -> JobSpec:
    return JobSpec(
        image="x",
        resources=Resources(gpu=gpu, cpu=cpu, memory=memory, disk=disk),
        placement=JobPlacement(regions=regions or [], **placement),
    )


def placed(got: Placement | NoPlacement) -> str:
    assert isinstance(got, Placement), got
    return got.node.metadata.name or ""


def refused(got: Placement | NoPlacement) -> str:
    assert isinstance(got, NoPlacement), got
    return got.message


NODES = [
    node("h100-sxm", "h100-sxm-80g-x1-us"),
    node("h100-pcie", "h100-pcie-80g-x1-us"),
    node("a100", "a100-sxm-80g-x1-eu", "eu"),
    node("l4", "l4-x1-us"),
]


# -- the GPU request: family, exact, type list, count, interconnect, minMemory ---------------------------


def test_a_family_matches_any_of_its_variants(catalog: Catalog) -> None:
    nodes = [node("nvl", "h100-nvl-94g-x1-us"), node("a100", "a100-sxm-80g-x1-us")]
    assert placed(place(spec("H100:1", profile="Cost"), nodes, set(), catalog, NOW)) == "nvl"
    assert placed(place(spec("H100:1"), NODES, set(), catalog, NOW)) in ("h100-sxm", "h100-pcie")


def test_a_family_never_matches_another_family(catalog: Catalog) -> None:
    # H200 is Hopper too, and more than an H100: still another family.
    nodes = [node("h200", "h200-sxm-141g-x1-us"), node("a100", "a100-sxm-80g-x1-us")]
    assert refused(place(spec("H100:1"), nodes, set(), catalog, NOW)) == "0/2 nodes: 2 other accelerator"
    got = place(spec("A100:1", regions=["us"]), NODES, set(), catalog, NOW)
    assert refused(got) == "0/4 nodes: 3 other accelerator, 1 other region"


def test_exact_pins_the_variant(catalog: Catalog) -> None:
    sxm = GPURequest(type=["H100-SXM-80G"], exact=True, count=1)
    assert placed(place(spec(sxm, profile="Cost"), NODES, set(), catalog, NOW)) == "h100-sxm"
    # exact takes variant ids only: a family name pins nothing.
    family = GPURequest(type=["H100"], exact=True, count=1)
    assert refused(place(spec(family), NODES, set(), catalog, NOW)) == "0/4 nodes: 4 other accelerator"


def test_a_variant_id_without_exact_matches_that_variant(catalog: Catalog) -> None:
    assert placed(place(spec("H100-PCIE-80G:1", profile="Speed"), NODES, set(), catalog, NOW)) == "h100-pcie"


def test_a_type_list_means_any_of_them(catalog: Catalog) -> None:
    req = GPURequest(type=["A100", "L4"], count=1)
    assert placed(place(spec(req, profile="Cost"), NODES, set(), catalog, NOW)) == "l4"  # 0.79 < 1.969
    assert placed(place(spec(req, profile="Speed"), NODES, set(), catalog, NOW)) == "a100"  # 312 > 121 TFLOPS
    assert placed(place(spec(req), NODES, {"l4"}, catalog, NOW)) == "a100"


def test_count_is_gpus_per_node_and_must_equal_the_offering(catalog: Catalog) -> None:
    nodes = [*NODES, node("l4-quad", "l4-x4-us")]
    assert placed(place(spec("L4:4"), nodes, set(), catalog, NOW)) == "l4-quad"
    got = refused(place(spec("L4:8"), nodes, set(), catalog, NOW))
    assert got == "0/5 nodes: 3 other accelerator, 2 not 8 GPUs per node"


def test_interconnect_nvlink_is_a_floor(catalog: Catalog) -> None:
    nvlink = GPURequest(type=["H100"], count=1, interconnect="NVLink")
    assert placed(place(spec(nvlink, profile="Cost"), NODES, set(), catalog, NOW)) == "h100-sxm"  # not PCIe
    got = refused(place(spec(nvlink), NODES, {"h100-sxm"}, catalog, NOW))
    assert got == "0/4 nodes: 2 other accelerator, 1 not NVLink, 1 busy"
    # Infinity Fabric is not NVLink; Any takes it.
    mi = [node("mi", "mi300x-x1-us")]
    amd = GPURequest(type=["MI300X"], count=1, interconnect="NVLink")
    assert refused(place(spec(amd), mi, set(), catalog, NOW)) == "0/1 nodes: 1 not NVLink"
    assert placed(
        place(spec(GPURequest(type=["MI300X"], count=1, interconnect="Any")), mi, set(), catalog, NOW)
    )


def test_min_memory_is_a_per_gpu_floor(catalog: Catalog) -> None:
    nodes = [*NODES, node("nvl", "h100-nvl-94g-x1-us")]
    big = GPURequest(type=["H100"], count=1, min_memory="90Gi")
    assert placed(place(spec(big), nodes, set(), catalog, NOW)) == "nvl"  # 94Gi; the others have 80Gi
    got = refused(place(spec(big), nodes, {"nvl"}, catalog, NOW))
    assert got == "0/5 nodes: 2 other accelerator, 2 below minMemory, 1 busy"


# -- host floors, regions, offerings, pool -----------------------------------------------------------------


def test_cpu_memory_and_disk_are_floors_on_the_host_shape(catalog: Catalog) -> None:
    # h100-sxm-80g-x1-us: 12 cores, 120Gi, 200Gi; h100-nvl-94g-x1-us: 16 cores, 160Gi, 1000Gi.
    nodes = [node("sxm", "h100-sxm-80g-x1-us"), node("nvl", "h100-nvl-94g-x1-us")]
    assert placed(place(spec("H100:1", cpu="12", profile="Speed"), nodes, set(), catalog, NOW)) == "sxm"
    assert placed(place(spec("H100:1", cpu="13"), nodes, set(), catalog, NOW)) == "nvl"
    assert placed(place(spec("H100:1", memory="150Gi"), nodes, set(), catalog, NOW)) == "nvl"
    assert placed(place(spec("H100:1", disk="500Gi"), nodes, set(), catalog, NOW)) == "nvl"
    assert refused(place(spec("H100:1", cpu="32"), nodes, set(), catalog, NOW)) == "0/2 nodes: 2 too few CPUs"
    got = refused(place(spec("H100:1", memory="1Ti"), nodes, set(), catalog, NOW))
    assert got == "0/2 nodes: 2 too little memory"
    assert (
        refused(place(spec("H100:1", disk="2Ti"), nodes, set(), catalog, NOW))
        == "0/2 nodes: 2 too little disk"
    )


def test_regions_restrict_and_empty_means_any(catalog: Catalog) -> None:
    assert placed(place(spec("A100:1"), NODES, set(), catalog, NOW)) == "a100"
    assert placed(place(spec("A100:1", regions=["eu", "asia"]), NODES, set(), catalog, NOW)) == "a100"
    assert "1 other region" in refused(place(spec("A100:1", regions=["us"]), NODES, set(), catalog, NOW))


def test_offerings_are_an_allow_list(catalog: Catalog) -> None:
    only_pcie = spec("H100:1", offerings=["h100-pcie-80g-x1-us"], profile="Speed")
    assert placed(place(only_pcie, NODES, set(), catalog, NOW)) == "h100-pcie"
    got = refused(place(only_pcie, NODES, {"h100-pcie"}, catalog, NOW))
    assert got == "0/4 nodes: 2 other accelerator, 1 offering not allowed, 1 busy"


def test_pool_restricts_to_its_nodes_and_pool_nodes_serve_only_their_pool(catalog: Catalog) -> None:
    nodes = [
        node("shared", "l4-x1-us"),
        node("mine", "l4-x1-us", pool="lab"),
        node("theirs", "l4-x1-us", pool="x"),
    ]
    assert placed(place(spec("L4:1", pool="lab"), nodes, set(), catalog, NOW)) == "mine"
    assert placed(place(spec("L4:1"), nodes, set(), catalog, NOW)) == "shared"
    assert refused(place(spec("L4:1"), nodes, {"shared"}, catalog, NOW)) == "0/3 nodes: 2 other pool, 1 busy"
    assert refused(place(spec("L4:1", pool="lab"), nodes, {"mine"}, catalog, NOW)) == (
        "0/3 nodes: 2 other pool, 1 busy"
    )


# -- rates: maxRateUSDPerHour and the bound rate of an estimate ------------------------------------------


def test_max_rate_filters_out_capacity_above_it(catalog: Catalog) -> None:
    # h100-pcie-80g-x1-us is 2.49 exactly: at the cap is allowed, a micro-dollar less is not.
    assert (
        placed(place(spec("H100:1", max_rate_usd_per_hour="2.49"), NODES, set(), catalog, NOW)) == "h100-pcie"
    )
    got = refused(place(spec("H100:1", max_rate_usd_per_hour="2.489999"), NODES, set(), catalog, NOW))
    assert got == "0/4 nodes: 2 other accelerator, 2 above maxRateUSDPerHour"


def test_offerings_above_the_bound_rate_are_skipped(catalog: Catalog) -> None:
    # Bound to the PCIe node's rate (2.49 $/h), + 10 %: 2.739 $/h; the SXM node (2.99) is above it.
    ceiling = rate_ceiling_micros(2_490_000)
    got = place(spec("H100:1"), NODES, {"h100-pcie"}, catalog, NOW, ceiling_micros=ceiling)
    assert refused(got) == "0/4 nodes: 2 other accelerator, 1 above the bound rate, 1 busy"
    # Without a ceiling the SXM node takes it; with one it is exactly at (+10 % of 2.99 = 3.289), too.
    assert placed(place(spec("H100:1"), NODES, {"h100-pcie"}, catalog, NOW)) == "h100-sxm"
    at = place(
        spec("H100:1"), NODES, {"h100-pcie"}, catalog, NOW, ceiling_micros=rate_ceiling_micros(2_990_000)
    )
    assert placed(at) == "h100-sxm"


def test_the_ceiling_still_orders_by_the_profile_under_it(catalog: Catalog) -> None:
    cost = spec("H100:1", profile="Cost")
    ceiling = rate_ceiling_micros(2_990_000)
    assert placed(place(cost, NODES, set(), catalog, NOW, ceiling_micros=ceiling)) == "h100-pcie"


def test_the_ceiling_is_read_from_the_annotation() -> None:
    def meta(value: str | None) -> ObjectMeta:
        return ObjectMeta(name="j", annotations={} if value is None else {RATE_CEILING_ANNOTATION: value})

    assert rate_ceiling_of(meta("3289000")) == 3_289_000
    assert rate_ceiling_of(meta(None)) is None
    assert rate_ceiling_of(meta("lots")) is None  # not the gateway's: ignored rather than fatal


# -- a small price book of our own, for the order: profiles and interruptible capacity ------------------


def offering(oid: str, variant: str, rate: int, spot: int | None = None, cold_high: int = 300) -> Offering:
    return Offering(
        id=oid,
        variant=variant,
        gpus_per_node=1,
        region_class="us",
        rate_micros_per_hour=rate,
        interruptible_rate_micros_per_hour=spot,
        host=HostShape(cpu="8", memory="64Gi", disk="200Gi"),
        startup=StartupBands(
            cold=StartupBand(low_seconds=60, high_seconds=cold_high),
            warm=StartupBand(low_seconds=5, high_seconds=20),
        ),
    )


# X-FAST: 1000 TFLOPS at 3.00 (3.0 $/PFLOPS-h); X-MID: 800 at 1.20 (1.5); X-SLOW: 500 at 1.00 (2.0).
MINI = Catalog(
    pricebook_version="2026-01-01.1",
    variants=[
        Variant(id="X-FAST", family="X", memory="80Gi", interconnect="NVLink", tflops=1000),
        Variant(id="X-MID", family="X", memory="80Gi", interconnect="NVLink", tflops=800),
        Variant(id="X-SLOW", family="X", memory="80Gi", interconnect="PCIe", tflops=500),
    ],
    offerings=[
        offering("fast", "X-FAST", 3_000_000, cold_high=400),
        offering("fast-quick", "X-FAST", 3_000_000, cold_high=200),
        offering("mid", "X-MID", 1_200_000),
        offering("slow", "X-SLOW", 1_000_000, spot=600_000),  # interruptible + 25 % = 0.75: worth it
        offering("slow-dear-spot", "X-SLOW", 1_000_000, spot=900_000),  # + 25 % = 1.125: not worth it
    ],
)


def test_cost_orders_by_the_lowest_rate() -> None:
    nodes = [node("a", "fast"), node("b", "mid"), node("c", "slow")]
    assert placed(place(spec("X:1", profile="Cost"), nodes, set(), MINI, NOW)) == "c"
    assert placed(place(spec("X:1", profile="Cost"), nodes, {"c"}, MINI, NOW)) == "b"


def test_speed_orders_by_tflops_then_the_cold_start() -> None:
    nodes = [node("a", "fast"), node("b", "mid"), node("c", "slow"), node("d", "fast-quick")]
    assert placed(place(spec("X:1", profile="Speed"), nodes, set(), MINI, NOW)) == "d"  # 200 s < 400 s
    assert placed(place(spec("X:1", profile="Speed"), nodes, {"d"}, MINI, NOW)) == "a"
    assert placed(place(spec("X:1", profile="Speed"), nodes, {"a", "d"}, MINI, NOW)) == "b"


def test_balanced_orders_by_rate_per_tflops() -> None:
    nodes = [node("a", "fast"), node("b", "mid"), node("c", "slow")]
    assert placed(place(spec("X:1", profile="Balanced"), nodes, set(), MINI, NOW)) == "b"  # 1.5 < 2.0 < 3.0
    assert placed(place(spec("X:1", profile="Balanced"), nodes, {"b"}, MINI, NOW)) == "c"
    assert placed(place(spec("X:1"), nodes, set(), MINI, NOW)) == "b"  # Balanced is the default


def test_ties_are_broken_by_node_name() -> None:
    nodes = [node("n3", "slow"), node("n1", "slow"), node("n2", "slow")]
    assert placed(place(spec("X:1", profile="Cost"), nodes, set(), MINI, NOW)) == "n1"
    assert placed(place(spec("X:1", profile="Cost"), nodes, {"n1"}, MINI, NOW)) == "n2"


def test_interruptible_never_excludes_interruptible_capacity() -> None:
    nodes = [node("spot", "slow", interruptible=True), node("od", "fast")]
    got = place(spec("X:1", profile="Cost", interruptible="Never"), nodes, set(), MINI, NOW)
    assert placed(got) == "od"
    assert refused(place(spec("X:1", interruptible="Never"), nodes, {"od"}, MINI, NOW)) == (
        "0/2 nodes: 1 interruptible, 1 busy"
    )
    assert placed(place(spec("X:1", profile="Cost"), nodes, set(), MINI, NOW)) == "od"  # Never is the default


def test_allow_takes_interruptible_capacity_when_its_expected_cost_is_lower() -> None:
    nodes = [node("od", "slow"), node("spot", "slow", interruptible=True)]
    got = place(spec("X:1", profile="Cost", interruptible="Allow"), nodes, set(), MINI, NOW)
    assert isinstance(got, Placement) and placed(got) == "spot"
    assert (got.interruptible, got.rate_micros_per_hour) == (True, 600_000)  # charged the interruptible rate


def test_allow_keeps_on_demand_when_interruptible_is_not_worth_the_risk() -> None:
    nodes = [node("od", "slow-dear-spot"), node("spot", "slow-dear-spot", interruptible=True)]
    got = place(spec("X:1", profile="Cost", interruptible="Allow"), nodes, set(), MINI, NOW)
    assert isinstance(got, Placement) and placed(got) == "od"
    assert (got.interruptible, got.rate_micros_per_hour) == (False, 1_000_000)
    # ... and takes the interruptible node when the on-demand one is busy.
    assert placed(place(spec("X:1", interruptible="Allow"), nodes, {"od"}, MINI, NOW)) == "spot"


def test_prefer_takes_interruptible_first_and_falls_back_to_on_demand() -> None:
    nodes = [node("od", "slow"), node("spot", "slow-dear-spot", interruptible=True), node("fast", "fast")]
    prefer = spec("X:1", profile="Cost", interruptible="Prefer")
    got = place(prefer, nodes, set(), MINI, NOW)
    assert isinstance(got, Placement) and placed(got) == "spot" and got.rate_micros_per_hour == 900_000
    assert placed(place(prefer, nodes, {"spot"}, MINI, NOW)) == "od"


def test_max_rate_compares_the_rate_charged_on_interruptible_capacity() -> None:
    nodes = [node("od", "slow"), node("spot", "slow", interruptible=True)]
    capped = spec("X:1", interruptible="Allow", max_rate_usd_per_hour="0.70")
    assert placed(place(capped, nodes, set(), MINI, NOW)) == "spot"
    assert (
        refused(place(capped, nodes, {"spot"}, MINI, NOW)) == "0/2 nodes: 1 above maxRateUSDPerHour, 1 busy"
    )


def test_interruptible_capacity_the_price_book_does_not_sell_is_refused() -> None:
    nodes = [node("spot", "fast", interruptible=True)]  # "fast" has no interruptible rate
    got = place(spec("X:1", interruptible="Prefer"), nodes, set(), MINI, NOW)
    assert refused(got) == "0/1 nodes: 1 not in price book"


# -- readiness, busy, and the reasons ----------------------------------------------------------------


def test_not_ready_nodes_are_skipped_phase_cordon_and_stale_heartbeat(catalog: Catalog) -> None:
    nodes = [
        node("old", "l4-x1-us", beat_age_s=16),
        node("down", "l4-x1-us", phase="NotReady"),
        node("cordoned", "l4-x1-us", unschedulable=True),
        node("fresh", "l4-x1-us", beat_age_s=15),  # exactly at the grace: still ready
    ]
    assert placed(place(spec("L4:1"), nodes, set(), catalog, NOW)) == "fresh"
    assert refused(place(spec("L4:1"), nodes, {"fresh"}, catalog, NOW)) == "0/4 nodes: 3 not ready, 1 busy"


def test_every_node_counts_once_under_its_first_reason_most_first(catalog: Catalog) -> None:
    nodes = [
        *[node(f"a100-{i}", "a100-sxm-80g-x1-us") for i in range(4)],  # other accelerator (even if busy)
        *[node(f"eu-{i}", "l4-x1-eu", "eu") for i in range(2)],  # other region
        node("l4-old", "l4-x1-us", beat_age_s=60),  # not ready (and busy: counted once, as not ready)
        *[node(f"l4-{i}", "l4-x1-us") for i in range(2)],  # busy
        node("ghost", "no-such-offering"),  # not in price book
    ]
    busy = {"a100-0", "l4-old", "l4-0", "l4-1"}
    got = refused(place(spec("L4:1", regions=["us"]), nodes, busy, catalog, NOW))
    assert got == "0/10 nodes: 4 other accelerator, 2 other region, 2 busy, 1 not in price book, 1 not ready"


def test_the_reason_order_is_fixed_and_documented() -> None:
    assert REASONS[0] == "not in price book" and REASONS[-2:] == ("not ready", "busy")
    assert REASONS.index("other accelerator") < REASONS.index("other region") < REASONS.index("busy")


def test_no_nodes_says_so(catalog: Catalog) -> None:
    assert refused(place(spec("L4:1"), [], set(), catalog, NOW)) == "0/0 nodes: no node agent is registered"


def test_a_placement_says_what_it_is_charged_at_and_why(catalog: Catalog) -> None:
    got = place(spec("L4:1"), NODES, set(), catalog, NOW)
    assert isinstance(got, Placement)
    assert (got.offering.id, got.rate_micros_per_hour, got.interruptible) == ("l4-x1-us", 790_000, False)
    assert got.pricebook_version == "2026-11-30.1"
    assert got.explain.startswith("l4-x1-us (us, on-demand) at 0.79 USD/h on node l4: profile Balanced")


# -- price book versions --------------------------------------------------------------------------------


def test_a_job_is_placed_and_priced_at_its_price_book(catalog: Catalog) -> None:
    old = catalog.at("2026-09-01.1")
    nodes = [node("sxm", "h100-sxm-80g-x1-us"), node("h200", "h200-sxm-141g-x1-us")]
    now_ = place(spec("H100:1"), nodes, set(), catalog, NOW)
    then = place(spec("H100:1"), nodes, set(), old, NOW)
    assert isinstance(now_, Placement) and isinstance(then, Placement)
    assert (now_.rate_micros_per_hour, now_.pricebook_version) == (2_990_000, "2026-11-30.1")
    assert (then.rate_micros_per_hour, then.pricebook_version) == (3_290_000, "2026-09-01.1")
    # H200 was not in the older book: its nodes are not capacity for Jobs admitted under it.
    assert (
        refused(place(spec("H200:1"), nodes, set(), old, NOW))
        == "0/2 nodes: 1 not in price book, 1 other accelerator"
    )


# -- the price book alone (what estimates can use) -----------------------------------------------------


def test_price_book_candidates_follow_the_profile(catalog: Catalog) -> None:
    cost, refusals = price_book_candidates(spec("H100:1", regions=["us"], profile="Cost"), catalog)
    assert [c.offering.id for c in cost][:1] == ["h100-pcie-80g-x1-us"]
    assert refusals["other region"] == 3 and sum(refusals.values()) + len(cost) == len(catalog.offerings)
    speed, _ = price_book_candidates(spec("H100:1", regions=["us"], profile="Speed"), catalog)
    assert speed[0].offering.id == "h100-sxm-80g-x1-us"
    allow, _ = price_book_candidates(
        spec("H100:1", regions=["us"], profile="Cost", interruptible="Allow"), catalog
    )
    assert (allow[0].offering.id, allow[0].interruptible, allow[0].rate_micros_per_hour) == (
        "h100-pcie-80g-x1-us",
        True,
        1_195_200,
    )


# -- the index: incremental changes, readiness over time, same answers as the wrapper -------------------


def test_the_index_changes_incrementally(catalog: Catalog) -> None:
    index = CapacityIndex()
    for n in NODES:
        index.upsert(n, NOW)
    job = spec("H100:1", profile="Cost")
    assert placed(place_in(index, job, catalog, NOW)) == "h100-pcie"
    index.mark_busy("h100-pcie")
    assert placed(place_in(index, job, catalog, NOW)) == "h100-sxm"
    index.mark_busy("h100-sxm")
    assert refused(place_in(index, job, catalog, NOW)) == "0/4 nodes: 2 other accelerator, 2 busy"
    index.mark_free("h100-pcie")
    assert placed(place_in(index, job, catalog, NOW)) == "h100-pcie"
    index.remove("h100-pcie")
    assert refused(place_in(index, job, catalog, NOW)) == "0/3 nodes: 2 other accelerator, 1 busy"
    # A node marked busy before its record arrives stays busy when it does.
    index.mark_busy("late")
    index.upsert(node("late", "h100-pcie-80g-x1-us"), NOW)
    assert refused(place_in(index, job, catalog, NOW)) == "0/4 nodes: 2 other accelerator, 2 busy"
    # A changed record moves the node: it now serves another offering.
    index.upsert(node("l4", "h100-nvl-94g-x1-us"), NOW)
    assert placed(place_in(index, job, catalog, NOW)) == "l4"


def test_heartbeats_go_stale_in_the_index_without_any_change(catalog: Catalog) -> None:
    index = CapacityIndex.of([node("l4", "l4-x1-us", beat_age_s=1)], now=NOW)
    job = spec("L4:1")
    assert placed(place_in(index, job, catalog, NOW + timedelta(seconds=14))) == "l4"
    assert refused(place_in(index, job, catalog, NOW + timedelta(seconds=15))) == "0/1 nodes: 1 not ready"
    index.upsert(node("l4", "l4-x1-us", beat_age_s=-15), NOW + timedelta(seconds=15))  # a new heartbeat
    assert placed(place_in(index, job, catalog, NOW + timedelta(seconds=15))) == "l4"


def test_a_node_not_ready_past_the_unreachable_grace_leaves_the_index(catalog: Catalog) -> None:
    # Issue #18: the nodes of stopped or killed agents leave placement and its explanations.
    nodes = [
        node("l4", "l4-x1-us"),
        node("down", "l4-x1-us", phase="NotReady", beat_age_s=10),
        node("stopped", "l4-x1-us", phase="NotReady", beat_age_s=601),  # past the grace: not counted
        node("killed", "l4-x1-us", beat_age_s=700),  # never marked NotReady: silent is NotReady
    ]
    index = CapacityIndex.of(nodes, {"l4"}, NOW, unreachable=timedelta(seconds=600))
    job = spec("L4:1")
    assert refused(place_in(index, job, catalog, NOW)) == "0/2 nodes: 1 not ready, 1 busy"
    assert "stopped" not in index and "killed" not in index
    # Time alone takes "down" out too, with no change to its record; l4 keeps beating.
    later = NOW + timedelta(seconds=591)
    index.upsert(node("l4", "l4-x1-us", beat_age_s=-590), later)
    assert refused(place_in(index, job, catalog, later)) == "0/1 nodes: 1 busy"
    assert sum(g.total for g in index.groups()) == len(index) == 1
    # Its agent comes back: a heartbeat puts it in again, and it is placed.
    index.upsert(node("down", "l4-x1-us", beat_age_s=-591), later)
    assert placed(place_in(index, job, catalog, later)) == "down"
    # Without an unreachable grace (estimates' per-call index, the default) nothing leaves.
    assert refused(place(job, nodes, {"l4"}, catalog, NOW)) == "0/4 nodes: 3 not ready, 1 busy"


def test_gone_counts_from_the_last_heartbeat_never_before_the_heartbeat_grace() -> None:
    second = timedelta(seconds=1)
    # An agent that stopped said NotReady itself: gone one grace after it did.
    assert gone_at(node("a", "l4-x1-us", phase="NotReady", beat_age_s=0), second) == NOW + second
    # One that was killed is Ready for the heartbeat grace (15 s) after its last beat: not gone before.
    assert gone_at(node("b", "l4-x1-us", beat_age_s=0), second) == NOW + timedelta(seconds=15)
    assert gone_at(node("c", "l4-x1-us", beat_age_s=0), 60 * second) == NOW + 60 * second
    assert gone_at(Node(metadata=ObjectMeta(name="d")), second) is None  # no time to count from


def test_the_index_answers_what_the_per_node_wrapper_answers(catalog: Catalog) -> None:
    rng = random.Random(5)
    offerings = [o.id for o in catalog.offerings if o.gpus_per_node == 1]
    nodes: dict[str, Node] = {}
    busy: set[str] = set()
    index = CapacityIndex()
    jobs = [
        spec("H100:1"),
        spec("A100,L4:1", regions=["us"], profile="Cost"),
        spec("L4:1", profile="Speed", interruptible="Allow"),
        spec(GPURequest(type=["H100"], count=1, interconnect="NVLink"), interruptible="Prefer"),
        spec("H200:1", max_rate_usd_per_hour="3.00", pool="lab", interruptible="Allow"),
    ]
    for step in range(400):
        name = f"n{rng.randrange(60):02d}"
        action = rng.random()
        if action < 0.5:
            o = catalog.offering(rng.choice(offerings))
            assert o is not None
            n = node(
                name,
                o.id,
                o.region_class,
                beat_age_s=rng.choice([1, 5, 20]),
                pool=rng.choice([None, None, "lab"]),
                interruptible=rng.choice([None, True]),
            )
            nodes[name] = n
            index.upsert(n, NOW)
        elif action < 0.6:
            nodes.pop(name, None)
            index.remove(name)
        elif action < 0.8:
            busy.add(name)
            index.mark_busy(name)
        else:
            busy.discard(name)
            index.mark_free(name)
        job = jobs[step % len(jobs)]
        assert place_in(index, job, catalog, NOW) == place(job, list(nodes.values()), busy, catalog, NOW)


def test_demands_are_hashable_and_default_like_the_gateway() -> None:
    d = demand_of(spec("H100:2"))
    assert d == Demand(gpu_types=("H100",), count=2, interruptible="Never", profile="Balanced")
    assert hash(d) == hash(demand_of(spec("H100:2")))
    assert place_demand(CapacityIndex(), d, MINI, NOW) == NoPlacement(
        "0/0 nodes: no node agent is registered"
    )


def test_completed_indexes_compress_as_kubernetes() -> None:
    assert compress([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert compress([]) == ""


def test_catalog_has_the_families_and_three_region_classes(catalog: Catalog) -> None:
    assert {"H100", "A100", "L4", "H200", "B200", "MI300X"} <= catalog.families()
    assert {o.region_class for o in catalog.offerings} == {"us", "eu", "asia"}
    assert isinstance(catalog.pricebooks[0], PriceBook)


# -- drained nodes (ADR-0022): a GPU fault takes a node out of placement, with its own reason -----------


def test_a_draining_node_is_skipped_and_counted_as_drained(catalog: Catalog) -> None:
    nodes = [
        node("faulty", "l4-x1-us", phase="Draining"),
        node("faulty-and-busy", "l4-x1-us", phase="Draining"),  # still finishing its work: drained, once
        node("down", "l4-x1-us", phase="NotReady"),
        node("ok", "l4-x1-us"),
    ]
    assert placed(place(spec("L4:1"), nodes, {"faulty-and-busy"}, catalog, NOW)) == "ok"
    got = refused(place(spec("L4:1"), nodes, {"ok", "faulty-and-busy"}, catalog, NOW))
    assert got == "0/4 nodes: 2 drained, 1 not ready, 1 busy"
    assert REASONS.index("above the bound rate") < REASONS.index("drained") < REASONS.index("not ready")


def test_a_drain_and_its_end_move_the_node_in_the_index(catalog: Catalog) -> None:
    index = CapacityIndex.of([node("l4", "l4-x1-us")], now=NOW)
    job = spec("L4:1")
    assert placed(place_in(index, job, catalog, NOW)) == "l4"
    index.upsert(node("l4", "l4-x1-us", phase="Draining"), NOW)
    assert not index.is_ready("l4")
    assert refused(place_in(index, job, catalog, NOW)) == "0/1 nodes: 1 drained"
    # Busy and free while drained: still drained (the counts never go below zero or double count).
    index.mark_busy("l4")
    index.mark_free("l4")
    assert refused(place_in(index, job, catalog, NOW)) == "0/1 nodes: 1 drained"
    # A drained node whose heartbeats stop stays "drained": the drain says more than the silence.
    index.expire(NOW + timedelta(seconds=60))
    assert refused(place_in(index, job, catalog, NOW + timedelta(seconds=60))) == "0/1 nodes: 1 drained"
    # The agent restarted (the operator's un-drain): Ready again, and placed.
    index.upsert(node("l4", "l4-x1-us"), NOW)
    assert placed(place_in(index, job, catalog, NOW)) == "l4"
    group = next(index.groups())
    assert (group.total, group.drained, group.not_ready, group.free) == (1, 0, 0, 1)
    index.upsert(node("l4", "l4-x1-us", phase="Draining"), NOW)
    index.remove("l4")
    assert (group.total, group.drained) == (0, 0)
