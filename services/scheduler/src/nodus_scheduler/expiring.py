"""TTL after finished: a finished Job with ``ttlSecondsAfterFinished`` is deleted, with its Attempts, that
long after it finished (Kubernetes' TTL-after-finished controller, a controller of its own there too).

It reconciles Jobs from the scheduler's informers: a Job not finished, or finished without a TTL, is none of
its business (:func:`settled`: it never wakes for them on a resync); one whose TTL has not passed asks to be
looked at when it does. Safe to kill at any line: a delete that finds nothing is what was wanted.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Final

from nats.aio.client import Client as NATS

from nodus_kit.errors import NotFound
from nodus_kit.eventing import publish_event
from nodus_kit.storing import ObjectStore
from nodus_scheduler.ranging import within_ranges
from nodus_scheduler.viewing import World
from nodus_schema.attempts import Attempt
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import parse_time
from nodus_schema.warmth import with_end


def settled(job: Job) -> bool:
    """Whether the Job has nothing to expire: not finished, or no TTL."""
    return job.status.phase not in TERMINAL_PHASES or job.spec.ttl_seconds_after_finished is None


WINDOW_RECHECK_S: Final = 1.0
"""How often an expired Job whose warm windows billing has not captured yet is looked at again."""
WINDOW_CAPTURE_GRACE_S: Final = 120.0
"""How long past its TTL such a Job waits for billing before it is deleted all the same."""


class Expirer:
    def __init__(
        self, nc: NATS, world: World, jobs: ObjectStore[Job], attempts: ObjectStore[Attempt]
    ) -> None:
        self.nc, self.world, self.jobs, self.attempts = nc, world, jobs, attempts

    async def reconcile(self, key: tuple[str, str]) -> float | None:
        job = self.world.jobs.get(*key)
        if job is None or settled(job):
            return None
        # A TTL stored before admission checked ranges (2^63 s) must not fail every look (ranging.py).
        job = within_ranges(job)
        ttl, done = job.spec.ttl_seconds_after_finished, job.status.completion_time
        if ttl is None or not done:
            return None
        left = (parse_time(done) + timedelta(seconds=ttl) - datetime.now(UTC)).total_seconds()
        if left > 0:
            return left
        if await self._windows_pending(job, -left):
            return WINDOW_RECHECK_S
        for a in self.world.attempts_of(key):
            with contextlib.suppress(NotFound):
                self.world.attempts.apply(
                    await self.attempts.delete(a.metadata.namespace, a.metadata.name or ""), deleted=True
                )
        with contextlib.suppress(NotFound):
            self.world.jobs.apply(
                await self.jobs.delete(job.metadata.namespace, job.metadata.name or ""), deleted=True
            )
        await publish_event(
            self.nc, job, "Expired", f"deleted {ttl}s after it finished (ttlSecondsAfterFinished)"
        )
        return None

    async def _windows_pending(self, job: Job, overdue_s: float) -> bool:
        """Whether the Job's runs kept nodes warm (scaledownWindow) and billing has not yet charged their
        windows: the TTL ends an open window now, and the Attempts wait for billing's capture (a deleted
        Attempt's hold would be released uncharged), at most WINDOW_CAPTURE_GRACE_S."""
        key = (job.metadata.namespace or "", job.metadata.name or "")
        kept = [a for a in self.world.attempts_of(key) if a.status.warm_until_ms is not None]
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        for a in kept:
            if a.status.warm_end_ms is None:
                self.world.attempts.apply(
                    await self.attempts.mutate(
                        a.metadata.namespace, a.metadata.name or "", lambda stored: with_end(stored, now_ms)
                    )
                )
        cost = job.status.cost
        return bool(kept) and not (cost is not None and cost.final) and overdue_s < WINDOW_CAPTURE_GRACE_S
