"""How much a hold reserves: one rule for billing's holds and for the estimate's ``holdUSD`` (ADR-0023).

A hold funds a window of a run ahead of its use (ten minutes by default), never more than is left under
every limit that applies to the run: the object's ``maxCostUSD``, its Sweep's shared cap, the project's
Budgets and its credits not held. A cap is a ceiling, not a deposit: a run whose limits leave less than
the window starts with what is left and is suspended when that is spent. Only when less than one billing
increment at the rate is left can nothing start.

The estimate and billing both call :func:`hold_micros` with billing's window, so the estimate's
``holdUSD`` is the first real hold and ``concurrentHoldUSD`` the real total of the first holds of the slots
that start together (:func:`holds_in_turn`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from nodus_schema.ledger import charge_micros

HOLD_WINDOW_MS: Final = 600_000
"""Billing's funding window (``NODUS_HOLD_WINDOW_S``): how far ahead of use a hold funds a run."""
INCREMENT_MS: Final = 1_000
"""The billing increment: time is charged in whole seconds, once per allocation."""
STOP_MARGIN_MS: Final = 60_000
"""Billing's stop margin (``NODUS_STOP_MARGIN_S``): a run is stopped while its hold still funds this long,
time to checkpoint and tear down."""
MARGIN_SHARE: Final = 5
"""A hold that funds less than five stop margins keeps a fifth of what it funds as its margin instead: a
$0.01 cap on a $2.99/h GPU funds 12 s, and a whole minute's margin would stop it before it started."""
RESUME_INCREMENTS: Final = 10
"""A suspended object resumes once ten increments of its rate fit (or two stop margins, if less): a sliver
of room left under a cap does not start a run again for a second of work."""


def minimum_hold_micros(rate_micros_per_hour: int) -> int:
    """The least hold a run can start with: one billing increment at the rate (``minimumChargeUSD``)."""
    return charge_micros(rate_micros_per_hour, INCREMENT_MS)


def hold_micros(rate_micros_per_hour: int, window_ms: int = HOLD_WINDOW_MS, room: int | None = None) -> int:
    """The hold a run takes at ``rate``: the window's charge, at most ``room`` (what every limit leaves;
    None: unlimited). 0 when less than :func:`minimum_hold_micros` is left: the run cannot start."""
    want = charge_micros(rate_micros_per_hour, window_ms)
    amount = want if room is None else min(want, room)
    return amount if amount >= minimum_hold_micros(rate_micros_per_hour) and amount > 0 else 0


def holds_in_turn(holds: Iterable[int], room: int | None, minimums: Iterable[int] | None = None) -> list[int]:
    """The holds of slots that start together, each placed in turn and sized to what the ones before left:
    the real first holds of ``maxParallel`` slots under one cap. A slot left less than its minimum gets 0
    (it waits, suspended, until room comes back). ``minimums`` defaults to 1 µ$ for every slot."""
    sized: list[int] = []
    left = room
    mins = list(minimums) if minimums is not None else None
    for i, want in enumerate(holds):
        amount = want if left is None else min(want, left)
        least = mins[i] if mins is not None else 1
        amount = amount if amount >= least and amount > 0 else 0
        sized.append(amount)
        if left is not None:
            left -= amount
    return sized


def stop_margin_ms(reserved_micros: int, rate_micros_per_hour: int, margin_ms: int = STOP_MARGIN_MS) -> int:
    """How long before its funding runs out a run is stopped: the stop margin, or a fifth of the time its
    hold funds in all when that is shorter (so a small cap runs most of what it allows)."""
    if rate_micros_per_hour <= 0:
        return margin_ms
    funded_ms = reserved_micros * 3_600_000 // rate_micros_per_hour
    return min(margin_ms, funded_ms // MARGIN_SHARE)


def resume_micros(rate_micros_per_hour: int, margin_ms: int = STOP_MARGIN_MS) -> int:
    """The room a suspended object needs before it runs again (:data:`RESUME_INCREMENTS`)."""
    return min(
        charge_micros(rate_micros_per_hour, 2 * margin_ms),
        charge_micros(rate_micros_per_hour, RESUME_INCREMENTS * INCREMENT_MS),
    )
