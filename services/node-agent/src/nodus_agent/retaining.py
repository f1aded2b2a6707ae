"""``recovery.checkpoint.retainAfterFinish``: the checkpoints of a finished Job are deleted once its
retention has passed, and those of a Job that no longer exists at once (nothing can resume from them: a
Job created again under the same name has another uid, so another folder, ADR-0017).

No agent watches a Job after its last Attempt, so one agent of the fleet (the holder of the
``agent-retention`` lease) walks the store's Job folders every few minutes and asks the ``jobs`` bucket
about each. Deleting is idempotent (:func:`nodus_agent.checkpointing.delete_checkpoints`), so a sweep
cut short by a crash or a lost lease is simply done again by the next holder.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from nodus_agent.checkpointing import delete_checkpoints
from nodus_kit.errors import NotFound
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import parse_time
from nodus_schema.quantities import parse_duration

log = logging.getLogger(__name__)

LEASE: Final = "agent-retention"
EVERY_S: Final = 300.0
DEFAULT_RETAIN: Final = timedelta(hours=168)  # the reference's default retainAfterFinish
_FOLDER: Final = re.compile(r"(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<uid8>[0-9a-f]{8})")


class JobReader(Protocol):
    async def get(self, namespace: str | None, name: str) -> Job: ...


def retention_of(job: Job) -> timedelta:
    policy = job.spec.recovery.checkpoint if job.spec.recovery else None
    value = policy.retain_after_finish if policy else None
    try:
        return parse_duration(value) if value else DEFAULT_RETAIN
    except ValueError:
        return DEFAULT_RETAIN


def expired(job: Job | None, uid8: str, now: datetime) -> bool:
    """Are the checkpoints in folder ``<name>-<uid8>`` past keeping? ``job``: the Job of that name now,
    None when there is none."""
    if job is None or (job.metadata.uid or "")[:8] != uid8:
        return True  # deleted (or replaced by a new Job of the same name): nothing can restore them
    if job.status.phase not in TERMINAL_PHASES or not job.status.completion_time:
        return False
    return now >= parse_time(job.status.completion_time) + retention_of(job)


async def sweep(client: Any, bucket: str, jobs: JobReader, now: datetime | None = None) -> int:
    """One pass over the store; how many objects were deleted."""
    now = now or datetime.now(UTC)
    deleted = 0
    async for namespace, folder in _job_folders(client, bucket):
        match = _FOLDER.fullmatch(folder)
        if match is None:
            continue  # outputs (``<ns>/<job>/``) and anything else: not ours to expire
        name, uid8 = match["name"], match["uid8"]
        try:
            job: Job | None = await jobs.get(namespace, name)
        except NotFound:
            job = None
        if not expired(job, uid8, now):
            continue
        count = await delete_checkpoints(client, bucket, namespace, folder, now)
        if count:
            log.info(
                "deleted %d checkpoint objects of %s/%s",
                count,
                namespace,
                folder,
                extra={"reason": "retention"},
            )
        deleted += count
    return deleted


async def run(client: Any, bucket: str, jobs: JobReader, every_s: float = EVERY_S) -> None:
    """Sweep every ``every_s`` while this agent holds the lease (cancelled when it loses it)."""
    while True:
        try:
            await sweep(client, bucket, jobs)
        except Exception as e:  # the store or the bus away: the next pass tries again
            log.warning("checkpoint retention pass failed: %s", e)
        await asyncio.sleep(every_s)


async def _job_folders(client: Any, bucket: str) -> AsyncIterator[tuple[str, str]]:
    """(namespace, job folder) of every ``<ns>/<folder>/`` in the bucket, one level at a time."""
    async for namespace in _prefixes(client, bucket, ""):
        async for folder in _prefixes(client, bucket, namespace + "/"):
            yield namespace, folder


async def _prefixes(client: Any, bucket: str, prefix: str) -> AsyncIterator[str]:
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            yield common["Prefix"][len(prefix) :].rstrip("/")
