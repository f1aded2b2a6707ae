"""Killing the sweep controller (SIGKILL, a real process) ten times while a 200-cell Sweep runs.

The rig is the scheduler's crash test's (tests/scheduler/test_crashing.py), with the sweep controller as
the process that dies: a nats-server of its own; the real scheduler and billing in this process (billing,
so every cell has a real cost the Sweep must add up to the micro-dollar); a simulated fleet of single-L4
nodes in this event loop (``nodus_agent.simulating``, docs/simulation.md), whose runs have sampled
lengths and throughputs, so the best cells are not all ties; and ``python -m nodus_sweeps`` as a
subprocess, killed with SIGKILL every dozen or so cells it creates and started again at once.

What "exactly once" means here, and how it is seen:
* a watch on the ``jobs`` bucket records the uid of every revision of every cell: a cell deleted and
  created again shows a second uid (or a DELETED event);
* every cell has exactly one Attempt, and it carries the cell's final uid (a cell created twice would
  leave an Attempt of the first uid behind, even if the watch never saw that uid);
* the fleet started exactly one run per cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_agent.simulating import FleetSettings, SimulatedFleet
from nodus_billing.service import BillingService
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.storing import ObjectStore
from nodus_scheduler.service import SchedulerService
from nodus_schema.attempts import JOB_UID_LABEL, Attempt
from nodus_schema.defaulting import default_sweep
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.sweeps import CELL_LABEL, SWEEP_LABEL, Sweep, SweepSpec
from nodus_testing.hosting import in_process
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

NS = "crash"
SWEEP = "grid"
A_VALUES = [f"{i / 100:.2f}" for i in range(1, 21)]  # 20 values
B_VALUES = [str(i) for i in range(10)]  # x 10 = 200 cells
CELLS = len(A_VALUES) * len(B_VALUES)
MAX_PARALLEL = 20
NODES = 24
KILLS = 10


def _controller(url: str, seed: Path | None, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NODUS_NATS_URL": url,
        "NODUS_NATS_NKEY_SEED": str(seed),
        # The same replica name each time: the new process takes its own (dead) lease at once.
        "NODUS_REPLICA": "crashing",
        "NODUS_LOG_LEVEL": "WARNING",
        "NODUS_RESYNC_S": "2",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nodus_sweeps"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


@dataclass
class Creations:
    """Every uid each cell name was seen with, from a watch on the jobs bucket (history 1: a watch may skip
    superseded revisions, never a whole object, so a second creation always shows a second uid)."""

    uids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    deleted: list[str] = field(default_factory=list)

    def see(self, name: str, uid: str) -> None:
        if uid not in self.uids[name]:
            self.uids[name].append(uid)

    @property
    def cells(self) -> int:
        return len(self.uids)

    def reached(self, n: int) -> bool:
        return self.cells >= n

    async def follow(self, jobs: ObjectStore[Job]) -> None:
        async with jobs.watch(NS) as w:
            async for event in w:
                meta = event.object.metadata
                if meta.labels.get(SWEEP_LABEL) != SWEEP:
                    continue
                self.see(meta.name or "", meta.uid or "")
                if event.type == "DELETED":
                    self.deleted.append(meta.name or "")


async def _create_sweep(nc: NATS) -> Sweep:
    body = {
        "maxParallel": MAX_PARALLEL,
        "matrix": {"params": {"A": A_VALUES, "B": B_VALUES}},
        "template": {
            "spec": {
                "image": "busybox",
                "command": ["true"],
                "resources": {"gpu": "L4:1"},
                # Short runs of sampled lengths: some cells cost one second, some two (billing bills
                # whole seconds from the Attempt's creation), so the cheapest cell is a real choice.
                "env": [
                    {"name": "NODUS_SIM_SECONDS", "value": "0.4"},
                    {"name": "NODUS_SIM_SIGMA", "value": "0.8"},
                ],
            }
        },
    }
    sweep = Sweep(
        metadata=ObjectMeta(name=SWEEP, namespace=NS, generation=1), spec=msgspec.convert(body, SweepSpec)
    )
    return await ObjectStore(nc, "sweeps", Sweep).create(default_sweep(sweep))


@pytest.mark.timeout(300)
async def test_killing_the_sweep_controller_ten_times_creates_every_cell_once_and_ends_exact(
    tmp_path: Path,
) -> None:
    rng = random.Random(11)
    with NatsServer() as server:
        nc = await connect(server.url, "crash", nkey_seed=server.harness_seed)
        await declaring.ensure(nc.jetstream())
        jobs = ObjectStore(nc, "jobs", Job)
        creations = Creations()
        watching = asyncio.create_task(creations.follow(jobs))
        fleet = await SimulatedFleet(
            nc,
            FleetSettings(
                fleet="k",
                nodes=NODES,
                offerings=("l4-x1-us",),
                progress_s=0,
                seed=3,
                workdir=tmp_path / "fleet",
            ),
        ).start()
        log = (tmp_path / "sweeps.log").open("ab")
        proc: subprocess.Popen[bytes] | None = None
        try:
            async with (
                in_process(
                    BillingService,
                    nc,
                    {"NODUS_STARTING_CREDITS_USD": "100", "NODUS_METER_TICK_S": "2"},
                ),
                in_process(SchedulerService, nc, {"NODUS_RESYNC_S": "2", "NODUS_FUNDING": "on"}),
            ):
                sweep = await _create_sweep(nc)
                proc = _controller(server.url, server.harness_seed, log)
                # Kill points spread over the whole Sweep: the first lands in the first burst of creates.
                points = [k * (CELLS - MAX_PARALLEL) // KILLS + rng.randint(1, 12) for k in range(KILLS)]
                for kill, point in enumerate(points):
                    await eventually(
                        functools.partial(creations.reached, point),
                        deadline_s=60,
                        message=f"only {creations.cells} cells before kill {kill + 1} (at {point})",
                    )
                    proc.kill()  # SIGKILL: no graceful shutdown, no lease released, work cut where it stands
                    proc.wait(timeout=10)
                    proc = _controller(server.url, server.harness_seed, log)
                final = await eventually(
                    lambda: _exact(nc, sweep),
                    deadline_s=180,
                    interval_s=0.5,
                    message="the Sweep never reached an exact, final status after the kills",
                )
                attempts = (await ObjectStore(nc, "attempts", Attempt).list(NS)).items
        finally:
            if proc is not None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await fleet.stop()
            await nc.close()

    assert creations.deleted == []
    twice = {name: uids for name, uids in creations.uids.items() if len(uids) != 1}
    assert twice == {}, "a cell created more than once"
    assert sorted(creations.uids) == sorted(f"{SWEEP}-{i}" for i in range(CELLS))
    final_uids = {name: uids[0] for name, uids in creations.uids.items()}
    # One Attempt per cell, of the cell's one uid; and the fleet ran each cell once.
    per_cell = Counter(a.spec.job for a in attempts)
    assert per_cell == Counter({name: 1 for name in final_uids})
    assert all(a.metadata.labels.get(JOB_UID_LABEL) == final_uids[a.spec.job] for a in attempts)
    assert fleet.stats["started"] == CELLS
    assert final.status.phase == "Succeeded"


async def _exact(nc: NATS, created: Sweep) -> Sweep:
    """The Sweep once its status says exactly what its cell Jobs say (asserts: not yet, with the reason)."""
    sweep = await ObjectStore(nc, "sweeps", Sweep).get(NS, SWEEP)
    st = sweep.status
    assert (st.phase, st.reason) == ("Succeeded", "CellsSucceeded"), (st.phase, st.reason, st.message)
    assert st.cost is not None and st.cost.final, "the cells' costs are not all final yet"
    cells = {
        int(j.metadata.labels[CELL_LABEL]): j
        for j in (await ObjectStore(nc, "jobs", Job).list(NS)).items
        if j.metadata.labels.get(SWEEP_LABEL) == SWEEP
    }
    assert sorted(cells) == list(range(CELLS))
    assert [r.index for r in st.cells] == list(range(CELLS)), "one row per cell, in index order"
    for row in st.cells:
        job = cells[row.index]
        assert job.status.phase == "Succeeded" and job.status.cost is not None and job.status.cost.final
        assert any(o.uid == created.metadata.uid for o in job.metadata.owner_references)
        params = {
            e.name.removeprefix("NODUS_PARAM_"): e.value
            for e in job.spec.env
            if e.name and e.name.startswith("NODUS_PARAM_")
        }
        assert row.params == params
        assert (row.object, row.phase, row.cost_usd, row.units_per_second, row.wall_seconds) == (
            job.metadata.name,
            job.status.phase,
            job.status.cost.total_usd,
            job.status.units_per_second,
            job.status.wall_seconds,
        ), f"row {row.index} says other than its Job"
    assert st.message == f"all {CELLS} cells succeeded"
    assert (st.observed_generation, bool(st.start_time), bool(st.completion_time)) == (1, True, True)
    total = sum(usd_to_micros(j.status.cost.total_usd or "0") for j in cells.values() if j.status.cost)
    assert usd_to_micros(st.cost.total_usd or "0") == total, (st.cost.total_usd, micros_to_usd(total))
    # The best cells, worked out from the Jobs (ties: the lowest index).
    by_cost = min(cells, key=lambda i: (usd_to_micros(_cost(cells[i])), i))
    by_tp = max(cells, key=lambda i: (Decimal(cells[i].status.units_per_second or "0"), -i))
    assert st.best is not None and (st.best.by_cost, st.best.by_throughput) == (by_cost, by_tp)
    return sweep


def _cost(job: Job) -> str:
    assert job.status.cost is not None and job.status.cost.total_usd is not None
    return job.status.cost.total_usd
