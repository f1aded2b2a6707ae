"""The double-entry ledger under holds and caps: entries that move micro-dollars between ledger accounts.

Every entry moves a non-negative amount from one ledger account to another, so the sum of all balances
is always zero and every balance can be re-derived by folding the entries (:func:`fold`). Each entry's id
is derived from the operation that made it (``hold:<id>:place``), and posting an id that is already in
the ledger does nothing: a message replayed any number of times changes nothing (ADR-0023).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodus_schema.wire import Wire

CREDITS_ISSUED = "credits:issued"
"""Where granted credits come from (and revoked ones go back to): the only account that goes negative."""


def available_account(project: str) -> str:
    """The ledger account of a project's credits that no hold has reserved."""
    return f"project:{project}:available"


def hold_account(hold_id: str) -> str:
    """The ledger account of one hold: what it still reserves."""
    return f"hold:{hold_id}"


def spend_account(job: str) -> str:
    """The ledger account of what a Job has been charged."""
    return f"spend:{job}"


class Entry(Wire):
    """One ledger entry: ``amount_micros`` moved from ``source`` to ``target``."""

    id: str
    source: str
    target: str
    amount_micros: int


def entry(entry_id: str, source: str, target: str, amount: int) -> Entry:
    """An entry moving ``amount`` µ$ from ``source`` to ``target``."""
    return Entry(id=entry_id, source=source, target=target, amount_micros=amount)


def fold(entries: Iterable[Entry]) -> dict[str, int]:
    """Every ledger account's balance from the entries alone (accounts at zero are left out)."""
    balances: dict[str, int] = {}
    for entry in entries:
        _move(balances, entry)
    return {account: amount for account, amount in balances.items() if amount}


def post(ledger: dict[str, Entry], balances: dict[str, int], entries: Iterable[Entry]) -> list[Entry]:
    """Append the entries whose id is new to ``ledger`` and ``balances`` (in place); return those posted.

    An id already in the ledger is skipped, which is what makes a replayed operation change nothing.
    """
    posted: list[Entry] = []
    for entry in entries:
        if entry.amount_micros < 0:
            raise ValueError(f"ledger entry {entry.id} moves a negative amount ({entry.amount_micros})")
        if entry.id in ledger:
            continue
        ledger[entry.id] = entry
        _move(balances, entry)
        posted.append(entry)
    return posted


def retract(ledger: dict[str, Entry], balances: dict[str, int], entry_id: str) -> Entry | None:
    """Take an entry out of ``ledger`` and its move out of ``balances`` (in place); the entry, or None.
    Only for entries whose move is posted again in another form at the same time (a running entry's new
    total, a filed run's move into its project's filed account), so the ledger keeps folding to the
    balances."""
    entry = ledger.pop(entry_id, None)
    if entry is not None:
        _move(
            balances,
            Entry(id=entry.id, source=entry.target, target=entry.source, amount_micros=entry.amount_micros),
        )
    return entry


def accrue(ledger: dict[str, Entry], balances: dict[str, int], entry: Entry) -> None:
    """Add ``entry``'s amount to the running entry of its id (the same accounts), or post it as the first."""
    running = retract(ledger, balances, entry.id)
    amount = entry.amount_micros + (running.amount_micros if running is not None else 0)
    post(
        ledger, balances, [Entry(id=entry.id, source=entry.source, target=entry.target, amount_micros=amount)]
    )


def balance(balances: Mapping[str, int], account: str) -> int:
    """One ledger account's balance (zero for an account no entry has touched)."""
    return balances.get(account, 0)


def _move(balances: dict[str, int], entry: Entry) -> None:
    balances[entry.source] = balances.get(entry.source, 0) - entry.amount_micros
    balances[entry.target] = balances.get(entry.target, 0) + entry.amount_micros
    # Zero balances are dropped so the kept balances and a fresh fold compare equal.
    for account in (entry.source, entry.target):
        if balances[account] == 0:
            del balances[account]
