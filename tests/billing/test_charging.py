"""Charges are exact integer micro-dollars, rounded up, never floats."""

from __future__ import annotations

from nodus_schema.ledger import charge_micros
from nodus_schema.quantities import micros_to_usd


def test_an_hour_at_the_rate_is_the_rate() -> None:
    assert charge_micros(2_990_000, 3_600_000) == 2_990_000


def test_partial_time_rounds_up_to_the_micro_dollar() -> None:
    # 1 ms at $2.99/h = 0.000830555… $ -> 831 µ$
    assert charge_micros(2_990_000, 1) == 1
    assert charge_micros(2_990_000, 1000) == 831
    assert micros_to_usd(charge_micros(2_990_000, 1000)) == "0.000831"


def test_zero_time_costs_nothing() -> None:
    assert charge_micros(2_990_000, 0) == 0
