"""Forgetting a deleted Job's record (pure, no I/O): a book keeps what its live Jobs need, and for the
deleted ones only totals, so that it stops growing with the Jobs a project ever ran (issue #23).

Once a Job is deleted from the store and its runs are filed out of the book (``filing``), all the book
still keeps of it is its record: what it spent, by month, under which labels, Sweep and Pipeline.
:class:`Forget` folds that record into totals and drops it:

- what it spent goes to its Sweep's ``forgotten_micros`` (a cell: its Sweep's cap, and through it its
  Pipeline's, count it as before) or to its Pipeline's (a Job stage);
- what it spent by month goes to the book's :class:`Forgotten` rows, one per label set, so that a Budget
  with a selector, even one created later, counts it as before. Rows are keyed by the Job's labels without
  ``nodus.dev/cell`` (each cell has its own), so a 1,000-cell Sweep folds into one row a month: a selector
  on ``nodus.dev/cell`` no longer matches a deleted cell (a Budget per cell of a Sweep is not a thing);
- what it ran beyond its holds (``unbilled_micros``) goes to the book's total, for the account.

A Job with a hold still in the book (open, or settled and not filed yet) is refused: its runs come first.
A Job the book does not know is nothing to do (forgotten already). Not remembered: it guards itself. An
operation on the Job delivered after it (a late put, a hold placed from a view that still had it) finds no
record and starts from nothing, as for a new Job: what it spent stays counted in the totals, and the
meter, which sees the Job deleted, releases, files and forgets again whatever came.
"""

from __future__ import annotations

from typing import Final

from nodus_billing.accounting import Entry, balance, spend_account
from nodus_billing.standing import CONFLICT, Forgotten, Result, State, job_spent
from nodus_schema.wire import Wire

CELL_LABEL: Final = "nodus.dev/cell"
"""The one label that tells a Sweep's cells apart (nodus_schema.sweeps.CELL_LABEL): not part of a row."""


class Forget(Wire, tag=True, tag_field="op"):
    """Fold the record of a deleted Job, all of whose runs are filed, into the book's totals."""

    job: str


def forget_job(state: State, op: Forget, key: str) -> tuple[Result, list[Entry]]:
    job = state.jobs.get(op.job)
    if job is None:
        return Result(op_id=key), []  # forgotten already, or never in the book
    if any(h.job == op.job for h in state.holds.values()) or balance(state.balances, spend_account(op.job)):
        msg = f"job {op.job} has runs in the book"
        return Result(op_id=key, ok=False, code=CONFLICT, message=msg, fix="file its runs first"), []
    spent = job_spent(state, op.job)
    sweep = state.sweeps.get(job.sweep) if job.sweep is not None else None
    pipeline = state.pipelines.get(job.pipeline) if job.pipeline is not None else None
    if sweep is not None:
        sweep.forgotten_micros += spent
    elif pipeline is not None:
        pipeline.forgotten_micros += spent
    labels = row_of(job.labels)
    row = next((r for r in state.forgotten if r.labels == labels), None)
    if row is None:
        row = Forgotten(labels=labels)
        state.forgotten.append(row)
    for month, amount in job.filed_months.items():
        row.months[month] = row.months.get(month, 0) + amount
    row.jobs += 1
    state.forgotten_unbilled_micros += job.unbilled_micros
    del state.jobs[op.job]
    return Result(op_id=key), []


def row_of(labels: dict[str, str]) -> dict[str, str]:
    """The labels a forgotten Job's row is kept under."""
    return {k: v for k, v in labels.items() if k != CELL_LABEL}


def named(state: State, name: str) -> list[str]:
    """The book's Jobs of this name, whatever their uid (``<name>@<uid>``)."""
    prefix = name + "@"
    return [ref for ref in state.jobs if ref.startswith(prefix)]


def forgettable(state: State, ref: str, filing: set[str]) -> bool:
    """Whether the Job ``ref`` has no run in the book once the holds ``filing`` are filed."""
    return all(h in filing for h, hold in state.holds.items() if hold.job == ref)
