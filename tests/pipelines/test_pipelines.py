"""The Pipeline controller end to end in one process (issue #22, ADR-0039): the real scheduler, billing and
sweep controller over a nats-server of their own, and a simulated fleet of L4 and H100 nodes.

* ``flow`` is the issue's four stages: prepare (Job) -> grid (a Sweep of 6 cells over GPU and LR) -> train
  (fromBest by Throughput) -> evaluate (fromStage of train's output). Each child is created once, owned by
  the Pipeline; train carries the best cell's params and GPU; the fromStage inputs are ``output`` inputs
  naming the producing Job; the cost is the children's, to the micro-dollar.
* A failed stage fails the Pipeline and its dependents never start; with ``onFailure: Continue`` only its
  dependents (transitively) are Skipped and the Pipeline succeeds.
* ``spec.state`` Suspended, Running and Cancelled reach a Job child and a Sweep child (and its cells).
* A Job that holds a child's name is never adopted: the stage fails, saying which Job and what to do.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nodus_schema.defaulting import default_job
from nodus_schema.expanding import PARAM_PREFIX
from nodus_schema.gpus import as_gpu_request
from nodus_schema.jobs import Job, JobInput, JobSpec, OutputInput
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelines import PIPELINE_LABEL, STAGE_LABEL, Pipeline
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL
from nodus_schema.wire import API_VERSION
from nodus_testing.waiting import eventually

from .conftest import NS, Rig, flow, job, rig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def owner(p: Pipeline) -> OwnerReference:
    return OwnerReference(
        api_version=API_VERSION,
        kind="Pipeline",
        name=p.metadata.name or "",
        uid=p.metadata.uid or "",
        controller=True,
        block_owner_deletion=True,
    )


async def test_four_stages_run_once_each_with_the_best_cell_and_outputs_named(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        created = await r.create("flow", flow(), maxCostUSD="5")
        done = await r.ended("flow", deadline_s=90)
        prepare, train, evaluate = [await r.job(f"flow-{s}") for s in ("prepare", "train", "evaluate")]
        grid = await r.sweep("flow-grid")
        cells = [await r.job(f"flow-grid-{i}") for i in range(6)]
        assert r.creations.once() == {} and r.creations.deleted == []

    st = done.status
    assert (st.phase, st.reason, st.message) == ("Succeeded", "StagesSucceeded", "all 4 stages succeeded")
    assert [(s.name, s.kind, s.object, s.phase) for s in st.stages] == [
        ("prepare", "Job", "flow-prepare", "Succeeded"),
        ("grid", "Sweep", "flow-grid", "Succeeded"),
        ("train", "Job", "flow-train", "Succeeded"),
        ("evaluate", "Job", "flow-evaluate", "Succeeded"),
    ]
    assert prepare and train and evaluate and grid and all(cells)
    # Every child once, owned by the Pipeline, labelled; the cells by the Sweep.
    assert r.creations.created("Sweep") == ["flow-grid"]
    assert r.creations.created("Job") == sorted(
        ["flow-prepare", "flow-train", "flow-evaluate", *(f"flow-grid-{i}" for i in range(6))]
    )
    for child, stage in ((prepare, "prepare"), (grid, "grid"), (train, "train"), (evaluate, "evaluate")):
        assert child.metadata.owner_references == [owner(created)]
        assert child.metadata.labels == {PIPELINE_LABEL: "flow", STAGE_LABEL: stage}
    assert all(c is not None and c.metadata.owner_references[0].kind == "Sweep" for c in cells)
    assert all(c is not None and c.metadata.labels[SWEEP_LABEL] == "flow-grid" for c in cells)

    # fromStage: the Sweep's template reads prepare's Job; evaluate reads train's Job.
    assert grid.spec.template.spec.inputs == [
        JobInput(name="data", output=OutputInput(job="flow-prepare", index=0, name="data"))
    ]
    assert evaluate.spec.inputs == [
        JobInput(name="model", output=OutputInput(job="flow-train", index=0, name="model"))
    ]

    # fromBest: the cell with the most units per second, its params and GPU on train, recorded.
    assert grid.status.best is not None and grid.status.best.by_throughput is not None
    best = next(row for row in grid.status.cells if row.index == grid.status.best.by_throughput)
    choice = st.stages[2].from_best
    assert choice is not None
    assert (choice.stage, choice.by, choice.cell, choice.object) == (
        "grid",
        "Throughput",
        best.index,
        best.object,
    )
    assert choice.params == best.params and choice.gpu == best.gpu
    env = {e.name: e.value for e in train.spec.env}
    assert env[f"{PARAM_PREFIX}LR"] == best.params["LR"]  # the template's LR=0 replaced
    assert sum(1 for e in train.spec.env if e.name == f"{PARAM_PREFIX}LR") == 1
    assert train.spec.resources is not None and train.spec.resources.gpu is not None
    assert as_gpu_request(train.spec.resources.gpu).type == as_gpu_request(best.gpu or "").type
    assert st.stages[3].from_best is None

    # The cost: the children's (the Sweep's is its cells'), exact, final, under the Pipeline's cap.
    assert st.cost is not None and st.cost.final and st.cost.limit_usd == "5"
    children = [prepare, grid, train, evaluate]
    total = sum(usd_to_micros(c.status.cost.total_usd or "0") for c in children if c.status.cost)
    assert usd_to_micros(st.cost.total_usd or "0") == total > 0
    assert [s.cost_usd for s in st.stages] == [
        c.status.cost.total_usd if c.status.cost else None for c in children
    ]
    assert all(s.start_time and s.completion_time and s.wall_seconds is not None for s in st.stages)
    assert st.start_time and st.completion_time and st.observed_generation == 1
    assert {c.type: c.status for c in st.conditions} == {"Complete": "True", "Progressing": "False"}


async def test_a_failed_stage_fails_the_pipeline_and_its_dependents_never_start(tmp_path: Path) -> None:
    stages = [
        {"name": "broken", "template": {"job": job(0.2, backoffLimit=0, env={"NODUS_SIM_EXIT": "3"})}},
        {"name": "after", "dependsOn": ["broken"], "template": {"job": job()}},
        {"name": "side", "template": {"job": job(1.0)}},
    ]
    async with rig(tmp_path) as r:
        await r.create("bad", stages)
        done = await r.ended("bad")
        assert await r.job("bad-after") is None

    st = done.status
    assert (st.phase, st.reason) == ("Failed", "StageFailed")
    assert st.message and st.message.startswith("stage 'broken' failed: BackoffLimitExceeded")
    rows = {s.name: s for s in st.stages}
    assert rows["broken"].phase == "Failed" and rows["broken"].object == "bad-broken"
    assert (rows["after"].phase, rows["after"].object) == ("Skipped", None)
    # A stage already running when another failed runs to its end; the Pipeline fails once it did.
    assert rows["side"].phase == "Succeeded"
    assert r.creations.created("Job") == ["bad-broken", "bad-side"]
    assert {c.type: c.status for c in st.conditions}["Failed"] == "True"


async def test_on_failure_continue_skips_only_the_dependents(tmp_path: Path) -> None:
    stages = [
        {
            "name": "flaky",
            "onFailure": "Continue",
            "template": {"job": job(0.2, backoffLimit=0, env={"NODUS_SIM_EXIT": "1"})},
        },
        {"name": "needs", "dependsOn": ["flaky"], "template": {"job": job()}},
        {"name": "later", "dependsOn": ["needs"], "template": {"job": job()}},
        {"name": "root", "template": {"job": job()}},
        {"name": "next", "dependsOn": ["root"], "template": {"job": job()}},
    ]
    async with rig(tmp_path) as r:
        await r.create("cont", stages)
        done = await r.ended("cont")
        created = r.creations.created("Job")

    st = done.status
    assert (st.phase, st.reason) == ("Succeeded", "StagesSucceeded"), st.message
    assert st.message == (
        "2 of 5 stages succeeded; failed with onFailure Continue: flaky; skipped: needs, later"
    )
    assert [(s.name, s.phase) for s in st.stages] == [
        ("flaky", "Failed"),
        ("needs", "Skipped"),
        ("later", "Skipped"),
        ("root", "Succeeded"),
        ("next", "Succeeded"),
    ]
    assert created == ["cont-flaky", "cont-next", "cont-root"]


async def _states(r: Rig, state: str, *names: str) -> bool:
    job = await r.job(names[0])
    sweep = await r.sweep(names[1])
    assert job is not None and sweep is not None
    assert (job.spec.state, sweep.spec.state) == (state, state)
    return True


async def test_suspended_running_and_cancelled_reach_every_child(tmp_path: Path) -> None:
    stages = [
        {"name": "hold", "template": {"job": job(120)}},
        {
            "name": "grid",
            "template": {
                "sweep": {
                    "maxParallel": 2,
                    "matrix": {"params": {"A": ["1", "2"]}},
                    "template": {"spec": job(120)},
                }
            },
        },
        {"name": "after", "dependsOn": ["hold", "grid"], "template": {"job": job()}},
    ]
    async with rig(tmp_path) as r:
        await r.create("st", stages)

        async def phases(pipeline: str, job_phase: str, sweep_phase: str) -> Pipeline:
            p = await r.pipeline("st")
            hold, grid = await r.job("st-hold"), await r.sweep("st-grid")
            assert hold is not None and grid is not None
            assert (hold.status.phase, grid.status.phase) == (job_phase, sweep_phase)
            assert p.status.phase == pipeline, (p.status.phase, p.status.message)
            return p

        await eventually(lambda: phases("Running", "Running", "Running"), deadline_s=30)
        await r.set_state("st", "Suspended")
        await eventually(lambda: _states(r, "Suspended", "st-hold", "st-grid"), deadline_s=10)
        suspended = await eventually(lambda: phases("Suspended", "Suspended", "Suspended"), deadline_s=30)
        cells = [await r.job(f"st-grid-{i}") for i in range(2)]
        assert all(c is not None and c.spec.state == "Suspended" for c in cells)

        await r.set_state("st", "Running")
        await eventually(lambda: _states(r, "Running", "st-hold", "st-grid"), deadline_s=10)
        await eventually(lambda: phases("Running", "Running", "Running"), deadline_s=30)

        await r.set_state("st", "Cancelled")
        await eventually(lambda: _states(r, "Cancelled", "st-hold", "st-grid"), deadline_s=10)
        done = await r.ended("st")
        assert await r.job("st-after") is None

    assert (suspended.status.reason, suspended.status.observed_generation) == ("Suspended", 2)
    st = done.status
    assert (st.phase, st.reason) == ("Cancelled", "Cancelled") and st.observed_generation == 4
    assert [(s.name, s.phase) for s in st.stages] == [
        ("hold", "Cancelled"),
        ("grid", "Cancelled"),
        ("after", "Skipped"),
    ]


async def test_a_job_holding_a_childs_name_is_not_adopted_and_fails_the_stage(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        spec = msgspec.convert(job(0.2), JobSpec)
        mine = await r.jobs.create(
            default_job(Job(metadata=ObjectMeta(name="own-b", namespace=NS), spec=spec))
        )
        await r.create(
            "own",
            [
                {"name": "a", "template": {"job": job()}},
                {"name": "b", "dependsOn": ["a"], "template": {"job": job()}},
            ],
        )
        done = await r.ended("own")
        held = await r.job("own-b")

    st = done.status
    rows = {s.name: s for s in st.stages}
    assert (st.phase, st.reason) == ("Failed", "StageFailed")
    assert rows["a"].phase == "Succeeded"
    assert rows["b"].phase == "Failed" and rows["b"].object is None
    assert rows["b"].message == (
        "the Job own-b is not this Pipeline's (it has no controller); "
        "delete or rename the Job own-b, or rename the Pipeline"
    )
    # Never adopted, never changed by the Pipeline.
    assert held is not None and held.metadata.uid == mine.metadata.uid
    assert held.metadata.owner_references == [] and held.metadata.labels == {}
    assert held.metadata.generation == mine.metadata.generation
