"""Ledger entries: what billing charged, one entry per charge, keyed by what it charges for.

Amounts are integer micro-dollars; an entry is created once (its name is the business key), so a
report that arrives twice can never charge twice.
"""

from __future__ import annotations

import msgspec

from nodus_schema.meta import ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

MICROS_PER_HOUR_MS = 3_600_000  # milliseconds in an hour: rate (µ$/h) × ms / this = µ$


class LedgerEntrySpec(Wire):
    job: str
    attempt: str
    offering: str
    pricebook_version: str
    rate_micros_per_hour: int
    billed_millis: int
    amount_micros: int
    segment: str = "Running"


class LedgerEntry(Wire):
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "LedgerEntry")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LedgerEntrySpec | None = None


def charge_micros(rate_micros_per_hour: int, millis: int) -> int:
    """The charge for ``millis`` of a node at ``rate``, rounded up to the micro-dollar (never a float)."""
    return -(-rate_micros_per_hour * millis // MICROS_PER_HOUR_MS)
