"""Usage and invoices as the API shows them: billing's rows (integer micro-dollars) as USD strings, grouped.

Pure: no I/O, no floats. Billing answers a project's charges per Attempt (``UsageRow``); this module turns
them into

* the usage export: one :class:`~nodus_schema.billing.UsageItem` per Attempt, every amount a USD string,
  every key present (JSON), and the same columns as CSV;
* the invoice of a month: one :class:`~nodus_schema.billing.InvoiceLine` per Sweep (a Job of its own
  stands for itself), offering and rate, with billed hours (6 decimals), what was charged and what Nodus
  covered, and the month's totals; as CSV with a final TOTAL row.

A line's amount is the sum of its Attempts' charges, each already rounded up to the micro-dollar by
billing (ADR-0010), so it may exceed quantity × rate by a few micro-dollars: the amount is what was
charged, the quantity what was run. Lines split by rate as well as by offering, so that a price book
change in the middle of a month never shows one rate for hours billed at two.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Final

from nodus_schema import to_builtins
from nodus_schema.billing import Invoice, InvoiceLine, UsageItem, UsageList, UsageRow
from nodus_schema.quantities import micros_to_usd
from nodus_schema.wire import csv_text

MONTH: Final = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")
"""A UTC month as the API writes it: ``YYYY-MM``."""
MILLIS_PER_HOUR: Final = 3_600_000
_HOURS_PLACES: Final = Decimal("0.000001")

USAGE_COLUMNS: Final = (
    "month",
    "job",
    "attempt",
    "sweep",
    "offering",
    "pricebookVersion",
    "rateUSDPerHour",
    "billedSeconds",
    "startTime",
    "finishTime",
    "costUSD",
    "bootUSD",
    "runningUSD",
    "restoreUSD",
    "teardownUSD",
    "coveredUSD",
)
"""The usage CSV's header, in order: the JSON item's keys."""
INVOICE_COLUMNS: Final = (
    "sweep",
    "job",
    "offering",
    "rateUSDPerHour",
    "attempts",
    "quantity",
    "amountUSD",
    "coveredUSD",
)
"""The invoice CSV's header, in order: the JSON line's keys (quantity is billed hours)."""
TOTAL: Final = "TOTAL"


def is_month(text: str) -> bool:
    return MONTH.fullmatch(text) is not None


def billed_seconds(millis: int) -> str:
    """Milliseconds as seconds with 3 decimals, exactly (``90500`` → ``"90.500"``)."""
    return f"{millis // 1000}.{millis % 1000:03d}"


def billed_hours(millis: int) -> Decimal:
    """Milliseconds as hours with 6 decimals (a millisecond is 0.00000028 h: the last place is rounded)."""
    return (Decimal(millis) / MILLIS_PER_HOUR).quantize(_HOURS_PLACES, rounding=ROUND_HALF_UP)


# ---------------------------------------------------------------------------------------------------------
# Usage
# ---------------------------------------------------------------------------------------------------------


def usage_item(row: UsageRow) -> UsageItem:
    return UsageItem(
        month=row.month,
        job=row.job,
        attempt=row.attempt,
        sweep=row.sweep,
        offering=row.offering,
        pricebook_version=row.pricebook_version,
        rate_usd_per_hour=micros_to_usd(row.rate_micros_per_hour),
        billed_seconds=billed_seconds(row.billed_millis),
        start_time=row.start_time,
        finish_time=row.finish_time,
        cost_usd=micros_to_usd(row.amount_micros),
        boot_usd=micros_to_usd(row.boot_micros),
        running_usd=micros_to_usd(row.running_micros),
        restore_usd=micros_to_usd(row.restore_micros),
        teardown_usd=micros_to_usd(row.teardown_micros),
        covered_usd=micros_to_usd(row.covered_micros),
    )


def _row_order(row: UsageRow) -> tuple[str, str]:
    return row.month, row.start_time or ""


def usage_list(project: str, month: str | None, rows: Iterable[UsageRow]) -> UsageList:
    """The usage export: one item per Attempt, oldest first (by month, then start time; rows that tie
    keep billing's order, which is the order their holds were placed in)."""
    items = [usage_item(r) for r in sorted(rows, key=_row_order)]
    return UsageList(project=project, month=month, items=items)


# ---------------------------------------------------------------------------------------------------------
# Invoices
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True, slots=True)
class _LineKey:
    """What an invoice line groups by: the Sweep (or the Job, for a Job of its own), offering and rate."""

    name: str
    is_job: bool
    offering: str
    rate_micros_per_hour: int


@dataclass(slots=True)
class _Sums:
    attempts: int = 0
    millis: int = 0
    amount_micros: int = 0
    covered_micros: int = 0

    def add(self, row: UsageRow) -> None:
        self.attempts += 1
        self.millis += row.billed_millis
        self.amount_micros += row.amount_micros
        self.covered_micros += row.covered_micros


def _key(row: UsageRow) -> _LineKey:
    if row.sweep:
        return _LineKey(row.sweep, False, row.offering, row.rate_micros_per_hour)
    return _LineKey(row.job, True, row.offering, row.rate_micros_per_hour)


def _line(key: _LineKey, sums: _Sums) -> InvoiceLine:
    return InvoiceLine(
        sweep=None if key.is_job else key.name,
        job=key.name if key.is_job else None,
        offering=key.offering,
        rate_usd_per_hour=micros_to_usd(key.rate_micros_per_hour),
        attempts=sums.attempts,
        quantity=str(billed_hours(sums.millis)),
        amount_usd=micros_to_usd(sums.amount_micros),
        covered_usd=micros_to_usd(sums.covered_micros),
    )


def invoice(project: str, month: str, rows: Iterable[UsageRow]) -> Invoice:
    """The month's charges of a project, one line per Sweep (or Job), offering and rate, sorted by name.
    Rows of other months are left out (billing answers the month asked; this is a second fence)."""
    groups: dict[_LineKey, _Sums] = {}
    for row in rows:
        if row.month == month:
            groups.setdefault(_key(row), _Sums()).add(row)
    lines = [_line(key, groups[key]) for key in sorted(groups)]
    return Invoice(
        project=project,
        month=month,
        lines=lines,
        total_usd=micros_to_usd(sum(s.amount_micros for s in groups.values())),
        covered_usd=micros_to_usd(sum(s.covered_micros for s in groups.values())),
    )


# ---------------------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _cells(obj: Any, columns: Sequence[str]) -> list[str]:
    data = to_builtins(obj)
    return [_cell(data.get(c)) for c in columns]


def usage_csv(usage: UsageList) -> str:
    """The usage export as CSV: the header, then one row per Attempt (the JSON items' values)."""
    return csv_text(USAGE_COLUMNS, (_cells(item, USAGE_COLUMNS) for item in usage.items))


def invoice_csv(inv: Invoice) -> str:
    """The invoice as CSV: the header, one row per line, and a TOTAL row (attempts, hours, amounts)."""
    rows = [_cells(line, INVOICE_COLUMNS) for line in inv.lines]
    hours = sum((Decimal(line.quantity) for line in inv.lines), Decimal("0.000000"))
    attempts = sum(line.attempts for line in inv.lines)
    rows.append([TOTAL, "", "", "", str(attempts), str(hours), inv.total_usd, inv.covered_usd])
    return csv_text(INVOICE_COLUMNS, rows)
