"""Killing the sweep controller (SIGKILL, a real process) ten times while the issue's four-stage Pipeline
runs (issue #22, ADR-0039), as tests/sweeps/test_crashing.py does for a Sweep.

The rig is tests/pipelines/conftest.py's with the sweep controller as ``python -m nodus_sweeps``, killed a
few changes after each start (a change: any write to a Job, Sweep or the Pipeline: a child or cell created,
a status written by the scheduler, billing or the controller) and started again at once, so the kills land
between a child's create and the status that records it, in the middle of a Sweep's cells, during state
writes. What "exactly once" means, and how it is seen:

* a watch on the ``jobs`` and ``sweeps`` buckets records every uid of every name: an object created twice
  shows a second uid (or a DELETED event);
* every Job (three stages, six cells) has exactly one Attempt, of its final uid; the fleet ran nine runs.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO

import pytest

from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import JOB_UID_LABEL, Attempt
from nodus_schema.jobs import Job
from nodus_schema.pipelines import Pipeline
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import Sweep
from nodus_testing.waiting import eventually

from .conftest import NS, Rig, flow, rig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SCHEDULE = [
    "Pipeline/crash",
    "Job/crash-prepare",
    "Sweep/crash-grid",
    "Job/crash-grid-0",
    "Job/crash-grid-2",
    "Job/crash-grid-4",
    "Job/crash-train",
    "Job/crash-train",
    "Job/crash-evaluate",
    "Job/crash-evaluate",
]
"""Kill ``i`` once the object ``SCHEDULE[i]`` exists and the controller wrote once or twice since it started:
ten kills, spread along the four stages."""
CHILDREN = ["Job/crash-prepare", "Sweep/crash-grid", "Job/crash-train", "Job/crash-evaluate"]
CELLS = [f"Job/crash-grid-{i}" for i in range(6)]


def _controller(rig: Rig, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NODUS_NATS_URL": rig.server.url,
        "NODUS_NATS_NKEY_SEED": str(rig.server.harness_seed),
        # The same replica name each time: the new process takes its own (dead) lease at once.
        "NODUS_REPLICA": "crashing",
        "NODUS_LOG_LEVEL": "WARNING",
        "NODUS_RESYNC_S": "2",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nodus_sweeps"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


async def test_killing_the_controller_ten_times_creates_every_child_and_cell_once(tmp_path: Path) -> None:
    rng = random.Random(22)
    log = (tmp_path / "sweeps.log").open("ab")
    proc: subprocess.Popen[bytes] | None = None
    async with rig(tmp_path, sweeps=False) as r:
        try:
            await r.create("crash", flow(seconds=2.0, max_parallel=2, last_seconds=6.0), maxCostUSD="5")
            proc = _controller(r, log)
            for kill, seen in enumerate(SCHEDULE):
                after = r.creations.controller_writes + rng.randint(1, 2)

                def due(seen: str = seen, after: int = after) -> bool:
                    return seen in r.creations.uids and r.creations.controller_writes >= after

                await eventually(due, deadline_s=30, message=f"kill {kill + 1}: no {seen}, or no write since")
                phase = (await r.pipeline("crash")).status.phase
                assert phase not in ("Succeeded", "Failed", "Cancelled"), f"ended before kill {kill + 1}"
                proc.kill()  # SIGKILL: no graceful shutdown, no lease released, work cut where it stands
                proc.wait(timeout=10)
                proc = _controller(r, log)
            done = await r.ended("crash", deadline_s=90)
            attempts = (await ObjectStore(r.nc, "attempts", Attempt).list(NS)).items
            jobs = {j.metadata.name or "": j for j in (await r.jobs.list(NS)).items}
            grid = await r.sweep("crash-grid")
        finally:
            if proc is not None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()

    assert r.creations.deleted == []
    assert r.creations.once() == {}, "an object created more than once"
    assert sorted(n for n in r.creations.uids if not n.startswith("Pipeline/")) == sorted(CHILDREN + CELLS)
    # One Attempt per Job, of its one uid; the fleet ran each once.
    assert Counter(a.spec.job for a in attempts) == Counter({name: 1 for name in jobs})
    assert all(a.metadata.labels.get(JOB_UID_LABEL) == jobs[a.spec.job].metadata.uid for a in attempts)
    assert r.fleet.stats["started"] == 9
    _check(done, jobs, grid)


def _check(done: Pipeline, jobs: dict[str, Job], grid: Sweep | None) -> None:
    assert grid is not None
    st = done.status
    assert (st.phase, st.reason, st.message) == ("Succeeded", "StagesSucceeded", "all 4 stages succeeded")
    assert [(s.name, s.phase) for s in st.stages] == [
        ("prepare", "Succeeded"),
        ("grid", "Succeeded"),
        ("train", "Succeeded"),
        ("evaluate", "Succeeded"),
    ]
    # fromBest as the Sweep says, applied once.
    assert grid.status.best is not None
    choice = st.stages[2].from_best
    assert choice is not None and choice.cell == grid.status.best.by_throughput
    train = jobs["crash-train"]
    assert {e.name: e.value for e in train.spec.env}["NODUS_PARAM_LR"] == choice.params["LR"]
    # The cost, exact: the three Jobs' and the Sweep's (its cells').
    children: list[Job | Sweep] = [jobs["crash-prepare"], grid, train, jobs["crash-evaluate"]]
    total = 0
    for child in children:
        assert child.status.cost is not None and child.status.cost.final
        total += usd_to_micros(child.status.cost.total_usd or "0")
    assert st.cost is not None and st.cost.final and usd_to_micros(st.cost.total_usd or "0") == total
