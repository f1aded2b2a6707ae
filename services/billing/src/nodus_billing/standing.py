"""The billing state as a value, and what it adds up to: holds, spend, headroom under caps and budgets.

:class:`State` is a msgspec Struct (camelCase JSON) the billing service keeps in KV; :mod:`holding`
changes it only through ``apply``. The ledger inside it is the truth; ``balances`` is its fold.

A Job's holds count against three levels of caps (:func:`caps_over`), innermost first: its own
``maxCostUSD``, its Sweep's (shared by the cells), and its Pipeline's (issue #22: shared by every stage, the
cells of its Sweep stages included). A Job stage points at its Pipeline (``Job.pipeline``); a cell points
at its Sweep, whose entry points at the Pipeline (``Sweep.pipeline``): :func:`pipeline_of`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Final, Literal, NamedTuple

import msgspec

from nodus_billing.accounting import Entry, available_account, balance, hold_account, spend_account
from nodus_schema.quantities import MAX_USD_MICROS, micros_to_usd
from nodus_schema.wire import Wire

INSUFFICIENT_CREDITS: Final = "InsufficientCredits"
BUDGET_EXCEEDED: Final = "BudgetExceeded"
MAX_COST_REACHED: Final = "MaxCostReached"
NOT_FOUND: Final = "NotFound"
CONFLICT: Final = "Conflict"
INVALID: Final = "Invalid"
INTERNAL: Final = "InternalError"
"""An operation billing could not apply (a bug, logged): refused alone, nothing else in its commit fails."""

# --- the bounds of a book ----------------------------------------------------------------------------
#
# A book is JSON in KV, but every operation copies it through msgpack, whose integers are 64-bit: an
# integer beyond that in a book fails every later operation of the project (the bug behind these
# bounds). So every integer a book keeps is bounded, with room for the sums that are kept:

BOOK_MAX_MICROS: Final = 10**18
"""The most any amount in a book may be: $1,000,000,000,000 (a thousand times the API's MAX_USD). It is
also the most all grants of a book may add up to (net of revokes), so that no balance, hold, spend or sum
of them ever passes it, and ``credits:issued`` (minus all grants) stays far inside int64."""
MAX_GRANT_MICROS: Final = MAX_USD_MICROS
"""The most one grant may be (the API's MAX_USD): larger grants are refused, not clamped."""
MAX_TIME_MS: Final = 253_402_300_799_999
"""The latest instant a book keeps (9999-12-31T23:59:59.999Z, the last one a UTC month can name)."""
MAX_COUNT: Final = BOOK_MAX_MICROS
"""The most a count in a book (a generation, a meter tick) may be."""

HoldStatus = Literal["Open", "Captured", "Released", "Expired"]

# --- the state ---------------------------------------------------------------------------------------


class Budget(Wire):
    project: str
    monthly_micros: int
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    """Labels an object must carry for the budget to apply; empty applies to the whole project."""
    generation: int = 0
    deleted: bool = False
    """A tombstone: the Budget (this uid) was deleted and applies no more. Kept, so that a late put of
    it (a redelivery, a retried commit) cannot bring it back: a deleted object never returns."""


class Pipeline(Wire):
    """A Pipeline's cap (issue #22), shared by every stage: its Job stages and its Sweep stages' cells."""

    project: str
    max_cost_micros: int | None = None
    generation: int = 0
    forgotten_micros: int = 0
    """What its Job stages that were deleted and forgotten spent (``forgetting``; its Sweep stages' cells
    are counted by their Sweep's): its cap counts it."""


class Sweep(Wire):
    project: str
    max_cost_micros: int | None = None
    generation: int = 0
    pipeline: str | None = None
    forgotten_micros: int = 0
    """What its cells that were deleted and forgotten spent (``forgetting``): its cap counts it."""
    """The Pipeline the Sweep is a stage of (its controller ownerReference): its cells count against that
    cap too. Never changes (a book older than Pipelines has none: the Sweep is under no Pipeline)."""


class Job(Wire):
    project: str
    sweep: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    max_cost_micros: int | None = None
    generation: int = 0
    unbilled_micros: int = 0
    """Usage reported beyond what the Job's holds reserved: recorded, not charged (ADR-0023)."""
    pipeline: str | None = None
    """The Pipeline a Job stage belongs to directly (its controller ownerReference). A cell has none here:
    its Pipeline is its Sweep's (:func:`pipeline_of`). Never changes."""
    filed: list[str] = msgspec.field(default_factory=list)
    """The holds of the Job filed out of the book (``filing``): their records are in the history bucket,
    their ids stay here, so an operation on one of them delivered late is a Conflict, never a new hold."""
    filed_months: dict[str, int] = msgspec.field(default_factory=dict)
    """What the filed holds charged, by the month they were placed in (the Job's spent beyond its spend
    account, and what its Budgets count of them)."""

    @property
    def filed_micros(self) -> int:
        return sum(self.filed_months.values())


def own_job(state: State, ref: str) -> Job:
    """The Job's record, made ``state``'s own before it is changed in place: a copy of a book shares its Job
    records with the book it was copied from (``holding.copied``), so a change to a shared one would
    change both."""
    job = state.jobs[ref]
    mine = msgspec.structs.replace(
        job, labels=dict(job.labels), filed=list(job.filed), filed_months=dict(job.filed_months)
    )
    state.jobs[ref] = mine
    return mine


class Forgotten(Wire):
    """What the deleted Jobs of one label set that the book forgot spent, by month (``forgetting``)."""

    labels: dict[str, str] = msgspec.field(default_factory=dict)
    months: dict[str, int] = msgspec.field(default_factory=dict)
    jobs: int = 0


class Usage(Wire):
    """What a captured hold paid for: one Attempt's run, split by billing segment (µ$)."""

    attempt: str = ""
    offering: str = ""
    pricebook_version: str = ""
    rate_micros_per_hour: int = 0
    billed_millis: int = 0
    segments: dict[str, int] = msgspec.field(default_factory=dict)
    """Boot, Running, Restore, Teardown: what each segment was charged (sums to the capture's total)."""
    covered: dict[str, int] = msgspec.field(default_factory=dict)
    """Segments Nodus paid for instead of charging them, with what they would have cost."""
    start_time: str | None = None
    finish_time: str | None = None


class Hold(Wire):
    job: str
    project: str
    month: str
    """The month (``YYYY-MM``, UTC) the hold counts against in budgets: the month it was placed."""
    funded_until_ms: int
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    status: HoldStatus = "Open"
    reserved_micros: int = 0
    """Everything ever reserved by the hold (place + extensions)."""
    charged_micros: int = 0
    last_tick: int = 0
    """The last meter tick charged: a tick number at or below it is a repeat."""
    rate_micros_per_hour: int = 0
    placed_ms: int = 0
    overrun_micros: int = 0
    """The run's usage beyond what the hold reserved, as far as it is already recorded in the Job's
    unbilled: every tick asks for the run's whole usage so far, so only what passes this is new."""
    usage: Usage | None = None
    """Set when the hold is captured: what it paid for (usage and invoices read it)."""


class Result(Wire):
    """What an operation did; a refusal carries an error code, a message with the amounts and a fix."""

    op_id: str
    ok: bool = True
    code: str | None = None
    message: str | None = None
    fix: str | None = None
    charged_micros: int = 0
    overrun_micros: int = 0
    """Usage reported beyond the hold: not charged (Nodus absorbs it), and added to the Job's unbilled."""
    released_micros: int = 0
    refunded_micros: int = 0
    """What a capture gave back of the ticks, which charged more than the run's final charge."""
    expired: list[str] = msgspec.field(default_factory=list)


class Repair(Wire):
    """One value billing changed in a stored book because the book could not hold it (written by an older
    version, before the bounds): where, what it was (as text: it may not fit an integer here) and what it is
    now (None: removed)."""

    at_ms: int
    path: str
    was: str
    now: str | None = None


MAX_REPAIRS: Final = 20
"""Repairs a book keeps (the latest): an audit trail, not a log."""


class State(Wire):
    budgets: dict[str, Budget] = msgspec.field(default_factory=dict)
    pipelines: dict[str, Pipeline] = msgspec.field(default_factory=dict)
    """Pipelines by ``<name>@<uid>`` (issue #22; absent from older books, and from books without any)."""
    sweeps: dict[str, Sweep] = msgspec.field(default_factory=dict)
    jobs: dict[str, Job] = msgspec.field(default_factory=dict)
    holds: dict[str, Hold] = msgspec.field(default_factory=dict)
    ledger: dict[str, Entry] = msgspec.field(default_factory=dict)
    """Append-only, in posting order, keyed by entry id."""
    balances: dict[str, int] = msgspec.field(default_factory=dict)
    """The ledger folded (non-zero accounts only); always equal to ``fold(ledger.values())``."""
    results: dict[str, Result] = msgspec.field(default_factory=dict)
    """The result of every applied operation id: what makes a replay return the same answer."""
    repairs: list[Repair] = msgspec.field(default_factory=list)
    """What billing changed in this book because it could not hold it (the latest :data:`MAX_REPAIRS`)."""
    filed: dict[str, int] = msgspec.field(default_factory=dict)
    """What every filed hold of the book charged, by month (``filing``): the sum over its Jobs'
    ``filed_months``, kept whole so that a quote, which reads no Jobs, counts them under project-wide
    Budgets."""
    filed_covered_micros: int = 0
    """What Nodus covered of the filed holds' runs (the account's unbilled counts it)."""
    forgotten: list[Forgotten] = msgspec.field(default_factory=list)
    """The deleted Jobs the book forgot, folded by label set (``forgetting``): Budgets with a selector
    count them."""
    forgotten_unbilled_micros: int = 0
    """What the forgotten Jobs ran beyond their holds (the account's unbilled counts it)."""


# --- reading the state -------------------------------------------------------------------------------


def month_of(at_ms: int) -> str:
    """The UTC month (``YYYY-MM``) of an epoch-milliseconds instant."""
    return _month_of_second(at_ms // 1000)


@functools.lru_cache(maxsize=1024)
def _month_of_second(second: int) -> str:
    # Cached: every quote and every pass asks the month of now (strftime was 2% of billing's time).
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m")


def held(state: State, hold_id: str) -> int:
    """What a hold still reserves."""
    return balance(state.balances, hold_account(hold_id))


def available(state: State, project: str) -> int:
    """A project's credits no hold reserves."""
    return balance(state.balances, available_account(project))


def project_held(state: State, project: str) -> int:
    """Everything a project's open holds reserve."""
    return sum(held(state, h) for h, hold in state.holds.items() if hold.project == project)


def job_spent(state: State, job: str) -> int:
    """What a Job has been charged: its spend account, and what its filed holds charged."""
    record = state.jobs.get(job)
    return balance(state.balances, spend_account(job)) + (record.filed_micros if record else 0)


def job_held(state: State, job: str) -> int:
    """What a Job's open holds reserve."""
    return sum(held(state, h) for h, hold in state.holds.items() if hold.job == job)


def sweep_spent(state: State, sweep: str) -> int:
    """What all the cells of a Sweep have been charged, the forgotten ones included."""
    record = state.sweeps.get(sweep)
    forgotten = record.forgotten_micros if record is not None else 0
    return forgotten + sum(job_spent(state, name) for name, job in state.jobs.items() if job.sweep == sweep)


def sweep_held(state: State, sweep: str) -> int:
    """What the open holds of all the cells of a Sweep reserve."""
    return sum(job_held(state, name) for name, job in state.jobs.items() if job.sweep == sweep)


def pipeline_of(state: State, job: Job) -> str | None:
    """The Pipeline whose cap a Job counts against: its own (a Job stage), else its Sweep's (a cell)."""
    if job.pipeline is not None:
        return job.pipeline
    sweep = state.sweeps.get(job.sweep) if job.sweep is not None else None
    return sweep.pipeline if sweep is not None else None


def pipeline_jobs(state: State, pipeline: str) -> list[str]:
    """Every Job under a Pipeline: its Job stages and the cells of its Sweep stages."""
    return [name for name, job in state.jobs.items() if pipeline_of(state, job) == pipeline]


def pipeline_spent(state: State, pipeline: str) -> int:
    """What everything under a Pipeline has been charged, the forgotten Jobs included."""
    return pipeline_forgotten(state, pipeline) + sum(
        job_spent(state, name) for name in pipeline_jobs(state, pipeline)
    )


def pipeline_forgotten(state: State, pipeline: str) -> int:
    """What the forgotten Jobs under a Pipeline spent: its Job stages' and its Sweep stages' cells'."""
    record = state.pipelines.get(pipeline)
    own = record.forgotten_micros if record is not None else 0
    return own + sum(s.forgotten_micros for s in state.sweeps.values() if s.pipeline == pipeline)


def forgotten_spent(state: State) -> int:
    """What every forgotten Job of the book spent."""
    return sum(sum(row.months.values()) for row in state.forgotten)


def pipeline_held(state: State, pipeline: str) -> int:
    """What the open holds of everything under a Pipeline reserve."""
    return _held_by(state, set(pipeline_jobs(state, pipeline)))


def siblings(state: State, job_name: str) -> list[str]:
    """The other Jobs under the Job's Sweep or Pipeline: the ones its Sweep's or Pipeline's cap binds
    together (the cells of its Sweep; every stage of its Pipeline, the cells of its Sweep stages included)."""
    job = state.jobs[job_name]
    pipeline = pipeline_of(state, job)
    return [
        name
        for name, other in state.jobs.items()
        if name != job_name
        and (
            (job.sweep is not None and other.sweep == job.sweep)
            or (pipeline is not None and pipeline_of(state, other) == pipeline)
        )
    ]


def _held_by(state: State, jobs: set[str]) -> int:
    return sum(held(state, h) for h, hold in state.holds.items() if hold.job in jobs)


def _committed(state: State, jobs: Iterable[str]) -> int:
    """Spent + held of some Jobs, in one pass over the holds."""
    members = set(jobs)
    return sum(job_spent(state, name) for name in members) + _held_by(state, members)


class Level(NamedTuple):
    """One cap a Job's holds count against: whose it is, the cap, and what is spent and held under it."""

    kind: Literal["Job", "Sweep", "Pipeline"]
    name: str
    """The book's name of the object (``<name>@<uid>``)."""
    cap: int
    committed: int

    @property
    def room(self) -> int:
        """What the cap leaves (below zero when it was lowered below what is committed)."""
        return self.cap - self.committed


def caps_over(state: State, job_name: str) -> list[Level]:
    """The caps a Job's holds count against, innermost first (the order ``holding.apply`` checks them):
    the Job's own, its Sweep's, its Pipeline's; each only when it is set."""
    job = state.jobs[job_name]
    out: list[Level] = []
    if job.max_cost_micros is not None:
        out.append(Level("Job", job_name, job.max_cost_micros, _committed(state, [job_name])))
    sweep = state.sweeps.get(job.sweep) if job.sweep is not None else None
    if job.sweep is not None and sweep is not None and sweep.max_cost_micros is not None:
        cells = [name for name, j in state.jobs.items() if j.sweep == job.sweep]
        committed = sweep.forgotten_micros + _committed(state, cells)
        out.append(Level("Sweep", job.sweep, sweep.max_cost_micros, committed))
    pipeline = pipeline_of(state, job)
    known = state.pipelines.get(pipeline) if pipeline is not None else None
    if pipeline is not None and known is not None and known.max_cost_micros is not None:
        committed = pipeline_forgotten(state, pipeline) + _committed(state, pipeline_jobs(state, pipeline))
        out.append(Level("Pipeline", pipeline, known.max_cost_micros, committed))
    return out


def binding_cap(state: State, job_name: str, room: int) -> Level | None:
    """The cap that leaves a Job ``room`` (what :func:`room_for` said), innermost first on a tie; None
    when no cap leaves that little (a Budget or the credits bind)."""
    return next((c for c in caps_over(state, job_name) if max(c.room, 0) == room), None)


def budget_used(state: State, budget: Budget, month: str) -> int:
    """What the holds counted in ``month`` that match the budget reserve or have been charged: those in
    the book, and those filed (by the labels of their Job; every one of the book's, for a Budget without a
    selector)."""
    booked = sum(
        hold.charged_micros + held(state, h)
        for h, hold in state.holds.items()
        if hold.project == budget.project and hold.month == month and matches(budget.selector, hold.labels)
    )
    return booked + filed_used(state, budget, month)


def filed_used(state: State, budget: Budget, month: str) -> int:
    """What the filed holds of ``month`` that a Budget counts charged (``filing``)."""
    if not budget.selector:
        return state.filed.get(month, 0)  # every Job's, the forgotten ones' too
    live = sum(
        job.filed_months.get(month, 0)
        for job in state.jobs.values()
        if job.project == budget.project and job.filed_months and matches(budget.selector, job.labels)
    )
    gone = sum(row.months.get(month, 0) for row in state.forgotten if matches(budget.selector, row.labels))
    return live + gone


def room_for(
    state: State, job_name: str, month: str, labels: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """The most one more hold (or extension) for the Job could reserve now, and the limit that binds
    (MaxCostReached, BudgetExceeded or InsufficientCredits): the same rules, in the same order, as
    ``holding.apply`` checks a hold against. For an extension, ``month`` and ``labels`` are the hold's
    (the Budgets it counts against are those of the month and labels it was placed with); by default
    the Job's labels now."""
    rooms = _rooms(state, job_name, month, labels)
    room = max(min(r for r, _ in rooms), 0)
    return room, _first_broken(rooms, room + 1)


def refusal_for(
    state: State, job_name: str, amount_micros: int, month: str, labels: Mapping[str, str] | None = None
) -> str | None:
    """The limit a hold (or extension) of ``amount_micros`` is refused with, None when it fits: the first
    rule, in ``holding.apply``'s order, that it breaks (which for amounts past the room need not be the
    rule with the least room: a Budget checked before the credits may be broken first)."""
    rooms = _rooms(state, job_name, month, labels)
    return _first_broken(rooms, amount_micros) if any(r < amount_micros for r, _ in rooms) else None


def _rooms(
    state: State, job_name: str, month: str, labels: Mapping[str, str] | None
) -> list[tuple[int, str]]:
    """What each rule leaves for the Job (negative where it is spent past already), in apply()'s order."""
    job = state.jobs[job_name]
    labels = job.labels if labels is None else labels
    # The Job's cap, its Sweep's, its Pipeline's (what everything under it spent and holds).
    rooms = [(cap.room, MAX_COST_REACHED) for cap in caps_over(state, job_name)]
    for _, budget in sorted(state.budgets.items()):
        if budget.project == job.project and binds(budget) and matches(budget.selector, labels):
            rooms.append((budget.monthly_micros - budget_used(state, budget, month), BUDGET_EXCEEDED))
    rooms.append((available(state, job.project), INSUFFICIENT_CREDITS))
    return rooms


def _first_broken(rooms: list[tuple[int, str]], amount_micros: int) -> str:
    """The first rule an amount breaks; the last one (the credits) when it breaks none."""
    return next((code for r, code in rooms if r < amount_micros), rooms[-1][1])


def binds(budget: Budget) -> bool:
    """Whether a Budget can ever bind: one at :data:`BOOK_MAX_MICROS` (where larger ones are clamped)
    allows more than any book can hold, so the credits always bind first and it is not checked. A deleted
    one (a tombstone) never binds."""
    return budget.monthly_micros < BOOK_MAX_MICROS and not budget.deleted


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether labels carry every label of a selector (an empty selector matches everything)."""
    return all(labels.get(k) == v for k, v in selector.items())


# --- what must stop, and what may resume -------------------------------------------------------------


class Suspension(Wire):
    """An object that cannot fund one more billing increment, with the reason and the fix."""

    kind: Literal["Job", "Sweep", "Pipeline", "Project"]
    name: str
    reason: str
    message: str
    fix: str


def suspensions(state: State, increment_micros: int) -> list[Suspension]:
    """Every Job, Sweep and Pipeline at its cap (MaxCostReached) and every project out of credit
    (InsufficientCredits).

    "At its cap" means the headroom left (cap − spent − held) cannot fund one more ``increment_micros``:
    its running work must checkpoint and stop when its holds run out. A cell of a Sweep at its cap is
    listed too, and so is every Job under a Pipeline at its cap. Raising the cap (or granting credits)
    takes the object off this list: it is resumable.
    """
    out: list[Suspension] = []
    for name, sweep in sorted(state.sweeps.items()):
        room = _sweep_room(state, name, sweep)
        if room is not None and room < increment_micros:
            out.append(_capped("Sweep", name, sweep.max_cost_micros or 0, room))
    for name, pipeline in sorted(state.pipelines.items()):
        if pipeline.max_cost_micros is not None:
            committed = pipeline_forgotten(state, name) + _committed(state, pipeline_jobs(state, name))
            room = pipeline.max_cost_micros - committed
            if room < increment_micros:
                out.append(_capped("Pipeline", name, pipeline.max_cost_micros, room))
    for name in sorted(state.jobs):
        capped = _job_capped(state, name, increment_micros)
        if capped is not None:
            out.append(capped)
    for project in sorted({job.project for job in state.jobs.values()}):
        free = available(state, project)
        if free < increment_micros:
            msg = f"project {project} has {usd(free)} not held, under one increment ({usd(increment_micros)})"
            fix = f"add at least {usd(increment_micros - free)} in credits"
            out.append(
                Suspension(kind="Project", name=project, reason=INSUFFICIENT_CREDITS, message=msg, fix=fix)
            )
    return out


def resumable(state: State, job: str, increment_micros: int) -> bool:
    """Whether a suspended Job may resume: neither it, its Sweep, its Pipeline nor its project is on the
    suspension list."""
    record = state.jobs[job]
    blocking = {("Job", job), ("Project", record.project)}
    if record.sweep is not None:
        blocking.add(("Sweep", record.sweep))
    pipeline = pipeline_of(state, record)
    if pipeline is not None:
        blocking.add(("Pipeline", pipeline))
    return not any((s.kind, s.name) in blocking for s in suspensions(state, increment_micros))


def _job_capped(state: State, name: str, increment_micros: int) -> Suspension | None:
    """The Job's own cap first; then its Sweep's, which stops every cell; then its Pipeline's, which stops
    every stage."""
    for cap in caps_over(state, name):
        if cap.room < increment_micros:
            via = "" if cap.kind == "Job" else f"{cap.kind.lower()} {cap.name}"
            return _capped("Job", name, cap.cap, cap.room, via=via)
    return None


def _sweep_room(state: State, name: str, sweep: Sweep) -> int | None:
    if sweep.max_cost_micros is None:
        return None
    return sweep.max_cost_micros - sweep_spent(state, name) - sweep_held(state, name)


def _capped(
    kind: Literal["Job", "Sweep", "Pipeline"], name: str, cap: int, room: int, via: str = ""
) -> Suspension:
    owner = via or f"{kind.lower()} {name}"
    msg = f"{kind} {name}: {usd(max(room, 0))} left under the maxCostUSD {usd(cap)} of {owner}"
    fix = f"raise the maxCostUSD of {owner} above {usd(cap - room)} to resume"
    return Suspension(kind=kind, name=name, reason=MAX_COST_REACHED, message=msg, fix=fix)


def usd(micros: int) -> str:
    """An amount for a sentence: ``$0.000123``."""
    return f"${micros_to_usd(micros)}"


def refused(key: str, code: str, message: str, fix: str) -> Result:
    """The refusal of the operation ``key``: nothing moved; asked again, it is judged again."""
    return Result(op_id=key, ok=False, code=code, message=message, fix=fix)
