"""What would let the price book serve a spec that nothing in it can (the fix of an estimate's blocking
CapacityUnavailable, :mod:`nodus_scheduler.estimating`): each placement constraint that, lifted alone,
lets something match, with the value that works; else the general advice."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nodus_scheduler.placing import price_book_candidates, request_of
from nodus_schema.catalog import GPUS_PER_NODE, Catalog
from nodus_schema.jobs import JobSpec
from nodus_schema.jobs import Placement as PlacementSpec
from nodus_schema.quantities import micros_to_usd

_GENERAL_FIX: Final = (
    "Widen placement: another GPU type or family in resources.gpu (or the Sweep's matrix.gpu), "
    "more placement.regions or placement.offerings, a higher placement.maxRateUSDPerHour, or "
    "placement.interruptible: Allow."
)


def _with_placement(spec: JobSpec, **change: Any) -> JobSpec:
    placement = msgspec.structs.replace(spec.placement or PlacementSpec(), **change)
    return msgspec.structs.replace(spec, placement=placement)


def capacity_fix(spec: JobSpec, catalog: Catalog, kind: str) -> str:
    """What would let the price book serve ``spec``: each placement constraint that, lifted alone, lets
    something match, with the value that works; else the general advice."""
    field = "spec.template.spec." if kind == "Sweep" else "spec."
    p = spec.placement or PlacementSpec()
    hints: list[str] = []
    if p.max_rate_usd_per_hour:
        fits, _ = price_book_candidates(_with_placement(spec, max_rate_usd_per_hour=None), catalog)
        if fits:
            cheapest = min(c.rate_micros_per_hour for c in fits)
            hints.append(
                f"raise {field}placement.maxRateUSDPerHour to at least {micros_to_usd(cheapest)} "
                "(the cheapest matching capacity)"
            )
    if (p.interruptible or "Never") == "Never":
        fits, _ = price_book_candidates(_with_placement(spec, interruptible="Allow"), catalog)
        if fits:
            hints.append(f"set {field}placement.interruptible: Allow (interruptible capacity matches)")
    if p.regions:
        fits, _ = price_book_candidates(_with_placement(spec, regions=[]), catalog)
        if fits:
            regions = ", ".join(sorted({c.offering.region_class for c in fits}))
            where = "spec.matrix.regions or " if kind == "Sweep" else ""
            hints.append(f"choose a region class in {where}{field}placement.regions that has it: {regions}")
    if p.offerings:
        fits, _ = price_book_candidates(_with_placement(spec, offerings=[]), catalog)
        if fits:
            ids = ", ".join(sorted({c.offering.id for c in fits})[:3])
            hints.append(f"allow a matching offering in {field}placement.offerings, e.g. {ids}")
    request = request_of(spec)
    if request is not None and spec.resources is not None:
        counts = []
        for count in GPUS_PER_NODE:
            if count == (request.count or 1):
                continue
            other = msgspec.structs.replace(request, count=count)
            resources = msgspec.structs.replace(spec.resources, gpu=other)
            if price_book_candidates(msgspec.structs.replace(spec, resources=resources), catalog)[0]:
                counts.append(str(count))
        if counts:
            where = "spec.matrix.gpu or " if kind == "Sweep" else ""
            hints.append(f"ask for {' or '.join(counts)} GPUs per node in {where}{field}resources.gpu.count")
    if not hints:
        return _GENERAL_FIX
    text = "; or ".join(hints)
    return text[0].upper() + text[1:] + "."
