"""status.cost and status.estimate: what an object has cost, and what a create would cost (ADR-031).

Every amount is a decimal USD string (``"12.50"``, at most 6 decimals); parse with
:func:`nodus_schema.quantities.parse_usd`. Durations are Go duration strings. These are display copies:
nothing is ever charged from these fields (the ledger in billing is the truth).
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema.quantities import micros_to_usd
from nodus_schema.wire import Wire

__all__ = [
    "BILLING_SEGMENTS",
    "BlockingReason",
    "Cost",
    "CostSegments",
    "DurationBand",
    "Estimate",
    "EstimateWarning",
    "PlacementPreview",
    "StartupEstimate",
    "USDBand",
    "opening_cost",
]

BILLING_SEGMENTS: Final = ("Boot", "Running", "Restore", "Teardown")
"""The billing segments of a charge, as CostSegments.coveredByNodus names them."""


class CostSegments(Wire):
    """CostSegments splits a charge by billing segment."""

    boot_usd: str | None = msgspec.field(default=None, name="bootUSD")
    """The charge from the start of billing until the program started."""
    covered_by_nodus: list[str] = msgspec.field(default_factory=list)
    """Segments (Boot, Running, Restore, Teardown) with time Nodus paid for instead of charging it."""
    restore_usd: str | None = msgspec.field(default=None, name="restoreUSD")
    """The charge for bringing a replacement up after capacity was lost."""
    running_usd: str | None = msgspec.field(default=None, name="runningUSD")
    """The charge while the program ran."""
    teardown_usd: str | None = msgspec.field(default=None, name="teardownUSD")
    """The charge from stop until deletion was confirmed, with the billing increment."""


class Cost(Wire):
    """status.cost on every kind that spends money: a display copy of the ledger, in decimal USD strings."""

    by_segment: CostSegments | None = None
    final: bool | None = None
    """Final is true once the final charge has posted."""
    funded_until_time: str | None = None
    """When the current holds stop paying for the object (RFC 3339)."""
    held_usd: str | None = msgspec.field(default=None, name="heldUSD")
    """What is currently held for the object."""
    limit_usd: str | None = msgspec.field(default=None, name="limitUSD")
    """The object's maxCostUSD, if it has one."""
    rate_usd_per_hour: str | None = msgspec.field(default=None, name="rateUSDPerHour")
    """The sum of the hourly rates of its capacity that is still billing."""
    total_usd: str | None = msgspec.field(default=None, name="totalUSD")
    """What has been charged for this object so far."""


def opening_cost(limit_usd: str | None) -> Cost:
    """status.cost of an object nothing was charged or held for yet: what billing writes first for a Job
    that has not run, and what the gateway stores with a Job billing quoted (so billing, finding it,
    does not write it again)."""
    zero = micros_to_usd(0)
    return Cost(total_usd=zero, held_usd=zero, rate_usd_per_hour=zero, limit_usd=limit_usd, final=False)


class BlockingReason(Wire):
    """BlockingReason says why a create would fail now."""

    code: str | None = None
    """The error code the create would return, for example InsufficientCredits."""
    fix: str | None = None
    message: str | None = None
    """The reason with the amounts involved."""


class EstimateWarning(Wire):
    """EstimateWarning is a non-blocking note on an estimate (e.g. ColdStart, InterruptibleSelected)."""

    code: str | None = None
    message: str | None = None


class USDBand(Wire):
    """USDBand is a median and a 90th-percentile amount in USD."""

    p50: str | None = None
    p90: str | None = None


class DurationBand(Wire):
    """DurationBand is a median and a 90th-percentile duration, as Go duration strings."""

    p50: str | None = None
    p90: str | None = None


class StartupEstimate(Wire):
    """StartupEstimate is the expected time to start, on cold and on warm capacity."""

    cold: DurationBand | None = None
    warm: DurationBand | None = None


class PlacementPreview(Wire):
    """PlacementPreview is the customer-safe description of the capacity a create would use."""

    explain: str | None = None
    """The scheduler's explanation, the same shape as Attempt status.placement.explain."""
    interruptible: bool | None = None
    offering: str | None = None
    """The offering id, for example h100-sxm-80g-x8-us."""
    region_class: str | None = None
    warm_reuse: bool | None = None


class Estimate(Wire):
    """status.estimate of a dry-run (?dryRun=All) and of every create of a compute kind (ADR-031)."""

    assembly_bound_usd: str | None = msgspec.field(default=None, name="assemblyBoundUSD")
    """The most a multi-node Job can cost if its members never assemble."""
    blocking_reasons: list[BlockingReason] = msgspec.field(default_factory=list)
    concurrent_hold_usd: str | None = msgspec.field(default=None, name="concurrentHoldUSD")
    """The total of the holds for every slot that starts at once."""
    cost_usd: USDBand | None = msgspec.field(default=None, name="costUSD")
    gang_hold_usd: str | None = msgspec.field(default=None, name="gangHoldUSD")
    """The total of the member holds of a multi-node Job."""
    hold_usd: str | None = msgspec.field(default=None, name="holdUSD")
    """The first hold that must fit your balance, every matching Budget and the object's own cap."""
    minimum_charge_usd: str | None = msgspec.field(default=None, name="minimumChargeUSD")
    """The billing increment rounding charged once per allocation."""
    overhead_usd: USDBand | None = msgspec.field(default=None, name="overheadUSD")
    placement_preview: PlacementPreview | None = None
    pricebook_version: str | None = None
    rate_usd_per_hour: str | None = msgspec.field(default=None, name="rateUSDPerHour")
    """The hourly rate of the chosen capacity."""
    startup: StartupEstimate | None = None
    topology: str | None = None
    """The resolved multi-node topology of a gang Job ("<nodes>x<gpusPerNode>", e.g. "2x8")."""
    valid_until: str | None = None
    """When the prices this estimate used stop being current (RFC 3339)."""
    warnings: list[EstimateWarning] = msgspec.field(default_factory=list)
