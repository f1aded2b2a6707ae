"""Billing's own settings: every ``NODUS_*`` variable it reads, read once in ``start()``
(:func:`nodus_kit.configuring.read_settings`); a bad one stops it before it serves, naming the variable.

The periods are seconds here, as operators write them; the meter works in milliseconds
(:class:`nodus_billing.metering.Terms`)."""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta

from nodus_kit.configuring import Env
from nodus_kit.leasing import LeaderSettings
from nodus_schema.holds import HOLD_WINDOW_MS, STOP_MARGIN_MS
from nodus_schema.quantities import usd_to_micros

__all__ = ["METER_TICK_MS", "ORPHAN_HOLD_MS", "BillingSettings"]

METER_TICK_MS: Final = 30_000
ORPHAN_HOLD_MS: Final = 120_000

Period = Annotated[float, Meta(gt=0)]
Margin = Annotated[float, Meta(ge=0)]


class BillingSettings(LeaderSettings, frozen=True, kw_only=True):
    """The lease TTL and resync period (:class:`~nodus_kit.leasing.LeaderSettings`), and billing's."""

    # A decimal string made exact micro-dollars, never a float (nodus_schema.quantities).
    starting_micros: Annotated[int, Env("NODUS_STARTING_CREDITS_USD", parse=usd_to_micros)] = 0
    """The credits each project gets once, when its book is first written."""
    hold_window_s: Annotated[Period, Env("NODUS_HOLD_WINDOW_S", "seconds")] = HOLD_WINDOW_MS / 1000
    """How far ahead of use a hold funds a run."""
    meter_tick_s: Annotated[Period, Env("NODUS_METER_TICK_S", "seconds")] = METER_TICK_MS / 1000
    """How often running usage is charged and holds extended."""
    stop_margin_s: Annotated[Margin, Env("NODUS_STOP_MARGIN_S", "seconds")] = STOP_MARGIN_MS / 1000
    """A Job is stopped while its holds still fund this long."""
    orphan_hold_s: Annotated[Period, Env("NODUS_ORPHAN_HOLD_S", "seconds")] = ORPHAN_HOLD_MS / 1000
    """A hold whose Attempt never appeared is released after this."""
    hold_expiry_s: Annotated[Margin, Env("NODUS_HOLD_EXPIRY_S", "seconds")] = 3600.0
    """A hold nobody extended for this long past its funding expires (the expiry loop, service.py)."""
