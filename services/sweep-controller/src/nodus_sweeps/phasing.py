"""A Pipeline's stages and phase from its children: rules, no I/O (ADR-0039).

Each stage is in one of the :data:`~nodus_schema.pipelines.STAGE_PHASES`:

* with a child (its Job or Sweep): the child's phase (Pending until it has one);
* without: Waiting while a dependency has not succeeded; *ready* once all have (the reconciler then
  creates it, or says why it cannot: a name taken, a best cell not settled or missing); Skipped once a
  dependency failed, was cancelled or was skipped, and every stage not started once the Pipeline will
  start nothing more (cancelled, or failing).

A stage *fails* when its child ended Failed, or Cancelled while the Pipeline was not cancelled, or when
it cannot be created (its name taken by an object the Pipeline does not control, a Sweep with no best
cell). A failed stage whose ``onFailure`` is Fail (the default) fails the Pipeline: nothing more starts,
and once its started children have ended it is Failed/StageFailed; with Continue only the stages that
depend on it (transitively) are Skipped.

The Pipeline's phase: Failed (a Fail stage failed), Cancelled (``spec.state`` Cancelled) or Succeeded
(every stage Succeeded or Skipped) once every child it started has ended; before that Running (with
reason StageFailed or Cancelling while it waits for them); Suspended while ``spec.state`` is Suspended
or while billing holds a child Suspended with MaxCostReached; Running once a child exists, else Pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from nodus_schema.costs import Cost
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import parse_time
from nodus_schema.pipelines import Pipeline, Stage, StageStatus, stage_kind
from nodus_sweeps.staging import Child, from_best_of

__all__ = ["Assessed", "Slot", "StageState", "assess", "phase_of", "row_of"]

FAILING: Final = ("Failed", "Cancelled", "Skipped")
"""Phases of a dependency after which a stage never starts."""
NAME_TAKEN: Final = "ChildNameTaken"
LISTED: Final = 5


@dataclass(frozen=True)
class Slot:
    """What the views hold under a stage's child name: the Pipeline's own child, or another object."""

    stage: Stage
    name: str
    child: Child | None = None
    holder: Child | None = None
    """An object with the child's name the Pipeline does not control (never adopted)."""
    holder_waits: bool = False
    """The holder is a child of an earlier Pipeline of this name (its cascade is still going): wait."""
    holder_message: str = ""
    gone: StageStatus | None = None
    """The stage's last row, when the child it shows ended and was deleted since (TTL after finished, a
    user): the stage keeps that row, and its child is never created again."""

    @property
    def started(self) -> bool:
        return self.child is not None or self.gone is not None


@dataclass
class StageState:
    stage: Stage
    slot: Slot
    phase: str
    message: str | None = None
    ready: bool = False
    """No child yet, every dependency succeeded: the reconciler may create it."""
    stalled: bool = False
    """Every dependency succeeded, yet it cannot be created yet (a best cell not settled, its name still
    held by an earlier Pipeline's child): ``message`` says what it waits for."""
    failed: bool = False
    reason: str | None = None
    """Why it failed (the child's reason, or one of the Pipeline's: ChildNameTaken, NoBestCell)."""

    @property
    def name(self) -> str:
        return self.stage.name or ""

    @property
    def fatal(self) -> bool:
        return self.failed and (self.stage.on_failure or "Fail") == "Fail"


@dataclass
class Assessed:
    """Every stage's state, in spec order, and what the Pipeline may still do."""

    states: list[StageState]
    starts: bool
    """Whether stages may start now (state Running, nothing failed the Pipeline, not ended)."""
    fatal: list[StageState] = field(default_factory=list)

    def by_name(self) -> dict[str, StageState]:
        return {s.name: s for s in self.states}


def assess(
    pipeline: Pipeline, slots: dict[str, Slot], blocked: dict[str, tuple[bool, str, str]] | None = None
) -> Assessed:
    """Every stage's state from ``slots`` (by stage name). ``blocked``: stages the reconciler could not
    create, with (failed, reason, message): failed for good, or waiting (a best cell not settled)."""
    blocked = blocked or {}
    cancelled = (pipeline.spec.state or "Running") == "Cancelled"
    memo: dict[str, StageState] = {}

    def visit(name: str, trail: frozenset[str]) -> StageState:
        if name in memo:
            return memo[name]
        slot = slots[name]
        if slot.child is not None:
            state = _child_state(slot, cancelled)
        elif slot.gone is not None:
            state = _gone_state(slot, cancelled)
        elif name in trail:  # a cycle (validation refuses them): it never starts
            return StageState(slot.stage, slot, "Waiting", "the stages form a cycle")
        else:
            deps = [visit(d, trail | {name}) for d in slot.stage.depends_on if d in slots]
            state = _unstarted(slot, deps, blocked.get(name))
        memo[name] = state
        return state

    states = [visit(s.stage.name or "", frozenset()) for s in slots.values()]
    fatal = [s for s in states if s.fatal]
    starts = (pipeline.spec.state or "Running") == "Running" and not fatal
    if cancelled or fatal:
        why = "the Pipeline was cancelled" if cancelled else f"stage {fatal[0].name!r} failed"
        for s in states:
            if not s.slot.started and not s.failed and s.phase != "Skipped":
                s.phase, s.message, s.ready = "Skipped", f"not started: {why}", False
    elif not starts:  # Suspended: what is ready starts once the Pipeline runs again
        for s in states:
            if s.ready:
                s.message = "ready to start once the Pipeline's spec.state is Running"
    return Assessed(states, starts, fatal)


def _child_state(slot: Slot, cancelled: bool) -> StageState:
    assert slot.child is not None
    st = slot.child.status
    phase = st.phase or "Pending"
    failed = phase == "Failed" or (phase == "Cancelled" and not cancelled)
    message = None
    if phase in ("Failed", "Cancelled", "Suspended") and (st.reason or st.message):
        message = ": ".join(x for x in (st.reason, st.message) if x)
    return StageState(slot.stage, slot, phase, message, failed=failed, reason=st.reason or phase)


def _gone_state(slot: Slot, cancelled: bool) -> StageState:
    assert slot.gone is not None
    phase = slot.gone.phase or "Succeeded"
    failed = phase == "Failed" or (phase == "Cancelled" and not cancelled)
    return StageState(slot.stage, slot, phase, slot.gone.message, failed=failed, reason=phase)


def _unstarted(slot: Slot, deps: list[StageState], blocked: tuple[bool, str, str] | None) -> StageState:
    down = [d for d in deps if d.phase in FAILING]
    if down:
        said = {"Failed": "failed", "Cancelled": "was cancelled", "Skipped": "was skipped"}
        which = ", ".join(f"{d.name!r} {said[d.phase]}" for d in down[:LISTED])
        return StageState(slot.stage, slot, "Skipped", f"skipped: stage {which}")
    waiting = [d.name for d in deps if d.phase != "Succeeded"]
    if waiting:
        return StageState(slot.stage, slot, "Waiting", f"waiting for {', '.join(repr(w) for w in waiting)}")
    if slot.holder is not None:
        if slot.holder_waits:
            return StageState(slot.stage, slot, "Waiting", f"waiting: {slot.holder_message}", stalled=True)
        return StageState(slot.stage, slot, "Failed", slot.holder_message, failed=True, reason=NAME_TAKEN)
    if blocked is not None:
        failed, reason, message = blocked
        if failed:
            return StageState(slot.stage, slot, "Failed", message, failed=True, reason=reason)
        return StageState(slot.stage, slot, "Waiting", message, stalled=True)
    return StageState(slot.stage, slot, "Waiting", "ready to start", ready=True)


# -- the Pipeline's phase -----------------------------------------------------------------------------------


def phase_of(pipeline: Pipeline, assessed: Assessed) -> tuple[str, str | None, str]:
    """(phase, reason, message) of the Pipeline (see the module's docstring)."""
    states = assessed.states
    n = len(states)
    started = [s for s in states if s.slot.started]
    open_ = [s for s in started if s.phase not in TERMINAL_PHASES]
    done = sum(1 for s in states if s.phase in (*TERMINAL_PHASES, "Skipped"))
    state = pipeline.spec.state or "Running"
    if assessed.fatal:
        first = assessed.fatal[0]
        cause = f"stage {first.name!r} failed" + (f": {first.message}" if first.message else "")
        if open_:
            return "Running", "StageFailed", f"{cause}; waiting for {_names(open_)} to end"
        return "Failed", "StageFailed", cause
    if state == "Cancelled":
        if open_:
            return "Running", "Cancelling", f"stopping {_names(open_)}"
        return "Cancelled", "Cancelled", f"cancelled with {done} of {n} stages finished"
    if all(s.phase in ("Succeeded", "Skipped") or (s.failed and not s.fatal) for s in states) and not open_:
        return "Succeeded", "StagesSucceeded", _succeeded(states)
    if state == "Suspended":
        return "Suspended", "Suspended", f"suspended with {done} of {n} stages finished"
    capped = [
        s for s in open_ if s.phase == "Suspended" and s.slot.child is not None and _capped(s.slot.child)
    ]
    if capped:
        cap = pipeline.spec.max_cost_usd
        fix = (
            f"raise spec.maxCostUSD (now ${cap}) to resume"
            if cap
            else "raise the stage's maxCostUSD to resume"
        )
        return "Suspended", "MaxCostReached", f"{_names(capped)} suspended at the cost cap; {fix}"
    if started:
        return "Running", None, f"{done} of {n} stages finished, {len(open_)} in progress"
    stalled = [s for s in states if s.stalled]
    if stalled:
        return "Pending", None, f"stage {stalled[0].name!r}: {stalled[0].message}"
    return "Pending", None, f"{n} stages to run"


def _capped(child: Child) -> bool:
    return child.status.reason == "MaxCostReached"


def _names(states: list[StageState]) -> str:
    names = [repr(s.name) for s in states[:LISTED]] + (["..."] if len(states) > LISTED else [])
    return f"stage{'s' if len(states) > 1 else ''} {', '.join(names)}"


def _succeeded(states: list[StageState]) -> str:
    n = len(states)
    ok = sum(1 for s in states if s.phase == "Succeeded")
    if ok == n:
        return f"all {n} stages succeeded"
    failed = [s.name for s in states if s.failed]
    skipped = [s.name for s in states if s.phase == "Skipped"]
    parts = [f"{ok} of {n} stages succeeded"]
    if failed:
        parts.append(f"failed with onFailure Continue: {', '.join(failed)}")
    if skipped:
        parts.append(f"skipped: {', '.join(skipped)}")
    return "; ".join(parts)


# -- rows ---------------------------------------------------------------------------------------------------


def row_of(state: StageState) -> StageStatus:
    """The stage's row of ``status.stages``."""
    child = state.slot.child
    kind = stage_kind(state.stage)
    if child is None and state.slot.gone is not None:
        return state.slot.gone
    if child is None:
        return StageStatus(name=state.name, kind=kind, phase=state.phase, message=state.message)
    st = child.status
    return StageStatus(
        name=state.name,
        kind=kind,
        object=child.metadata.name,
        phase=state.phase,
        cost_usd=st.cost.total_usd if st.cost else None,
        wall_seconds=_wall(child),
        start_time=st.start_time,
        completion_time=st.completion_time,
        message=state.message,
        from_best=from_best_of(child),
    )


def _wall(child: Child) -> int | None:
    """A Job's own wall time; a Sweep's from its start to its completion (whole seconds)."""
    if isinstance(child, Job):
        return child.status.wall_seconds
    st = child.status
    if not (st.start_time and st.completion_time):
        return None
    try:
        return max(0, int((parse_time(st.completion_time) - parse_time(st.start_time)).total_seconds()))
    except ValueError:
        return None


def costs_of(slots: dict[str, Slot]) -> list[Cost | None]:
    """The children's costs; a child gone since it ended counts with the cost its row last showed."""
    costs = [s.child.status.cost for s in slots.values() if s.child is not None]
    gone = [s.gone.cost_usd for s in slots.values() if s.gone is not None and s.gone.cost_usd]
    return costs + [Cost(total_usd=usd, final=True) for usd in gone]


def cost_final(child: Child) -> bool:
    return bool(child.status.cost and child.status.cost.final)
