"""Credits in a project's book: grants and revokes (pure, no I/O; ``holding.apply`` applies them).

A grant moves credits from ``credits:issued`` (the only account that goes negative) to the project's
available account; a revoke moves them back, never more than no hold reserves. All grants of a book, net
of revokes, stay within ``BOOK_MAX_MICROS`` (``standing``'s bounds).
"""

from __future__ import annotations

from nodus_billing.accounting import CREDITS_ISSUED, Entry, available_account, balance, entry
from nodus_billing.standing import (
    BOOK_MAX_MICROS,
    INSUFFICIENT_CREDITS,
    INVALID,
    Result,
    State,
    available,
    refused,
    usd,
)
from nodus_schema.wire import Wire


class Grant(Wire, tag=True, tag_field="op"):
    grant_id: str
    project: str
    amount_micros: int


class Revoke(Wire, tag=True, tag_field="op"):
    revoke_id: str
    project: str
    amount_micros: int


def granted_total(state: State) -> int:
    """Every credit granted in the book, net of revokes (``credits:issued`` is minus that)."""
    return -balance(state.balances, CREDITS_ISSUED)


def grant(state: State, op: Grant, key: str) -> tuple[Result, list[Entry]]:
    if op.amount_micros <= 0:
        return refused(key, INVALID, f"grant of {op.amount_micros} µ$", "grant a positive amount"), []
    total = granted_total(state)
    if total + op.amount_micros > BOOK_MAX_MICROS:
        msg = (
            f"project {op.project} has {usd(total)} granted; {usd(op.amount_micros)} more passes"
            f" {usd(BOOK_MAX_MICROS)}, the most a billing book holds"
        )
        fix = f"grant at most {usd(max(BOOK_MAX_MICROS - total, 0))}, or revoke credits first"
        return refused(key, INVALID, msg, fix), []
    return Result(op_id=key), [entry(key, CREDITS_ISSUED, available_account(op.project), op.amount_micros)]


def revoke(state: State, op: Revoke, key: str) -> tuple[Result, list[Entry]]:
    if op.amount_micros <= 0:
        return refused(key, INVALID, f"revoke of {op.amount_micros} µ$", "revoke a positive amount"), []
    free = available(state, op.project)
    if op.amount_micros > free:
        # Credits that holds reserve or that were spent are never revoked: that could take a balance below
        # what running work was promised.
        msg = f"project {op.project} has {usd(free)} not held; cannot revoke {usd(op.amount_micros)}"
        return refused(
            key, INSUFFICIENT_CREDITS, msg, f"revoke at most {usd(free)}, or release holds first"
        ), []
    return Result(op_id=key), [entry(key, available_account(op.project), CREDITS_ISSUED, op.amount_micros)]
