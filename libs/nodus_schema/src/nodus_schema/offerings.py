"""Offering as an API object: one priced kind of node from the price book, served read-only.

The scheduler's catalog (:mod:`nodus_schema.catalog`) is the source; the scheduler publishes each
offering of it into the ``offerings`` bucket, as this type, so that people and tools can list the price
book with ``kubectl get offerings`` instead of reading a file shipped inside the scheduler. The rate is a
decimal string of USD per hour (money on the wire is never a number); the catalog holds integer
micro-dollars, and :func:`offering_object` converts exactly.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema import catalog
from nodus_schema.meta import ListMeta, ObjectMeta
from nodus_schema.quantities import micros_to_usd
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "PRICEBOOK_LABEL",
    "PROVIDER_LABEL",
    "REGION_CLASS_LABEL",
    "VARIANT_LABEL",
    "Offering",
    "OfferingHost",
    "OfferingList",
    "OfferingSpec",
    "offering_object",
]

# Labels, so that `kubectl get offerings -l nodus.dev/region-class=us` selects without client filtering.
VARIANT_LABEL: Final = "nodus.dev/variant"
REGION_CLASS_LABEL: Final = "nodus.dev/region-class"
PROVIDER_LABEL: Final = "nodus.dev/provider"
PRICEBOOK_LABEL: Final = "nodus.dev/pricebook-version"


class OfferingHost(Wire):
    """The host of one node. Unlike the catalog's HostShape, every field is required, so none is left off
    the wire for being equal to a default (clients would have to know the defaults)."""

    cpu: str
    memory: str
    disk: str


class OfferingSpec(Wire):
    variant: str
    gpus_per_node: int = msgspec.field(name="gpusPerNode")
    region_class: str
    provider: str
    rate_usd_per_hour: str = msgspec.field(name="rateUSDPerHour")
    """The on-demand rate of one whole node, USD per hour, as a decimal string ("31.92")."""
    pricebook_version: str
    interruptible: bool = False
    """True: the offering sells interruptible capacity only, at rateUSDPerHour."""
    interruptible_rate_usd_per_hour: str | None = msgspec.field(
        default=None, name="interruptibleRateUSDPerHour"
    )
    """The rate of one whole node on interruptible capacity (the provider may reclaim it), USD per hour, as a
    decimal string; absent when the offering sells no interruptible capacity."""
    host: OfferingHost | None = None
    startup: catalog.StartupBands | None = None
    """Cold and warm startup bands in seconds (low, high)."""


class Offering(Wire):
    """A priced kind of node (cluster-scoped; the name is the offering id, ``h100-sxm-80g-x8-us``)."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Offering")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: OfferingSpec = msgspec.field(
        default_factory=lambda: OfferingSpec(
            variant="",
            gpus_per_node=0,
            region_class="",
            provider="",
            rate_usd_per_hour="0.00",
            pricebook_version="",
        )
    )


class OfferingList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Offerings."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "OfferingList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Offering] = msgspec.field(default_factory=list)


def offering_object(offering: catalog.Offering, pricebook_version: str) -> Offering:
    """The API object for one offering of a price book (no server fields: uid, versions, timestamps)."""
    spec = OfferingSpec(
        variant=offering.variant,
        gpus_per_node=offering.gpus_per_node,
        region_class=offering.region_class,
        provider=offering.provider,
        interruptible=offering.interruptible,
        host=OfferingHost(cpu=offering.host.cpu, memory=offering.host.memory, disk=offering.host.disk),
        rate_usd_per_hour=micros_to_usd(offering.rate_micros_per_hour),
        interruptible_rate_usd_per_hour=(
            None
            if offering.interruptible_rate_micros_per_hour is None
            else micros_to_usd(offering.interruptible_rate_micros_per_hour)
        ),
        startup=offering.startup,
        pricebook_version=pricebook_version,
    )
    labels = {
        VARIANT_LABEL: offering.variant,
        REGION_CLASS_LABEL: offering.region_class,
        PROVIDER_LABEL: offering.provider,
        PRICEBOOK_LABEL: pricebook_version,
    }
    return Offering(metadata=ObjectMeta(name=offering.id, labels=labels), spec=spec)
