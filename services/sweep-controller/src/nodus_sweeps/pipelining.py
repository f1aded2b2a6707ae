"""The Pipeline reconciler (issue #22, ADR-0039): stages in, children created in order, status out.

Level-triggered and safe to kill at any line: a pass derives everything from the Pipeline and its children
as the informers hold them (the jobs and sweeps informers index children by ``nodus.dev/pipeline``,
:func:`nodus_sweeps.staging.by_pipeline`), creates each ready stage's child by its deterministic name
(``<pipeline>-<stage>``: a create that finds the name taken reads it, and keeps it only if the Pipeline
controls it by uid, so a replayed pass never creates a child twice and never adopts another object),
writes ``spec.state`` onto the unfinished children, and writes the status by compare-and-set on the
Pipeline's revision only when it changed. What it writes it hands to the informers at once
(write-through), so its next pass sees it before the watch does.

The rules are elsewhere: what a child is made of (fromStage rewritten into ``output`` inputs, fromBest
applied) in :mod:`nodus_sweeps.staging`; stage phases, failure policy and the Pipeline's phase in
:mod:`nodus_sweeps.phasing`. A Pipeline that ended (a terminal phase with a completion time) is
frozen: it starts nothing more, and only its rows and cost follow its children until their costs are
final; then it is settled and the resync leaves it out. A Pipeline that is gone is not acted on: the
gateway's cascade deletes its children (a child this controller created while the Pipeline was being
deleted, which the cascade may have missed, it deletes at once: :meth:`PipelineReconciler._still_there`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import tracing
from nodus_kit.errors import AlreadyExists, Conflict, NotFound, TemporaryError
from nodus_kit.eventing import publish_event
from nodus_kit.informing import Informer
from nodus_kit.keying import Event
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import Condition, now_rfc3339, set_condition
from nodus_schema.pipelinerules import validate_pipeline
from nodus_schema.pipelines import Pipeline, PipelineStatus, StageStatus, child_name, stage_kind
from nodus_schema.sweeps import Sweep
from nodus_sweeps.phasing import NAME_TAKEN, Assessed, Slot, assess, cost_final, costs_of, phase_of, row_of
from nodus_sweeps.reconciling import roll_up
from nodus_sweeps.staging import (
    PIPELINES,
    Child,
    Fail,
    Made,
    Wait,
    controlled_by,
    controller_of,
    earlier_pipelines,
    holder_sentence,
    make_child,
    pipeline_value,
)

log = logging.getLogger(__name__)
SYNC_WAIT_S = 5.0
Key = tuple[str, str]


class PipelineReconciler:
    """Reconciles one Pipeline per call from the pipelines, jobs and sweeps informers (the last two indexed
    by :data:`~nodus_sweeps.staging.PIPELINES`), which the service declares and starts."""

    def __init__(
        self, nc: NATS, pipelines: Informer[Pipeline], jobs: Informer[Job], sweeps: Informer[Sweep]
    ) -> None:
        self.nc = nc
        self.pipelines = pipelines
        self.jobs = jobs
        self.sweeps = sweeps
        self._checked: dict[Key, tuple[str | None, int | None, str | None]] = {}  # uid, generation, problem
        self._announced: dict[Key, set[str]] = {}  # holders told of (uid of the holder)

    # -- the controller's declarations --------------------------------------------------------------------
    def wakes(self, event: Event[Any]) -> list[Key]:
        """Mapper of Job and Sweep changes for objects no Pipeline controls that hold a child's name of a
        Pipeline the informer holds (their delete frees the name). A Pipeline's own children wake it
        through ``owns``."""
        obj = event.object
        ref = controller_of(obj)
        if ref is not None and ref.kind == "Pipeline":
            return []
        ns, name = obj.metadata.namespace or "", obj.metadata.name or ""
        keys = []
        at = name.find("-")
        while at > 0:
            pipeline = self.pipelines.get(ns, name[:at])
            if pipeline is not None and any(s.name == name[at + 1 :] for s in pipeline.spec.stages):
                keys.append((ns, name[:at]))
            at = name.find("-", at + 1)
        return keys

    def settled(self, pipeline: Pipeline) -> bool:
        """Nothing left to do: ended for its generation, its cost final, and every child it has ended with a
        final cost, in the phase and at the cost its row shows."""
        st, meta = pipeline.status, pipeline.metadata
        if st.phase not in TERMINAL_PHASES or not st.completion_time:
            return False
        if st.observed_generation != meta.generation or not (st.cost is not None and st.cost.final):
            return False
        rows = {r.name: r for r in st.stages}
        for slot in self._slots(pipeline).values():
            child = slot.child
            if child is None:
                continue
            row = rows.get(slot.stage.name or "")
            cost = child.status.cost.total_usd if child.status.cost else None
            if row is None or (row.object, row.phase, row.cost_usd) != (slot.name, child.status.phase, cost):
                return False
            if child.status.phase not in TERMINAL_PHASES or not cost_final(child):
                return False
        return True

    # -- a pass ---------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        await self._synced()
        try:
            pipeline = await self._pipeline(key)
        except NotFound:
            self._forget(key)  # gone: its children are the gateway's cascade to delete
            return None
        with tracing.object_span("reconcile Pipeline", pipeline):
            return await self._reconcile(key, pipeline)

    async def _synced(self) -> None:
        """A pass works only from listed views: a restarted controller must never create a child the store
        already holds because it has not read it yet."""
        for informer in (self.pipelines, self.jobs, self.sweeps):
            if not informer.synced.is_set() and not await informer.wait_synced(SYNC_WAIT_S):
                raise TemporaryError(f"the {informer.name} informer has not listed yet", delay=1.0)

    async def _pipeline(self, key: Key) -> Pipeline:
        held = self.pipelines.get(*key)
        if held is not None:
            return held
        pipeline = await self.pipelines.store.get(*key)  # NotFound: deleted (or never there)
        self.pipelines.apply(pipeline)
        return pipeline

    def _forget(self, key: Key) -> None:
        self._checked.pop(key, None)
        self._announced.pop(key, None)

    async def _reconcile(self, key: Key, pipeline: Pipeline) -> float | None:
        old = pipeline.status
        ended = old.phase in TERMINAL_PHASES and old.completion_time is not None
        problem = self._problem(key, pipeline)
        if problem is not None and not ended:
            return await self._write(key, pipeline, _invalid(pipeline, problem))
        slots = self._slots(pipeline)
        await self._propagate_state(pipeline, slots)
        assessed = assess(pipeline, slots)
        if assessed.starts and not ended:
            assessed = await self._start(pipeline, slots, assessed)
        await self._announce(key, pipeline, slots)
        status = _status(pipeline, slots, assessed, ended)
        return await self._write(key, pipeline, status)

    def _problem(self, key: Key, pipeline: Pipeline) -> str | None:
        """What makes the Pipeline invalid (the gateway admits none such; one written straight into the
        store could be), checked once per generation."""
        uid, generation = pipeline.metadata.uid, pipeline.metadata.generation
        held = self._checked.get(key)
        if held is not None and held[:2] == (uid, generation):
            return held[2]
        errors = validate_pipeline(pipeline)
        problem = (
            "; ".join(str(e) for e in errors[:5]) + ("; ..." if len(errors) > 5 else "") if errors else None
        )
        self._checked[key] = (uid, generation, problem)
        return problem

    def _slots(self, pipeline: Pipeline) -> dict[str, Slot]:
        """Every stage's child name and what the views hold under it: the Pipeline's own child (from the
        index: only its children are read), or an object it does not control (never adopted)."""
        meta = pipeline.metadata
        ns, name, uid = meta.namespace or "", meta.name or "", meta.uid
        value = pipeline_value(ns, name)
        owned: dict[str, dict[str, Child]] = {
            "Job": {j.metadata.name or "": j for j in self.jobs.by_index(PIPELINES, value)},
            "Sweep": {s.metadata.name or "": s for s in self.sweeps.by_index(PIPELINES, value)},
        }
        rows = {r.name: r for r in pipeline.status.stages}
        slots: dict[str, Slot] = {}
        for stage in pipeline.spec.stages:
            kind = stage_kind(stage) or "Job"
            cname = child_name(name, stage.name or "")
            found = owned[kind].get(cname)
            if found is None:  # not filed under this Pipeline: free, or held by an object it does not own
                found = (self.jobs if kind == "Job" else self.sweeps).get(ns, cname)
            row = rows.get(stage.name or "")
            if found is not None and controlled_by(found, name, uid):
                slots[stage.name or ""] = Slot(stage, cname, child=found)
            elif row is not None and row.object == cname and row.phase in TERMINAL_PHASES:
                slots[stage.name or ""] = Slot(stage, cname, gone=row)  # ended, then deleted: never again
            elif found is None:
                slots[stage.name or ""] = Slot(stage, cname)
            else:
                slots[stage.name or ""] = _held(pipeline, stage.name or "", cname, found)
        return slots

    async def _start(self, pipeline: Pipeline, slots: dict[str, Slot], assessed: Assessed) -> Assessed:
        """Create the child of every ready stage, unless one of them can never be made and that fails the
        Pipeline (then none starts)."""
        children = {n: s.child for n, s in slots.items() if s.child is not None}
        gone = {n: s.gone for n, s in slots.items() if s.gone is not None}
        blocked: dict[str, tuple[bool, str, str]] = {}
        made: dict[str, Made] = {}
        for state in assessed.states:
            if not state.ready:
                continue
            result = make_child(pipeline, state.stage, children, gone)
            if isinstance(result, Wait):
                blocked[state.name] = (False, "", result.message)
            elif isinstance(result, Fail):
                blocked[state.name] = (True, result.reason, result.message)
            else:
                made[state.name] = result
        if blocked:
            assessed = assess(pipeline, slots, blocked)
        if assessed.starts:
            for stage, result in made.items():
                slots[stage] = await self._create(pipeline, slots[stage], result)
        return assess(pipeline, slots, blocked)

    async def _create(self, pipeline: Pipeline, slot: Slot, made: Made) -> Slot:
        """Create one child by its name; a name found taken is kept only if the Pipeline controls it."""
        child = made.child
        informer: Informer[Any] = self.jobs if isinstance(child, Job) else self.sweeps
        ns, stage = child.metadata.namespace, slot.stage.name or ""
        try:
            created = await informer.store.create(tracing.stamp(child))
        except AlreadyExists:
            # Ours (a create the view has not seen yet) or another object: never adopted.
            try:
                found = await informer.store.get(ns, slot.name)
            except NotFound:
                return slot  # deleted meanwhile: its event brings the next pass, which creates it
            informer.apply(found)
            if controlled_by(found, pipeline.metadata.name or "", pipeline.metadata.uid):
                return Slot(slot.stage, slot.name, child=found)
            return _held(pipeline, stage, slot.name, found)
        informer.apply(created)  # write-through: the next pass counts it
        if not await self._still_there(pipeline):
            # Deleted while this pass worked from the view: the gateway's cascade may have listed the
            # children before this one landed, so it goes now (a child never outlives its Pipeline).
            with contextlib.suppress(NotFound):
                informer.apply(await informer.store.delete(ns, slot.name), deleted=True)
            return slot
        log.info(
            "stage started", extra={"pipeline": pipeline.metadata.name, "stage": stage, "child": slot.name}
        )
        best = f" with the best cell #{made.best.cell} of stage {made.best.stage!r}" if made.best else ""
        await publish_event(
            self.nc,
            pipeline,
            "StageStarted",
            f"stage {stage!r}: created the {child.kind} {slot.name}{best}",
            phase=pipeline.status.phase,
            once=f"StageStarted:{stage}",
        )
        return Slot(slot.stage, slot.name, child=created)

    async def _still_there(self, pipeline: Pipeline) -> bool:
        """Whether the Pipeline (this uid) is still in the store, read after a child was created."""
        meta = pipeline.metadata
        try:
            now = await self.pipelines.store.get(meta.namespace, meta.name or "")
        except NotFound:
            return False
        return now.metadata.uid == meta.uid

    async def _propagate_state(self, pipeline: Pipeline, slots: dict[str, Slot]) -> None:
        """The Pipeline's spec.state onto every unfinished child whose own differs (a new generation of the
        child, as the gateway writes a spec change)."""
        wanted = pipeline.spec.state or "Running"
        name, uid = pipeline.metadata.name or "", pipeline.metadata.uid
        for slot in slots.values():
            child = slot.child
            if (
                child is None
                or child.status.phase in TERMINAL_PHASES
                or (child.spec.state or "Running") == wanted
            ):
                continue

            def change(c: Any, wanted: str = wanted) -> Any:
                if not controlled_by(c, name, uid) or c.status.phase in TERMINAL_PHASES:
                    return None
                if (c.spec.state or "Running") == wanted:
                    return None
                meta = msgspec.structs.replace(c.metadata, generation=(c.metadata.generation or 1) + 1)
                return msgspec.structs.replace(
                    c, metadata=meta, spec=msgspec.structs.replace(c.spec, state=wanted)
                )

            informer: Informer[Any] = self.jobs if isinstance(child, Job) else self.sweeps
            with contextlib.suppress(NotFound):
                written = await informer.store.mutate(child.metadata.namespace, slot.name, change)
                informer.apply(written)
                if controlled_by(written, name, uid):
                    slots[slot.stage.name or ""] = Slot(slot.stage, slot.name, child=written)

    async def _announce(self, key: Key, pipeline: Pipeline, slots: dict[str, Slot]) -> None:
        """One Warning event per object that holds a child's name the Pipeline needs (per holder)."""
        told = self._announced.setdefault(key, set())
        now = {
            s.holder.metadata.uid or "": s
            for s in slots.values()
            if s.holder is not None and not s.holder_waits
        }
        for uid in sorted(set(now) - told):
            slot = now[uid]
            await publish_event(
                self.nc,
                pipeline,
                NAME_TAKEN,
                f"stage {slot.stage.name!r}: {slot.holder_message}",
                severity="Warning",
                phase=pipeline.status.phase,
                once=f"{NAME_TAKEN}:{slot.stage.name}:{uid}",
            )
            log.warning("child name taken", extra={"pipeline": pipeline.metadata.name, "child": slot.name})
        self._announced[key] = set(now)

    async def _write(self, key: Key, pipeline: Pipeline, status: PipelineStatus) -> float | None:
        """Write ``status`` by compare-and-set on the revision read, if it changed."""
        if _same(pipeline.status, status):
            return None
        try:
            written = await self.pipelines.store.update(msgspec.structs.replace(pipeline, status=status))
        except NotFound:
            self._forget(key)
            return None
        except Conflict:
            # The gateway wrote first (a spec change): read it again and redo the pass.
            with contextlib.suppress(NotFound):
                self.pipelines.apply(await self.pipelines.store.get(*key))
            return 0.0
        self.pipelines.apply(written)
        if status.phase in TERMINAL_PHASES and pipeline.status.phase not in TERMINAL_PHASES:
            await publish_event(
                self.nc,
                written,
                status.reason or status.phase or "",
                status.message or "",
                severity="Normal" if status.phase == "Succeeded" else "Warning",
                phase=status.phase,
                once=f"ended:{status.phase}",
            )
        return None


def _held(pipeline: Pipeline, stage: str, cname: str, holder: Child) -> Slot:
    """The slot of a stage whose child's name ``holder`` takes: a child of an earlier Pipeline of this name
    is waited for (the gateway's cascade deletes it); anything else fails the stage, never adopted."""
    spec_stage = next(s for s in pipeline.spec.stages if s.name == stage)
    sentence = holder_sentence(holder, pipeline)
    if earlier_pipelines(holder, pipeline):
        return Slot(
            spec_stage,
            cname,
            holder=holder,
            holder_waits=True,
            holder_message=f"{sentence}; it is being deleted",
        )
    fix = f"delete or rename the {holder.kind} {cname}, or rename the Pipeline"
    return Slot(spec_stage, cname, holder=holder, holder_message=f"{sentence}; {fix}")


def _invalid(pipeline: Pipeline, problem: str) -> PipelineStatus:
    """The status of a Pipeline no stage of which can start: Failed/Invalid, nothing created."""
    old = pipeline.status
    now = now_rfc3339()
    status = PipelineStatus(
        phase="Failed",
        reason="Invalid",
        message=f"the Pipeline is invalid: {problem}",
        start_time=old.start_time,
        completion_time=old.completion_time or now,
        observed_generation=pipeline.metadata.generation,
        conditions=[msgspec.structs.replace(c) for c in old.conditions],
        cost=roll_up([], pipeline.spec.max_cost_usd, True),
        estimate=old.estimate,
        estimated_duration=old.estimated_duration,
        stages=[
            StageStatus(name=s.name or "", kind=stage_kind(s), phase="Skipped") for s in pipeline.spec.stages
        ],
    )
    _conditions(pipeline, status)
    return status


def _status(pipeline: Pipeline, slots: dict[str, Slot], assessed: Assessed, ended: bool) -> PipelineStatus:
    old = pipeline.status
    rows = [row_of(s) for s in assessed.states]
    if ended:
        # Frozen: the ending stays; a row follows its child still (its cost), a row without one is kept.
        phase, reason, message = old.phase or "", old.reason, old.message or ""
        before = {r.name: r for r in old.stages}
        rows = [r if r.object is not None or r.name not in before else before[r.name] for r in rows]
    else:
        phase, reason, message = phase_of(pipeline, assessed)
    children = [s.child for s in slots.values() if s.child is not None]
    final = phase in TERMINAL_PHASES and all(cost_final(c) for c in children)
    started = children or any(s.gone is not None for s in slots.values())
    now = now_rfc3339()
    status = PipelineStatus(
        phase=phase,
        reason=reason,
        message=message,
        start_time=old.start_time or (now if started else None),
        completion_time=(old.completion_time or now) if phase in TERMINAL_PHASES else None,
        observed_generation=pipeline.metadata.generation,
        # Copies: set_condition changes a condition in place, and the old status is the view's.
        conditions=[msgspec.structs.replace(c) for c in old.conditions],
        cost=roll_up(costs_of(slots), pipeline.spec.max_cost_usd, final),
        estimate=old.estimate,
        estimated_duration=old.estimated_duration,
        stages=rows,
    )
    _conditions(pipeline, status)
    return status


def _conditions(pipeline: Pipeline, status: PipelineStatus) -> None:
    """Complete or Failed once ended, Progressing while not (True while Pending or Running, False while
    Suspended or once Cancelled), as the Sweep's."""
    phase, reason, message = status.phase or "", status.reason, status.message
    at = status.completion_time or now_rfc3339()
    generation = pipeline.metadata.generation
    if phase in ("Succeeded", "Failed"):
        kind = "Complete" if phase == "Succeeded" else "Failed"
        set_condition(
            status.conditions,
            Condition(
                type=kind,
                status="True",
                reason=reason or phase,
                message=message,
                observed_generation=generation,
            ),
            now=at,
        )
    going = "True" if phase in ("Pending", "Running") else "False"
    set_condition(
        status.conditions,
        Condition(
            type="Progressing",
            status=going,
            reason=reason or phase,
            message=message,
            observed_generation=generation,
        ),
        now=at,
    )


def _same(a: PipelineStatus, b: PipelineStatus) -> bool:
    """Equal but for condition timestamps (which must not cause a write on every pass)."""
    strip_a = [msgspec.structs.replace(c, last_transition_time=None) for c in a.conditions]
    strip_b = [msgspec.structs.replace(c, last_transition_time=None) for c in b.conditions]
    return msgspec.structs.replace(a, conditions=strip_a) == msgspec.structs.replace(b, conditions=strip_b)
