"""The estimate endpoint answers from the scheduler's informers (issue #23): the same estimate as from lists
of the buckets, whatever is busy or kept warm, and a snapshot that follows every change of a Node or an
Attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS

from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.estimateview import CapacityView, candidates
from nodus_scheduler.estimating import estimate
from nodus_scheduler.placing import price_book_candidates
from nodus_scheduler.viewing import World
from nodus_scheduler.warmplanning import kept_warm
from nodus_schema.attempts import Attempt, AttemptSpec, AttemptStatus
from nodus_schema.catalog import Catalog
from nodus_schema.estimating import EstimateRequest
from nodus_schema.jobs import JobSpec, Resources
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus
from nodus_schema.sweeps import SweepMatrix, SweepSpec, SweepTemplate

NOW = datetime.now(UTC).replace(microsecond=0)
NOW_MS = int(NOW.timestamp() * 1000)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def node(name: str, offering: str = "l4-x1-us", rv: int = 1) -> Node:
    return Node(
        metadata=ObjectMeta(name=name, resource_version=str(rv)),
        spec=NodeSpec(offering=offering, region_class="us"),
        status=NodeStatus(phase="Ready", last_heartbeat_time=format_time(NOW - timedelta(seconds=1))),
    )


def attempt(name: str, on: str, ns: str, phase: str, *, warm_s: int = 0, warm_from: str = "") -> Attempt:
    status = AttemptStatus(phase=phase)
    if warm_s:
        status = AttemptStatus(phase=phase, warm_since_ms=NOW_MS - 1000, warm_until_ms=NOW_MS + warm_s * 1000)
    return Attempt(
        metadata=ObjectMeta(name=name, namespace=ns, resource_version="1"),
        spec=AttemptSpec(
            job="j",
            index=0,
            attempt=1,
            node=on,
            offering="l4-x1-us",
            region_class="us",
            rate_micros_per_hour=790_000,
            pricebook_version="v",
            warm_from=warm_from or None,
        ),
        status=status,
    )


def world_of(nc: NATS, nodes: list[Node], attempts: list[Attempt]) -> World:
    """A World whose informers hold these objects, as if listed (never started: no bus traffic)."""
    world = World(nc, funding=False)
    for n in nodes:
        world.nodes.apply(n)
    for a in attempts:
        world.attempts.apply(a)
    world.nodes.synced.set()
    world.attempts.synced.set()
    return world


def spec(window: str | None = None) -> JobSpec:
    return JobSpec(image="busybox", resources=Resources(gpu="L4:1"), scaledown_window=window)


async def test_the_informed_estimate_is_the_listed_one(nc: NATS, catalog: Catalog) -> None:
    nodes = [node(f"n{i}") for i in range(4)] + [node("h0", "h100-sxm-80g-x1-us")]
    attempts = [
        attempt("busy", "n0", "p", "Running"),
        attempt("keeper", "n1", "p", "Succeeded", warm_s=300),  # kept warm for p
        attempt("other", "n2", "q", "Succeeded", warm_s=300),  # kept warm for q
        attempt("old", "n3", "p", "Succeeded", warm_s=300),
        attempt("reuse", "n3", "p", "Succeeded", warm_from="old"),  # old's window was reused
    ]
    view = CapacityView(world_of(nc, nodes, attempts), timedelta(minutes=10))
    capacity = view.now(NOW)
    assert capacity is not None
    assert capacity.busy == {"n0"} and capacity.warm == kept_warm(attempts, NOW) == {"n1": "p", "n2": "q"}
    requests = [
        EstimateRequest(namespace=ns, kind="Job", job_spec=s)
        for ns in ("p", "q", "r")
        for s in (spec(), spec("5m"), JobSpec(image="x", resources=Resources(gpu="H100:1")))
    ]
    sweep = SweepSpec(
        matrix=SweepMatrix(gpu=["L4:1", "H100:1"]), template=SweepTemplate(spec=JobSpec(image="busybox"))
    )
    requests.append(EstimateRequest(namespace="p", kind="Sweep", sweep_spec=sweep))
    for request in requests:
        for _ in range(2):  # the second time from the index's remembered plans
            listed = estimate(request, catalog, nodes, {"n0"}, NOW, warm=kept_warm(attempts, NOW))
            informed = estimate(
                request, catalog, capacity.nodes, capacity.busy, NOW, warm=capacity.warm, capacity=capacity
            )
            assert informed == listed


async def test_a_change_of_a_node_or_an_attempt_makes_a_new_snapshot(nc: NATS) -> None:
    world = world_of(nc, [node("n0")], [])
    view = CapacityView(world, timedelta(minutes=10))
    first = view.now(NOW)
    assert first is not None and view.now(NOW) is first  # kept while nothing changed
    world.attempts.apply(attempt("a", "n0", "p", "Running"))
    second = view.now(NOW)
    assert second is not None and second is not first and second.busy == {"n0"}
    world.nodes.apply(node("n1", rv=2))
    third = view.now(NOW)
    assert third is not None and [n.metadata.name for n in third.nodes] == ["n0", "n1"]


async def test_before_the_informers_list_there_is_no_snapshot(nc: NATS) -> None:
    world = World(nc, funding=False)
    assert CapacityView(world, timedelta(minutes=10)).now(NOW) is None


def test_candidates_are_the_price_books_and_remembered(catalog: Catalog) -> None:
    s = spec()
    assert candidates(s, catalog) == price_book_candidates(s, catalog)
    assert candidates(s, catalog) is candidates(spec(), catalog)
