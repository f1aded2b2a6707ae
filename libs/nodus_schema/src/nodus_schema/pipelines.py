"""The Pipeline resource (issue #22): stages whose outputs feed the next, under one shared dollar cap.

A Pipeline is a DAG of *stages*. Each stage is a Job or a Sweep (``template.job`` or ``template.sweep``:
exactly one), named ``<pipeline>-<stage>`` when the sweep controller creates it as an owned child, once
every stage in its ``dependsOn`` succeeded. A stage reads a dependency's committed output with
``inputs[].fromStage: {stage, output}`` (mounted under ``/nodus/inputs/<name>``, as ``output`` inputs are),
and a Job stage that depends on a Sweep stage can take that Sweep's best cell (``fromBest: {stage, by}``:
by Cost or Throughput) as its parameters (``NODUS_PARAM_*``), its GPU and its region.

``spec.maxCostUSD`` is one cap shared by every stage (billing suspends what runs at the cap with
MaxCostReached and resumes it when the cap is raised); ``spec.state`` (Running, Suspended, Cancelled)
is passed on to every child; a failed stage fails the Pipeline unless its ``onFailure`` is Continue
(then the stages that depend on it are Skipped, the others go on). Rules: ``pipelinerules.py``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema.costs import Cost, DurationBand, Estimate
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import Condition, ListMeta, ObjectMeta
from nodus_schema.sweeps import SweepSpec
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "BEST_BY",
    "MAX_STAGES",
    "ON_FAILURE",
    "PIPELINE_LABEL",
    "STAGE_LABEL",
    "STAGE_PHASES",
    "BestCell",
    "BestChoice",
    "Pipeline",
    "PipelineList",
    "PipelineSpec",
    "PipelineStatus",
    "Stage",
    "StageStatus",
    "StageTemplate",
    "child_name",
    "stage_kind",
]

PIPELINE_LABEL: Final = "nodus.dev/pipeline"
"""Label on every child (Job or Sweep) of a Pipeline: the Pipeline's name."""
STAGE_LABEL: Final = "nodus.dev/stage"
"""Label on every child of a Pipeline: its stage's name."""
MAX_STAGES: Final = 32
BEST_BY: Final = ("Cost", "Throughput")
ON_FAILURE: Final = ("Fail", "Continue")
STAGE_PHASES: Final = (
    "Waiting",  # a dependency has not succeeded yet
    "Pending",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
    "Cancelled",
    "Skipped",  # a dependency failed (with onFailure: Continue) or the Pipeline ended first
)


class BestCell(Wire):
    """BestCell takes a Sweep stage's best cell as this Job stage's parameters, GPU and region."""

    stage: str | None = None
    """A Sweep stage this stage dependsOn."""
    by: str | None = None
    """Cost (the cheapest succeeded cell, the default) or Throughput (the most units per second)."""


class StageTemplate(Wire):
    """StageTemplate is what a stage creates: exactly one of a Job spec and a Sweep spec."""

    job: JobSpec | None = None
    sweep: SweepSpec | None = None


class Stage(Wire):
    """Stage is one node of the Pipeline's DAG."""

    name: str | None = None
    """A DNS label, unique in the Pipeline; the child is ``<pipeline>-<stage>``."""
    depends_on: list[str] = msgspec.field(default_factory=list)
    """Stages that must succeed before this one starts."""
    template: StageTemplate = msgspec.field(default_factory=StageTemplate)
    from_best: BestCell | None = None
    on_failure: str | None = None
    """Fail (the default: the Pipeline fails) or Continue (its dependents are Skipped, the rest go on)."""


class PipelineSpec(Wire):
    """PipelineSpec is a DAG of stages with one shared cap."""

    stages: list[Stage] = msgspec.field(default_factory=list)
    max_cost_usd: str | None = msgspec.field(default=None, name="maxCostUSD")
    """One cap shared by every stage, its Sweeps' cells included (decimal string)."""
    state: str | None = None
    """Running (default), Suspended or Cancelled: passed on to every child."""


class BestChoice(Wire):
    """The best cell a stage took from a Sweep stage (fromBest), as it was when the stage was created."""

    stage: str | None = None
    by: str | None = None
    cell: int | None = None
    object: str | None = None
    """The cell Job's name."""
    params: dict[str, str] = msgspec.field(default_factory=dict)
    gpu: str | None = None
    region: str | None = None


class StageStatus(Wire):
    """StageStatus is one stage as the Pipeline last saw it."""

    name: str
    kind: str | None = None
    """Job or Sweep."""
    object: str | None = None
    """The child's name (``<pipeline>-<stage>``) once created."""
    phase: str | None = None
    cost_usd: str | None = msgspec.field(default=None, name="costUSD")
    wall_seconds: int | None = None
    start_time: str | None = None
    completion_time: str | None = None
    message: str | None = None
    from_best: BestChoice | None = None


class PipelineStatus(Wire):
    """PipelineStatus rolls the stages up: phase, cost, conditions, the DAG's estimate."""

    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)
    cost: Cost | None = None
    estimate: Estimate | None = None
    """The whole DAG: cost is the sum of the stages', the warnings name the critical path."""
    estimated_duration: DurationBand | None = None
    """p50 and p90 of the critical path's time (the longest chain of stages)."""
    stages: list[StageStatus] = msgspec.field(default_factory=list)


class Pipeline(Wire):
    """Pipeline chains Jobs and Sweeps into a DAG whose outputs feed the next stages."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Pipeline")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PipelineSpec = msgspec.field(default_factory=PipelineSpec)
    status: PipelineStatus = msgspec.field(default_factory=PipelineStatus)


class PipelineList(Wire, omit_defaults=False):
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "PipelineList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Pipeline] = msgspec.field(default_factory=list)


def child_name(pipeline: str, stage: str) -> str:
    """The child of a stage: ``<pipeline>-<stage>``."""
    return f"{pipeline}-{stage}"


def stage_kind(stage: Stage) -> str | None:
    """Job or Sweep (None when the template has neither, or both: a validation error)."""
    t = stage.template
    if (t.job is None) == (t.sweep is None):
        return None
    return "Job" if t.job is not None else "Sweep"
