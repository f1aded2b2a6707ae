"""``recovery.checkpoint.retainAfterFinish``: the checkpoints of a finished Job are deleted once its
retention has passed, and those of a Job that no longer exists at once (nothing can resume from them: a
Job created again under the same name has another uid, so another folder, ADR-0017).

No agent watches a Job after its last Attempt, so one agent of the fleet (the holder of the
``agent-retention`` lease) walks the store's Job folders every few minutes and asks the gateway which of
them are past keeping (``nodus.rpc.node.<node>.retention``, nodus_schema.noding): an agent reads no Job
itself (ADR-0026). Deleting is idempotent (:func:`nodus_agent.checkpointing.delete_checkpoints`), so a
sweep cut short by a crash or a lost lease is simply done again by the next holder.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from nats.aio.client import Client as NATS

from nodus_agent.checkpointing import delete_checkpoints
from nodus_kit import messaging
from nodus_schema.noding import MAX_FOLDERS, JobFolder, RetentionReply, RetentionRequest, retention_subject
from nodus_schema.volumes import STORE_PREFIX

log = logging.getLogger(__name__)

LEASE: Final = "agent-retention"
EVERY_S: Final = 300.0
_FOLDER: Final = re.compile(r"(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<uid8>[0-9a-f]{8})")


class RetentionAsker(Protocol):
    async def expired(self, folders: list[JobFolder]) -> list[bool]: ...


class Asker:
    """Asks the gateway, in requests of at most MAX_FOLDERS folders."""

    def __init__(self, nc: NATS, node: str, *, timeout_s: float = 10.0) -> None:
        self.nc, self.subject, self.timeout_s = nc, retention_subject(node), timeout_s

    async def expired(self, folders: list[JobFolder]) -> list[bool]:
        out: list[bool] = []
        for i in range(0, len(folders), MAX_FOLDERS):
            chunk = folders[i : i + MAX_FOLDERS]
            req = RetentionRequest(folders=chunk)
            reply = await messaging.request(
                self.nc, self.subject, req, RetentionReply, timeout=self.timeout_s
            )
            if len(reply.expired) != len(chunk):
                raise ValueError(f"the retention answer has {len(reply.expired)} verdicts for {len(chunk)}")
            out += reply.expired
        return out


async def sweep(client: Any, bucket: str, ask: RetentionAsker, now: datetime | None = None) -> int:
    """One pass over the store; how many objects were deleted. ``now``: the deletion's own clock (what
    expired is the gateway's word)."""
    now = now or datetime.now(UTC)
    found: list[tuple[str, str, JobFolder]] = []
    async for namespace, folder in _job_folders(client, bucket):
        match = _FOLDER.fullmatch(folder)
        if match is None:
            continue  # outputs (``<ns>/<job>/``) and anything else: not ours to expire
        where = JobFolder(namespace=namespace, name=match["name"], uid8=match["uid8"])
        found.append((namespace, folder, where))
    if not found:
        return 0
    verdicts = await ask.expired([f for _, _, f in found])
    deleted = 0
    for (namespace, folder, _), gone in zip(found, verdicts, strict=True):
        if not gone:
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


async def run(client: Any, bucket: str, ask: RetentionAsker, every_s: float = EVERY_S) -> None:
    """Sweep every ``every_s`` while this agent holds the lease (cancelled when it loses it)."""
    while True:
        try:
            await sweep(client, bucket, ask)
        except Exception as e:  # the store, the bus or the gateway away: the next pass tries again
            log.warning("checkpoint retention pass failed: %s", e)
        await asyncio.sleep(every_s)


async def _job_folders(client: Any, bucket: str) -> AsyncIterator[tuple[str, str]]:
    """(namespace, job folder) of every ``<ns>/<folder>/`` in the bucket, one level at a time. Nodus's own
    ``_nodus/`` (blobs, Workspaces: ADR-0036) is no namespace: a blob's folder must never pass for a Job's."""
    async for namespace in _prefixes(client, bucket, ""):
        if f"{namespace}/" == STORE_PREFIX:
            continue
        async for folder in _prefixes(client, bucket, namespace + "/"):
            yield namespace, folder


async def _prefixes(client: Any, bucket: str, prefix: str) -> AsyncIterator[str]:
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            yield common["Prefix"][len(prefix) :].rstrip("/")
