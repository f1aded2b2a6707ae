"""The estimate of a Pipeline (issue #22, ADR-0031): each stage asked of the scheduler and billing as the
object it will create, the answers put together by :mod:`nodus_gateway.chaining`.

A Job stage is estimated as the Job ``<pipeline>-<stage>``, a Sweep stage as that Sweep, each spec defaulted
as the sweep controller defaults it when it creates the child (the Pipeline itself is stored as sent); a
``fromBest`` stage as its template, since which cell is best is known only once its Sweep ran. The stages
are asked at once, each with :func:`nodus_gateway.estimating.plan` (two round trips). The answers:

* names the scheduler's catalog does not know, in any stage: one 422 Invalid with every stage's causes,
  each on the stage's own field (``spec.stages[2].template.job.resources.gpu.type[0]``);
* a stage the services did not answer (no responders, a timeout, a service's failure): the first such
  error, in stage order, is the Pipeline's, so :func:`nodus_gateway.estimating.estimate_for` treats it as
  it treats a Job's (a dry run answers 503 or 504, a create goes on without an estimate);
* otherwise :func:`nodus_gateway.chaining.combine`.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS

from nodus_gateway.chaining import PipelineEstimate, StageEstimate, combine, rerooted
from nodus_gateway.estimating import Planned, plan, unknown_names
from nodus_gateway.resources import resource
from nodus_schema import Job, ObjectMeta, Sweep
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.errors import StatusCause
from nodus_schema.estimating import DEFAULT_MAX_PARALLEL, PipelineCap
from nodus_schema.pipelines import Pipeline, Stage, child_name

__all__ = ["ask_stages", "stage_object"]


def stage_object(pipeline: Pipeline, stage: Stage) -> Job | Sweep | None:
    """The child a stage creates, defaulted, as it is estimated (None: the stage has no single template)."""
    meta = pipeline.metadata
    owner = meta.name or meta.generate_name or "pipeline"
    child = ObjectMeta(name=child_name(owner, stage.name or "stage"), namespace=meta.namespace)
    template = stage.template
    if (template.job is None) == (template.sweep is None):
        return None
    if template.job is not None:
        return default_job(Job(metadata=child, spec=template.job))
    assert template.sweep is not None
    return default_sweep(Sweep(metadata=child, spec=template.sweep))


def _at(index: int, obj: Job | Sweep) -> str:
    return f"spec.stages[{index}].template.{'job' if isinstance(obj, Job) else 'sweep'}"


def _moved(cause: StatusCause, at: str) -> StatusCause:
    return StatusCause(
        field=rerooted(cause.field, at), message=rerooted(cause.message, at), reason=cause.reason
    )


async def ask_stages(nc: NATS, pipeline: Pipeline, *, timeout: float | None = None) -> PipelineEstimate:
    """The Pipeline's estimate from every stage's (see the module's notes). Raises as
    :func:`nodus_gateway.estimating.ask` does."""
    children: list[tuple[int, Stage, Job | Sweep]] = []
    for index, stage in enumerate(pipeline.spec.stages):
        obj = stage_object(pipeline, stage)
        if obj is not None:  # validation refused a stage without exactly one template before this
            children.append((index, stage, obj))
    cap = PipelineCap(
        name=pipeline.metadata.name or "",
        max_cost_usd=pipeline.spec.max_cost_usd,
        uid=pipeline.metadata.uid,
    )
    answers: list[Planned | BaseException] = await asyncio.gather(
        *(
            plan(
                nc,
                resource("jobs" if isinstance(obj, Job) else "sweeps"),
                obj,
                timeout=timeout,
                pipeline=cap,
            )
            for _, _, obj in children
        ),
        return_exceptions=True,
    )
    planned: list[Planned] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        planned.append(answer)
    causes = [
        _moved(c, _at(index, obj))
        for (index, _, obj), p in zip(children, planned, strict=True)
        for c in p.invalid
    ]
    if causes:
        raise unknown_names(resource("pipelines"), pipeline, causes)
    return combine(
        [
            _stage_estimate(index, stage, obj, p)
            for (index, stage, obj), p in zip(children, planned, strict=True)
        ],
        pipeline.spec.max_cost_usd,
    )


def _stage_estimate(index: int, stage: Stage, obj: Job | Sweep, planned: Planned) -> StageEstimate:
    parallel = 1
    if isinstance(obj, Sweep):
        parallel = obj.spec.max_parallel or DEFAULT_MAX_PARALLEL
    return StageEstimate(
        name=stage.name or str(index),
        kind="Job" if isinstance(obj, Job) else "Sweep",
        at=_at(index, obj),
        depends_on=tuple(stage.depends_on),
        estimate=planned.estimate,
        slots=tuple(planned.slots),
        max_parallel=parallel,
        download=planned.download,
    )
