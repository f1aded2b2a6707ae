"""What must hold of a billing book after every operation: the money simulator's checks (issue #18).

Pure reads of a :class:`State` against what the simulator expects (:class:`Tally`, kept from the results
of the operations it applied, never from the book). Every check raises :class:`Broken` with the amounts;
``simulating`` adds the seed, the step and the operation. The checks read the book the way its users do
(``serving.account_view``, the ``standing`` reads), so a book that passes them shows every reader the
same, exact numbers.

Every check is strict: there are no tolerated problems. When it was written (#18) the simulator found
five in billing, tolerated for a while as known problems and all fixed since (docs/billing.md, "The money
simulator"); ``tests/billing/test_simulator.py`` replays the seeds that showed them:

- unbilled: a Job's ``unbilledMicros`` counted a run's overrun again at every tick past its funding and at
  its capture. Fixed in ``holding``: a hold records its overrun once (``Hold.overrun_micros``), and each
  tick or capture replaces that record.
- launch-failure: a start that failed on the node (AttemptFinished, reason Lost, no program start) was
  charged up to a second of Running. Fixed in the scheduler (such a report fills no ``startTime``) and in
  ``segmenting`` (a node that reports its times and no launch had none): it is covered whole.
- budget-revived: a deleted Budget's record went with its generation, so a late put of it put it back.
  Fixed in ``holding``: a delete leaves a tombstone (``Budget.deleted``) that no later put revives.
- extension-month: the meter sized an extension by the room of this month's Budgets; ``apply`` judges it by
  the month the hold was placed in, and refused it. Fixed: ``room_for`` takes the hold's month for an
  extension, and the meter passes it.
- extension-labels: likewise by the Job's labels now, against the labels the hold was placed with. Fixed:
  ``room_for`` takes the hold's labels too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from nodus_billing.accounting import (
    CREDITS_ISSUED,
    Entry,
    available_account,
    balance,
    fold,
    hold_account,
    spend_account,
)
from nodus_billing.filing import filed_account
from nodus_billing.forgetting import row_of
from nodus_billing.holding import copied, granted_total
from nodus_billing.serving import account_view
from nodus_billing.standing import (
    CONFLICT,
    Hold,
    Job,
    Result,
    State,
    binds,
    budget_used,
    caps_over,
    held,
    matches,
    pipeline_of,
    pipeline_spent,
    sweep_spent,
)


class Broken(AssertionError):
    """An invariant that does not hold: what was expected, and what the book says."""


@dataclass
class Tally:
    """What one project's book must say, kept by the simulator from the results of its operations."""

    granted: int = 0
    """Grants accepted minus revokes accepted."""
    charged: dict[str, int] = field(default_factory=dict)
    """Per hold: what its ticks and capture charged (net of a capture's refund)."""
    reported: dict[str, int] = field(default_factory=dict)
    """Per hold: the run's usage the meter last reported (a tick's running total, or the capture's)."""
    resolved: Counter[str] = field(default_factory=Counter)
    """Per hold: how many times a capture, release or expiry resolved it (never more than once)."""
    committed: dict[str, int] = field(default_factory=dict)
    """Spent + held of every Job, Sweep and Pipeline, and what every Budget has used per month, after the
    last operation: an operation may never take one above its limit unless it was above it already (a
    limit lowered below what is committed is accepted by design: ADR-0023)."""


def check_book(
    state: State,
    project: str,
    tally: Tally,
    use_bounds: Mapping[str, int],
    *,
    redefined: frozenset[str] = frozenset(),
    filed: Mapping[str, Hold] | None = None,
    forgotten: Mapping[str, Job] | None = None,
) -> None:
    """Every invariant of a project's book; raises :class:`Broken`. ``use_bounds``: per open hold, the
    most its run can have cost so far (nothing is charged ahead of use; an orphan hold's bound is 0).
    ``redefined``: the limits this operation changed (a Budget put again), whose use is taken as it is.
    ``filed``: the holds filed out of the book (the history bucket's records), by id; ``forgotten``: the
    records of the Jobs it forgot, as they were then, by name.

    The checks of the runs read the book with its filed holds and forgotten Jobs put back
    (:func:`unfiled`); the book as it is must fold, and show every reader the same numbers as that whole
    book (:func:`_filing`)."""
    whole = unfiled(state, filed or {}, forgotten or {})
    _ledger(state)
    if whole is not state:
        _filing(state, whole, project, filed or {}, forgotten or {})
        _ledger(whole)
    _account(whole, project, tally)
    _holds(whole, tally, use_bounds)
    _spend(whole)
    _ceilings(whole, tally, redefined)
    _unbilled(whole, tally)


def unfiled(state: State, filed: Mapping[str, Hold], forgotten: Mapping[str, Job] | None = None) -> State:
    """The book as it would be had nothing been filed out of it nor forgotten: every forgotten Job's
    record back (``forgetting``) and the totals it was folded into gone; every filed hold back with its
    netted entry, the filed totals and the project's running entry of them gone (``filing``). The book
    itself when nothing was filed."""
    forgotten = forgotten or {}
    if not forgotten and not any(job.filed for job in state.jobs.values()):
        return state
    whole = copied(state)
    for ref, record in forgotten.items():
        if ref in whole.jobs:
            raise Broken(f"job {ref} was forgotten, but the book has a record of it again")
        whole.jobs[ref] = msgspec.convert(msgspec.to_builtins(record), type=Job)
    for sweep in whole.sweeps.values():
        sweep.forgotten_micros = 0
    for pipeline in whole.pipelines.values():
        pipeline.forgotten_micros = 0
    whole.forgotten, whole.forgotten_unbilled_micros = [], 0
    for entry_id in [e for e, entry in whole.ledger.items() if entry.target.endswith(":filed")]:
        del whole.ledger[entry_id]
    for name, job in whole.jobs.items():
        for hold_id in job.filed:
            hold = filed.get(hold_id)
            if hold is None:
                raise Broken(f"hold {hold_id} is filed by job {name}, but no history record holds it")
            whole.holds[hold_id] = hold
            if hold.charged_micros:
                net = f"hold:{hold_id}:settled"
                source = available_account(hold.project)
                whole.ledger[net] = Entry(
                    id=net, source=source, target=spend_account(name), amount_micros=hold.charged_micros
                )
        whole.jobs[name] = msgspec.structs.replace(job, filed=[], filed_months={})  # shared with state
    whole.filed, whole.filed_covered_micros = {}, 0
    whole.balances = fold(whole.ledger.values())
    return whole


def check_capture(state: State, hold_id: str, total: int, covered: bool) -> None:
    """A run's hold captured once: it charged the run's charge or what it reserved, whichever is less;
    a run Nodus covers (it never began because of Nodus) is charged nothing and recorded as covered.
    ``total`` is the run's charge from its times, worked out by the simulator, not by segmenting."""
    hold = state.holds[hold_id]
    usage = hold.usage
    if usage is None:
        raise Broken(f"hold {hold_id} was captured without its usage")
    billed = sum(usage.segments.values())
    if covered:
        if hold.charged_micros or billed or sum(usage.covered.values()) != total:
            raise Broken(
                f"run {hold_id} never began because of Nodus: it must be covered ({total} µ$) and"
                f" charged nothing, but charged {hold.charged_micros} µ$ (segments {usage.segments},"
                f" covered {usage.covered})"
            )
        return
    if billed != total or set(usage.covered) & set(usage.segments):
        raise Broken(
            f"run {hold_id} costs {total} µ$ by its times, but its usage says segments {usage.segments}"
            f" and covered {usage.covered}"
        )
    expected = min(total, hold.reserved_micros)
    if hold.charged_micros != expected:
        raise Broken(
            f"hold {hold_id} captured {hold.charged_micros} µ$; the run cost {total} µ$ and the hold"
            f" reserved {hold.reserved_micros} µ$, so it must have charged {expected} µ$"
        )


def check_expiry(state: State, now_ms: int, expired: list[str]) -> None:
    """An expiry releases exactly the open holds funded until ``now_ms`` or before: none still funded."""
    early = [h for h in expired if state.holds[h].funded_until_ms > now_ms]
    due = [h for h, hold in state.holds.items() if hold.status == "Open" and hold.funded_until_ms <= now_ms]
    if early or due:
        raise Broken(
            f"an expiry at {now_ms} expired {early}, still funded, and left {due} open, funded no longer"
        )


def check_replay(before: bytes, after: bytes, posted: list[Entry], first: Result, again: Result) -> None:
    """An operation id applied again (a redelivery, a retry, a replay after a restart) changes nothing:
    no entry, the same book; it answers as the first time, that it did nothing new, or (its hold has
    resolved since) Conflict."""
    if posted:
        raise Broken(f"a repeated operation posted {[(e.id, e.amount_micros) for e in posted]}")
    if after != before:
        raise Broken("a repeated operation changed the book")
    if again != first and again.code != CONFLICT and not (again.ok and again.charged_micros == 0):
        raise Broken(f"a repeated operation answered {again}, the first time {first}")


def committed(state: State) -> dict[str, tuple[int, int | None]]:
    """Per limit (``job:``, ``sweep:``, ``pipeline:``, ``budget:<name>:<month>``): what is committed under
    it and the limit (None: no limit). Jobs, Sweeps and Pipelines: spent + held (a Pipeline's: of its Job
    stages and of its Sweep stages' cells); Budgets: used (charged + held) in a month.
    Worked out in one pass over the balances and holds, apart from the reads ``apply`` judges by."""
    jobs = {name: balance(state.balances, spend_account(name)) for name in state.jobs}
    budgets = [(name, b) for name, b in state.budgets.items() if binds(b)]
    used: dict[str, int] = {}
    for hold_id, hold in state.holds.items():
        left = balance(state.balances, hold_account(hold_id))
        jobs[hold.job] = jobs.get(hold.job, 0) + left
        for name, budget in budgets:
            if budget.project == hold.project and matches(budget.selector, hold.labels):
                key = f"budget:{name}:{hold.month}"
                used[key] = used.get(key, 0) + hold.charged_micros + left
    out: dict[str, tuple[int, int | None]] = {}
    sweeps: dict[str, int] = {}
    pipelines: dict[str, int] = {}
    for name, job in state.jobs.items():
        out[f"job:{name}"] = (jobs[name], job.max_cost_micros)
        if job.sweep is not None:
            sweeps[job.sweep] = sweeps.get(job.sweep, 0) + jobs[name]
        pipeline = pipeline_of(state, job)
        if pipeline is not None:
            pipelines[pipeline] = pipelines.get(pipeline, 0) + jobs[name]
    for name, sweep in state.sweeps.items():
        out[f"sweep:{name}"] = (sweeps.get(name, 0), sweep.max_cost_micros)
    for name, pipe in state.pipelines.items():
        out[f"pipeline:{name}"] = (pipelines.get(name, 0), pipe.max_cost_micros)
    for key, amount in used.items():
        out[key] = (amount, state.budgets[key.split(":")[1]].monthly_micros)
    return out


# --- the checks --------------------------------------------------------------------------------------


def _ledger(state: State) -> None:
    folded = fold(state.ledger.values())
    if state.balances != folded:
        wrong = sorted(a for a in set(folded) | set(state.balances) if folded.get(a) != state.balances.get(a))
        shown = ", ".join(f"{a}: kept {state.balances.get(a, 0)}, folded {folded.get(a, 0)}" for a in wrong)
        raise Broken(f"the ledger does not fold to the balances ({shown})")
    total = sum(state.balances.values())
    if total:
        raise Broken(f"the balances sum to {total} µ$, not zero")
    below = {a: v for a, v in state.balances.items() if v < 0 and a != CREDITS_ISSUED}
    if below:
        raise Broken(f"accounts below zero: {below}")


def _filing(
    state: State, whole: State, project: str, filed: Mapping[str, Hold], forgotten: Mapping[str, Job]
) -> None:
    """The book with runs filed out of it and Jobs forgotten says what the whole book says: to the
    account, to every cap and to every Budget; its filed totals are the sums of what its Jobs filed, its
    forgotten rows what its forgotten Jobs spent."""
    months: dict[str, int] = {}
    for name, job in [*state.jobs.items(), *forgotten.items()]:
        mine = [filed[h] for h in job.filed]
        charged: dict[str, int] = {}
        for hold in mine:
            if hold.status == "Open" or hold.job != name or hold.labels != job.labels:
                raise Broken(f"job {name} filed hold {hold} (open, another's, or under other labels)")
            charged[hold.month] = charged.get(hold.month, 0) + hold.charged_micros
        if {m: v for m, v in charged.items() if v} != job.filed_months:
            raise Broken(f"job {name} says its filed runs charged {job.filed_months}; they charged {charged}")
        for month, amount in job.filed_months.items():
            months[month] = months.get(month, 0) + amount
        if set(job.filed) & set(state.holds):  # (a forgotten Job has none in the book: forget refuses)
            raise Broken(f"job {name} filed holds the book still has: {set(job.filed) & set(state.holds)}")
    account = balance(state.balances, filed_account(project))
    if months != state.filed or account != sum(months.values()):
        raise Broken(f"the book's filed totals {state.filed} (account {account}) are not its Jobs': {months}")
    if account_view(project, state) != account_view(project, whole):
        raise Broken(
            f"the account reads {account_view(project, state)}; unfiled, {account_view(project, whole)}"
        )
    rows: dict[str, tuple[dict[str, int], int]] = {}
    for job in forgotten.values():
        key = json.dumps(row_of(job.labels), sort_keys=True)
        got, n = rows.get(key, ({}, 0))
        for month, amount in job.filed_months.items():
            got[month] = got.get(month, 0) + amount
        rows[key] = (got, n + 1)
    kept = {json.dumps(r.labels, sort_keys=True): (r.months, r.jobs) for r in state.forgotten}
    if kept != rows or len(kept) != len(state.forgotten):
        raise Broken(f"the book's forgotten rows {state.forgotten} are not its forgotten Jobs': {rows}")
    for name in state.sweeps:
        if sweep_spent(state, name) != sweep_spent(whole, name):
            raise Broken(
                f"sweep {name} spent {sweep_spent(state, name)}; unfiled, {sweep_spent(whole, name)}"
            )
    for name in state.pipelines:
        if pipeline_spent(state, name) != pipeline_spent(whole, name):
            raise Broken(
                f"pipeline {name} spent {pipeline_spent(state, name)}; unfiled, {pipeline_spent(whole, name)}"
            )
    for name in state.jobs:
        if caps_over(state, name) != caps_over(whole, name):
            raise Broken(
                f"job {name}: the caps read {caps_over(state, name)}; unfiled, {caps_over(whole, name)}"
            )
    every = {h.month for h in whole.holds.values()}
    for name, budget in state.budgets.items():
        for month in every:
            if budget_used(state, budget, month) != budget_used(whole, budget, month):
                raise Broken(
                    f"budget {name} in {month} counts {budget_used(state, budget, month)} µ$; unfiled,"
                    f" {budget_used(whole, budget, month)}"
                )


def _account(state: State, project: str, tally: Tally) -> None:
    view = account_view(project, state)
    if view.granted_micros != tally.granted or granted_total(state) != tally.granted:
        raise Broken(
            f"project {project}: the account shows {view.granted_micros} µ$ granted (the book"
            f" {granted_total(state)}), but the grants and revokes accepted add up to {tally.granted}"
        )
    parts = view.available_micros + view.held_micros + view.spent_micros
    if view.granted_micros != parts:
        raise Broken(
            f"project {project}: granted {view.granted_micros} µ$ != available {view.available_micros} +"
            f" held {view.held_micros} + spent {view.spent_micros} = {parts}"
        )


def _holds(state: State, tally: Tally, use_bounds: Mapping[str, int]) -> None:
    for hold_id, hold in state.holds.items():
        left = held(state, hold_id)
        if hold.charged_micros != tally.charged.get(hold_id, 0):
            raise Broken(
                f"hold {hold_id} says it charged {hold.charged_micros} µ$; its results charged"
                f" {tally.charged.get(hold_id, 0)}"
            )
        times = tally.resolved[hold_id]
        if hold.status == "Open":
            if times:
                raise Broken(f"hold {hold_id} is open, but was resolved {times} time(s)")
            if left != hold.reserved_micros - hold.charged_micros:
                raise Broken(
                    f"open hold {hold_id} holds {left} µ$; it reserved {hold.reserved_micros} and"
                    f" charged {hold.charged_micros}"
                )
            bound = use_bounds.get(hold_id)
            if bound is not None and hold.charged_micros > bound:
                raise Broken(
                    f"hold {hold_id} charged {hold.charged_micros} µ$, ahead of its run's use so far"
                    f" ({bound} µ$)"
                )
        elif left or times != 1:
            raise Broken(f"hold {hold_id} is {hold.status} holding {left} µ$, resolved {times} time(s)")


def _spend(state: State) -> None:
    by_job: dict[str, int] = {}
    for hold in state.holds.values():
        by_job[hold.job] = by_job.get(hold.job, 0) + hold.charged_micros
    for name in state.jobs:
        spent = balance(state.balances, spend_account(name))
        if spent != by_job.get(name, 0):
            raise Broken(f"job {name} spent {spent} µ$, but its holds charged {by_job.get(name, 0)}")


def _ceilings(state: State, tally: Tally, redefined: frozenset[str]) -> None:
    now = committed(state)
    for key, (amount, limit) in now.items():
        before = tally.committed.get(key, 0)
        if limit is not None and key not in redefined and amount > max(limit, before):
            raise Broken(
                f"{key} has {amount} µ$ spent and held (before this operation {before}), above its limit"
                f" of {limit} µ$"
            )
    tally.committed = {key: amount for key, (amount, _) in now.items()}


def _unbilled(state: State, tally: Tally) -> None:
    """Usage beyond what holds charged is counted as unbilled (ADR-0023), once: a Job's ``unbilledMicros``
    is exactly what its runs reported beyond what their holds charged, no less and no more."""
    expected: dict[str, int] = {}
    for hold_id, hold in state.holds.items():
        over = max(0, tally.reported.get(hold_id, 0) - hold.charged_micros)
        expected[hold.job] = expected.get(hold.job, 0) + over
    for name, job in state.jobs.items():
        want = expected.get(name, 0)
        if job.unbilled_micros != want:
            raise Broken(f"job {name} records {job.unbilled_micros} µ$ unbilled; its runs overran by {want}")
