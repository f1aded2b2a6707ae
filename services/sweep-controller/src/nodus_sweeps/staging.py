"""A Pipeline's children, and what flows into them: rules over objects and the informers' memory, no I/O.

Which objects are a Pipeline's children is Kubernetes' ControllerRef, never labels (as for a Sweep's cells,
ADR-0007): the child of stage ``s`` of the Pipeline ``p`` with uid U is the Job (or Sweep) named
``child_name(p, s)`` whose controller ownerReference is ``kind: Pipeline, name: p, uid: U``
(:func:`controlled_by`). The informers of Jobs and Sweeps file every object labelled ``nodus.dev/pipeline``
whose controller is a Pipeline under ``<namespace>/<pipeline>`` (:func:`by_pipeline`), so a pass reads its
own children and nothing else; a Sweep stage's cell Jobs carry the label too (a cell copies its Sweep's
labels) but are filed nowhere, their controller being the Sweep.

What a stage is created with (ADR-0039):

* ``inputs[].fromStage {stage, output}`` becomes ``output {job, index: 0, name: output}``, the producing Job
  named: a Job stage's child, or a Sweep stage's best cell (by Throughput when this stage's ``fromBest``
  names that stage with ``by: Throughput``, else by Cost). The agent reads it as any ``output`` input.
* ``fromBest {stage, by}`` puts that Sweep's best cell's params (``NODUS_PARAM_<NAME>``), GPU and region on
  the Job, exactly as the cell had them (:func:`nodus_schema.expanding.cell_job`), and records the choice
  on the child (the :data:`FROM_BEST_ANNOTATION`), which ``status.stages[].fromBest`` is read back from.

The best cell by Cost is taken only once the Sweep's cost is final (a cell's last charge can still move the
cheapest); by Throughput once the Sweep succeeded. A Sweep that has none fails the stage (:class:`Fail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec

from nodus_schema.costs import Estimate
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.estimating import RATE_CEILING_ANNOTATION
from nodus_schema.expanding import Cell, cell_job, cell_job_name, expand
from nodus_schema.jobs import Job, JobInput, JobSpec, OutputInput
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelinerules import stage_inputs
from nodus_schema.pipelines import (
    PIPELINE_LABEL,
    STAGE_LABEL,
    BestChoice,
    Pipeline,
    Stage,
    StageStatus,
    child_name,
    stage_kind,
)
from nodus_schema.sweeps import Sweep, SweepCell, SweepSpec, SweepStatus, SweepTemplate
from nodus_schema.wire import API_VERSION

__all__ = [
    "FROM_BEST_ANNOTATION",
    "PIPELINES",
    "Child",
    "Fail",
    "Made",
    "Wait",
    "by_pipeline",
    "controlled_by",
    "controller_of",
    "from_best_of",
    "make_child",
    "pipeline_value",
]

Child = Job | Sweep
PIPELINES: Final = "pipeline"
"""The index (of the jobs and sweeps informers) of a Pipeline's children by ``<namespace>/<pipeline>``."""
FROM_BEST_ANNOTATION: Final = "nodus.dev/from-best"
"""On a child made with fromBest: the choice (a BestChoice as JSON), read back into its stage's row."""
GROUP: Final = "nodus.dev"
C = TypeVar("C", Job, Sweep)

_best_encoder = msgspec.json.Encoder()
_best_decoder = msgspec.json.Decoder(BestChoice)


# -- ownership ----------------------------------------------------------------------------------------------


def pipeline_value(namespace: str, pipeline: str) -> str:
    """The index value of the children of the Pipeline ``pipeline`` (a name holds no ``/``)."""
    return f"{namespace}/{pipeline}"


def controller_of(obj: Child) -> OwnerReference | None:
    """The controller ownerReference: the first with ``controller: true`` (metav1.GetControllerOf)."""
    return next((ref for ref in obj.metadata.owner_references if ref.controller), None)


def by_pipeline(obj: Child) -> tuple[str, ...]:
    """Indexer: an object labelled ``nodus.dev/pipeline`` whose controller is a Pipeline files under
    ``<namespace>/<pipeline>``; anything else (a Sweep's cells, a user's Job) nowhere."""
    name = obj.metadata.labels.get(PIPELINE_LABEL)
    ref = controller_of(obj)
    if not name or ref is None or ref.kind != "Pipeline":
        return ()
    return (pipeline_value(obj.metadata.namespace or "", name),)


def pipeline_uid(obj: Child, pipeline: str) -> str | None:
    """The uid of the Pipeline named ``pipeline`` that controls ``obj``; None for any other controller."""
    ref = controller_of(obj)
    if ref is None or ref.kind != "Pipeline" or ref.name != pipeline or not ref.uid:
        return None
    return ref.uid if ref.api_version.partition("/")[0] == GROUP else None


def controlled_by(obj: Child, pipeline: str, uid: str | None) -> bool:
    """Whether the Pipeline ``pipeline`` with ``uid`` controls ``obj`` (the only objects it acts on)."""
    return bool(uid) and pipeline_uid(obj, pipeline) == uid


def owner_reference(pipeline: Pipeline) -> OwnerReference:
    meta = pipeline.metadata
    return OwnerReference(
        api_version=API_VERSION,
        kind="Pipeline",
        name=meta.name or "",
        uid=meta.uid or "",
        controller=True,
        block_owner_deletion=True,
    )


def holder_sentence(obj: Child, pipeline: Pipeline) -> str:
    """Who holds a child's name: ``the Job flow-train is not this Pipeline's (it has no controller)``."""
    ref = controller_of(obj)
    if ref is None:
        whose = "it has no controller"
    elif ref.kind == "Pipeline" and ref.name == pipeline.metadata.name:
        whose = (
            f"its controller is the Pipeline {ref.name} of uid {ref.uid}, an earlier Pipeline of this name"
        )
    else:
        whose = f"its controller is the {ref.kind} {ref.name} of uid {ref.uid}"
    return f"the {obj.kind} {obj.metadata.name} is not this Pipeline's ({whose})"


def earlier_pipelines(obj: Child, pipeline: Pipeline) -> bool:
    """A child of an earlier Pipeline of this name (deleted; the gateway's cascade has not removed it yet)."""
    uid = pipeline_uid(obj, pipeline.metadata.name or "")
    return uid is not None and uid != pipeline.metadata.uid


# -- what flows ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """The stage cannot be created yet (what it reads is not settled); ``message`` says what it waits for."""

    message: str


@dataclass(frozen=True)
class Fail:
    """The stage can never be created as it is: it fails with ``reason`` and ``message``."""

    reason: str
    message: str


@dataclass(frozen=True)
class Made:
    """The child to create, and the best cell it took (fromBest)."""

    child: Child
    best: BestChoice | None


def best_by(stage: Stage, producer: str) -> str:
    """The order a stage takes a Sweep producer's best cell in: Throughput when its fromBest names that
    stage with ``by: Throughput``, else Cost."""
    fb = stage.from_best
    if fb is not None and fb.stage == producer and (fb.by or "Cost") == "Throughput":
        return "Throughput"
    return "Cost"


def best_cell(sweep: Sweep, stage: str, by: str) -> tuple[SweepCell, Cell | None] | Wait | Fail:
    """The Sweep's best succeeded cell by Cost or Throughput: its row and its matrix cell."""
    st: SweepStatus = sweep.status
    name = sweep.metadata.name
    if not any(r.phase == "Succeeded" for r in st.cells):
        return Fail(
            "NoBestCell", f"the Sweep {name} of stage {stage!r} has no succeeded cell, so no best cell"
        )
    if by == "Cost" and not (st.cost is not None and st.cost.final):
        return Wait(f"waiting for the cell costs of the Sweep {name} (stage {stage!r}) to be final")
    index = None if st.best is None else st.best.by_throughput if by == "Throughput" else st.best.by_cost
    row = next((r for r in st.cells if r.index == index), None) if index is not None else None
    if row is None:
        what = "a throughput (unitsPerSecond)" if by == "Throughput" else "a cost"
        return Fail(
            "NoBestCell",
            f"the Sweep {name} of stage {stage!r} has no best cell by {by}: no succeeded cell reported "
            f"{what}",
        )
    cells = expand(sweep)
    return row, (cells[row.index] if row.index < len(cells) else None)


def _gone(producer: str, gone: dict[str, StageStatus]) -> str | Fail | None:
    """A producer whose child succeeded and was deleted since (TTL after finished): a Job's name still
    names its committed outputs; a Sweep's best cell can no longer be read."""
    row = gone.get(producer)
    if row is None or row.phase != "Succeeded":
        return None
    if row.kind == "Job":
        return row.object or ""
    return Fail(
        "ChildGone", f"the Sweep {row.object} of stage {producer!r} was deleted: its best cell is unknown"
    )


def _producer_job(
    stage: Stage, producer: str, children: dict[str, Child], gone: dict[str, StageStatus]
) -> tuple[str, tuple[SweepCell, Cell | None] | None] | Wait | Fail:
    """The Job whose output a fromStage of ``producer`` reads (and, from a Sweep, its best cell)."""
    child = children.get(producer)
    if child is None:
        was = _gone(producer, gone)
        if isinstance(was, str):
            return was, None
        if was is not None:
            return was
    if child is None or child.status.phase != "Succeeded":
        return Wait(f"waiting for stage {producer!r} to succeed")
    if isinstance(child, Job):
        return child.metadata.name or "", None
    chosen = best_cell(child, producer, best_by(stage, producer))
    if isinstance(chosen, Wait | Fail):
        return chosen
    row = chosen[0]
    return row.object or cell_job_name(child.metadata.name or "", row.index), chosen


def rewrite_inputs(
    stage: Stage, children: dict[str, Child], gone: dict[str, StageStatus] | None = None
) -> list[JobInput] | Wait | Fail:
    """The stage's inputs with every fromStage turned into an ``output`` input naming the producing Job."""
    _, items = stage_inputs(stage)
    out: list[JobInput] = []
    for inp in items:
        ref = inp.from_stage
        if ref is None:
            out.append(inp)
            continue
        found = _producer_job(stage, ref.stage or "", children, gone or {})
        if isinstance(found, Wait | Fail):
            return found
        out.append(JobInput(name=inp.name, output=OutputInput(job=found[0], index=0, name=ref.output)))
    return out


def _with_cell(spec: JobSpec, sweep: Sweep, cell: Cell) -> JobSpec:
    """``spec`` with the cell's GPU, region and params, exactly as the Sweep's cell Job had them."""
    shell = Sweep(metadata=sweep.metadata, spec=SweepSpec(template=SweepTemplate(spec=spec)))
    return cell_job(shell, cell).spec


def _from_best(
    stage: Stage, spec: JobSpec, children: dict[str, Child], gone: dict[str, StageStatus]
) -> tuple[JobSpec, BestChoice] | Wait | Fail:
    fb = stage.from_best
    assert fb is not None and fb.stage is not None
    sweep = children.get(fb.stage)
    was = _gone(fb.stage, gone) if sweep is None else None
    if isinstance(was, Fail):
        return was
    if sweep is None or sweep.status.phase != "Succeeded":
        return Wait(f"waiting for stage {fb.stage!r} to succeed")
    if not isinstance(sweep, Sweep):
        return Fail("NoBestCell", f"fromBest names stage {fb.stage!r}, which is a Job, not a Sweep")
    by = fb.by or "Cost"
    chosen = best_cell(sweep, fb.stage, by)
    if isinstance(chosen, Wait | Fail):
        return chosen
    row, cell = chosen
    if cell is None:  # the matrix no longer has the row's cell: only the row's params are known
        cell = Cell(row.index, None, None, tuple(sorted(row.params.items())), row.repetition)
    choice = BestChoice(
        stage=fb.stage,
        by=by,
        cell=row.index,
        object=row.object or cell_job_name(sweep.metadata.name or "", row.index),
        params=dict(cell.params),
        gpu=cell.gpu_text,
        region=cell.region,
    )
    return _with_cell(spec, sweep, cell), choice


def make_child(
    pipeline: Pipeline, stage: Stage, children: dict[str, Child], gone: dict[str, StageStatus] | None = None
) -> Made | Wait | Fail:
    """The child of ``stage`` as it is to be created now: defaulted as the gateway would, with fromStage
    inputs rewritten and fromBest applied, labelled, controlled by the Pipeline, bound to its estimate.
    ``children``: the Pipeline's children by stage name (the dependencies' are read); ``gone``: the rows
    of stages whose child ended and was deleted since."""
    gone = gone or {}
    kind = stage_kind(stage)
    if kind is None:
        return Fail(
            "InvalidStage", f"stage {stage.name!r} has neither or both of template.job and template.sweep"
        )
    inputs = rewrite_inputs(stage, children, gone)
    if isinstance(inputs, Wait | Fail):
        return inputs
    meta = _meta(pipeline, stage)
    if stage.template.job is not None:
        spec = msgspec.structs.replace(stage.template.job, inputs=inputs)
        best = None
        if stage.from_best is not None and stage.from_best.stage:
            applied = _from_best(stage, spec, children, gone)
            if isinstance(applied, Wait | Fail):
                return applied
            spec, best = applied
            annotations = {**meta.annotations, FROM_BEST_ANNOTATION: _best_encoder.encode(best).decode()}
            meta = msgspec.structs.replace(meta, annotations=annotations)
        job = default_job(Job(metadata=meta, spec=spec))
        return Made(_bound(pipeline, job), best)
    assert stage.template.sweep is not None
    sweep_spec = stage.template.sweep
    template = msgspec.structs.replace(
        sweep_spec.template, spec=msgspec.structs.replace(sweep_spec.template.spec, inputs=inputs)
    )
    sweep = default_sweep(Sweep(metadata=meta, spec=msgspec.structs.replace(sweep_spec, template=template)))
    return Made(_bound(pipeline, sweep), None)


def _meta(pipeline: Pipeline, stage: Stage) -> ObjectMeta:
    """The child's metadata: its name, the Pipeline's labels and the two of the Pipeline, its controller
    ownerReference; the rate ceiling the Pipeline was bound to by a dry-run, if any (ADR-0031)."""
    meta = pipeline.metadata
    labels = {**meta.labels, PIPELINE_LABEL: meta.name or "", STAGE_LABEL: stage.name or ""}
    ceiling = meta.annotations.get(RATE_CEILING_ANNOTATION)
    return ObjectMeta(
        name=child_name(meta.name or "", stage.name or ""),
        namespace=meta.namespace,
        labels=labels,
        annotations={RATE_CEILING_ANNOTATION: ceiling} if ceiling is not None else {},
        owner_references=[owner_reference(pipeline)],
        generation=1,
    )


def _bound(pipeline: Pipeline, child: C) -> C:
    """The child placed and priced at the price book version the Pipeline was admitted under, as a Sweep
    binds its cells (``status.estimate.pricebookVersion``); none recorded: the newest when it is placed."""
    admitted = pipeline.status.estimate.pricebook_version if pipeline.status.estimate else None
    if admitted is None:
        return child
    estimate = msgspec.structs.replace(child.status.estimate or Estimate(), pricebook_version=admitted)
    return msgspec.structs.replace(child, status=msgspec.structs.replace(child.status, estimate=estimate))


def from_best_of(child: Child | None) -> BestChoice | None:
    """The best cell a child was made with (its :data:`FROM_BEST_ANNOTATION`); None without one."""
    text = child.metadata.annotations.get(FROM_BEST_ANNOTATION) if child is not None else None
    if not text:
        return None
    try:
        return _best_decoder.decode(text)
    except msgspec.DecodeError:
        return None
