"""Billing's half of an estimate (ADR-031): what the scheduler's plan costs, what must be held, the caps.

Served on ``nodus.rpc.billing.quote`` (queue group ``billing``). The request carries the scheduler's reply
(rates, durations, startup bands per slot), so billing prices it without the catalog and stays the only
service that turns time into money. The arithmetic is :func:`nodus_schema.estimating.price`.

Caps: a create fails when its first hold cannot fit under maxCostUSD (blocking MaxCostReached, with the
amounts and a fix); a cap the run will probably reach is only a warning, because reaching it suspends the
object (nothing is lost) rather than refusing the create.

Balances: with the books at hand (the billing service always passes them) the first hold must also fit
the project's credits not held (InsufficientCredits) and every project-wide Budget this month
(BudgetExceeded); each is a blocking reason with the amounts and a fix, so a create that cannot be funded
is refused. Without the books (a bare quote in tests) the quote says BalanceNotChecked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.standing import (
    BUDGET_EXCEEDED,
    INSUFFICIENT_CREDITS,
    State,
    available,
    binds,
    budget_used,
    month_of,
)
from nodus_kit import errors, messaging
from nodus_schema.costs import BlockingReason, Estimate, EstimateWarning
from nodus_schema.estimating import (
    DEFAULT_MAX_PARALLEL,
    QUOTE_SUBJECT,
    EstimateReply,
    Money,
    QuoteRequest,
    SlotPlan,
    apply_money,
    price,
)
from nodus_schema.quantities import micros_to_usd, usd_to_micros

log = logging.getLogger(__name__)

QUEUE = "billing"

BALANCE_NOT_CHECKED = EstimateWarning(
    code="BalanceNotChecked",
    message="account balances and Budgets are not checked by estimates yet; holdUSD must fit your balance "
    "when the object is created",
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


def cap_blocking(cap: int, hold: int, field: str, what: str) -> BlockingReason | None:
    """MaxCostReached when the first hold does not fit under the cap: the create would be refused."""
    if cap >= hold:
        return None
    return BlockingReason(
        code="MaxCostReached",
        message=f"{field} {_usd(cap)} is below the first hold {_usd(hold)} of {what}: "
        "not even one slot could start",
        fix=f"Raise {field} to at least {_usd(hold)}, or lower the hold: a shorter spec.expectedDuration "
        "(the hold is the p90 cost of one slot, at most one hour of it) or cheaper capacity.",
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
    if money.hold <= cap < money.concurrent_hold:
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


def _cell_caps(slots: list[SlotPlan]) -> list[BlockingReason]:
    """A Sweep's template cap applies to every cell Job alone: each cell's first hold must fit it."""
    out: list[BlockingReason] = []
    for slot in slots:
        cap = _cap_micros(slot.max_cost_usd, "spec.template.spec.maxCostUSD")
        alone = price([slot]) if cap is not None else None
        if cap is not None and alone is not None:
            what = f"cells {slot.label} (from cell {slot.first_cell})"
            reason = cap_blocking(cap, alone.hold, "spec.template.spec.maxCostUSD", what)
            if reason is not None:
                out.append(reason)
    return out


def quote(request: QuoteRequest, state: State | None = None) -> EstimateReply:
    """The priced estimate: the scheduler's estimate plus amounts, cap reasons and warnings."""
    scheduled, asked = request.scheduled, request.request
    sweep = asked.sweep_spec if asked.kind == "Sweep" else None
    max_parallel = (sweep.max_parallel or DEFAULT_MAX_PARALLEL) if sweep is not None else None
    money = price(scheduled.slots, max_parallel=max_parallel)
    estimate: Estimate = scheduled.estimate
    blocking, warnings = list(estimate.blocking_reasons), list(estimate.warnings)
    if money is not None:  # None: nothing matched the price book, and the scheduler's reasons say so
        estimate = apply_money(estimate, money)
        if sweep is not None:
            cap_text, what = sweep.max_cost_usd, "the Sweep's largest cell slot"
            blocking += _cell_caps(scheduled.slots)
        else:
            cap_text, what = (asked.job_spec.max_cost_usd if asked.job_spec else None), "one index"
        cap = _cap_micros(cap_text, "spec.maxCostUSD")
        if cap is not None:
            reason = cap_blocking(cap, money.hold, "spec.maxCostUSD", what)
            if reason is not None:
                blocking.append(reason)
            else:
                warnings += cap_warnings(cap, money, "spec.maxCostUSD")
    if state is None:
        warnings.append(BALANCE_NOT_CHECKED)
    elif money is not None:
        blocking += balance_blocking(state, asked.namespace, money.hold)
    estimate = msgspec.structs.replace(estimate, blocking_reasons=blocking, warnings=warnings)
    return EstimateReply(estimate=estimate, slots=scheduled.slots)


def balance_blocking(state: State, project: str, hold: int) -> list[BlockingReason]:
    """InsufficientCredits / BudgetExceeded when the first hold does not fit the project's books."""
    out: list[BlockingReason] = []
    free = available(state, project)
    if hold > free:
        out.append(
            BlockingReason(
                code=INSUFFICIENT_CREDITS,
                message=f"project {project} has {_dollars(free)} of credits not held; "
                f"the first hold is {_dollars(hold)}",
                fix=f"Ask an administrator to grant project {project} at least {_dollars(hold - free)} "
                "(nodus credits grant), or wait for running work to release its holds.",
            )
        )
    month = month_of(int(time.time() * 1000))
    for name, budget in sorted(state.budgets.items()):
        if budget.project != project or budget.selector or not binds(budget):
            continue  # a selector's Budget applies by labels, which a quote does not see; holds check it
        used = budget_used(state, budget, month)
        if used + hold > budget.monthly_micros:
            out.append(
                BlockingReason(
                    code=BUDGET_EXCEEDED,
                    message=f"Budget {name.rsplit('@', 1)[0]} allows {_dollars(budget.monthly_micros)} "
                    f"in {month}; "
                    f"{_dollars(used)} is used or held and the first hold is {_dollars(hold)}",
                    fix=f"Raise spec.monthlyUSD of Budget {name.rsplit('@', 1)[0]} to at least "
                    f"{_dollars(used + hold)}, or wait for next month.",
                )
            )
    return out


def _dollars(micros: int) -> str:
    return f"${micros_to_usd(micros)}"


def _handler(books: Books | None) -> Callable[[QuoteRequest], Awaitable[EstimateReply]]:
    async def handle(request: QuoteRequest) -> EstimateReply:
        project = request.request.namespace
        try:
            state = await books.read(project) if books is not None else None
        except errors.NodusError:
            raise
        except Exception:  # a sentence for the estimate, never a Python error's text (logged here)
            log.exception("billing could not read the books for a quote", extra={"project": project})
            raise errors.Unavailable(
                f"billing could not read the books of project {project} for the estimate just now; retry"
            ) from None
        try:
            return quote(request, state)
        except ValueError as e:  # a duration in the plan that does not parse: the caller's to fix
            raise errors.Invalid(str(e)) from None

    return handle


async def serve_quotes(nc: NATS, *, subject: str = QUOTE_SUBJECT, books: Books | None = None) -> Any:
    """Serve ``nodus.rpc.billing.quote`` in queue group ``billing``; returns the subscription."""
    return await messaging.serve(nc, subject, QuoteRequest, _handler(books), queue=QUEUE)
