"""How cost grows with size (issue #23): lists, watch fan-out, controller memory and reconcile lag at
1,000, 10,000 and 100,000 Jobs, in one namespace and spread over 100 namespaces.

For each layout a fresh nats-server; for each size the Jobs are added to reach it (bench/growth_stack.py:
written straight into the store, Suspended, with the status the controllers write) and the four
control-plane processes are started fresh over them, so each process's memory is what listing that many
Jobs costs it. Once the stack is idle it is measured (bench/growth_measures.py): lists through the gateway,
watch fan-out to 100 clients, each process's RSS, and the lag from a Job's update to the scheduler's and
billing's writes. Every row is a cost per object (or per update) at a size against the same at the
smallest size, as a ratio of rates: 100% is flat, below 100% it grew. The chart of every measure goes to
docs/benchmarks-growth.png.

``NODUS_GROWTH_SIZES`` (default ``1000,10000,100000``) and ``NODUS_GROWTH_LAYOUTS`` (``one,hundred``)
choose what runs; 100,000 takes some minutes per layout.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx

from bench import growth_chart
from bench.growth_measures import PAGE, WAIT_S, WATCHERS, fan_out, lag, p99, walk, whole
from bench.growth_stack import (
    CONTROLLERS,
    SERVICES,
    Layout,
    headers,
    job_name,
    seed,
    settled_template,
    start_services,
    stop_services,
    wait_idle,
)
from bench.running import Result, bus_auth
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job
from nodus_testing.natsserver import NatsServer

LAYOUTS: Final = {"one": Layout("one namespace", 1), "hundred": Layout("100 namespaces", 100)}
UPDATES: Final = 20  # watch fan-out rounds per size
PROBES: Final = 10  # reconcile lag probes per size
IDLE_DEADLINE_S: Final = 300.0
"""How long the stack may take to settle over a size before it is measured anyway (see _measure)."""
TARGET: Final = 0.8
"""Flat within this machine's run-to-run noise (2 shared cores): a cost per object at most 1.25x the
smallest size's."""


def _sizes() -> list[int]:
    return [int(s) for s in os.environ.get("NODUS_GROWTH_SIZES", "1000,10000,100000").split(",")]


def _layouts() -> list[Layout]:
    return [LAYOUTS[k] for k in os.environ.get("NODUS_GROWTH_LAYOUTS", "one,hundred").split(",")]


async def run(n: int) -> list[Result]:
    del n  # the sizes come from NODUS_GROWTH_SIZES
    sizes = _sizes()
    data: dict[str, dict[int, dict[str, Any]]] = {}
    for layout in _layouts():
        data[layout.name] = await _layout(layout, sizes)
    out = Path(tempfile.gettempdir()) / "nodus-growth.json"
    out.write_text(json.dumps(data, indent=1))
    print(f"growth: every measure in {out}")
    growth_chart.write(data)
    return _results(data, sizes)


async def _layout(layout: Layout, sizes: list[int]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    with (
        NatsServer(auth=bus_auth()) as server,
        tempfile.TemporaryDirectory(prefix="nodus-growth-") as tmp_dir,
    ):
        tmp = Path(tmp_dir)
        nc = await connect(server.url, "bench", nkey_seed=server.harness_seed)
        try:
            await declaring.ensure(nc.jetstream())
            jobs = ObjectStore(nc, "jobs", Job)
            services = start_services(server, tmp, "empty")
            try:
                template = await settled_template(jobs)
                await wait_idle(services)
                empty = {name: services.rss(name) for name, _ in SERVICES}
            finally:
                stop_services(services)
            have = 0
            for size in sizes:
                seconds = await seed(jobs, template, layout, have, size)
                print(
                    f"growth: {layout.name}, {size:,} Jobs seeded ({size - have:,} in {seconds:.0f} s)",
                    flush=True,
                )
                have = size
                rows[size] = await _measure(server, tmp, jobs, layout, size, empty)
                print(f"growth: {layout.name}, {size:,}: {json.dumps(rows[size])}", flush=True)
        finally:
            await nc.close()
    return rows


async def _measure(
    server: NatsServer, tmp: Path, jobs: ObjectStore[Job], layout: Layout, size: int, empty: dict[str, int]
) -> dict[str, Any]:
    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    services = start_services(server, tmp, str(size))
    try:
        row["ready_s"] = time.perf_counter() - t0
        try:
            row["idle_s"] = await wait_idle(services, IDLE_DEADLINE_S)
        except TimeoutError:
            # Still busy (billing metering 100,000 Jobs of one project, one book): measured as it is, the
            # time to idle a lower bound.
            row["idle_s"], row["idle"] = IDLE_DEADLINE_S, False
        row["rss"] = {name: services.rss(name) for name, _ in SERVICES}
        row["rss_per_object"] = {k: (v - empty[k]) / size for k, v in row["rss"].items()}
        async with httpx.AsyncClient(base_url=services.gateway_url, headers=headers(), timeout=600) as http:
            row.update(await _lists(http, layout, size))
        cpu0 = services.cpu()
        watch = await fan_out(services.gateway_url, jobs, layout.first, job_name(0), UPDATES)
        row["watch_p99_ms"] = p99(watch) * 1e3
        row["watch_p50_ms"] = statistics.median(watch) * 1e3
        row["watch_cpu_ms_per_update"] = (services.cpu() - cpu0) / UPDATES * 1e3
        row.update(await _lags(jobs, layout, size))
    finally:
        stop_services(services)
    return row


async def _lists(http: httpx.AsyncClient, layout: Layout, size: int) -> dict[str, Any]:
    """The walk and the whole list over every Job (one namespace, or all namespaces); with 100
    namespaces also one namespace's whole list (size / 100 Jobs)."""
    scope = layout.first if layout.namespaces == 1 else None
    rounds = 5 if size <= 1_000 else 3 if size <= 10_000 else 1
    walks = [await walk(http, scope) for _ in range(rounds)]
    pages = [s for w in walks for s in w.pages]
    objects = sum(w.objects for w in walks)
    row: dict[str, Any] = {
        "walk_us_per_object": sum(w.seconds for w in walks) / objects * 1e6,
        "page_p99_ms": p99(pages) * 1e3,
        "page_p50_ms": statistics.median(pages) * 1e3,
        "pages": len(pages),
        "walk_complete": all(w.complete for w in walks),
    }
    repeats = 20 if size <= 1_000 else 10 if size <= 10_000 else 3
    timed = [await whole(http, scope) for _ in range(repeats)]
    row["whole_p99_ms"] = p99([s for s, _ in timed]) * 1e3
    row["whole_us_per_object"] = row["whole_p99_ms"] * 1e3 / timed[0][1]
    if layout.namespaces > 1:
        one = [await whole(http, layout.first) for _ in range(20)]
        row["ns_whole_p99_ms"] = p99([s for s, _ in one]) * 1e3
        row["ns_whole_us_per_object"] = row["ns_whole_p99_ms"] * 1e3 / one[0][1]
    return row


async def _lags(jobs: ObjectStore[Job], layout: Layout, size: int) -> dict[str, Any]:
    """Probes on distinct Jobs (each is cancelled), taken from the top of the seeded range."""
    scheduler, billing = [], []
    for k in range(PROBES):
        i = size - 1 - k
        s, b = await lag(jobs, layout.namespace(i), job_name(i))
        scheduler.append(s)
        billing.append(b)
        if WAIT_S in (s, b):
            break  # a write not seen within WAIT_S: the lag is at least that, and the next probes too
    return {
        "lag_scheduler_p99_ms": p99(scheduler) * 1e3,
        "lag_scheduler_p50_ms": statistics.median(scheduler) * 1e3,
        "lag_billing_p99_ms": p99(billing) * 1e3,
        "lag_billing_p50_ms": statistics.median(billing) * 1e3,
    }


def _results(data: dict[str, dict[int, dict[str, Any]]], sizes: list[int]) -> list[Result]:
    out: list[Result] = []
    base = sizes[0]
    for layout, rows in data.items():
        first = rows[base]
        for size in sizes[1:]:
            row = rows[size]
            out += _rows(layout, size, base, row, first)
    return out


def _rows(layout: str, size: int, base: int, row: dict[str, Any], first: dict[str, Any]) -> list[Result]:
    at, was = f"{layout}, {size:,}", f"same at {base:,}"
    scope = "all namespaces" if "ns_whole_p99_ms" in row else "the namespace"
    walk_us, whole_us = row["walk_us_per_object"], row["whole_us_per_object"]
    out = [
        _per(
            f"list {scope}, limit={PAGE} walk: {walk_us:.1f} µs/object, "
            f"page p99 {row['page_p99_ms']:.0f} ms ({at})",
            f"{was}: {first['walk_us_per_object']:.1f} µs/object",
            walk_us,
            first["walk_us_per_object"],
            1e6,
        ),
        _per(
            f"list {scope}, no limit: p99 {row['whole_p99_ms']:.0f} ms, {whole_us:.1f} µs/object ({at})",
            f"{was}: {first['whole_us_per_object']:.1f} µs/object",
            whole_us,
            first["whole_us_per_object"],
            1e6,
        ),
    ]
    if "ns_whole_p99_ms" in row:
        out.append(
            _per(
                f"list one namespace ({size // 100:,} Jobs), no limit: p99 {row['ns_whole_p99_ms']:.1f} ms, "
                f"{row['ns_whole_us_per_object']:.0f} µs/object ({at})",
                f"{was} ({base // 100:,} Jobs): {first['ns_whole_us_per_object']:.0f} µs/object",
                row["ns_whole_us_per_object"],
                first["ns_whole_us_per_object"],
                1e6,
            )
        )
    out.append(
        _per(
            f"watch fan-out to {WATCHERS} clients: p99 {row['watch_p99_ms']:.0f} ms per update ({at})",
            f"{was}: {first['watch_p99_ms']:.0f} ms",
            row["watch_p99_ms"],
            first["watch_p99_ms"],
            1e3,
        )
    )
    for name in CONTROLLERS:
        now, then = row["rss_per_object"][name], first["rss_per_object"][name]
        mib = row["rss"][name] / 2**20
        out.append(
            _per(
                f"{name} RSS: {now / 1024:.1f} KiB/Job, {mib:.0f} MiB ({at})",
                f"{was}: {then / 1024:.1f} KiB/Job",
                now,
                then,
                2**20,
            )
        )
    for who in ("scheduler", "billing"):
        key = f"lag_{who}_p99_ms"
        out.append(
            _per(
                f"reconcile lag, Job cancelled -> {who}'s write: p99 {row[key]:.0f} ms ({at})",
                f"{was}: {first[key]:.0f} ms",
                row[key],
                first[key],
                1e3,
            )
        )
    return out


def _per(name: str, baseline: str, cost: float, base_cost: float, scale: float) -> Result:
    """A row whose ratio is the smallest size's cost over this size's (flat: 100%). Its rates are
    ``scale / cost``: objects per second for µs per object, Jobs per MiB for bytes, per second for ms."""
    return Result(name, baseline, scale / max(cost, 1e-9), scale / max(base_cost, 1e-9), target=TARGET)
