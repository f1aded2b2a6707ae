"""What the book is told of a Job before it is metered or held: the Job, its Sweep and its Pipeline, each at
its generation (``PutPipeline``, ``PutSweep``, ``PutJob``; ADR-0024, issue #22), and which objects they are.

A Job is under a Sweep's shared cap, and under a Pipeline's, only through a *controller* ownerReference
(metav1.GetControllerOf, as the controllers decide their children): a Job stage's controller is its
Pipeline; a cell's is its Sweep, whose controller is the Pipeline of a Sweep stage. A plain reference, which
a user may set, never puts a Job under anyone's cap. Objects are named in the book ``<name>@<uid>``, so one
created again under the same name starts from nothing.

The meter reads the Sweep and the Pipeline from its informers, and so does the hold endpoint where its
replica's informers are listed (the leader's; elsewhere from the store), both from the store on a miss
(:func:`viewed`, :func:`stored`); the puts are planners decided inside the commit, so each is applied only
when the book lacks the object's current generation.
"""

from __future__ import annotations

from typing import Any, TypeVar

from nodus_billing.books import Step
from nodus_billing.holding import Op, PutJob, PutSweep
from nodus_billing.pipelining import PutPipeline
from nodus_billing.standing import State
from nodus_kit import errors
from nodus_kit.errors import NotFound
from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job
from nodus_schema.pipelines import Pipeline
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import Sweep

T = TypeVar("T", Sweep, Pipeline)


def job_ref(name: str, uid: str | None) -> str:
    """A Job in the book: its name and uid, so a re-created Job of the same name starts from nothing."""
    return f"{name}@{uid or ''}"


def controller_ref(obj: Any, kind: str) -> str | None:
    """The object's controller of ``kind`` as the book names it (``<name>@<uid>``): its ownerReference with
    ``controller: true`` only; None when it has none, of another kind, or without a uid."""
    ref = next((o for o in obj.metadata.owner_references if o.controller), None)
    if ref is None or ref.kind != kind or not ref.uid:
        return None
    return f"{ref.name}@{ref.uid}"


def sweep_ref_of(job: Job) -> str | None:
    """The Sweep a cell Job belongs to, as the book names it: its *controller* ownerReference only
    (metav1.GetControllerOf, as the sweep controller decides cells). A plain reference to a Sweep, which a
    user may set, never puts a Job under a Sweep's shared cap."""
    return controller_ref(job, "Sweep")


def pipeline_ref_of(job: Job, sweep: Sweep | None) -> str | None:
    """The Pipeline a Job counts under, as the book names it: a Job stage's controller, or the controller of
    a cell's Sweep (``sweep``: the cell's Sweep as found; None when gone). Controllers only, as for Sweeps."""
    if sweep_ref_of(job) is not None:
        return controller_ref(sweep, "Pipeline") if sweep is not None else None
    return controller_ref(job, "Pipeline")


def viewed(informer: Informer[T], namespace: str | None, ref: str | None) -> T | None:
    """The object ``ref`` names in an informer (None: no ref, not seen, or another uid of that name)."""
    if ref is None:
        return None
    name, uid = ref.rsplit("@", 1)
    obj = informer.get(namespace, name)
    return obj if obj is not None and obj.metadata.uid == uid else None


async def stored(store: ObjectStore[T], namespace: str | None, ref: str | None) -> T | None:
    """The object ``ref`` names as stored (None: no ref, gone, or created again under its name)."""
    if ref is None:
        return None
    name, uid = ref.rsplit("@", 1)
    try:
        obj = await store.get(namespace, name)
    except NotFound:
        return None
    return obj if obj.metadata.uid == uid else None


def puts(job: Job, obj: Sweep | None, pipeline: Pipeline | None = None) -> list[Step]:
    """PutPipeline / PutSweep / PutJob, decided inside the commit: only when the book lacks the current
    generation. ``obj``: the cell's Sweep, of the uid its ownerReference names (None: not a cell, or gone);
    ``pipeline``: the Pipeline of :func:`pipeline_ref_of`, of that uid (None: under none, or gone).

    A Sweep or a Pipeline that is gone and was never in the book is left out (its children are being
    deleted): the Job goes in without it. One in the book stays: a Sweep's or a Job's Pipeline, once put,
    is kept as the book has it (it never changes, ``pipelining``)."""
    meta = job.metadata
    ns = meta.namespace or ""
    sweep = sweep_ref_of(job)
    piped = pipeline_ref_of(job, obj)
    ref = job_ref(meta.name or "", meta.uid)
    gen = meta.generation or 1
    cap = cap_micros(job.spec.max_cost_usd, f"spec.maxCostUSD of job {ns}/{meta.name}")
    pcap = None
    if pipeline is not None:
        pcap = cap_micros(
            pipeline.spec.max_cost_usd, f"spec.maxCostUSD of pipeline {ns}/{pipeline.metadata.name}"
        )

    def under(state: State) -> str | None:
        """The Pipeline a stage goes into the book under: one that exists, or that the book knows."""
        return piped if piped is not None and (pipeline is not None or piped in state.pipelines) else None

    def put_pipeline(state: State) -> Op | None:
        if piped is None or pipeline is None:
            return None
        pgen = pipeline.metadata.generation or 1
        known = state.pipelines.get(piped)
        if known is not None and known.generation >= pgen:
            return None
        return PutPipeline(name=piped, project=ns, generation=pgen, max_cost_micros=pcap)

    def put_sweep(state: State) -> Op | None:
        if sweep is None or obj is None:
            return None
        sgen = obj.metadata.generation or 1
        known = state.sweeps.get(sweep)
        if known is not None and known.generation >= sgen:
            return None
        return PutSweep(
            name=sweep,
            project=ns,
            generation=sgen,
            max_cost_micros=cap_micros(
                obj.spec.max_cost_usd, f"spec.maxCostUSD of sweep {ns}/{obj.metadata.name}"
            ),
            pipeline=known.pipeline if known is not None else under(state),
        )

    def put_job(state: State) -> Op | None:
        known = state.jobs.get(ref)
        if known is not None and known.generation >= gen:
            return None
        # A Sweep that is gone and was never in the book: its cells are being deleted.
        of = sweep if sweep is not None and (obj is not None or sweep in state.sweeps) else None
        # A cell is under its Sweep's Pipeline, through its Sweep: only a Job stage names one itself.
        stage = None if sweep is not None else known.pipeline if known is not None else under(state)
        return PutJob(
            name=ref,
            project=ns,
            generation=gen,
            sweep=of,
            labels=dict(meta.labels),
            max_cost_micros=cap,
            pipeline=stage,
        )

    return [put_pipeline, put_sweep, put_job]


def cap_micros(text: str | None, what: str = "spec.maxCostUSD") -> int | None:
    """A cap as micro-dollars (admission has checked it; a value an older admission let through that does
    not parse is refused with a sentence, never a Python error)."""
    if not text:
        return None
    try:
        return usd_to_micros(text)
    except ValueError as e:
        raise errors.Invalid(
            f"{what} {text[:70]!r} is not an amount billing can read ({e}); set it to a USD string such"
            ' as "12.50"'
        ) from None
