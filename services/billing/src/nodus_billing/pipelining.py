"""A Pipeline's cap in the book (issue #22): the third level of caps, over Jobs and Sweeps (pure, no I/O).

A Pipeline's ``spec.maxCostUSD`` is one cap shared by every stage, the cells of its Sweep stages included.
The book keeps it as :class:`standing.Pipeline` (``PutPipeline``, by generation, as Sweeps are kept), and
a stage points at it: a Job stage's entry (``Job.pipeline``) or a Sweep stage's (``Sweep.pipeline``), whose
cells count against it through their Sweep. ``standing.caps_over`` lists it after the Job's and the
Sweep's caps, so ``room_for`` and ``holding.apply`` judge every hold and extension against all three.

The rules of a stage's Pipeline, as those of a cell's Sweep: it is put before its stages
(``NotFound`` otherwise); a Job is under a Pipeline directly or through its Sweep, never both (``Invalid``);
and it never changes once in the book (``Conflict``, in ``holding``), so what was spent under a Pipeline
stays there.
"""

from __future__ import annotations

from nodus_billing.accounting import Entry
from nodus_billing.standing import CONFLICT, INVALID, NOT_FOUND, Pipeline, Result, State, refused
from nodus_schema.wire import Wire


class PutPipeline(Wire, tag=True, tag_field="op"):
    """A Pipeline's cap at its generation (an older one is ignored: a late put never undoes a raise)."""

    name: str
    project: str
    generation: int
    max_cost_micros: int | None = None


def put_pipeline(state: State, op: PutPipeline, key: str) -> tuple[Result, list[Entry]]:
    old = state.pipelines.get(op.name)
    if old is not None and old.project != op.project:
        return refused(key, CONFLICT, f"pipeline {op.name} belongs to {old.project}", "use another name"), []
    if old is None or op.generation > old.generation:
        state.pipelines[op.name] = Pipeline(
            project=op.project,
            max_cost_micros=op.max_cost_micros,
            generation=op.generation,
            forgotten_micros=old.forgotten_micros if old else 0,  # its deleted stages' spend stays
        )
    return Result(op_id=key), []


def stage_refusal(
    state: State, key: str, project: str, pipeline: str | None, sweep: str | None = None
) -> Result | None:
    """Why a Sweep or a Job cannot go into the book under ``pipeline`` (None: it can)."""
    if pipeline is None:
        return None
    if sweep is not None:
        msg = f"a cell of sweep {sweep} is under its Sweep's Pipeline, not pipeline {pipeline} directly"
        return refused(key, INVALID, msg, "put the cell with its Sweep only")
    known = state.pipelines.get(pipeline)
    if known is None or known.project != project:
        msg = f"pipeline {pipeline} is not known in project {project}"
        return refused(key, NOT_FOUND, msg, "put the Pipeline before its stages")
    return None
