"""Holds, caps and budgets as a pure value: ``apply(state, op) -> (state, result, entries)`` (ADR-0023).

No I/O here. The billing service keeps one :class:`State` (a msgspec Struct, camelCase on the wire) in
KV and drives it with operations. Every operation has a deterministic id (:func:`op_id`); the result of
each applied id is remembered, so an operation delivered twice changes nothing and returns the same
result. Money is integer micro-dollars throughout.

A hold is a pending transfer: placing it moves credits from the project's available account to the
hold's own ledger account; meter ticks and the capture move from the hold to the Job's spend account;
the rest goes back to available exactly once, when the hold is captured, released or expires.

Every integer an operation brings is bounded before it is applied (:func:`bounded`), so no operation can
put into a book what the book cannot hold (``standing.BOOK_MAX_MICROS``): an amount that only measures
usage (a tick, a capture, a run's segments) or a limit (a cap, a Budget) is clamped, since the clamp
changes nothing the book can tell apart; an amount that would move money beyond the bound (a hold, an
extension, a grant) or a time or count beyond its bound is refused, that operation alone, with a message
and a fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from nodus_billing.accounting import (
    Entry,
    available_account,
    entry,
    hold_account,
    post,
    spend_account,
)
from nodus_billing.crediting import Grant as Grant  # operations of the book, as the rest
from nodus_billing.crediting import Revoke as Revoke
from nodus_billing.crediting import grant, revoke
from nodus_billing.crediting import granted_total as granted_total
from nodus_billing.filing import File as File
from nodus_billing.filing import file_holds, filed_conflict, filed_refusal
from nodus_billing.forgetting import Forget as Forget
from nodus_billing.forgetting import forget_job
from nodus_billing.pipelining import PutPipeline as PutPipeline
from nodus_billing.pipelining import put_pipeline, stage_refusal
from nodus_billing.standing import (
    BOOK_MAX_MICROS,
    BUDGET_EXCEEDED,
    CONFLICT,
    INSUFFICIENT_CREDITS,
    INVALID,
    MAX_COST_REACHED,
    MAX_COUNT,
    MAX_GRANT_MICROS,
    MAX_TIME_MS,
    NOT_FOUND,
    Budget,
    Hold,
    HoldStatus,
    Job,
    Result,
    State,
    Sweep,
    Usage,
    available,
    binds,
    budget_used,
    caps_over,
    held,
    matches,
    month_of,
    own_job,
    refused,
    usd,
)
from nodus_schema.ledger import charge_micros
from nodus_schema.wire import Wire

# --- operations --------------------------------------------------------------------------------------


class PutBudget(Wire, tag=True, tag_field="op"):
    name: str
    project: str
    monthly_micros: int
    generation: int
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    deleted: bool = False
    """The Budget was deleted: it no longer applies, and no later put of the same ref puts it back (the
    ref carries the object's uid, and a deleted object never returns)."""


class PutSweep(Wire, tag=True, tag_field="op"):
    name: str
    project: str
    generation: int
    max_cost_micros: int | None = None
    pipeline: str | None = None
    """The Pipeline the Sweep is a stage of (issue #22, ``pipelining``): its cells are under its cap."""


class PutJob(Wire, tag=True, tag_field="op"):
    name: str
    project: str
    generation: int
    sweep: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    max_cost_micros: int | None = None
    pipeline: str | None = None
    """The Pipeline of a Job stage (a cell's is its Sweep's, so a cell has none here)."""


class PlaceHold(Wire, tag=True, tag_field="op"):
    hold_id: str
    job: str
    amount_micros: int
    funded_until_ms: int
    at_ms: int
    rate_micros_per_hour: int = 0


class ExtendHold(Wire, tag=True, tag_field="op"):
    hold_id: str
    more_micros: int
    funded_until_ms: int


class Charge(Wire, tag=True, tag_field="op"):
    """A meter tick: charge part of the usage from the hold, which stays open."""

    hold_id: str
    tick: str
    amount_micros: int


class Capture(Wire, tag=True, tag_field="op"):
    """The final charge of a hold (beyond its ticks); the rest is released and the hold resolves.

    ``total_micros``, when given, is the run's whole final charge and wins over ``amount_micros``: the
    hold ends having charged exactly that, ticks included. Ticks charge a running run's time up to a
    second behind the clock; a finish that reaches the meter later than that (a report delayed by a
    failover) leaves the ticks above the run's real use, and the capture gives the difference back."""

    hold_id: str
    amount_micros: int
    usage: Usage | None = None
    total_micros: int | None = None


class Release(Wire, tag=True, tag_field="op"):
    hold_id: str


class Expire(Wire, tag=True, tag_field="op"):
    """Release every open hold whose ``funded_until_ms`` is at or before ``now_ms``."""

    now_ms: int


Op = (
    Grant
    | Revoke
    | PutBudget
    | PutPipeline
    | PutSweep
    | PutJob
    | PlaceHold
    | ExtendHold
    | Charge
    | Capture
    | Release
    | Expire
    | File
    | Forget
)


def op_id(op: Op) -> str:
    """The deterministic id of an operation: the same request always has the same id."""
    match op:
        case Grant():
            return f"grant:{op.grant_id}"
        case Revoke():
            return f"revoke:{op.revoke_id}"
        case PutBudget():
            return f"budget:{op.name}:{op.generation}" + (":deleted" if op.deleted else "")
        case PutPipeline():
            return f"pipeline:{op.name}:{op.generation}"
        case PutSweep():
            return f"sweep:{op.name}:{op.generation}"
        case PutJob():
            return f"job:{op.name}:{op.generation}"
        case PlaceHold():
            return f"hold:{op.hold_id}:place"
        case ExtendHold():
            return f"hold:{op.hold_id}:extend:{op.funded_until_ms}"
        case Charge():
            return f"hold:{op.hold_id}:charge:{op.tick}"
        case Capture():
            return f"hold:{op.hold_id}:capture"
        case Release():
            return f"hold:{op.hold_id}:release"
        case Expire():
            return f"expire:{op.now_ms}"
        case File():
            return f"file:{op.job}"
        case Forget():
            return f"forget:{op.job}"


_REMEMBERED: Final = (Grant, Revoke, PlaceHold, Capture, Release, Expire)
"""Operations whose result is remembered by id. The others are idempotent by a guard instead, so the
state does not grow with them: a put by its generation, an extension by its fundedUntil, a meter tick
by its number (each only moves forward)."""


def apply(state: State, op: Op, *, copy: bool = True) -> tuple[State, Result, list[Entry]]:
    """Apply one operation to a copy of ``state``: the new state, the result, the entries it posted.
    ``copy=False`` applies it to ``state`` itself and returns that, changed as the copy would be: for a
    commit that applies many operations to one copy of the book it read (``books``), where a copy per
    operation would cost each operation the size of the book.

    An operation id applied before returns its first result, the same state and no entries. A refusal
    is not remembered: asked again (after a cap was raised, credits granted) it is judged again.
    Once a hold resolves, its entries are netted into one and its results dropped (:func:`_settle`), so
    the state grows by one hold record and one entry per run, until the Job is final or gone and its runs
    are filed out of the book (``filing``); any later operation on it is a Conflict.
    """
    key = op_id(op)
    if key in state.results:
        return state, state.results[key], []
    op, refusal = bounded(op, key)
    if refusal is not None:
        return state, refusal, []
    new = _clone(state) if copy else state
    result, posted = _handle(new, op, key)
    return new, result, posted


def copied(state: State) -> State:
    """A deep copy of ``state``, as :func:`apply` makes before each operation."""
    return _clone(state)


def _handle(new: State, op: Op, key: str) -> tuple[Result, list[Entry]]:
    """The operation applied to ``new`` (a copy the caller owns): handled, posted, remembered, settled."""
    result, entries = _HANDLERS[type(op)](new, op, key)
    posted = post(new.ledger, new.balances, entries)
    if isinstance(op, _REMEMBERED) and result.ok:
        new.results[key] = result  # a refusal moved nothing: asked again, it is judged again
    if isinstance(op, Charge | ExtendHold) and result.ok:
        _merge(new, op.hold_id, posted)
    resolved = (
        result.expired
        if isinstance(op, Expire)
        else [op.hold_id]
        if isinstance(op, Capture | Release)
        else []
    )
    for hold_id in resolved if result.ok else []:
        _settle(new, hold_id)
    return result, posted


def hold_amount(rate_micros_per_hour: int, window_millis: int) -> int:
    """What a hold for ``window_millis`` of capacity at ``rate`` reserves (rounded up, as charges are)."""
    return charge_micros(rate_micros_per_hour, window_millis)


def bounded(op: Op, key: str) -> tuple[Op, Result | None]:
    """The operation with every integer inside what a book holds, or the refusal of it (see the module).

    Clamped: a Job's, Sweep's or Pipeline's cap above ``BOOK_MAX_MICROS`` is no cap (no book can spend
    that much); a Budget above it is set to it (where it never binds: ``standing.binds``); usage (a tick's
    or capture's amount, a run's segments and billed time) at it (only the unbilled overrun beyond the
    hold could tell the difference, and it saturates there). Refused: a grant above ``MAX_GRANT_MICROS``,
    a hold or an extension above ``BOOK_MAX_MICROS``, a rate above it, a time outside 1970..9999, a count
    above ``MAX_COUNT``."""
    match op:
        case Grant() if op.amount_micros > MAX_GRANT_MICROS:
            most = usd(MAX_GRANT_MICROS)
            msg = f"a grant of {usd(op.amount_micros)} is more than one grant may be ({most})"
            return op, refused(key, INVALID, msg, f"grant at most {usd(MAX_GRANT_MICROS)} at a time")
        case PutJob() | PutSweep() | PutPipeline() | PutBudget() if not 0 <= op.generation <= MAX_COUNT:
            return op, refused(key, INVALID, f"generation {op.generation}", f"use 0 to {MAX_COUNT}")
        case PutJob() | PutSweep() | PutPipeline() if (op.max_cost_micros or 0) > BOOK_MAX_MICROS:
            return msgspec.structs.replace(op, max_cost_micros=None), None
        case PutJob() | PutSweep() | PutPipeline() if (op.max_cost_micros or 0) < 0:
            return msgspec.structs.replace(op, max_cost_micros=0), None
        case PutBudget() if op.monthly_micros > BOOK_MAX_MICROS:
            return msgspec.structs.replace(op, monthly_micros=BOOK_MAX_MICROS), None
        case PlaceHold() | ExtendHold():
            amount = op.amount_micros if isinstance(op, PlaceHold) else op.more_micros
            if amount > BOOK_MAX_MICROS:
                most = usd(BOOK_MAX_MICROS)
                msg = f"a hold of {usd(amount)} is more than any billing book can fund ({most})"
                return op, refused(key, INVALID, msg, "hold less: a shorter window or a lower rate")
            times = [op.funded_until_ms] + ([op.at_ms] if isinstance(op, PlaceHold) else [])
            if any(not 0 <= t <= MAX_TIME_MS for t in times):
                msg = f"a hold at {times[-1]} ms funded until {times[0]} ms (since 1970, UTC)"
                return op, refused(key, INVALID, msg, "use times from 1970 to 9999")
            if isinstance(op, PlaceHold) and not 0 <= op.rate_micros_per_hour <= BOOK_MAX_MICROS:
                msg = f"a rate of {op.rate_micros_per_hour} µ$/h"
                return op, refused(key, INVALID, msg, f"use a rate of at most {usd(BOOK_MAX_MICROS)}/h")
        case Charge():
            if len(op.tick) > 18:  # more digits than MAX_COUNT has: not a tick number
                return op, refused(
                    key, INVALID, f"meter tick {op.tick[:24]!r}...", "number ticks 1, 2, 3, ..."
                )
            if op.amount_micros > BOOK_MAX_MICROS:
                return msgspec.structs.replace(op, amount_micros=BOOK_MAX_MICROS), None
        case Capture():
            usage = _bounded_usage(op.usage) if op.usage is not None else None
            total = None if op.total_micros is None else min(op.total_micros, BOOK_MAX_MICROS)
            amount = min(op.amount_micros, BOOK_MAX_MICROS)
            if (usage, total, amount) != (op.usage, op.total_micros, op.amount_micros):
                return msgspec.structs.replace(
                    op, usage=usage, total_micros=total, amount_micros=amount
                ), None
    return op, None


def _bounded_usage(usage: Usage) -> Usage:
    """A run's usage with every amount and time at most ``BOOK_MAX_MICROS`` (only a run no book could
    pay for reaches it: what is charged is what its hold reserved)."""

    def clamp(n: int) -> int:
        return max(-BOOK_MAX_MICROS, min(n, BOOK_MAX_MICROS))

    segments = {k: clamp(v) for k, v in usage.segments.items()}
    covered = {k: clamp(v) for k, v in usage.covered.items()}
    rate, millis = clamp(usage.rate_micros_per_hour), clamp(usage.billed_millis)
    if (segments, covered, rate, millis) == (
        usage.segments,
        usage.covered,
        usage.rate_micros_per_hour,
        usage.billed_millis,
    ):
        return usage
    return msgspec.structs.replace(
        usage, segments=segments, covered=covered, rate_micros_per_hour=rate, billed_millis=millis
    )


def encode(state: State) -> bytes:
    """The state as JSON, for KV."""
    return msgspec.json.encode(state)


def decode(data: bytes) -> State:
    """The state back from :func:`encode`."""
    return msgspec.json.decode(data, type=State)


# --- handlers (mutate the cloned state, return the result and the entries to post) -------------------

_Handled = tuple[Result, list[Entry]]


def _put_budget(state: State, op: PutBudget, key: str) -> _Handled:
    if op.monthly_micros < 0:
        return refused(key, INVALID, "a budget's monthly amount is negative", "set it to zero or more"), []
    old = state.budgets.get(op.name)
    if old is not None and old.project != op.project:
        return refused(key, CONFLICT, f"budget {op.name} belongs to {old.project}", "use another name"), []
    if op.deleted:
        # A tombstone, not a removal: a put of this Budget arriving late must not bring it back.
        gen = max(op.generation, old.generation if old is not None else 0)
        state.budgets[op.name] = Budget(project=op.project, monthly_micros=0, generation=gen, deleted=True)
        return Result(op_id=key), []
    if old is not None and old.deleted:
        return Result(op_id=key), []  # deleted for good: this uid's Budget never returns
    if old is None or op.generation > old.generation:
        state.budgets[op.name] = Budget(
            project=op.project,
            monthly_micros=op.monthly_micros,
            selector=dict(op.selector),
            generation=op.generation,
        )
    return Result(op_id=key), []


def _put_sweep(state: State, op: PutSweep, key: str) -> _Handled:
    old = state.sweeps.get(op.name)
    if old is not None and old.project != op.project:
        return refused(key, CONFLICT, f"sweep {op.name} belongs to {old.project}", "use another name"), []
    if old is not None and old.pipeline != op.pipeline:
        msg = f"sweep {op.name} is under pipeline {old.pipeline}"
        return refused(key, CONFLICT, msg, "a Sweep's Pipeline never changes"), []
    refusal = stage_refusal(state, key, op.project, op.pipeline)
    if refusal is not None:
        return refusal, []
    if old is None or op.generation > old.generation:
        state.sweeps[op.name] = Sweep(
            project=op.project,
            max_cost_micros=op.max_cost_micros,
            generation=op.generation,
            pipeline=op.pipeline,
            forgotten_micros=old.forgotten_micros if old else 0,  # its deleted cells' spend stays
        )
    return Result(op_id=key), []


def _put_job(state: State, op: PutJob, key: str) -> _Handled:
    old = state.jobs.get(op.name)
    if old is not None and (old.project, old.sweep, old.pipeline) != (op.project, op.sweep, op.pipeline):
        # Spend already attributed to a project, Sweep and Pipeline must stay there.
        msg = f"job {op.name} belongs to project {old.project}, sweep {old.sweep}, pipeline {old.pipeline}"
        return refused(key, CONFLICT, msg, "a Job's project, Sweep and Pipeline never change"), []
    refusal = stage_refusal(state, key, op.project, op.pipeline, op.sweep)
    if refusal is not None:
        return refusal, []
    if op.sweep is not None:
        sweep = state.sweeps.get(op.sweep)
        if sweep is None or sweep.project != op.project:
            msg = f"sweep {op.sweep} is not known in project {op.project}"
            return refused(key, NOT_FOUND, msg, "put the Sweep before its cells"), []
    if old is not None and op.generation > old.generation:
        # What it ran beyond its holds and what it filed stay: they are its history, not its spec.
        labels, cap, generation = dict(op.labels), op.max_cost_micros, op.generation
        state.jobs[op.name] = msgspec.structs.replace(
            old, labels=labels, max_cost_micros=cap, generation=generation
        )
    elif old is None:
        state.jobs[op.name] = Job(
            project=op.project,
            sweep=op.sweep,
            labels=dict(op.labels),
            max_cost_micros=op.max_cost_micros,
            generation=op.generation,
            pipeline=op.pipeline,
        )
    return Result(op_id=key), []


def _place_hold(state: State, op: PlaceHold, key: str) -> _Handled:
    if op.amount_micros <= 0:
        return refused(key, INVALID, f"hold of {op.amount_micros} µ$", "hold a positive amount"), []
    if op.hold_id in state.holds:
        return refused(key, CONFLICT, f"hold {op.hold_id} exists", "use a new hold id"), []
    job = state.jobs.get(op.job)
    if job is None:
        return refused(key, NOT_FOUND, f"job {op.job} is not known to billing", "put the Job first"), []
    if op.hold_id in job.filed:
        return filed_conflict(op.job, op.hold_id, key), []
    month = month_of(op.at_ms)
    refusal = _does_not_fit(state, key, op.job, job, job.labels, month, op.amount_micros)
    if refusal is not None:
        return refusal, []
    state.holds[op.hold_id] = Hold(
        job=op.job,
        project=job.project,
        month=month,
        funded_until_ms=op.funded_until_ms,
        labels=dict(job.labels),
        reserved_micros=op.amount_micros,
        rate_micros_per_hour=op.rate_micros_per_hour,
        placed_ms=op.at_ms,
    )
    moved = entry(key, available_account(job.project), hold_account(op.hold_id), op.amount_micros)
    return Result(op_id=key), [moved]


def _extend(state: State, op: ExtendHold, key: str) -> _Handled:
    hold, refusal = _open_hold(state, op.hold_id, key)
    if hold is None:
        return refusal, []
    if op.more_micros < 0:
        return refused(key, INVALID, f"extension of {op.more_micros} µ$", "extend by zero or more"), []
    if op.funded_until_ms <= hold.funded_until_ms:
        return Result(op_id=key), []  # funded that far already: a repeat reserves nothing more
    job = state.jobs[hold.job]
    over = _does_not_fit(state, key, hold.job, job, hold.labels, hold.month, op.more_micros)
    if over is not None:
        return over, []
    hold.funded_until_ms = max(hold.funded_until_ms, op.funded_until_ms)
    hold.reserved_micros += op.more_micros
    moved = entry(key, available_account(hold.project), hold_account(op.hold_id), op.more_micros)
    return Result(op_id=key), [moved]


def _charge(state: State, op: Charge, key: str) -> _Handled:
    hold, refusal = _open_hold(state, op.hold_id, key)
    if hold is None:
        return refusal, []
    if not op.tick.isdigit():
        return refused(key, INVALID, f"meter tick {op.tick!r}", "number ticks 1, 2, 3, ... per hold"), []
    if int(op.tick) <= hold.last_tick:
        return Result(op_id=key), []  # this tick (or a later one) was charged: a repeat charges nothing
    hold.last_tick = int(op.tick)
    result, entries = _charge_from(state, op.hold_id, hold, op.amount_micros, key)
    return result, entries


def _capture(state: State, op: Capture, key: str) -> _Handled:
    hold, refusal = _open_hold(state, op.hold_id, key)
    if hold is None:
        return refusal, []
    if op.total_micros is not None and op.total_micros < 0:
        return refused(key, INVALID, f"final charge of {op.total_micros} µ$", "charge zero or more"), []
    if op.total_micros is not None and op.total_micros < hold.charged_micros:
        # The ticks charged more than the run used: the difference goes back into the hold (and from
        # there, with the rest, to the project's credits), so the run costs exactly its final charge.
        back = hold.charged_micros - op.total_micros
        hold.charged_micros = op.total_micros
        result = Result(op_id=key, refunded_micros=back)
        entries = [entry(f"{key}:refund", spend_account(hold.job), hold_account(op.hold_id), back)]
        _record_overrun(state, hold, 0)  # it ran no further than its charge: nothing overran
    else:
        amount = op.amount_micros if op.total_micros is None else op.total_micros - hold.charged_micros
        result, entries = _charge_from(state, op.hold_id, hold, amount, key)
        if not result.ok:
            return result, []
    rest = held(state, op.hold_id) - result.charged_micros + result.refunded_micros
    result.released_micros = rest
    hold.usage = op.usage
    return result, [*entries, _resolve(state, op.hold_id, hold, "Captured", rest)]


def _release(state: State, op: Release, key: str) -> _Handled:
    hold, refusal = _open_hold(state, op.hold_id, key)
    if hold is None:
        return refusal, []
    rest = held(state, op.hold_id)
    return Result(op_id=key, released_micros=rest), [_resolve(state, op.hold_id, hold, "Released", rest)]


def _expire(state: State, op: Expire, key: str) -> _Handled:
    due = [
        h for h, hold in state.holds.items() if hold.status == "Open" and hold.funded_until_ms <= op.now_ms
    ]
    entries = [_resolve(state, h, state.holds[h], "Expired", held(state, h)) for h in due]
    released = sum(e.amount_micros for e in entries)
    return Result(op_id=key, released_micros=released, expired=due), entries


_HANDLERS: Final[Mapping[type[Any], Callable[[State, Any, str], _Handled]]] = {
    Grant: grant,
    Revoke: revoke,
    PutBudget: _put_budget,
    PutPipeline: put_pipeline,
    PutSweep: _put_sweep,
    PutJob: _put_job,
    PlaceHold: _place_hold,
    ExtendHold: _extend,
    Charge: _charge,
    Capture: _capture,
    Release: _release,
    Expire: _expire,
    File: file_holds,
    Forget: forget_job,
}


# --- the rules ---------------------------------------------------------------------------------------


def _does_not_fit(
    state: State, key: str, job_name: str, job: Job, labels: Mapping[str, str], month: str, amount: int
) -> Result | None:
    """Why ``amount`` more for the Job does not fit, checked cap → Sweep cap → Pipeline cap → budgets →
    credits."""
    for cap in caps_over(state, job_name):
        if cap.committed + amount > cap.cap:
            return _over_cap(key, f"{cap.kind.lower()} {cap.name}", cap.cap, cap.committed, amount)
    for name, budget in sorted(state.budgets.items()):
        if budget.project != job.project or not binds(budget) or not matches(budget.selector, labels):
            continue
        used = budget_used(state, budget, month)
        if used + amount > budget.monthly_micros:
            msg = (
                f"budget {name} allows {usd(budget.monthly_micros)} in {month}; {usd(used)} is used or"
                f" held, {usd(amount)} more does not fit"
            )
            return refused(key, BUDGET_EXCEEDED, msg, f"raise budget {name} or wait for next month")
    free = available(state, job.project)
    if amount > free:
        msg = f"project {job.project} has {usd(free)} not held; the hold needs {usd(amount)}"
        fix = f"ask an administrator to grant at least {usd(amount - free)} in credits (nodus credits grant)"
        return refused(key, INSUFFICIENT_CREDITS, msg, fix)
    return None


def _over_cap(key: str, what: str, cap: int, committed: int, amount: int) -> Result:
    msg = (
        f"{what} has maxCostUSD {usd(cap)}; {usd(committed)} is spent or held, {usd(amount)} more exceeds it"
    )
    fix = f"raise maxCostUSD of {what} to at least {usd(committed + amount)}"
    return refused(key, MAX_COST_REACHED, msg, fix)


def _charge_from(state: State, hold_id: str, hold: Hold, amount: int, key: str) -> _Handled:
    """Charge up to what the hold still reserves; usage beyond it is reported and recorded, not charged."""
    if amount < 0:
        return refused(key, INVALID, f"charge of {amount} µ$", "charge zero or more"), []
    charged = min(amount, held(state, hold_id))
    overrun = amount - charged
    hold.charged_micros += charged
    _record_overrun(state, hold, overrun)
    moved = entry(key, hold_account(hold_id), spend_account(hold.job), charged)
    return Result(op_id=key, charged_micros=charged, overrun_micros=overrun), [moved]


def _record_overrun(state: State, hold: Hold, overrun: int) -> None:
    """Keep the Job's unbilled at what its runs used beyond what their holds charged (Nodus absorbs it).
    ``overrun`` is the run's whole usage so far beyond what its hold charged, as each tick and the
    capture ask for it: it replaces the hold's last record (a tick past the funding asks again for what an
    earlier one recorded; an extension may pay for it later; the final charge settles it)."""
    before, hold.overrun_micros = hold.overrun_micros, overrun
    job = own_job(state, hold.job)
    # Saturates: what Nodus absorbed is recorded, never charged, and a book cannot hold more than the bound.
    job.unbilled_micros = min(max(0, job.unbilled_micros + overrun - before), BOOK_MAX_MICROS)


def _resolve(state: State, hold_id: str, hold: Hold, status: HoldStatus, rest: int) -> Entry:
    """Resolve the hold: the one entry id per hold that returns the rest, so it can resolve only once."""
    hold.status = status
    return entry(f"hold:{hold_id}:resolve", hold_account(hold_id), available_account(hold.project), rest)


def _open_hold(state: State, hold_id: str, key: str) -> tuple[Hold, Result] | tuple[None, Result]:
    hold = state.holds.get(hold_id)
    if hold is None:
        filed = filed_refusal(state, hold_id, key)
        return None, filed or refused(key, NOT_FOUND, f"hold {hold_id} is not known", "place the hold first")
    if hold.status != "Open":
        msg = f"hold {hold_id} is already {hold.status.lower()}"
        return None, refused(key, CONFLICT, msg, "place a new hold; a hold resolves once")
    return hold, Result(op_id=key)


def _merge(state: State, hold_id: str, posted: list[Entry]) -> None:
    """Fold a tick's or an extension's entry into the hold's running one (same accounts, summed), so an
    open hold keeps two entries however long it runs. Balances already moved when it was posted."""
    for one in posted:
        into = f"hold:{hold_id}:place" if one.target == hold_account(hold_id) else f"hold:{hold_id}:charged"
        del state.ledger[one.id]
        running = state.ledger.get(into)
        if running is None:
            state.ledger[into] = entry(into, one.source, one.target, one.amount_micros)
        else:
            running.amount_micros += one.amount_micros


def _settle(state: State, hold_id: str) -> None:
    """A resolved hold's entries netted into one (available -> spend, what it charged) and its results
    dropped: the balances are unchanged, and a replay of any of its operations is a Conflict."""
    hold = state.holds[hold_id]
    prefix = f"hold:{hold_id}:"
    for entry_id in [e for e in state.ledger if e.startswith(prefix)]:
        del state.ledger[entry_id]
    for op_key in [k for k in state.results if k.startswith(prefix)]:
        del state.results[op_key]
    if hold.charged_micros:
        net = f"hold:{hold_id}:settled"
        state.ledger[net] = Entry(
            id=net,
            source=available_account(hold.project),
            target=spend_account(hold.job),
            amount_micros=hold.charged_micros,
        )


def _clone(state: State) -> State:
    # A copy keeps apply() pure: the caller's state is never touched, so a crash between apply and the KV
    # write loses nothing. The Job records are shared, not copied: they are most of a book's bytes (one per
    # Job until it is forgotten, issue #23), a commit changes few of them, and the handlers that change one
    # make it the copy's own first (standing.own_job). Everything else is copied whole.
    shell = msgspec.structs.replace(state, jobs={})
    new = msgspec.msgpack.decode(msgspec.msgpack.encode(shell), type=State)
    new.jobs = dict(state.jobs)
    return new
