"""The accelerator catalog and the versioned price book: data types and the matching rule of the reference.

**Catalog.** Accelerator *families* (``H100``) and their *variants* (``H100-SXM-80G``, ``H100-PCIE-80G``,
``H100-NVL-94G``), each with its memory per GPU, its interconnect (``NVLink``, ``PCIe``,
``InfinityFabric``) and its dense BF16 TFLOPS (the speed the Speed and Balanced profiles compare, ADR-0014).

**Price book.** Versioned lists of *offerings*: a variant × GPUs per node (1, 2, 4 or 8) × region class ×
provider (``h100-sxm-80g-x8-us``), with the host shape, the on-demand rate, the interruptible rate (when the
offering sells interruptible capacity) and the cold and warm startup bands. Rates are integer micro-dollars
per node-hour (money is exact); the API shows them as decimal strings. A version is immutable once
published: a price change is a new version, and "a new price book version applies to new admissions only"
(a Job is placed and priced at the version it was admitted under, ADR-0014).

**Matching** (the reference): a family matches any of its variants and never another family; ``exact: true``
pins the variant named; a list of types means any of them; ``count`` is GPUs per node and must equal the
offering's; ``interconnect: NVLink`` and ``minMemory`` are floors.

A :class:`Catalog` is one version of the price book together with the catalog of variants, and knows the
other versions it was loaded with: :meth:`Catalog.at` returns another version, :meth:`Catalog.latest` the
newest. Treat it as immutable: lookups are indexed once, on first use.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Final

import msgspec

from nodus_schema.costs import DurationBand, StartupEstimate
from nodus_schema.gpus import GPURequest
from nodus_schema.quantities import format_duration, parse_bytes, parse_cpu_millis
from nodus_schema.wire import Wire

__all__ = [
    "GPUS_PER_NODE",
    "INTERCONNECTS",
    "Catalog",
    "HostShape",
    "Offering",
    "PriceBook",
    "StartupBand",
    "StartupBands",
    "UnknownPricebook",
    "Variant",
    "catalog_errors",
    "offering_matches",
    "startup_estimate",
    "variant_matches",
    "variant_refusal",
    "version_key",
]

INTERCONNECTS: Final = ("NVLink", "PCIe", "InfinityFabric")
"""The interconnects of the catalog. Only ``NVLink`` satisfies ``interconnect: NVLink``: AMD's Infinity
Fabric is a fast GPU-to-GPU link too, but it is not what the request names."""
GPUS_PER_NODE: Final = (1, 2, 4, 8)


class Variant(Wire):
    """One accelerator model: ``H100-SXM-80G`` of family ``H100``."""

    id: str
    family: str
    memory: str
    """Per GPU, a quantity ("80Gi")."""
    interconnect: str = "PCIe"
    """One of INTERCONNECTS."""
    tflops: int = 0
    """Dense BF16 tensor TFLOPS of one GPU (the vendor's figure without sparsity); 0 when unknown, which the
    Speed and Balanced profiles rank last."""


class HostShape(Wire):
    """The host of one node: CPU cores, memory and ephemeral disk, as quantities."""

    cpu: str = "8"
    memory: str = "64Gi"
    disk: str = "200Gi"


class StartupBand(Wire):
    """A startup band in whole seconds: usually ``low``, rarely above ``high`` (read as p50 and p90)."""

    low_seconds: int
    high_seconds: int


class StartupBands(Wire):
    """Startup of one node: cold (provision, boot, image pull) and warm (container start on a kept node)."""

    cold: StartupBand
    warm: StartupBand


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
    """True: the offering sells interruptible capacity only, at ``rate_micros_per_hour`` (older price books
    had no separate interruptible rate). New offerings leave it false and set the interruptible rate."""
    interruptible_rate_micros_per_hour: int | None = None
    """Rate of one whole node on interruptible capacity (the provider may reclaim it), micro-dollars per
    hour; None when the offering sells no interruptible capacity."""
    host: HostShape = msgspec.field(default_factory=HostShape)
    startup: StartupBands | None = None
    """Cold and warm startup bands; None where the price book gives none (the defaults apply)."""

    def rate_for(self, interruptible: bool) -> int | None:
        """The rate of a node of this offering on on-demand or interruptible capacity; None when the price
        book does not sell that capacity (an interruptible-only offering has no on-demand rate)."""
        if self.interruptible:
            return self.rate_micros_per_hour if interruptible else None
        return self.interruptible_rate_micros_per_hour if interruptible else self.rate_micros_per_hour


class PriceBook(Wire):
    """One version of the price book: its offerings, immutable once published."""

    version: str
    """``YYYY-MM-DD.N``: the day it was published and a sequence number; compared as numbers."""
    effective_time: str | None = None
    """When it became the version new admissions use (RFC 3339), for people; ordering uses the version."""
    offerings: list[Offering] = msgspec.field(default_factory=list)


class UnknownPricebook(KeyError):
    """A price book version the catalog was not loaded with."""


def version_key(version: str) -> tuple[tuple[int, str], ...]:
    """The sort key of a version: its numbers compared as numbers (``2026-11-30.1`` < ``2026-11-30.10``)."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[^0-9A-Za-z]+", version) if p)


class Catalog(Wire, dict=True):
    """The catalog of variants and one version of the price book, knowing every version it was loaded with.

    ``pricebooks`` holds every version (this one included); a Catalog built by hand with only
    ``pricebook_version`` and ``offerings`` knows just that one.
    """

    pricebook_version: str
    variants: list[Variant] = msgspec.field(default_factory=list)
    offerings: list[Offering] = msgspec.field(default_factory=list)
    pricebooks: list[PriceBook] = msgspec.field(default_factory=list)

    @functools.cached_property
    def _variants(self) -> dict[str, Variant]:
        return {v.id: v for v in self.variants}

    @functools.cached_property
    def _offerings(self) -> dict[str, Offering]:
        return {o.id: o for o in self.offerings}

    @functools.cached_property
    def _versions(self) -> dict[str, Catalog]:
        return {self.pricebook_version: self}

    def variant(self, variant_id: str) -> Variant | None:
        return self._variants.get(variant_id)

    def offering(self, offering_id: str) -> Offering | None:
        return self._offerings.get(offering_id)

    def families(self) -> set[str]:
        return {v.family for v in self.variants}

    def versions(self) -> list[str]:
        """Every price book version known, newest first."""
        known = {b.version for b in self.pricebooks} | {self.pricebook_version}
        return sorted(known, key=version_key, reverse=True)

    @functools.cached_property
    def _newest(self) -> str:
        return self.versions()[0]

    def latest(self) -> Catalog:
        """The newest version: the one new admissions use (found once: every estimate asks)."""
        return self.at(self._newest)

    def at(self, version: str) -> Catalog:
        """The catalog at price book ``version`` (the same object on every call); raises UnknownPricebook."""
        cached = self._versions.get(version)
        if cached is not None:
            return cached
        book = next((b for b in self.pricebooks if b.version == version), None)
        if book is None:
            raise UnknownPricebook(version)
        other = Catalog(
            pricebook_version=version,
            variants=self.variants,
            offerings=book.offerings,
            pricebooks=self.pricebooks,
        )
        # Every version shares one cache: one object per version, whichever version is asked first.
        other.__dict__["_versions"] = self._versions
        self._versions[version] = other
        return other


# ---------------------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------------------


def variant_matches(request: GPURequest, variant: Variant) -> bool:
    """Does one variant satisfy the type list, exactness, interconnect and memory of a request?"""
    return _variant_refusal(request, variant) is None


def variant_refusal(request: GPURequest, variant: Variant) -> str | None:
    """None when the variant satisfies the request's type list, exactness, interconnect and memory floor,
    else the first failing one: ``other accelerator``, ``not NVLink`` or ``below minMemory``."""
    return _variant_refusal(request, variant)


def _type_matches(request: GPURequest, variant: Variant) -> bool:
    wanted = {t.upper() for t in request.type}
    if request.exact:
        return variant.id.upper() in wanted
    return variant.family.upper() in wanted or variant.id.upper() in wanted


def _variant_refusal(request: GPURequest, variant: Variant) -> str | None:
    if not _type_matches(request, variant):
        return "other accelerator"
    if request.interconnect == "NVLink" and variant.interconnect != "NVLink":
        return "not NVLink"
    if request.min_memory and parse_bytes(variant.memory) < parse_bytes(request.min_memory):
        return "below minMemory"
    return None


def offering_matches(request: GPURequest, offering: Offering, catalog: Catalog) -> str | None:
    """None when the offering fits the request, else a short reason (for "0/40 nodes: …" messages):
    ``other accelerator`` (type, family or exact), ``not NVLink``, ``below minMemory``,
    ``not N GPUs per node``, or ``unknown variant``."""
    variant = catalog.variant(offering.variant)
    if variant is None:
        return "unknown variant"
    why = _variant_refusal(request, variant)
    if why:
        return why
    if (request.count or 1) != offering.gpus_per_node:
        return f"not {request.count or 1} GPUs per node"
    return None


def startup_estimate(offering: Offering | None) -> StartupEstimate | None:
    """The offering's startup bands as the API's StartupEstimate (low as p50, high as p90), or None."""
    if offering is None or offering.startup is None:
        return None

    def band(b: StartupBand) -> DurationBand:
        low, high = timedelta(seconds=b.low_seconds), timedelta(seconds=b.high_seconds)
        return DurationBand(p50=format_duration(low), p90=format_duration(high))

    return StartupEstimate(cold=band(offering.startup.cold), warm=band(offering.startup.warm))


# ---------------------------------------------------------------------------------------------------------
# Checks of a loaded catalog
# ---------------------------------------------------------------------------------------------------------


def catalog_errors(catalog: Catalog) -> list[str]:
    """Everything wrong with a catalog and its price books, one sentence each ([] when it is sound)."""
    errs: list[str] = []
    ids = [v.id for v in catalog.variants]
    errs += [f"variant {i} is listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for v in catalog.variants:
        if v.interconnect not in INTERCONNECTS:
            errs.append(
                f"variant {v.id}: interconnect {v.interconnect!r} is not one of {', '.join(INTERCONNECTS)}"
            )
        errs += _quantity_errors(f"variant {v.id}: memory", v.memory, parse_bytes)
        if v.tflops < 0:
            errs.append(f"variant {v.id}: tflops must not be negative")
    books = catalog.pricebooks or [PriceBook(version=catalog.pricebook_version, offerings=catalog.offerings)]
    versions = [b.version for b in books]
    errs += [
        f"price book {v} is listed twice" for v in sorted({v for v in versions if versions.count(v) > 1})
    ]
    for book in books:
        errs += _book_errors(book, catalog)
    return errs


def _book_errors(book: PriceBook, catalog: Catalog) -> list[str]:
    errs: list[str] = []
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.[0-9]+", book.version):
        errs.append(f"price book {book.version!r}: a version is YYYY-MM-DD.N")
    seen: set[str] = set()
    for o in book.offerings:
        where = f"price book {book.version}, offering {o.id}"
        if o.id in seen:
            errs.append(f"{where}: listed twice")
        seen.add(o.id)
        if catalog.variant(o.variant) is None:
            errs.append(f"{where}: unknown variant {o.variant}")
        if o.gpus_per_node not in GPUS_PER_NODE:
            errs.append(f"{where}: gpusPerNode {o.gpus_per_node} is not 1, 2, 4 or 8")
        if o.rate_micros_per_hour <= 0:
            errs.append(f"{where}: the on-demand rate must be positive")
        spot = o.interruptible_rate_micros_per_hour
        if spot is not None and not 0 < spot <= o.rate_micros_per_hour:
            errs.append(f"{where}: the interruptible rate must be positive and at most the on-demand rate")
        if o.startup is not None:
            for name, band in (("cold", o.startup.cold), ("warm", o.startup.warm)):
                if not 0 <= band.low_seconds <= band.high_seconds:
                    errs.append(f"{where}: the {name} startup band must have 0 <= low <= high")
        errs += _quantity_errors(f"{where}: host cpu", o.host.cpu, parse_cpu_millis)
        errs += _quantity_errors(f"{where}: host memory", o.host.memory, parse_bytes)
        errs += _quantity_errors(f"{where}: host disk", o.host.disk, parse_bytes)
    return errs


def _quantity_errors(where: str, value: str, parse: Callable[[str], int]) -> list[str]:
    try:
        parse(value)
    except ValueError as e:
        return [f"{where}: {e}"]
    return []
