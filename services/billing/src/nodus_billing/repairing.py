"""Repair on read: a stored book that holds what a book cannot hold is mended, not left to fail forever.

Before the bounds of ``standing`` (``BOOK_MAX_MICROS``), an operation could write an integer beyond 64
bits into a book: the KV value is JSON, which takes any integer, but every later ``apply`` copies the
state through msgpack, which does not (``OverflowError``). A Job admitted with ``maxCostUSD:
"99999999999999"`` (10^20 µ$) did it: billing put the Job, with its cap, into the project's book, the
write succeeded, and from then on every hold, grant and meter tick of the project failed. Deleting the Job
did not help (a book keeps its Jobs' records), and neither did restarting billing (the book is in KV).

:func:`repair` mends such a book, deterministically, so every replica mends it the same way:

* a Job's or Sweep's ``maxCostMicros`` beyond the bound becomes no cap (nothing a book holds can reach
  it), a negative one beyond it zero;
* every other integer beyond ``±BOOK_MAX_MICROS`` (a Budget, an unbilled amount, a hold's amounts, a
  ledger entry, a remembered result, a run's usage) is clamped to the bound;
* the balances are folded again from the (repaired) ledger, so ``balances == fold(ledger)`` holds.

Each change is recorded in the book (``State.repairs``, with what the value was, as text); the books log
it, count it and publish an event when they write the repaired book (``books.Books``). A book that only
holds integers msgpack can encode is returned as it is: the check costs one encode.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nodus_billing.accounting import fold
from nodus_billing.standing import BOOK_MAX_MICROS, MAX_REPAIRS, Repair, State

CAP_FIELDS: Final = frozenset({"maxCostMicros"})
"""Caps: beyond the bound they are no cap, rather than a cap at the bound (which could bind first)."""
_SKIPPED: Final = frozenset({"balances", "repairs"})
"""Balances are folded again from the ledger; repairs are this module's own record."""


class BookUnrepairable(Exception):
    """A book that still cannot be encoded after its repair (nothing this module knows how to mend)."""


def encodable(state: State) -> bool:
    """Whether every integer of the state fits msgpack's 64 bits (what ``holding.apply`` copies through)."""
    try:
        msgspec.msgpack.encode(state)
    except OverflowError:
        return False
    return True


def repair(state: State, at_ms: int) -> tuple[State, list[Repair]]:
    """The state mended (see the module) and what was changed; the same state and ``[]`` when nothing
    needed it. Pure and deterministic: the same stored book is repaired the same way by every replica."""
    if encodable(state):
        return state, []
    tree = msgspec.to_builtins(state)  # JSON-like: integers of any size survive, as they did in KV
    repairs: list[Repair] = []
    for section, value in tree.items():
        if section not in _SKIPPED:
            tree[section] = _walk(value, section, section, repairs, at_ms)
    mended = msgspec.convert(tree, State)
    balances = fold(mended.ledger.values())
    for account in sorted(set(balances) | set(mended.balances)):
        was, now = mended.balances.get(account, 0), balances.get(account, 0)
        if was != now:
            repairs.append(Repair(at_ms=at_ms, path=f"balances.{account}", was=str(was), now=str(now)))
    mended.balances = balances
    mended.repairs = [*mended.repairs, *repairs][-MAX_REPAIRS:]
    if not encodable(mended):
        raise BookUnrepairable(f"the book still holds integers beyond 64 bits after {len(repairs)} repairs")
    return mended, repairs


def _walk(node: Any, path: str, key: str, repairs: list[Repair], at_ms: int) -> Any:
    if isinstance(node, dict):
        return {k: _walk(v, f"{path}.{k}", k, repairs, at_ms) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, f"{path}[{i}]", key, repairs, at_ms) for i, v in enumerate(node)]
    if isinstance(node, bool) or not isinstance(node, int) or -BOOK_MAX_MICROS <= node <= BOOK_MAX_MICROS:
        return node
    now: int | None
    if key in CAP_FIELDS:
        now = None if node > 0 else 0
    else:
        now = BOOK_MAX_MICROS if node > 0 else -BOOK_MAX_MICROS
    repairs.append(Repair(at_ms=at_ms, path=path, was=str(node), now=None if now is None else str(now)))
    return now
