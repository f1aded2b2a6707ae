"""Billing's half of an estimate (ADR-031): what the scheduler's plan costs, what must be held, the caps.

Served on ``nodus.rpc.billing.quote`` (queue group ``billing``). The request carries the scheduler's reply
(rates, durations, startup bands per slot), so billing prices it without the catalog and stays the only
service that turns time into money. The arithmetic is :func:`nodus_schema.estimating.price`.

Holds (ADR-0023, nodus_schema.holds): the first hold of a slot is billing's funding window at the rate,
sized to what every limit leaves (the cap, the Sweep's cap, the credits not held, Budgets), so holdUSD and
concurrentHoldUSD are the holds billing will place. A cap is a ceiling, not a deposit: a create is refused
(blocking MaxCostReached, InsufficientCredits or BudgetExceeded, with the amounts and a fix) only when not
even one billing increment at the rate fits; a cap, balance or Budget below a full first hold is a
warning (the run starts with what is left and is suspended when it is spent), and so is a cap the run
will probably reach. Without the books (a bare quote in tests) the quote says BalanceNotChecked.

A Pipeline's stage (issue #22) is quoted as the Job or Sweep it creates; when the request names its
Pipeline (``QuoteRequest.pipeline``, optional), the first holds are sized under what the Pipeline's cap
leaves as well (less what its stages spent and hold, read from the book by the Pipeline's uid), as billing
sizes them, and a stage that cannot start under it is blocked with MaxCostReached (:func:`under_pipeline`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.books import BUCKET as BOOKS_BUCKET
from nodus_billing.books import Books
from nodus_billing.repairing import encodable
from nodus_billing.standing import (
    BUDGET_EXCEEDED,
    INSUFFICIENT_CREDITS,
    MAX_COST_REACHED,
    Budget,
    Hold,
    State,
    available,
    binds,
    budget_used,
    month_of,
    pipeline_held,
    pipeline_spent,
)
from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_schema.costs import BlockingReason, Estimate, EstimateWarning
from nodus_schema.estimating import (
    DEFAULT_MAX_PARALLEL,
    QUOTE_SUBJECT,
    EstimateReply,
    Money,
    PipelineCap,
    QuoteRequest,
    SlotPlan,
    apply_money,
    capped,
    capped_each,
    price,
)
from nodus_schema.holds import HOLD_WINDOW_MS
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.wire import Wire

log = logging.getLogger(__name__)

QUEUE = "billing"
CONCURRENCY = 64
"""Quotes handled at once (``messaging.serve``): a burst's quotes wait for one shared read together."""

BALANCE_NOT_CHECKED = EstimateWarning(
    code="BalanceNotChecked",
    message="account balances and Budgets were not checked by this estimate; when the object is created, its "
    "first hold is sized to the credits and Budgets left, and it must be at least minimumChargeUSD",
)


def _cap_micros(text: str | None, field: str) -> int | None:
    if not text:
        return None
    try:
        return usd_to_micros(text)
    except ValueError as e:
        raise errors.Invalid(f"{field}: {e}") from None


def _usd(micros: int) -> str:
    return micros_to_usd(micros)


def cap_blocking(cap: int, least: int, field: str, what: str) -> BlockingReason | None:
    """MaxCostReached when not even the least a run can start with fits under the cap (one billing
    increment at the rate, on every node of a slot): the create would be refused. Any cap at or above it
    runs: its first hold is sized to the cap, and the object is suspended when that is spent (ADR-0023)."""
    if cap >= least:
        return None
    return BlockingReason(
        code="MaxCostReached",
        message=f"{field} {_usd(cap)} is below the minimum charge {_usd(least)} of {what} (one billing "
        "increment at its rate): not even one slot could start",
        fix=f"Raise {field} to at least {_usd(least)}; any cap from there runs until it is spent, then "
        "suspends the object with MaxCostReached.",
    )


def cap_warnings(cap: int, money: Money, field: str) -> list[EstimateWarning]:
    """Warnings for a cap the first hold fits under, but the run or its parallelism may not."""
    out: list[EstimateWarning] = []
    if cap < money.cost_p50:
        likely = f"is likely to be reached (p50 cost {_usd(money.cost_p50)})"
    elif cap < money.cost_p90:
        likely = f"may be reached (p90 cost {_usd(money.cost_p90)})"
    else:
        likely = ""
    if likely:
        out.append(
            EstimateWarning(
                code="MaxCostBelowEstimate",
                message=f"{field} {_usd(cap)} {likely}; reaching it suspends the object with MaxCostReached",
            )
        )
    if cap < money.hold:
        out.append(
            EstimateWarning(
                code="MaxCostLimitsHold",
                message=f"{field} {_usd(cap)} is below a full first hold {_usd(money.hold)} (the funding "
                f"window at the rate): the first hold is {_usd(cap)}, and the object is suspended with "
                "MaxCostReached when it is spent",
            )
        )
    elif cap < money.concurrent_hold:
        out.append(
            EstimateWarning(
                code="MaxCostLimitsParallelism",
                message=f"{field} {_usd(cap)} is below the concurrent hold {_usd(money.concurrent_hold)}: "
                "fewer slots than requested can be funded at once",
            )
        )
    if money.assembly_bound is not None and money.hold <= cap < money.assembly_bound:
        out.append(
            EstimateWarning(
                code="MaxCostBelowAssemblyBound",
                message=f"{field} {_usd(cap)} is below the assembly bound {_usd(money.assembly_bound)}: "
                "gangs that keep failing to assemble may reach it before the Job fails",
            )
        )
    return out


def _cell_caps(slots: list[SlotPlan], window_ms: int) -> list[BlockingReason]:
    """A Sweep's template cap applies to every cell Job alone: each cell must be able to start under it."""
    out: list[BlockingReason] = []
    for slot in slots:
        cap = _cap_micros(slot.max_cost_usd, "spec.template.spec.maxCostUSD")
        alone = price([slot], window_ms=window_ms) if cap is not None else None
        if cap is not None and alone is not None:
            what = f"cells {slot.label} (from cell {slot.first_cell})"
            reason = cap_blocking(cap, alone.least, "spec.template.spec.maxCostUSD", what)
            if reason is not None:
                out.append(reason)
    return out


def _template_cap(slots: list[SlotPlan]) -> int | None:
    """The Sweep template's maxCostUSD (the same on every slot): each cell's own cap."""
    caps = {_cap_micros(s.max_cost_usd, "spec.template.spec.maxCostUSD") for s in slots}
    return min((c for c in caps if c is not None), default=None)


def quote(
    request: QuoteRequest, state: State | None = None, window_ms: int = HOLD_WINDOW_MS
) -> EstimateReply:
    """The priced estimate: the scheduler's estimate plus amounts, cap reasons and warnings. ``window_ms`` is
    billing's funding window, so the estimate's holds are the ones billing places (nodus_schema.holds)."""
    scheduled, asked = request.scheduled, request.request
    sweep = asked.sweep_spec if asked.kind == "Sweep" else None
    max_parallel = (sweep.max_parallel or DEFAULT_MAX_PARALLEL) if sweep is not None else None
    money = price(scheduled.slots, max_parallel=max_parallel, window_ms=window_ms)
    estimate: Estimate = scheduled.estimate
    blocking, warnings = list(estimate.blocking_reasons), list(estimate.warnings)
    if money is not None:  # None: nothing matched the price book, and the scheduler's reasons say so
        if sweep is not None:
            cap_text, what = sweep.max_cost_usd, "the Sweep's largest cell slot"
            blocking += _cell_caps(scheduled.slots, window_ms)
            money = capped_each(money, _template_cap(scheduled.slots))
        else:
            cap_text, what = (asked.job_spec.max_cost_usd if asked.job_spec else None), "one index"
        cap = _cap_micros(cap_text, "spec.maxCostUSD")
        if cap is not None:
            reason = cap_blocking(cap, money.least, "spec.maxCostUSD", what)
            if reason is not None:
                blocking.append(reason)
            else:
                warnings += cap_warnings(cap, money, "spec.maxCostUSD")
                money = capped(money, cap)
        if request.pipeline is not None:
            money, found = under_pipeline(request.pipeline, state, money, what)
            blocking += [r for r in found if isinstance(r, BlockingReason)]
            warnings += [w for w in found if isinstance(w, EstimateWarning)]
    if state is None:
        warnings.append(BALANCE_NOT_CHECKED)
    elif money is not None:
        found = balance_blocking(state, asked.namespace, money)
        blocking += [r for r in found if isinstance(r, BlockingReason)]
        warnings += [w for w in found if isinstance(w, EstimateWarning)]
        # The credits and project-wide Budgets left bound the first holds as the cap does.
        money = capped(money, books_room(state, asked.namespace))
    if money is not None:
        estimate = apply_money(estimate, money)
    estimate = msgspec.structs.replace(estimate, blocking_reasons=blocking, warnings=warnings)
    return EstimateReply(estimate=estimate, slots=scheduled.slots)


def under_pipeline(
    pipeline: PipelineCap, state: State | None, money: Money, what: str
) -> tuple[Money, list[BlockingReason | EstimateWarning]]:
    """The first holds of a Pipeline's stage under what the Pipeline's cap leaves (its cap less what its
    stages spent and hold in the book), as billing's ``room_for`` sizes them: MaxCostReached when not even
    the least a slot starts with fits; the hold warnings of a cap otherwise (the cap's MaxCostBelowEstimate
    is the Pipeline's estimate's to give, over every stage's cost)."""
    field = f"spec.maxCostUSD of pipeline {pipeline.name}"
    cap = _cap_micros(pipeline.max_cost_usd, field)
    if cap is None:
        return money, []
    ref = f"{pipeline.name}@{pipeline.uid}" if pipeline.uid else None
    committed = pipeline_spent(state, ref) + pipeline_held(state, ref) if state is not None and ref else 0
    room = max(cap - committed, 0)
    if room < money.least:
        reason = BlockingReason(
            code=MAX_COST_REACHED,
            message=f"{field} ({_usd(cap)}, of which {_usd(committed)} is spent or held by its stages) "
            f"leaves {_usd(room)}, below the minimum charge {_usd(money.least)} of {what} (one billing "
            "increment at its rate): not even one slot could start",
            fix=f"Raise {field} to at least {_usd(committed + money.least)}; any cap from there runs "
            "until it is spent, then suspends the stages with MaxCostReached.",
        )
        return money, [reason]
    named = field if not committed else f"what {field} leaves"
    notes = [w for w in cap_warnings(room, money, named) if w.code != "MaxCostBelowEstimate"]
    return capped(money, room), list(notes)


def balance_blocking(state: State, project: str, money: Money) -> list[BlockingReason | EstimateWarning]:
    """InsufficientCredits / BudgetExceeded when not even the least a slot starts with fits the project's
    books; a warning when the first hold is larger than they leave (the hold is sized to what is left, and
    the object is suspended when it is spent)."""
    out: list[BlockingReason | EstimateWarning] = []
    hold, least = money.hold, money.least
    free = available(state, project)
    if least > free:
        out.append(
            BlockingReason(
                code=INSUFFICIENT_CREDITS,
                message=f"project {project} has {_dollars(free)} of credits not held; "
                f"the least a run can start with is {_dollars(least)}",
                fix=f"Ask an administrator to grant project {project} at least {_dollars(least - free)} "
                "(nodus credits grant), or wait for running work to release its holds.",
            )
        )
    elif hold > free:
        out.append(
            EstimateWarning(
                code="CreditsLimitHold",
                message=f"project {project} has {_dollars(free)} of credits not held, less than the first "
                f"hold {_dollars(hold)}: the run starts with what is left and is suspended with "
                "InsufficientCredits when it is spent",
            )
        )
    month = month_of(int(time.time() * 1000))
    for name, budget in sorted(state.budgets.items()):
        if budget.project != project or budget.selector or not binds(budget):
            continue  # a selector's Budget applies by labels, which a quote does not see; holds check it
        used = budget_used(state, budget, month)
        short = name.rsplit("@", 1)[0]
        if used + least > budget.monthly_micros:
            out.append(
                BlockingReason(
                    code=BUDGET_EXCEEDED,
                    message=f"Budget {short} allows {_dollars(budget.monthly_micros)} in {month}; "
                    f"{_dollars(used)} is used or held and the least a run can start with is "
                    f"{_dollars(least)}",
                    fix=f"Raise spec.monthlyUSD of Budget {short} to at least {_dollars(used + least)}, "
                    "or wait for next month.",
                )
            )
        elif used + hold > budget.monthly_micros:
            out.append(
                EstimateWarning(
                    code="BudgetLimitsHold",
                    message=f"Budget {short} leaves {_dollars(budget.monthly_micros - used)} in {month}, "
                    f"less than the first hold {_dollars(hold)}: the run starts with what is left and is "
                    "suspended with BudgetExceeded when it is spent",
                )
            )
    return out


def books_room(state: State, project: str) -> int:
    """What the project's books leave for new holds now: its credits not held, and what every project-wide
    Budget leaves this month (a selector's Budget binds by labels, which a quote does not see)."""
    room = available(state, project)
    month = month_of(int(time.time() * 1000))
    for budget in state.budgets.values():
        if budget.project == project and not budget.selector and binds(budget):
            room = min(room, budget.monthly_micros - budget_used(state, budget, month))
    return max(room, 0)


def _dollars(micros: int) -> str:
    return f"${micros_to_usd(micros)}"


class _Glance(Wire):
    """What a quote reads of a project's book (:func:`quote`, without a Pipeline): its balances, Budgets
    and holds. Not its ledger, the result of every operation applied, nor the Jobs and Sweeps it records:
    the bulk of a book, and what grows with every Job metered, which a full read decodes (and copies
    through msgpack to check) on every quote."""

    budgets: dict[str, Budget] = msgspec.field(default_factory=dict)
    holds: dict[str, Hold] = msgspec.field(default_factory=dict)
    balances: dict[str, int] = msgspec.field(default_factory=dict)
    filed: dict[str, int] = msgspec.field(default_factory=dict)
    """What the book's filed runs charged by month (``filing``): project-wide Budgets count it."""


class _GlanceBook(Wire):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    state: _Glance = msgspec.field(default_factory=_Glance)


class QuoteReads:
    """Reads of projects' books for quotes: only what a quote reads, and shared by the quotes that wait
    together.

    A burst of creates (50 clients) brings a burst of quotes for one project. One read per project runs at
    a time; the quotes that arrive while it runs wait for the next one, which starts when it ends and
    answers all of them. Each quote is so answered from a read that started after it arrived (it sees
    every write acknowledged before it asked, as a read of its own would), and a burst of n quotes costs
    two reads, not n.

    A read decodes the balances, Budgets and holds only (:class:`_Glance`). A project without a book yet
    is quoted on its starting credits (:meth:`Books.opening`, no second read). A quote for a Pipeline's
    stage (it reads the Jobs and Pipelines too) and a glance whose amounts need repair (``repairing``)
    read the whole book through :meth:`Books.read`, as before, which repairs it and writes it back."""

    def __init__(self, books: Books) -> None:
        self.books = books
        self.glances = ObjectStore(books.nc, BOOKS_BUCKET, _GlanceBook)
        self._next: dict[str, asyncio.Future[State]] = {}
        """Per project, the read the quotes arriving now will share (not started yet)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self.reads = 0
        """Book reads done (tests/billing/test_quote_reads.py reads it)."""

    async def read(self, project: str, *, whole: bool = False) -> State:
        """What a quote reads of ``project``'s book; ``whole``: all of it (a Pipeline's stage)."""
        if whole:
            return await self.books.read(project)
        waiting = self._next.get(project)
        if waiting is not None:
            return await asyncio.shield(waiting)
        mine: asyncio.Future[State] = asyncio.get_running_loop().create_future()
        self._next[project] = mine
        lock = self._locks.setdefault(project, asyncio.Lock())
        try:
            async with lock:  # the read in flight, if any, ends first
                if self._next.get(project) is mine:
                    del self._next[project]  # from here, new arrivals wait for the read after this one
                self.reads += 1
                state = await self._glance(project)
        except BaseException as e:
            if self._next.get(project) is mine:
                del self._next[project]
            if not mine.done():
                mine.set_exception(e if isinstance(e, Exception) else errors.Unavailable("billing stopped"))
                mine.exception()  # retrieved: nobody else may be waiting for it
            raise
        finally:
            if not lock.locked() and project not in self._next:
                self._locks.pop(project, None)
        mine.set_result(state)
        return state

    async def _glance(self, project: str) -> State:
        try:
            book = await self.glances.get(None, project)
        except errors.NotFound:
            return self.books.opening(project)  # no book yet: the starting credits it opens with
        g = book.state
        state = State(budgets=g.budgets, holds=g.holds, balances=g.balances, filed=g.filed)
        return state if encodable(state) else await self.books.read(project)


def _handler(books: Books | None, window_ms: int) -> Callable[[QuoteRequest], Awaitable[EstimateReply]]:
    reads = QuoteReads(books) if books is not None else None

    async def handle(request: QuoteRequest) -> EstimateReply:
        project = request.request.namespace
        try:
            whole = request.pipeline is not None
            state = await reads.read(project, whole=whole) if reads is not None else None
        except errors.NodusError:
            raise
        except Exception:  # a sentence for the estimate, never a Python error's text (logged here)
            log.exception("billing could not read the books for a quote", extra={"project": project})
            raise errors.Unavailable(
                f"billing could not read the books of project {project} for the estimate just now; retry"
            ) from None
        try:
            return quote(request, state, window_ms)
        except ValueError as e:  # a duration in the plan that does not parse: the caller's to fix
            raise errors.Invalid(str(e)) from None

    return handle


async def serve_quotes(
    nc: NATS, *, subject: str = QUOTE_SUBJECT, books: Books | None = None, window_ms: int = HOLD_WINDOW_MS
) -> Any:
    """Serve ``nodus.rpc.billing.quote`` in queue group ``billing``; returns the subscription. Up to
    :data:`CONCURRENCY` quotes are handled at once, so those of a burst share their book's read
    (:class:`QuoteReads`) instead of waiting for one read each, one after another."""
    handler = _handler(books, window_ms)
    return await messaging.serve(nc, subject, QuoteRequest, handler, queue=QUEUE, concurrency=CONCURRENCY)
