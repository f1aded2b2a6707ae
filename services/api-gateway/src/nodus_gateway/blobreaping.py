"""Expiry of blobs nothing refers to (ADR-0036): an upload nobody runs must not cost storage for ever.

A blob may go when **nothing refers to it** (no Job, Sweep or Pipeline stage of its project names it as
``source.blob``, and no revision of a Volume of its project is it) **and it was not used** for
``NODUS_BLOB_TTL`` (7 days: long enough for a code upload that waits for a rerun, or a revision pushed
before the Job that reads it is written). "Used" is the record's ``lastUsedTime``: set at upload, at each
admission that names it (at most hourly), and when it becomes a revision.

**Safe against a use that races the sweep.** The record goes first, by compare-and-set on the revision the
sweep judged, and the store's object only after: a use touches the record (a new revision), so either
the touch comes first and the delete is refused (the blob stays), or the delete comes first and the touch
finds no record, and the admission or the revision that wanted it is refused ("upload it again"), never
admitted with a blob that is about to vanish (``blobbing.touch_blob(strict=True)``).

Every gateway replica sweeps on its own timer (hourly, jittered): deleting is idempotent and the
compare-and-set keeps two replicas from judging the same record twice, so no lease is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

from nodus_gateway.resources import BLOBS, Stores
from nodus_gateway.storeaccess import StoreAccess
from nodus_kit import errors as kit
from nodus_schema import Job, Sweep
from nodus_schema.jobs import JobSpec
from nodus_schema.meta import parse_time
from nodus_schema.pipelinerules import stage_spec
from nodus_schema.pipelines import Pipeline
from nodus_schema.volumes import Blob, Volume, blob_key

log = logging.getLogger(__name__)

DEFAULT_TTL: Final = timedelta(days=7)
DEFAULT_INTERVAL_S: Final = 3600.0


def _used(blob: Blob) -> datetime:
    stamp = blob.status.last_used_time or blob.metadata.creation_timestamp
    try:
        return parse_time(stamp) if stamp else datetime.now(UTC)
    except ValueError:
        return datetime.now(UTC)  # a time we cannot read keeps the blob: deleting is the irreversible way


def _source_blob(spec: JobSpec) -> str | None:
    return spec.source.blob if spec.source is not None else None


def referenced(
    jobs: Iterable[Job],
    sweeps: Iterable[Sweep],
    volumes: Iterable[Volume],
    pipelines: Iterable[Pipeline] = (),
) -> set[str]:
    """The digests a project's objects refer to (a Pipeline's: every stage's, created or not). Pure."""
    found: set[str] = set()
    for pipeline in pipelines:
        for stage in pipeline.spec.stages:
            spec = stage_spec(stage)
            found.add((_source_blob(spec) if spec is not None else None) or "")
    for job in jobs:
        found.add(_source_blob(job.spec) or "")
    for sweep in sweeps:
        found.add(_source_blob(sweep.spec.template.spec) or "")
    for vol in volumes:
        found.update(rev.digest for rev in vol.status.revisions)
    found.discard("")
    return found


class BlobReaper:
    """Deletes the expired blobs of every project: :meth:`sweep` once, :meth:`run` on a timer."""

    def __init__(
        self,
        stores: Stores,
        access: StoreAccess,
        *,
        ttl: timedelta = DEFAULT_TTL,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.stores, self.access, self.ttl, self.interval_s = stores, access, ttl, interval_s
        self.deleted = 0

    async def run(self) -> None:
        while True:
            # Spread, so replicas started together do not sweep together.
            await asyncio.sleep(self.interval_s * random.uniform(0.8, 1.2))
            try:
                await self.sweep()
            except Exception:  # the next sweep tries again; a failed one deletes nothing it did not judge
                log.exception("expiring unused blobs failed")

    async def sweep(self, now: datetime | None = None, namespace: str | None = None) -> int:
        """One pass over the blobs of every project (or one); returns how many were deleted."""
        gone = 0
        for project, blob in await self.expired(now or datetime.now(UTC), namespace):
            gone += await self.delete(project, blob)
        self.deleted += gone
        return gone

    async def expired(self, now: datetime, namespace: str | None = None) -> list[tuple[str, Blob]]:
        """The blobs unused since ``now - ttl`` that nothing of their project refers to, as read now (of
        one project, or of all)."""
        by_project: dict[str, list[Blob]] = defaultdict(list)
        for blob in (await self.stores[BLOBS].list(namespace)).items:
            if _used(blob) + self.ttl <= now:
                by_project[blob.metadata.namespace or ""].append(blob)
        found: list[tuple[str, Blob]] = []
        for namespace, candidates in by_project.items():
            keep = await self._referenced(namespace)
            found += [(namespace, b) for b in candidates if "sha256:" + (b.metadata.name or "") not in keep]
        return found

    async def _referenced(self, namespace: str) -> set[str]:
        jobs = (await self.stores["jobs"].list(namespace)).items
        sweeps = (await self.stores["sweeps"].list(namespace)).items
        volumes = (await self.stores["volumes"].list(namespace)).items
        pipelines = (await self.stores["pipelines"].list(namespace)).items
        return referenced(jobs, sweeps, volumes, pipelines)

    async def delete(self, namespace: str, blob: Blob) -> bool:
        """Delete ``blob`` as it was judged: its record by compare-and-set on the revision read (False when
        it was used or deleted since), then its object in the store."""
        name = blob.metadata.name or ""
        try:
            await self.stores[BLOBS].delete(namespace, name, resource_version=blob.metadata.resource_version)
        except (kit.Conflict, kit.NotFound):
            return False  # used meanwhile (a new revision of the record), or another replica took it
        with contextlib.suppress(Exception):  # an object left behind costs storage, not correctness
            await self.access.delete(blob_key(namespace, "sha256:" + name))
        size = blob.spec.size_bytes
        log.info("deleted an unused blob", extra={"ns": namespace, "digest": name, "bytes": size})
        return True
