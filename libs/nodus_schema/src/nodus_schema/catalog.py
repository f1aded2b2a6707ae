"""The accelerator catalog and the price book: pure data types and the matching rule of the reference.

A family (``H100``) matches any of its variants (``H100-SXM-80G``, ``H100-PCIE-80G``, …) and never another
family; ``exact: true`` pins the variant named. A list of types means any of them. ``count`` is GPUs per
node and must equal the offering's; ``interconnect: NVLink`` and ``minMemory`` are floors.
Rates are integer micro-dollars per hour (money is exact); the API shows them as decimal strings.
"""

from __future__ import annotations

import msgspec

from nodus_schema.gpus import GPURequest
from nodus_schema.quantities import parse_bytes
from nodus_schema.wire import Wire


class Variant(Wire):
    """One accelerator model: ``H100-SXM-80G`` of family ``H100``."""

    id: str
    family: str
    memory: str  # per GPU, a quantity ("80Gi")
    interconnect: str = "PCIe"  # "NVLink" or "PCIe"


class HostShape(Wire):
    cpu: str = "8"
    memory: str = "64Gi"
    disk: str = "200Gi"


class Offering(Wire):
    """A priced kind of node: variant × GPUs per node × region class (``h100-sxm-80g-x8-us``)."""

    id: str
    variant: str
    gpus_per_node: int = msgspec.field(name="gpusPerNode")
    region_class: str
    rate_micros_per_hour: int
    """On-demand rate of one whole node, micro-dollars per hour."""
    provider: str = "local"
    interruptible: bool = False
    host: HostShape = msgspec.field(default_factory=HostShape)


class Catalog(Wire):
    """The catalog and one version of the price book, as loaded from data files."""

    pricebook_version: str
    variants: list[Variant] = msgspec.field(default_factory=list)
    offerings: list[Offering] = msgspec.field(default_factory=list)

    def variant(self, variant_id: str) -> Variant | None:
        return next((v for v in self.variants if v.id == variant_id), None)

    def offering(self, offering_id: str) -> Offering | None:
        return next((o for o in self.offerings if o.id == offering_id), None)

    def families(self) -> set[str]:
        return {v.family for v in self.variants}


def variant_matches(request: GPURequest, variant: Variant) -> bool:
    """Does one variant satisfy the type list, exactness, interconnect and memory of a request?"""
    wanted = [t.upper() for t in request.type]
    if request.exact:
        type_ok = variant.id.upper() in wanted
    else:
        type_ok = variant.family.upper() in wanted or variant.id.upper() in wanted
    if not type_ok:
        return False
    if request.interconnect == "NVLink" and variant.interconnect != "NVLink":
        return False
    return not (request.min_memory and parse_bytes(variant.memory) < parse_bytes(request.min_memory))


def offering_matches(request: GPURequest, offering: Offering, catalog: Catalog) -> str | None:
    """None when the offering fits the request, else a short reason (for "0/40 nodes: …" messages)."""
    variant = catalog.variant(offering.variant)
    if variant is None:
        return "unknown variant"
    if not variant_matches(request, variant):
        return "other accelerator"
    if (request.count or 1) != offering.gpus_per_node:
        return f"not {request.count or 1} GPUs per node"
    return None
