"""Warm capacity, the pure parts (issue #21): the rules of a window (nodus_schema.warmth), the capacity
index's warm marks and placement's warm-first pick, billing's Teardown and its cap, and what an estimate
expects of warm capacity (warmplanning)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_billing.standing import Hold, Usage
from nodus_billing.warming import end_of_funding, horizon_ms, warm_open, with_window
from nodus_scheduler.capacity import CapacityIndex, Warm
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimating import estimate
from nodus_scheduler.placing import demand_of, place_demand
from nodus_scheduler.warmplanning import kept_warm, plan_warm
from nodus_schema.attempts import Attempt, AttemptSpec, AttemptStatus
from nodus_schema.catalog import Catalog
from nodus_schema.estimating import EstimateRequest
from nodus_schema.jobs import JobSpec, Placement, Resources
from nodus_schema.ledger import charge_micros
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_schema.sweeps import SweepMatrix, SweepSpec, SweepTemplate
from nodus_schema.warmth import keeps_warm, open_at, scaledown_window, window_end_ms, window_ms

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
RATE = 790_000


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def node(name: str, offering: str = "l4-x1-us", beat: datetime = NOW) -> Node:
    return Node(
        metadata=ObjectMeta(name=name),
        spec=NodeSpec(offering=offering, region_class="us"),
        status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(beat)),
    )


def keeper(
    name: str = "k",
    node_name: str = "n0",
    ns: str = "a",
    *,
    since: int = NOW_MS - 60_000,
    window_s: int = 300,
) -> Attempt:
    return Attempt(
        metadata=ObjectMeta(
            name=name, namespace=ns, creation_timestamp=format_time(NOW - timedelta(minutes=5))
        ),
        spec=AttemptSpec(
            job="j",
            index=0,
            attempt=1,
            node=node_name,
            offering="l4-x1-us",
            region_class="us",
            rate_micros_per_hour=RATE,
            pricebook_version="v",
        ),
        status=AttemptStatus(
            phase="Succeeded",
            billing_start_ms=since - 10_000,
            program_start_ms=since - 9_000,
            billing_stop_ms=since,
            warm_since_ms=since,
            warm_until_ms=since + window_s * 1000,
        ),
    )


def reuser(of: Attempt, at: datetime, ns: str = "a") -> Attempt:
    a = keeper(name=f"r-{of.metadata.name}", node_name=of.spec.node, ns=ns)
    a.metadata.creation_timestamp = format_time(at)
    a.spec.warm_from = of.metadata.name
    a.status = AttemptStatus(phase="Running")
    return a


# -- the rules --------------------------------------------------------------------------------------------
def test_only_a_window_above_zero_and_an_ending_that_keeps_the_node_keeps_it_warm() -> None:
    spec = JobSpec(image="x", scaledown_window="5m")
    assert scaledown_window(spec) == timedelta(minutes=5)
    assert keeps_warm(spec, "Succeeded", "Completed") and keeps_warm(spec, "Failed", "Error")
    assert not keeps_warm(spec, "Lost", "Lost")
    assert not keeps_warm(JobSpec(image="x", scaledown_window="0s"), "Succeeded", "Completed")
    assert not keeps_warm(JobSpec(image="x"), "Succeeded", "Completed")


@given(
    window_s=st.integers(1, 1200),
    end_after_s=st.one_of(st.none(), st.integers(-5, 1500)),
    reuse_after_s=st.one_of(st.none(), st.integers(0, 1500)),
    now_after_s=st.integers(0, 2000),
)
def test_a_window_ends_at_its_earliest_end_and_never_before_it_began(
    window_s: int, end_after_s: int | None, reuse_after_s: int | None, now_after_s: int
) -> None:
    since = NOW_MS
    k = keeper(since=since, window_s=window_s)
    if end_after_s is not None:
        k.status.warm_end_ms = since + end_after_s * 1000
    reusers = [] if reuse_after_s is None else [reuser(k, NOW + timedelta(seconds=reuse_after_s))]
    end = window_end_ms(k, reusers)
    assert end is not None and since <= end <= since + window_s * 1000
    candidates = [since + window_s * 1000]
    if end_after_s is not None:
        candidates.append(since + end_after_s * 1000)
    if reuse_after_s is not None:
        candidates.append(since + reuse_after_s * 1000)
    assert end == max(since, min(candidates))
    now = since + now_after_s * 1000
    assert open_at(k, now, reusers) == (now < end)
    assert 0 <= window_ms(k, now, reusers) <= end - since
    # What billing charges for it never exceeds the window at the rate.
    assert charge_micros(RATE, window_ms(k, now, reusers)) <= charge_micros(RATE, window_s * 1000)


# -- the capacity index and placement -----------------------------------------------------------------------
def test_a_warm_node_is_busy_for_others_and_first_for_its_project(catalog: Catalog) -> None:
    index = CapacityIndex.of([node("n0"), node("n1")], now=NOW)
    index.mark_warm("n1", Warm("a", NOW.timestamp() + 300, "k"))
    d = demand_of(JobSpec(image="x", resources=Resources(gpu="L4:1")))
    mine = place_demand(index, d, catalog, NOW, warm_for="a")
    assert not isinstance(mine, str) and getattr(mine, "warm_from", None) == "k"
    assert mine.node.metadata.name == "n1"  # type: ignore[union-attr]
    theirs = place_demand(index, d, catalog, NOW, warm_for="b")
    assert getattr(theirs, "node", None) is not None and theirs.node.metadata.name == "n0"  # type: ignore[union-attr]
    index.mark_busy("n0")
    assert getattr(place_demand(index, d, catalog, NOW, warm_for="b"), "message", "").startswith("0/2 nodes")
    # A run on the warm node: busy; its end leaves it kept; the window's end frees it.
    index.mark_busy("n1")
    index.mark_free("n1")
    assert index.warm("n1") is not None and index.first_warm(next(iter(index.groups())), "a") == "n1"
    later = NOW + timedelta(seconds=301)
    index.upsert(node("n1", beat=later), later)
    index.expire(later)
    assert index.warm("n1") is None
    found = place_demand(index, d, catalog, later, warm_for="b")
    assert getattr(found, "node", None) is not None and found.node.metadata.name == "n1"  # type: ignore[union-attr]


def test_counts_stay_whole_through_any_order_of_marks() -> None:
    index = CapacityIndex.of([node(f"n{i}") for i in range(3)], now=NOW)
    ops: list[Any] = [
        lambda: index.mark_warm("n0", Warm("a", NOW.timestamp() + 60, "k")),
        lambda: index.mark_busy("n0"),
        lambda: index.mark_warm("n0", None),
        lambda: index.mark_free("n0"),
        lambda: index.mark_warm("n1", Warm("b", NOW.timestamp() + 60, "k2")),
        lambda: index.upsert(node("n1"), NOW),
        lambda: index.remove("n2"),
    ]
    for op in ops:
        op()
        (group,) = list(index.groups())
        assert group.free + group.busy + group.not_ready + group.drained == group.total
    (group,) = list(index.groups())
    assert (group.total, group.free, group.busy) == (2, 1, 1)


# -- billing ---------------------------------------------------------------------------------------------
def test_the_window_is_charged_as_teardown_at_the_runs_rate() -> None:
    k = keeper(window_s=300)
    r = reuser(k, NOW)  # reused 60 s into the window
    usage = Usage(attempt="k", rate_micros_per_hour=RATE, segments={"Boot": 10, "Running": 20})
    assert not warm_open(k, [r], NOW_MS)
    charged = with_window(usage, k, [r], NOW_MS)
    assert charged.segments["Teardown"] == charge_micros(RATE, 60_000)
    assert (charged.segments["Boot"], charged.segments["Running"]) == (10, 20)
    assert horizon_ms(k, [r]) == 10_000 + 60_000
    # A run Nodus covered keeps nothing to charge.
    covered = Usage(attempt="k", rate_micros_per_hour=RATE, covered={"Boot": 5})
    assert with_window(covered, k, [r], NOW_MS) is covered


def test_a_window_the_hold_cannot_fund_ends_where_the_funding_ends() -> None:
    k = keeper(window_s=1200)
    hold = Hold(job="j@u", project="a", month="2026-12", funded_until_ms=NOW_MS + 300)
    assert end_of_funding(hold, k, [], NOW_MS, tick_ms=500) == NOW_MS
    hold.funded_until_ms = NOW_MS - 2_000  # ran out between two looks: never past the funding
    assert end_of_funding(hold, k, [], NOW_MS, tick_ms=500) == NOW_MS - 2_000
    hold.funded_until_ms = NOW_MS + 10_000  # still funded for a while
    assert end_of_funding(hold, k, [], NOW_MS, tick_ms=500) is None
    hold.funded_until_ms = k.status.warm_until_ms or 0  # funded to the window's own end
    assert end_of_funding(hold, k, [], NOW_MS, tick_ms=500) is None


# -- the estimate ----------------------------------------------------------------------------------------
def test_kept_warm_lists_open_unreused_windows_on_idle_nodes() -> None:
    open_ = keeper("k1", "n0", "a")
    reused = keeper("k2", "n1", "a")
    ran_out = keeper("k3", "n2", "a", since=NOW_MS - 400_000)
    busy = keeper("k4", "n3", "b")
    running = keeper("k5", "n3", "b")
    running.status = AttemptStatus(phase="Running")
    found = kept_warm([open_, reused, reuser(reused, NOW), ran_out, busy, running], NOW)
    assert found == {"n0": "a"}


def test_a_sweep_with_a_window_expects_one_cold_start_per_node(catalog: Catalog) -> None:
    spec = JobSpec(
        image="x", resources=Resources(gpu="L4:1"), scaledown_window="5m", placement=Placement(regions=["us"])
    )
    nodes = [node("n0"), node("n1")]
    plan = plan_warm(spec, catalog, nodes, {}, "a", NOW, runs=20, limit=4)
    assert (plan.warm_starts, plan.tails, plan.concurrency) == (18, 2, 2)
    # A node already kept for the project saves one more cold start; one kept for another is not ours.
    assert plan_warm(spec, catalog, nodes, {"n0": "a"}, "a", NOW, runs=20, limit=4).warm_starts == 19
    other = plan_warm(spec, catalog, nodes, {"n0": "b"}, "a", NOW, runs=20, limit=4)
    assert (other.warm_starts, other.concurrency) == (19, 1)
    # Without a window only what is already warm is reused, and nothing stays warm after.
    plain = JobSpec(image="x", resources=Resources(gpu="L4:1"), placement=Placement(regions=["us"]))
    assert (plan_warm(plain, catalog, nodes, {}, "a", NOW, runs=20, limit=4).warm_starts) == 0
    reuse = plan_warm(plain, catalog, nodes, {"n0": "a"}, "a", NOW, runs=20, limit=4)
    assert (reuse.warm_starts, reuse.tails) == (1, 0) and reuse.reuse_now is not None


def test_the_estimate_prices_warm_starts_and_the_windows_after(catalog: Catalog) -> None:
    def sweep(window: str | None) -> SweepSpec:
        template = JobSpec(
            image="x",
            resources=Resources(gpu="L4:1"),
            expected_duration="2m",
            scaledown_window=window,
            placement=Placement(regions=["us"]),
        )
        return SweepSpec(
            matrix=SweepMatrix(params={"A": [str(i) for i in range(20)]}),
            template=SweepTemplate(spec=template),
        )

    nodes = [node("n0"), node("n1")]
    with_window = estimate(
        EstimateRequest(namespace="a", kind="Sweep", sweep_spec=sweep("5m")), catalog, nodes, set(), NOW
    )
    without = estimate(
        EstimateRequest(namespace="a", kind="Sweep", sweep_spec=sweep(None)), catalog, nodes, set(), NOW
    )
    (slot,) = with_window.slots
    assert (slot.warm_starts, slot.warm_tails, slot.warm_window) == (18, 2, "5m")
    assert with_window.estimate.placement_preview and with_window.estimate.placement_preview.warm_reuse
    assert without.estimate.placement_preview and not without.estimate.placement_preview.warm_reuse
    codes = [w.code for w in with_window.estimate.warnings]
    assert "WarmWindow" in codes and "ColdStart" not in codes
