"""TTL after finished: a finished Job with ``ttlSecondsAfterFinished`` is deleted, with its Attempts, that
long after it finished (Kubernetes' TTL-after-finished controller, a controller of its own there too).

It reconciles Jobs from the scheduler's informers: a Job not finished, or finished without a TTL, is none of
its business (:func:`settled`: it never wakes for them on a resync); one whose TTL has not passed asks to be
looked at when it does. Safe to kill at any line: a delete that finds nothing is what was wanted.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client as NATS

from nodus_kit.errors import NotFound
from nodus_kit.eventing import publish_event
from nodus_kit.storing import ObjectStore
from nodus_scheduler.ranging import within_ranges
from nodus_scheduler.viewing import World
from nodus_schema.attempts import Attempt
from nodus_schema.jobs import TERMINAL_PHASES, Job
from nodus_schema.meta import parse_time


def settled(job: Job) -> bool:
    """Whether the Job has nothing to expire: not finished, or no TTL."""
    return job.status.phase not in TERMINAL_PHASES or job.spec.ttl_seconds_after_finished is None


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
