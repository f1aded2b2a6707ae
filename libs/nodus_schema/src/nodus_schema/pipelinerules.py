"""Validation of Pipelines (issue #22): every rule, every error at once, each with its field path.

The stages: 1 to :data:`MAX_STAGES`, each a DNS label unique in the Pipeline whose child name
``<pipeline>-<stage>`` fits its kind's name limit, with exactly one of ``template.job`` and
``template.sweep`` (each checked by the Job's or the Sweep's own rules, ``fromStage`` inputs allowed),
no ``state`` of its own (children follow the Pipeline's). The DAG: every ``dependsOn`` names another
stage of the Pipeline (FieldValueNotFound), and there is no cycle (the cycle is named, ``a -> b -> a``).
What flows: a ``fromStage`` input names a stage this stage depends on, and an output that stage declares;
``fromBest`` names a Sweep stage this (Job) stage depends on, by Cost or Throughput.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from nodus_schema.checks import dns_label, enum, max_items, unique_at, usd
from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.jobrules import validate_job_spec
from nodus_schema.jobs import SPEC_STATES, JobInput, JobSpec
from nodus_schema.pipelines import (
    BEST_BY,
    MAX_STAGES,
    ON_FAILURE,
    Pipeline,
    Stage,
    child_name,
    stage_kind,
)
from nodus_schema.validating import (
    MAX_JOB_NAME,
    MAX_SWEEP_NAME,
    sweep_spec_rules,
    validate_object_meta,
)
from nodus_schema.wire import API_VERSION

__all__ = [
    "MAX_PIPELINE_NAME",
    "find_cycle",
    "stage_inputs",
    "stage_outputs",
    "stage_spec",
    "validate_pipeline",
]

MAX_PIPELINE_NAME: Final = 40
"""So that ``<pipeline>-<stage>`` can fit a child's name with a short stage name."""


def stage_spec(stage: Stage) -> JobSpec | None:
    """The Job spec a stage runs: its Job's, or its Sweep's template (None: neither)."""
    t = stage.template
    if t.job is not None:
        return t.job
    return t.sweep.template.spec if t.sweep is not None else None


def stage_inputs(stage: Stage) -> tuple[Path, list[JobInput]]:
    """The stage's inputs and their path under the stage (``template.job.inputs`` or
    ``template.sweep.template.spec.inputs``)."""
    t = Path("template")
    if stage.template.job is not None:
        return t.child("job").child("inputs"), stage.template.job.inputs
    if stage.template.sweep is not None:
        tp = t.child("sweep").child("template").child("spec").child("inputs")
        return tp, stage.template.sweep.template.spec.inputs
    return t, []


def stage_outputs(stage: Stage) -> list[str]:
    """The output names a stage declares (its Job's, or its Sweep template's)."""
    spec = stage_spec(stage)
    return [o.name for o in spec.outputs if o.name] if spec is not None else []


def find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """A cycle of the graph ``stage -> its dependencies`` as ``[a, b, ..., a]``, or None (a DAG)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in edges.get(node, []):
            if dep not in edges:
                continue  # an unknown stage: reported on its own
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if state.get(dep) is None and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in edges:
        if state.get(node) is None and (found := visit(node)) is not None:
            return found
    return None


def _indexed(stages: list[Stage]) -> Iterator[tuple[int, Stage, Path]]:
    for i, stage in enumerate(stages):
        yield i, stage, Path("spec").child("stages").index(i)


def _template(errs: ErrorList, sp: Path, pipeline: str, stage: Stage) -> None:
    kind = stage_kind(stage)
    tp = sp.child("template")
    if kind is None:
        both = stage.template.job is not None
        message = "exactly one of job and sweep" + (", not both" if both else "")
        errs.add(tp, CauseType.REQUIRED if not both else CauseType.FORBIDDEN, f"Required value: {message}")
        return
    if stage.name:
        most = MAX_JOB_NAME if kind == "Job" else MAX_SWEEP_NAME
        name = child_name(pipeline, stage.name)
        if len(name) > most:
            errs.add(
                sp.child("name"),
                CauseType.TOO_LONG,
                f"the stage's {kind} would be named {name!r} ({len(name)} characters): must be at most "
                f"{most}; shorten the stage's or the Pipeline's name",
            )
    if stage.template.job is not None:
        jp = tp.child("job")
        if stage.template.job.state not in (None, "Running"):
            errs.forbidden(jp.child("state"), "stages follow the Pipeline's spec.state; leave this unset")
        errs.extend(validate_job_spec(stage.template.job, jp, in_pipeline=True))
    elif stage.template.sweep is not None:
        wp = tp.child("sweep")
        if stage.template.sweep.state not in (None, "Running"):
            errs.forbidden(wp.child("state"), "stages follow the Pipeline's spec.state; leave this unset")
        sweep_spec_rules(errs, wp, stage.template.sweep, in_pipeline=True)


def _depends_on(errs: ErrorList, sp: Path, stage: Stage, known: set[str]) -> None:
    dp = sp.child("dependsOn")
    unique_at(errs, dp, stage.depends_on)
    for j, dep in enumerate(stage.depends_on):
        if dep == stage.name:
            errs.invalid(dp.index(j), dep, "a stage cannot depend on itself")
        elif dep not in known:
            errs.add(
                dp.index(j),
                CauseType.NOT_FOUND,
                f"Not found: {dep!r}: no stage of that name (the stages are {', '.join(sorted(known))})",
            )


def _flows(errs: ErrorList, sp: Path, stage: Stage, by_name: dict[str, Stage]) -> None:
    """fromStage inputs and fromBest name a dependency, and what it produces."""
    ip, items = stage_inputs(stage)
    for j, inp in enumerate(items):
        ref = inp.from_stage
        if ref is None or not ref.stage:
            continue
        fp = _join(sp, ip).index(j).child("fromStage")
        producer = by_name.get(ref.stage)
        if producer is None:
            errs.add(fp.child("stage"), CauseType.NOT_FOUND, f"Not found: {ref.stage!r}: no such stage")
            continue
        if ref.stage not in stage.depends_on:
            errs.invalid(
                fp.child("stage"),
                ref.stage,
                f"stage {stage.name!r} reads it but does not depend on it: add {ref.stage!r} to dependsOn",
            )
        declared = stage_outputs(producer)
        if ref.output and ref.output not in declared:
            known = ", ".join(repr(o) for o in declared) or "none"
            errs.add(
                fp.child("output"),
                CauseType.NOT_FOUND,
                f"Not found: {ref.output!r}: stage {ref.stage!r} declares no such output (it has: {known})",
            )
    best = stage.from_best
    if best is None:
        return
    bp = sp.child("fromBest")
    enum(errs, bp.child("by"), best.by, BEST_BY)
    if stage.template.job is None:
        errs.forbidden(bp, "fromBest applies to a Job stage (a Sweep stage sweeps its own settings)")
    if not best.stage:
        errs.required(bp.child("stage"), "Required value: the Sweep stage whose best cell to take")
        return
    producer = by_name.get(best.stage)
    if producer is None:
        errs.add(bp.child("stage"), CauseType.NOT_FOUND, f"Not found: {best.stage!r}: no stage of that name")
    elif producer.template.sweep is None:
        errs.invalid(bp.child("stage"), best.stage, "must name a Sweep stage (a Job has no best cell)")
    elif best.stage not in stage.depends_on:
        errs.invalid(bp.child("stage"), best.stage, f"add {best.stage!r} to this stage's dependsOn")


def _join(base: Path, rel: Path) -> Path:
    """``base`` followed by the (dotted, index-free) relative path ``rel``."""
    out = base
    for part in str(rel).split("."):
        out = out.child(part)
    return out


def _cell_names(errs: ErrorList, stages: list[Stage]) -> None:
    """A stage named like a cell of a Sweep stage (``grid-0`` beside Sweep stage ``grid``) would take that
    cell's name (``<pipeline>-grid-0``): refused, naming the Sweep stage."""
    sweeps = {s.name for s in stages if s.name and s.template.sweep is not None}
    for _, stage, sp in _indexed(stages):
        base, dash, tail = (stage.name or "").rpartition("-")
        if dash and tail.isdigit() and base in sweeps:
            errs.invalid(
                sp.child("name"),
                stage.name,
                f"its child would take the name of cell {tail} of Sweep stage {base!r}; choose another name",
            )


def _stages(errs: ErrorList, pipeline: Pipeline) -> None:
    stages = pipeline.spec.stages
    path = Path("spec").child("stages")
    if not stages:
        errs.required(path, "Required value: at least one stage")
        return
    max_items(errs, path, stages, MAX_STAGES)
    unique_at(errs, path, [s.name for s in stages], "name")
    known = {s.name for s in stages if s.name}
    by_name = {s.name: s for s in stages if s.name}
    for _, stage, sp in _indexed(stages):
        if not stage.name:
            errs.required(sp.child("name"), "Required value: a DNS label, unique in the Pipeline")
        else:
            dns_label(errs, sp.child("name"), stage.name)
        enum(errs, sp.child("onFailure"), stage.on_failure, ON_FAILURE)
        _template(errs, sp, pipeline.metadata.name or "", stage)
        _depends_on(errs, sp, stage, known)
        _flows(errs, sp, stage, by_name)
    _cell_names(errs, stages)
    cycle = find_cycle({s.name: list(s.depends_on) for s in stages if s.name})
    if cycle is not None:
        at = next(sp for _, s, sp in _indexed(stages) if s.name == cycle[0])
        errs.invalid(
            at.child("dependsOn"),
            cycle[1:-1] or cycle,
            f"the stages form a cycle: {' -> '.join(cycle)}; a Pipeline is a DAG",
        )


def validate_pipeline(pipeline: Pipeline) -> list[FieldError]:
    """Every rule of a Pipeline: type, metadata, its own fields, the DAG and every stage's template."""
    errs = ErrorList()
    if pipeline.api_version != API_VERSION:
        errs.not_supported("apiVersion", pipeline.api_version, (API_VERSION,))
    if pipeline.kind != "Pipeline":
        errs.not_supported("kind", pipeline.kind, ("Pipeline",))
    errs.extend(validate_object_meta(pipeline.metadata, max_name=MAX_PIPELINE_NAME))
    usd(errs, Path("spec").child("maxCostUSD"), pipeline.spec.max_cost_usd)
    enum(errs, Path("spec").child("state"), pipeline.spec.state, SPEC_STATES)
    _stages(errs, pipeline)
    return errs.as_list()
