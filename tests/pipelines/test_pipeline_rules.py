"""The Pipeline controller's rules, pure (ADR-0039): what a child is made of (fromStage rewritten into
``output`` inputs, fromBest applied and recorded), stage phases and the failure policy, the Pipeline's
phase, the index of children, the mapper of name holders, and when a Pipeline is settled."""

from __future__ import annotations

from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.informing import Informer
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore
from nodus_schema.costs import Cost, Estimate
from nodus_schema.gpus import as_gpu_request
from nodus_schema.jobs import Job, JobInput, JobStatus, OutputInput
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelines import (
    PIPELINE_LABEL,
    STAGE_LABEL,
    BestChoice,
    Pipeline,
    PipelineSpec,
    PipelineStatus,
    StageStatus,
)
from nodus_schema.sweeps import Sweep, SweepBest, SweepCell, SweepSpec, SweepStatus
from nodus_schema.wire import API_VERSION
from nodus_sweeps.phasing import Slot, assess, phase_of, row_of
from nodus_sweeps.pipelining import PipelineReconciler, _invalid
from nodus_sweeps.staging import (
    FROM_BEST_ANNOTATION,
    PIPELINES,
    Fail,
    Made,
    Wait,
    by_pipeline,
    from_best_of,
    make_child,
)

NS = "ns"
UID = "P-UID"


def pipeline(stages: list[dict[str, Any]], state: str | None = None, **meta: Any) -> Pipeline:
    spec = msgspec.convert({"stages": stages, "state": state, "maxCostUSD": "2"}, PipelineSpec)
    return Pipeline(metadata=ObjectMeta(name="p", namespace=NS, uid=UID, generation=1, **meta), spec=spec)


def js(**spec: Any) -> dict[str, Any]:
    return {"image": "busybox", "command": ["true"], "resources": {"gpu": "L4:1"}, **spec}


def ctrl(kind: str = "Pipeline", name: str = "p", uid: str = UID) -> OwnerReference:
    return OwnerReference(api_version=API_VERSION, kind=kind, name=name, uid=uid, controller=True)


def child_job(name: str, phase: str | None = None, rv: int = 1, **status: Any) -> Job:
    meta = ObjectMeta(
        name=name,
        namespace=NS,
        uid=f"u-{name}",
        resource_version=str(rv),
        labels={PIPELINE_LABEL: "p"},
        owner_references=[ctrl()],
    )
    return Job(metadata=meta, status=JobStatus(phase=phase, **status))


def grid_sweep(final: bool = True, best: SweepBest | None = None, phases: tuple[str, ...] = ()) -> Sweep:
    """The child ``p-grid``: a Sweep over GPU x LR x region, four cells, succeeded unless ``phases``."""
    body = {
        "matrix": {"gpu": ["L4:1", "H100:1"], "regions": ["us"], "params": {"LR": ["1", "2"]}},
        "template": {"spec": js()},
    }
    spec = msgspec.convert(body, SweepSpec)
    phases = phases or ("Succeeded",) * 4
    rows = [
        SweepCell(
            index=i,
            repetition=0,
            object=f"p-grid-{i}",
            phase=phases[i],
            params={"LR": str(1 + i % 2)},
            gpu=["L4:1", "H100:1"][i // 2],
            region="us",
            cost_usd=f"0.0{i + 1}",
            units_per_second=str(10 * (i + 1)),
        )
        for i in range(4)
    ]
    status = SweepStatus(
        phase="Succeeded",
        cells=rows,
        best=best if best is not None else SweepBest(by_cost=0, by_throughput=3),
        cost=Cost(total_usd="0.10", final=final),
    )
    meta = ObjectMeta(
        name="p-grid", namespace=NS, uid="u-grid", resource_version="9", owner_references=[ctrl()]
    )
    return Sweep(metadata=meta, spec=spec, status=status)


FLOW = [
    {"name": "prep", "template": {"job": js(outputs=[{"name": "data", "path": "/nodus/outputs/data"}])}},
    {
        "name": "grid",
        "dependsOn": ["prep"],
        "template": {
            "sweep": {
                "matrix": {"params": {"LR": ["1", "2"]}},
                "template": {
                    "spec": js(
                        inputs=[{"name": "data", "fromStage": {"stage": "prep", "output": "data"}}],
                        outputs=[{"name": "ckpt", "path": "/nodus/outputs/ckpt"}],
                    )
                },
            }
        },
    },
    {
        "name": "train",
        "dependsOn": ["grid", "prep"],
        "fromBest": {"stage": "grid", "by": "Throughput"},
        "template": {
            "job": js(
                env=[{"name": "NODUS_PARAM_LR", "value": "0"}, {"name": "KEEP", "value": "1"}],
                inputs=[
                    {"name": "ckpt", "fromStage": {"stage": "grid", "output": "ckpt"}},
                    {"name": "data", "fromStage": {"stage": "prep", "output": "data"}},
                    {"name": "web", "url": {"url": "https://example.com/x"}},
                ],
            )
        },
    },
    {
        "name": "cheap",
        "dependsOn": ["grid"],
        "template": {"job": js(inputs=[{"name": "ckpt", "fromStage": {"stage": "grid", "output": "ckpt"}}])},
    },
]


# -- what a child is made of --------------------------------------------------------------------------------


def test_a_sweep_stage_reads_the_producing_job_and_is_owned_labelled_and_bound() -> None:
    p = pipeline(FLOW, labels={"team": "a"}, annotations={"x": "y"})
    p = msgspec.structs.replace(p, status=PipelineStatus(estimate=Estimate(pricebook_version="2026-11")))
    made = make_child(p, p.spec.stages[1], {"prep": child_job("p-prep", "Succeeded")})
    assert isinstance(made, Made) and isinstance(made.child, Sweep) and made.best is None
    sweep = made.child
    assert sweep.metadata.name == "p-grid" and sweep.metadata.namespace == NS
    assert sweep.metadata.labels == {"team": "a", PIPELINE_LABEL: "p", STAGE_LABEL: "grid"}
    assert sweep.metadata.annotations == {}  # only the rate ceiling of a dry-run would be carried
    assert sweep.metadata.owner_references == [
        OwnerReference(
            api_version=API_VERSION,
            kind="Pipeline",
            name="p",
            uid=UID,
            controller=True,
            block_owner_deletion=True,
        )
    ]
    assert sweep.spec.template.spec.inputs == [
        JobInput(name="data", output=OutputInput(job="p-prep", index=0, name="data"))
    ]
    assert (sweep.spec.max_parallel, sweep.spec.state) == (4, "Running"), "defaulted as the gateway would"
    assert sweep.status.estimate == Estimate(pricebook_version="2026-11")


def test_from_best_takes_the_cells_params_gpu_and_region_and_from_stage_names_the_best_cell() -> None:
    p = pipeline(FLOW)
    children: dict[str, Job | Sweep] = {"prep": child_job("p-prep", "Succeeded"), "grid": grid_sweep()}
    made = make_child(p, p.spec.stages[2], children)
    assert isinstance(made, Made) and isinstance(made.child, Job)
    job = made.child
    # By Throughput: cell 3 (H100, LR=2, us); fromStage of the Sweep names that cell's Job.
    assert made.best == BestChoice(
        stage="grid",
        by="Throughput",
        cell=3,
        object="p-grid-3",
        params={"LR": "2"},
        gpu="H100:1",
        region="us",
    )
    assert from_best_of(job) == made.best
    assert msgspec.json.decode(job.metadata.annotations[FROM_BEST_ANNOTATION]) == msgspec.to_builtins(
        made.best
    )
    assert [(e.name, e.value) for e in job.spec.env] == [("KEEP", "1"), ("NODUS_PARAM_LR", "2")]
    assert job.spec.resources is not None and job.spec.resources.gpu is not None
    assert as_gpu_request(job.spec.resources.gpu).type == ["H100"]
    assert job.spec.placement is not None and job.spec.placement.regions == ["us"]
    assert job.spec.inputs == [
        JobInput(name="ckpt", output=OutputInput(job="p-grid-3", index=0, name="ckpt")),
        JobInput(name="data", output=OutputInput(job="p-prep", index=0, name="data")),
        msgspec.convert({"name": "web", "url": {"url": "https://example.com/x"}}, JobInput),
    ]
    assert job.spec.state == "Running" and job.spec.backoff_limit == 6
    # Without fromBest the Sweep's output is its cheapest cell's.
    cheap = make_child(p, p.spec.stages[3], children)
    assert isinstance(cheap, Made) and isinstance(cheap.child, Job)
    assert cheap.child.spec.inputs[0].output == OutputInput(job="p-grid-0", index=0, name="ckpt")
    assert from_best_of(cheap.child) is None


def test_the_cheapest_cell_waits_for_final_costs_and_a_sweep_without_a_best_cell_fails_the_stage() -> None:
    p = pipeline(FLOW)
    prep = child_job("p-prep", "Succeeded")
    waiting = make_child(p, p.spec.stages[3], {"prep": prep, "grid": grid_sweep(final=False)})
    assert waiting == Wait("waiting for the cell costs of the Sweep p-grid (stage 'grid') to be final")
    # Throughput does not wait for costs.
    assert isinstance(make_child(p, p.spec.stages[2], {"prep": prep, "grid": grid_sweep(final=False)}), Made)
    none = grid_sweep(best=SweepBest(by_cost=0), phases=("Succeeded", "Failed", "Failed", "Failed"))
    failed = make_child(p, p.spec.stages[2], {"prep": prep, "grid": none})
    assert isinstance(failed, Fail) and failed.reason == "NoBestCell"
    assert "no best cell by Throughput: no succeeded cell reported a throughput" in failed.message
    nothing = grid_sweep(phases=("Failed",) * 4)
    assert make_child(p, p.spec.stages[3], {"prep": prep, "grid": nothing}) == Fail(
        "NoBestCell", "the Sweep p-grid of stage 'grid' has no succeeded cell, so no best cell"
    )
    assert make_child(p, p.spec.stages[3], {"prep": prep}) == Wait("waiting for stage 'grid' to succeed")


# -- stages and the Pipeline's phase ------------------------------------------------------------------------

DAG = [
    {"name": "a", "template": {"job": js()}},
    {"name": "b", "dependsOn": ["a"], "template": {"job": js()}},
    {"name": "c", "dependsOn": ["b"], "template": {"job": js()}},
    {"name": "d", "template": {"job": js()}},
]


def slots(p: Pipeline, **children: Job) -> dict[str, Slot]:
    return {s.name or "": Slot(s, f"p-{s.name}", child=children.get(s.name or "")) for s in p.spec.stages}


def test_stages_wait_start_and_the_pipeline_goes_pending_running_succeeded() -> None:
    p = pipeline(DAG)
    first = assess(p, slots(p))
    assert [(s.name, s.phase, s.ready) for s in first.states] == [
        ("a", "Waiting", True),
        ("b", "Waiting", False),
        ("c", "Waiting", False),
        ("d", "Waiting", True),
    ]
    assert first.states[1].message == "waiting for 'a'" and first.starts
    assert phase_of(p, first) == ("Pending", None, "4 stages to run")
    running = assess(p, slots(p, a=child_job("p-a", "Succeeded"), d=child_job("p-d", "Running")))
    assert [s.ready for s in running.states] == [False, True, False, False]
    assert phase_of(p, running) == ("Running", None, "1 of 4 stages finished, 1 in progress")
    done = {n: child_job(f"p-{n}", "Succeeded") for n in "abcd"}
    assert phase_of(p, assess(p, slots(p, **done))) == (
        "Succeeded",
        "StagesSucceeded",
        "all 4 stages succeeded",
    )


def test_a_failed_stage_fails_the_pipeline_once_running_stages_ended_and_nothing_else_starts() -> None:
    p = pipeline(DAG)
    failed = child_job("p-a", "Failed", reason="BackoffLimitExceeded", message="1 failure")
    running = assess(p, slots(p, a=failed, d=child_job("p-d", "Running")))
    assert not running.starts and [s.phase for s in running.states] == [
        "Failed",
        "Skipped",
        "Skipped",
        "Running",
    ]
    assert running.states[1].message == "skipped: stage 'a' failed"
    assert phase_of(p, running) == (
        "Running",
        "StageFailed",
        "stage 'a' failed: BackoffLimitExceeded: 1 failure; waiting for stage 'd' to end",
    )
    ended = assess(p, slots(p, a=failed, d=child_job("p-d", "Succeeded")))
    assert phase_of(p, ended) == (
        "Failed",
        "StageFailed",
        "stage 'a' failed: BackoffLimitExceeded: 1 failure",
    )
    # A child cancelled while the Pipeline was not is a failure too.
    cancelled = assess(p, slots(p, a=child_job("p-a", "Cancelled"), d=child_job("p-d", "Succeeded")))
    assert phase_of(p, cancelled)[:2] == ("Failed", "StageFailed")


def test_on_failure_continue_skips_the_dependents_transitively_and_the_rest_goes_on() -> None:
    stages = [dict(DAG[0], onFailure="Continue"), *DAG[1:]]
    p = pipeline(stages)
    state = assess(p, slots(p, a=child_job("p-a", "Failed"), d=child_job("p-d", "Running")))
    assert state.starts and [s.phase for s in state.states] == ["Failed", "Skipped", "Skipped", "Running"]
    assert state.states[2].message == "skipped: stage 'b' was skipped"
    assert phase_of(p, state)[0] == "Running"
    done = assess(p, slots(p, a=child_job("p-a", "Failed"), d=child_job("p-d", "Succeeded")))
    assert phase_of(p, done) == (
        "Succeeded",
        "StagesSucceeded",
        "1 of 4 stages succeeded; failed with onFailure Continue: a; skipped: b, c",
    )


def test_suspended_cancelled_and_the_cost_cap_say_so() -> None:
    p = pipeline(DAG, state="Suspended")
    s = assess(p, slots(p, a=child_job("p-a", "Succeeded"), d=child_job("p-d", "Suspended")))
    assert not s.starts and s.states[1].message == "ready to start once the Pipeline's spec.state is Running"
    assert phase_of(p, s) == ("Suspended", "Suspended", "suspended with 1 of 4 stages finished")
    p = pipeline(DAG, state="Cancelled")
    c = assess(p, slots(p, a=child_job("p-a", "Succeeded"), d=child_job("p-d", "Running")))
    assert [x.phase for x in c.states] == ["Succeeded", "Skipped", "Skipped", "Running"]
    assert phase_of(p, c) == ("Running", "Cancelling", "stopping stage 'd'")
    c = assess(p, slots(p, a=child_job("p-a", "Succeeded"), d=child_job("p-d", "Cancelled")))
    assert phase_of(p, c) == ("Cancelled", "Cancelled", "cancelled with 4 of 4 stages finished")
    p = pipeline(DAG)
    capped = child_job("p-d", "Suspended", reason="MaxCostReached")
    m = assess(p, slots(p, a=child_job("p-a", "Running"), d=capped))
    assert phase_of(p, m) == (
        "Suspended",
        "MaxCostReached",
        "stage 'd' suspended at the cost cap; raise spec.maxCostUSD (now $2) to resume",
    )


def test_a_row_shows_the_child_and_its_cost() -> None:
    p = pipeline(DAG)
    job = child_job("p-a", "Succeeded", cost=Cost(total_usd="0.25", final=True), wall_seconds=7)
    state = assess(p, slots(p, a=job)).states[0]
    assert row_of(state) == StageStatus(
        name="a", kind="Job", object="p-a", phase="Succeeded", cost_usd="0.25", wall_seconds=7
    )


# -- the index, the mapper, settled -------------------------------------------------------------------------


def views() -> tuple[Informer[Pipeline], Informer[Job], Informer[Sweep], PipelineReconciler]:
    """The service's informers, never connected (only their views are used)."""
    pipelines = Informer(ObjectStore(NATS(), "pipelines", Pipeline), name="pipelines")
    jobs = Informer(ObjectStore(NATS(), "jobs", Job), indexers={PIPELINES: by_pipeline}, name="jobs")
    sweeps = Informer(ObjectStore(NATS(), "sweeps", Sweep), indexers={PIPELINES: by_pipeline}, name="sweeps")
    return pipelines, jobs, sweeps, PipelineReconciler(NATS(), pipelines, jobs, sweeps)


def test_the_index_holds_a_pipelines_children_only_and_a_name_holder_wakes_it() -> None:
    pipelines, jobs, _, rec = views()
    pipelines.apply(
        msgspec.structs.replace(
            pipeline(DAG), metadata=ObjectMeta(name="p", namespace=NS, uid=UID, resource_version="1")
        )
    )
    jobs.apply(child_job("p-a", "Running"))
    cell = child_job("p-grid-0", rv=2)
    cell.metadata.owner_references = [ctrl("Sweep", "p-grid", "u-grid")]
    jobs.apply(cell)
    user = Job(
        metadata=ObjectMeta(
            name="p-b", namespace=NS, uid="user", resource_version="3", labels={PIPELINE_LABEL: "p"}
        )
    )
    jobs.apply(user)
    assert [j.metadata.name for j in jobs.by_index(PIPELINES, f"{NS}/p")] == ["p-a"]
    assert rec.wakes(Event("DELETED", user, 4)) == [(NS, "p")], "a holder of b's name wakes p"
    assert rec.wakes(Event("MODIFIED", cell, 2)) == [], "a cell holds no stage's name"
    assert rec.wakes(Event("MODIFIED", child_job("p-a", rv=5), 5)) == [], "own children wake p through owns"
    slots = rec._slots(pipelines.get(NS, "p"))  # type: ignore[arg-type]
    assert slots["a"].child is not None and slots["b"].holder is user and slots["b"].child is None
    assert slots["b"].holder_message == (
        "the Job p-b is not this Pipeline's (it has no controller); "
        "delete or rename the Job p-b, or rename the Pipeline"
    )


def test_a_pipeline_is_settled_once_ended_with_final_costs_matching_its_rows() -> None:
    _, jobs, _, rec = views()
    p = pipeline(DAG[:1])
    ended = PipelineStatus(
        phase="Succeeded",
        completion_time="2026-12-01T00:00:00Z",
        observed_generation=1,
        cost=Cost(total_usd="0.25", final=True),
        stages=[StageStatus(name="a", kind="Job", object="p-a", phase="Succeeded", cost_usd="0.25")],
    )
    p = msgspec.structs.replace(p, status=ended)
    jobs.apply(child_job("p-a", "Succeeded", cost=Cost(total_usd="0.25", final=False)))
    assert not rec.settled(p), "the child's cost is not final"
    jobs.apply(child_job("p-a", "Succeeded", rv=2, cost=Cost(total_usd="0.25", final=True)))
    assert rec.settled(p)
    jobs.apply(child_job("p-a", "Succeeded", rv=3, cost=Cost(total_usd="0.26", final=True)))
    assert not rec.settled(p), "the row says another cost"
    assert not rec.settled(
        msgspec.structs.replace(p, metadata=msgspec.structs.replace(p.metadata, generation=2))
    )


def test_a_child_deleted_after_it_ended_keeps_its_row_and_is_never_made_again() -> None:
    """TTL after finished (or a user) deletes an ended child: the stage keeps its row and its cost, and a
    later stage still reads its committed output by the Job's name; a deleted Sweep's best cell is unknown."""
    _, _, _, rec = views()
    stages = [
        {"name": "a", "template": {"job": js(outputs=[{"name": "o", "path": "/nodus/outputs/o"}])}},
        {
            "name": "b",
            "dependsOn": ["a"],
            "template": {"job": js(inputs=[{"name": "o", "fromStage": {"stage": "a", "output": "o"}}])},
        },
    ]
    row = StageStatus(name="a", kind="Job", object="p-a", phase="Succeeded", cost_usd="0.25")
    p = msgspec.structs.replace(pipeline(stages), status=PipelineStatus(phase="Running", stages=[row]))
    slots = rec._slots(p)
    assert slots["a"].gone == row and slots["a"].child is None
    state = assess(p, slots)
    assert [(s.name, s.phase, s.ready) for s in state.states] == [
        ("a", "Succeeded", False),
        ("b", "Waiting", True),
    ]
    assert row_of(state.states[0]) == row
    made = make_child(p, p.spec.stages[1], {}, {"a": row})
    assert isinstance(made, Made) and isinstance(made.child, Job)
    assert made.child.spec.inputs == [JobInput(name="o", output=OutputInput(job="p-a", index=0, name="o"))]
    swept = StageStatus(name="grid", kind="Sweep", object="p-grid", phase="Succeeded")
    assert make_child(pipeline(FLOW), pipeline(FLOW).spec.stages[3], {}, {"grid": swept}) == Fail(
        "ChildGone", "the Sweep p-grid of stage 'grid' was deleted: its best cell is unknown"
    )


def test_an_earlier_pipelines_child_is_waited_for_and_an_invalid_pipeline_fails_at_once() -> None:
    _, jobs, _, rec = views()
    p = pipeline(DAG[:1])
    old = child_job("p-a", "Succeeded")
    old.metadata.owner_references = [ctrl(uid="OLD")]
    jobs.apply(old)
    slots = rec._slots(p)
    assert slots["a"].holder is old and slots["a"].holder_waits
    state = assess(p, slots)
    assert state.states[0].stalled and not state.states[0].ready
    assert phase_of(p, state) == (
        "Pending",
        None,
        "stage 'a': waiting: the Job p-a is not this Pipeline's (its controller is the Pipeline p of uid "
        "OLD, an earlier Pipeline of this name); it is being deleted",
    )
    cyclic = pipeline([dict(DAG[0], dependsOn=["b"]), dict(DAG[1], dependsOn=["a"])])
    problem = rec._problem((NS, "p"), cyclic)
    assert problem is not None and "the stages form a cycle: a -> b -> a" in problem
    status = _invalid(cyclic, problem)
    assert (status.phase, status.reason) == ("Failed", "Invalid") and status.completion_time
    assert [(s.name, s.phase) for s in status.stages] == [("a", "Skipped"), ("b", "Skipped")]
    assert status.cost is not None and status.cost.final
