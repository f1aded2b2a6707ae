"""Filing a Job's settled runs out of its project's book (pure, no I/O): the book stays the size of what
is open, not of everything that ever ran (issue #23).

A project's book is one bus message, written whole at every commit, so what it keeps is what every commit
of the project pays for. A run's hold, once settled, is needed again only by the usage report, invoices and
recovery costs, which read it in the ``history`` bucket instead (``archiving``). :class:`File` takes the
settled holds of one Job out of the book:

- the hold records go (the meter wrote them to the Job's history record first);
- each hold's netted entry (``hold:<id>:settled``: available -> the Job's spend) is retracted, and its
  amount accrues to the project's one running entry ``filed:<project>`` (available -> the project's
  ``filed`` account), so the ledger still folds to the balances and sums to zero, and the Job's spend
  account empties;
- the Job's record keeps what caps, Budgets and late messages need of them: the hold ids
  (``Job.filed``: an operation on a filed hold is a Conflict, never a new hold), and what they charged by
  month (``Job.filed_months``: ``standing.job_spent`` adds it, so the Job's, its Sweep's and its Pipeline's
  caps count it; Budgets with a selector count it by the Job's labels);
- the book's ``filed`` (by month) and ``filed_covered_micros`` keep the totals a quote and the account read
  without the Jobs.

Only holds that resolved are filed (:func:`fileable`); an open one (or one of another Job, or one filed
already) is left where it is, so a File delivered twice, late or early changes nothing it should not. It is
not remembered: it guards itself, as puts and ticks do. A hold placed under other labels than its Job has
now (the Job was relabelled since) stays in the book too, so every Budget counts exactly what it counted
before the filing.
"""

from __future__ import annotations

from nodus_billing.accounting import Entry, accrue, available_account, retract
from nodus_billing.standing import CONFLICT, NOT_FOUND, Hold, Job, Result, State, own_job, refused
from nodus_schema.wire import Wire


class File(Wire, tag=True, tag_field="op"):
    """File these settled holds of the Job out of the book (their records are in the history bucket)."""

    job: str
    hold_ids: list[str]


def filed_account(project: str) -> str:
    """The ledger account of what a project's filed runs charged."""
    return f"project:{project}:filed"


def filed_entry(project: str) -> str:
    """The id of the project's running entry of filed charges (available -> filed)."""
    return f"filed:{project}"


def file_holds(state: State, op: File, key: str) -> tuple[Result, list[Entry]]:
    job = state.jobs.get(op.job)
    if job is None:
        return refused(key, NOT_FOUND, f"job {op.job} is not known to billing", "put the Job first"), []
    job = own_job(state, op.job)  # a copy of a book shares its Job records with the book it came from
    for hold_id in sorted(set(op.hold_ids)):
        hold = state.holds.get(hold_id)
        if hold is None or not fileable(hold, op.job, job):
            continue  # filed already, another Job's, still running, or placed under other labels
        del state.holds[hold_id]
        settled = retract(state.ledger, state.balances, f"hold:{hold_id}:settled")
        if settled is not None:
            moved = Entry(
                id=filed_entry(job.project),
                source=available_account(job.project),
                target=filed_account(job.project),
                amount_micros=settled.amount_micros,
            )
            accrue(state.ledger, state.balances, moved)
        job.filed.append(hold_id)
        if hold.charged_micros:
            job.filed_months[hold.month] = job.filed_months.get(hold.month, 0) + hold.charged_micros
            state.filed[hold.month] = state.filed.get(hold.month, 0) + hold.charged_micros
        if hold.usage is not None:
            state.filed_covered_micros += sum(hold.usage.covered.values())
    return Result(op_id=key), []


def fileable(hold: Hold, ref: str, job: Job) -> bool:
    """Whether a hold of the Job ``ref`` can be filed: it settled, and it was placed under the labels the
    Job has now (what its Budgets count of it is then the same in the book and out of it; a hold placed
    before the Job was relabelled stays in the book)."""
    return hold.job == ref and hold.status != "Open" and hold.labels == job.labels


def filed_refusal(state: State, hold_id: str, key: str) -> Result | None:
    """The Conflict for an operation on a hold filed out of the book (None: no Job filed it). Read only on
    the way to refusing an unknown hold, so the walk over the Jobs costs nothing otherwise."""
    name = next((name for name, job in state.jobs.items() if hold_id in job.filed), None)
    return filed_conflict(name, hold_id, key) if name is not None else None


def filed_conflict(job: str, hold_id: str, key: str) -> Result:
    msg = f"hold {hold_id} of job {job} has settled and is filed"
    return refused(key, CONFLICT, msg, "place a new hold; a hold resolves once")
