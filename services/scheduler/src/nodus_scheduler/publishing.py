"""Publishing the price book: every offering of the scheduler's catalog as an Offering object.

The API serves the ``offerings`` bucket read-only (``kubectl get offerings``); the scheduler, which owns
the catalog, keeps the bucket equal to it at start. Idempotent, so every replica may run it at every
start: an offering is created when missing, updated only when its spec or labels differ, and deleted
when the price book no longer has it. A write that loses a race with another replica is re-read and
retried; both replicas publish the same data, so whoever wins is right.

During a rolling upgrade to a new price book, an old replica that restarts would publish the old one
again; the next start of a new replica puts it right. Publishing from the elected leader only would
close that window; it is not needed while the catalog ships with the scheduler's image.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import errors as kit
from nodus_kit.storing import ObjectStore
from nodus_schema.catalog import Catalog
from nodus_schema.offerings import Offering, offering_object

log = logging.getLogger(__name__)

BUCKET = "offerings"


@dataclass(frozen=True, slots=True)
class Published:
    """What one publication changed, by offering id."""

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    unchanged: int = 0


def _same(a: Offering, b: Offering) -> bool:
    return a.spec == b.spec and a.metadata.labels == b.metadata.labels


async def _put(store: ObjectStore[Offering], wanted: Offering) -> bool:
    """Create or update one offering; False when it already held exactly this (no write)."""
    name = wanted.metadata.name or ""
    try:
        await store.create(wanted)
        return True
    except kit.AlreadyExists:
        pass

    def change(current: Offering) -> Offering | None:
        if _same(current, wanted):
            return None
        # The scheduler owns these objects whole: spec and labels are the price book's.
        meta = msgspec.structs.replace(current.metadata, labels=wanted.metadata.labels)
        return msgspec.structs.replace(current, metadata=meta, spec=wanted.spec)

    before = await store.get(None, name)
    after = await store.mutate(None, name, change)
    return after.metadata.resource_version != before.metadata.resource_version


async def publish_catalog(nc: NATS, catalog: Catalog) -> Published:
    """Make the ``offerings`` bucket hold exactly the offerings of ``catalog``; see the module doc."""
    store = ObjectStore(nc, BUCKET, Offering)
    wanted = {o.id: offering_object(o, catalog.pricebook_version) for o in catalog.offerings}
    current = {o.metadata.name: o for o in (await store.list()).items}
    created: list[str] = []
    updated: list[str] = []
    deleted: list[str] = []
    for name, offering in wanted.items():
        existing = current.get(name)
        if existing is not None and _same(existing, offering):
            continue
        if await _put(store, offering):
            (updated if existing is not None else created).append(name)
    for name in sorted(n for n in current if n and n not in wanted):
        try:
            await store.delete(None, name)
            deleted.append(name)
        except kit.NotFound:
            pass  # another replica deleted it first
    result = Published(
        tuple(created), tuple(updated), tuple(deleted), len(wanted) - len(created) - len(updated)
    )
    log.info(
        "price book published",
        extra={
            "pricebook": catalog.pricebook_version,
            # Not "created": that name is a LogRecord attribute, and logging refuses to overwrite it.
            "offeringsCreated": len(created),
            "offeringsUpdated": len(updated),
            "offeringsDeleted": len(deleted),
        },
    )
    return result
