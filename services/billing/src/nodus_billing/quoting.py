"""Billing's half of an estimate (ADR-031): what the scheduler's plan costs, what must be held, the caps.

Served on ``nodus.rpc.billing.quote`` (queue group ``billing``). The request carries the scheduler's reply
(rates, durations, startup bands per slot), so billing prices it without the catalog and stays the only
service that turns time into money. The arithmetic is :func:`nodus_schema.estimating.price`.

Caps: a create fails when its first hold cannot fit under maxCostUSD (blocking MaxCostReached, with the
amounts and a fix); a cap the run will probably reach is only a warning, because reaching it suspends the
object (nothing is lost) rather than refusing the create.

Balances are not checked: accounts, holds and budgets come with the billing issue (#7), and until then no
estimate can say InsufficientCredits. Every quote carries the BalanceNotChecked warning so that a caller
never reads the absence of that blocking reason as "my balance covers it".
"""

from __future__ import annotations

from typing import Any

import msgspec
from nats.aio.client import Client as NATS

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


def quote(request: QuoteRequest) -> EstimateReply:
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
    warnings.append(BALANCE_NOT_CHECKED)
    estimate = msgspec.structs.replace(estimate, blocking_reasons=blocking, warnings=warnings)
    return EstimateReply(estimate=estimate, slots=scheduled.slots)


async def _handle(request: QuoteRequest) -> EstimateReply:
    try:
        return quote(request)
    except ValueError as e:  # a duration in the plan that does not parse: the caller's to fix
        raise errors.Invalid(str(e)) from None


async def serve_quotes(nc: NATS, *, subject: str = QUOTE_SUBJECT) -> Any:
    """Serve ``nodus.rpc.billing.quote`` in queue group ``billing``; returns the subscription."""
    return await messaging.serve(nc, subject, QuoteRequest, _handle, queue=QUEUE)
