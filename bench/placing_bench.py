"""Placement throughput: 10,000 pending single-GPU indexes against 1,000 nodes (issue #5: at least 1,000/s).

The fleet is 1,000 nodes over the shipped price book's offerings (mostly single-GPU, a fifth of them
interruptible, fifty in a BYOC pool, a few not ready). The pending work is a mix of Jobs of every rule:
families, exact variants, type lists, regions, NVLink, memory and host floors, rate caps, pools, the three
interruptible policies and the three profiles. Each placement marks its node busy; once 500 are busy the
oldest finishes, so the scheduler keeps placing into a fleet half full, as it would. Some requests never fit
(B200 is not offered; the pool has few nodes): refusals are timed too, with their reason counts.

Measured: :func:`place_in` on a long-lived CapacityIndex (the request judged per group and cached per
distinct request), the same with every request distinct (no cache hit: each one judges every group),
and the per-node :func:`place` wrapper as the baseline (it builds an index of the node list every call,
as lifecycle.py does today).

``python -m bench.placing_bench`` prints the table and the placements per second; registered in
``bench/__main__.py`` it is ``python -m bench placing``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from datetime import UTC, datetime, timedelta

from bench.running import Result, render
from nodus_scheduler.capacity import CapacityIndex
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.placing import Placement, place, place_in
from nodus_schema.catalog import Catalog
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec, Resources
from nodus_schema.jobs import Placement as JobPlacement
from nodus_schema.meta import ObjectMeta, format_time
from nodus_schema.nodes import Node, NodeSpec, NodeStatus

NODES = 1_000
PENDING = 10_000
RUNNING = 500
REQUIRED = 1_000.0
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def fleet(catalog: Catalog, rng: random.Random) -> list[Node]:
    singles = [o for o in catalog.offerings if o.gpus_per_node == 1]
    others = [o for o in catalog.offerings if o.gpus_per_node > 1]
    nodes: list[Node] = []
    for i in range(NODES):
        o = rng.choice(singles) if rng.random() < 0.9 else rng.choice(others)
        spot = o.interruptible_rate_micros_per_hour is not None and rng.random() < 0.2
        stale = rng.random() < 0.02
        nodes.append(
            Node(
                metadata=ObjectMeta(name=f"node-{i:04d}"),
                spec=NodeSpec(
                    offering=o.id,
                    region_class=o.region_class,
                    pool="lab" if i % 20 == 0 else None,
                    interruptible=spot or None,
                ),
                status=NodeStatus(
                    phase="Ready",
                    last_heartbeat_time=format_time(NOW - timedelta(seconds=60 if stale else 2)),
                ),
            )
        )
    return nodes


def jobs(rate_cap: str | None = None) -> list[JobSpec]:
    def job(gpu: GPURequest | str, regions: list[str] | None = None, **kw: str) -> JobSpec:
        cpu, memory = kw.pop("cpu", None), kw.pop("memory", None)
        if rate_cap is not None and "max_rate_usd_per_hour" not in kw:
            kw["max_rate_usd_per_hour"] = rate_cap
        return JobSpec(
            image="x",
            resources=Resources(gpu=gpu, cpu=cpu, memory=memory),
            placement=JobPlacement(regions=regions or [], **kw),  # type: ignore[arg-type]
        )

    return [
        job("H100:1"),
        job("H100:1", ["us"], profile="Cost", interruptible="Allow"),
        job("A100:1", ["eu"], profile="Speed"),
        job("L4:1", interruptible="Prefer"),
        job("A100,L4:1", ["us", "eu"], profile="Cost"),
        job(GPURequest(type=["H100-SXM-80G"], exact=True, count=1), ["us", "eu"]),
        job(GPURequest(type=["H100", "H200"], count=1, interconnect="NVLink", min_memory="90Gi")),
        job("L40S:1", cpu="8", memory="64Gi"),
        job("A10G:1", max_rate_usd_per_hour="1.00"),
        job("L4:1", pool="lab"),
        job("MI300X:1", profile="Speed"),
        job("B200:1"),  # nothing offers it: every node refused, the reasons counted
    ]


def drive(
    catalog: Catalog, nodes: list[Node], specs: list[JobSpec], n: int, *, indexed: bool
) -> tuple[float, int]:
    """Place ``n`` indexes drawn in turn from ``specs``; returns (placements per second, how many placed)."""
    index = CapacityIndex.of(nodes, (), NOW)
    busy: set[str] = set()
    running: deque[str] = deque()
    placed = 0
    start = time.perf_counter()
    for i in range(n):
        spec = specs[i % len(specs)]
        got = place_in(index, spec, catalog, NOW) if indexed else place(spec, nodes, busy, catalog, NOW)
        if isinstance(got, Placement):
            name = got.node.metadata.name or ""
            index.mark_busy(name)
            busy.add(name)
            running.append(name)
            placed += 1
            if len(running) > RUNNING:
                done = running.popleft()
                index.mark_free(done)
                busy.discard(done)
    return n / (time.perf_counter() - start), placed


async def run(n: int) -> list[Result]:
    """The bench's measures (``n`` is ignored for the index: it always places PENDING indexes)."""
    catalog = load_catalog()
    nodes = fleet(catalog, random.Random(42))
    mixed = jobs()
    # Every request distinct: a different rate cap each, so no cached judgement is ever reused.
    distinct = [s for k in range(PENDING // len(mixed) + 1) for s in jobs(f"{50 + k}.{k % 1000:03d}")]
    indexed, placed = max(drive(catalog, nodes, mixed, PENDING, indexed=True) for _ in range(3))
    uncached, _ = max(drive(catalog, nodes, distinct, PENDING, indexed=True) for _ in range(3))
    baseline, _ = drive(catalog, nodes, mixed, min(n, 300), indexed=False)
    print(f"place_in: {indexed:,.0f} placements/s ({placed:,} of {PENDING:,} placed against {NODES:,} nodes)")
    print(f"place_in, every request distinct: {uncached:,.0f} placements/s")
    print(f"place() over the node list: {baseline:,.0f} placements/s")
    await asyncio.sleep(0)
    return [
        Result(
            f"place_in, {PENDING:,} pending, {NODES:,} nodes",
            "required 1,000 placements/s",
            indexed,
            REQUIRED,
            target=1.0,
        ),
        Result(
            "place_in, every request distinct",
            "required 1,000 placements/s",
            uncached,
            REQUIRED,
            target=1.0,
        ),
        Result("place_in (capacity index)", "place() over the node list", indexed, baseline),
    ]


def main() -> None:
    print(render(asyncio.run(run(PENDING))))


if __name__ == "__main__":
    main()
