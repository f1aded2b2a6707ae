"""The Job lifecycle, level-triggered: read the Job and its Attempts, take one step, write the status.

Safe to kill at any line: an Attempt is created before its assignment is published, and every Pending
Attempt's assignment is published again on each pass (the agent is idempotent on the attempt name and
the stream drops duplicate ids), so a crash between the two writes only delays the start.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from decimal import Decimal

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import messaging
from nodus_kit.errors import AlreadyExists, NotFound
from nodus_kit.selecting import Selector
from nodus_kit.storing import ObjectStore
from nodus_scheduler.placing import NoPlacement, place, rate_ceiling_of
from nodus_schema.attempts import (
    ATTEMPT_TERMINAL,
    JOB_LABEL,
    JOB_UID_LABEL,
    Attempt,
    AttemptSpec,
    AttemptStatus,
    attempt_name,
)
from nodus_schema.catalog import Catalog
from nodus_schema.jobs import TERMINAL_PHASES, Job, JobStatus
from nodus_schema.messages import StartAttempt, StopAttempt
from nodus_schema.meta import Condition, ObjectMeta, OwnerReference, now_rfc3339, set_condition
from nodus_schema.nodes import Node
from nodus_schema.quantities import parse_duration
from nodus_schema.wire import API_VERSION

log = logging.getLogger(__name__)
DEFAULT_BACKOFF_LIMIT = 6
DEFAULT_MAX_ATTEMPTS = 3
# Even with no event, look at every unfinished Job this often (a safety net, not the trigger).
RECHECK_S = 10.0


@dataclass
class View:
    """What the Attempts of one Job say, index by index."""

    succeeded: dict[int, Attempt] = field(default_factory=dict)
    active: dict[int, Attempt] = field(default_factory=dict)
    failures: int = 0  # customer failures, across all indexes (backoffLimit)
    infra: dict[int, int] = field(default_factory=dict)  # infrastructure replacements per index
    tries: dict[int, int] = field(default_factory=dict)  # attempts started per index


def summarize(attempts: list[Attempt]) -> View:
    v = View()
    for a in sorted(attempts, key=lambda a: a.spec.attempt):
        i, phase = a.spec.index, a.status.phase
        v.tries[i] = max(v.tries.get(i, 0), a.spec.attempt)
        if phase == "Succeeded":
            v.succeeded[i] = a
        elif phase == "Failed":
            v.failures += 1
        elif phase == "Lost":
            v.infra[i] = v.infra.get(i, 0) + 1
        elif phase not in ATTEMPT_TERMINAL:
            v.active[i] = a
    return v


class Lifecycle:
    def __init__(self, nc: NATS, catalog: Catalog) -> None:
        self.js = nc.jetstream()
        self.jobs = ObjectStore(nc, "jobs", Job)
        self.attempts = ObjectStore(nc, "attempts", Attempt)
        self.nodes = ObjectStore(nc, "nodes", Node)
        self.catalog = catalog
        # One placement at a time: choosing a free node and claiming it (creating the Attempt) must not
        # interleave with another Job's choice, or two Jobs could take the same node.
        self._placing = asyncio.Lock()
        self.waiting: set[tuple[str, str]] = set()

    async def reconcile(self, key: tuple[str, str]) -> float | None:
        ns, name = key
        named = await self._attempts_of(ns, name)
        try:
            job = await self.jobs.get(ns, name)
        except NotFound:
            # The Job was deleted (or its Sweep was): nothing of it may keep running.
            await self._stop(named, "JobDeleted")
            self.waiting.discard(key)
            return None
        attempts = [a for a in named if a.metadata.labels.get(JOB_UID_LABEL) == job.metadata.uid]
        # Leftovers of an earlier Job of the same name: stop them, never count them.
        await self._stop([a for a in named if a not in attempts], "JobDeleted")
        if job.status.phase in TERMINAL_PHASES:
            await self._stop(attempts, "JobFinished")
            self.waiting.discard(key)
            return None
        await self._mark_lost(attempts)
        halt = self._halt_reason(job)
        if halt:
            # Cancelled, Suspended or past the deadline: what runs stops (the agent reports Stopped).
            await self._stop(attempts, halt)
        view = summarize(attempts)
        for a in view.active.values():
            if a.status.phase == "Pending":
                await self._assign(job, a)
        message = await self._step(job, view)
        view = summarize(
            [
                a
                for a in await self._attempts_of(ns, name)
                if a.metadata.labels.get(JOB_UID_LABEL) == job.metadata.uid
            ]
        )
        status = self._status(job, view, message)
        if status.phase in TERMINAL_PHASES:
            await self._stop(list(view.active.values()), status.reason or "JobFinished")
        await self._write_status(job, status)
        return None if status.phase in TERMINAL_PHASES else RECHECK_S

    async def _attempts_of(self, ns: str, name: str) -> list[Attempt]:
        page = await self.attempts.list(ns, selector=Selector.equals({JOB_LABEL: name}))
        return page.items

    async def _step(self, job: Job, view: View) -> str | None:
        """Start Attempts for indexes that need one, up to parallelism. Returns why one could not start."""
        spec = job.spec
        if self._halt_reason(job) or self._over_backoff(job, view):
            return None
        completions, parallelism = spec.completions or 1, spec.parallelism or 1
        max_attempts = (spec.recovery.max_attempts if spec.recovery else None) or DEFAULT_MAX_ATTEMPTS
        todo = [
            i
            for i in range(completions)
            if i not in view.succeeded and i not in view.active and view.infra.get(i, 0) < max_attempts
        ]
        key = (job.metadata.namespace or "", job.metadata.name or "")
        free = parallelism - len(view.active)
        if not todo or free <= 0:
            self.waiting.discard(key)
            return None
        async with self._placing:
            for index in todo[:free]:
                placed = await self._place_one(job, index, view.tries.get(index, 0) + 1)
                if placed is not None:
                    self.waiting.add(key)
                    return placed
        self.waiting.discard(key)
        return None

    async def _place_one(self, job: Job, index: int, attempt_no: int) -> str | None:
        nodes = (await self.nodes.list()).items
        busy = await self._busy_nodes()
        # A create bound to a dry-run's estimate is never placed above its rate + 10 % (ADR-031).
        choice = place(job.spec, nodes, busy, self.catalog, ceiling_micros=rate_ceiling_of(job.metadata))
        if isinstance(choice, NoPlacement):
            return choice.message
        meta = job.metadata
        attempt = Attempt(
            metadata=ObjectMeta(
                name=attempt_name(meta.name or "", meta.uid or "", index, attempt_no),
                namespace=meta.namespace,
                labels={JOB_LABEL: meta.name or "", JOB_UID_LABEL: meta.uid or ""},
                owner_references=[
                    OwnerReference(
                        api_version=API_VERSION,
                        kind="Job",
                        name=meta.name or "",
                        uid=meta.uid or "",
                        controller=True,
                    )
                ],
            ),
            spec=AttemptSpec(
                job=meta.name or "",
                index=index,
                attempt=attempt_no,
                node=choice.node.metadata.name or "",
                offering=choice.offering.id,
                region_class=choice.offering.region_class,
                rate_micros_per_hour=choice.offering.rate_micros_per_hour,
                pricebook_version=self.catalog.pricebook_version,
                gpu_variant=choice.offering.variant,
            ),
            status=AttemptStatus(phase="Pending"),
        )
        try:
            attempt = await self.attempts.create(attempt)
        except AlreadyExists:
            return None  # a previous pass created it; this pass re-publishes its assignment below
        log.info("placed", extra={"job": meta.name, "index": index, "node": attempt.spec.node})
        await self._assign(job, attempt)
        return None

    async def _busy_nodes(self) -> set[str]:
        page = await self.attempts.list()
        return {a.spec.node for a in page.items if a.status.phase not in ATTEMPT_TERMINAL}

    async def _assign(self, job: Job, attempt: Attempt) -> None:
        spec = job.spec
        left = self._deadline_left(job)
        # The agent enforces what is left of the Job's timeout on this run (the Job's clock, not the run's).
        timeout = None if left is None else max(1, math.ceil(left))
        message = StartAttempt(
            namespace=attempt.metadata.namespace or "",
            job=job.metadata.name or "",
            attempt=attempt.metadata.name or "",
            index=attempt.spec.index,
            attempt_no=attempt.spec.attempt,
            node=attempt.spec.node,
            image=spec.image,
            command=list(spec.command),
            args=list(spec.args),
            env=list(spec.env),
            working_dir=spec.working_dir,
            completions=spec.completions or 1,
            timeout_seconds=timeout,
        )
        await messaging.publish(
            self.js,
            f"nodus.assign.{attempt.spec.node}",
            message,
            msg_id=f"{attempt.metadata.namespace}/{attempt.metadata.name}:start",
        )

    async def _stop(self, attempts: list[Attempt], reason: str) -> None:
        for a in attempts:
            if a.status.phase in ATTEMPT_TERMINAL:
                continue
            stop = StopAttempt(
                namespace=a.metadata.namespace or "", attempt=a.metadata.name or "", reason=reason
            )
            await messaging.publish(
                self.js,
                f"nodus.assign.{a.spec.node}",
                stop,
                msg_id=f"{a.metadata.namespace}/{a.metadata.name}:stop",
            )

    async def _mark_lost(self, attempts: list[Attempt]) -> None:
        """Active Attempts on a node that stopped heartbeating are lost: infrastructure, not the user's."""
        from datetime import UTC, datetime

        from nodus_scheduler.placing import HEARTBEAT_GRACE
        from nodus_schema.meta import parse_time

        now = datetime.now(UTC)
        for a in attempts:
            if a.status.phase in ATTEMPT_TERMINAL:
                continue
            try:
                node = await self.nodes.get(None, a.spec.node)
                beat = node.status.last_heartbeat_time
                alive = node.status.phase == "Ready" and beat and now - parse_time(beat) <= HEARTBEAT_GRACE
            except NotFound:
                alive = False
            if not alive:
                await self.attempts.mutate(a.metadata.namespace, a.metadata.name or "", _lost)

    def _deadline_left(self, job: Job) -> float | None:
        """Seconds left of spec.timeout, counted from the Job's start (time Suspended is not excluded yet)."""
        if not job.spec.timeout:
            return None
        total = parse_duration(job.spec.timeout).total_seconds()
        if not job.status.start_time:
            return total
        from datetime import UTC, datetime

        from nodus_schema.meta import parse_time

        return total - (datetime.now(UTC) - parse_time(job.status.start_time)).total_seconds()

    def _halt_reason(self, job: Job) -> str | None:
        if job.spec.state in ("Cancelled", "Suspended"):
            return job.spec.state
        left = self._deadline_left(job)
        return "DeadlineExceeded" if left is not None and left <= 0 else None

    def _over_backoff(self, job: Job, view: View) -> bool:
        limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else DEFAULT_BACKOFF_LIMIT
        return view.failures > limit

    def _status(self, job: Job, view: View, unplaced: str | None) -> JobStatus:
        spec, old = job.spec, job.status
        completions = spec.completions or 1
        status = msgspec.structs.replace(
            old,
            active=len(view.active),
            succeeded=len(view.succeeded),
            failed=view.failures,
            attempts=sum(view.tries.values()),
            completed_indexes=compress(sorted(view.succeeded)) or None,
            observed_generation=job.metadata.generation,
        )
        if view.tries and not status.start_time:
            status = msgspec.structs.replace(status, start_time=now_rfc3339())
        phase, reason, message = self._phase(job, view, unplaced, completions)
        if phase in TERMINAL_PHASES:
            wall, units = _measures(list(view.succeeded.values()))
            status = msgspec.structs.replace(
                status,
                completion_time=old.completion_time or now_rfc3339(),
                wall_seconds=wall,
                units_per_second=units,
            )
        status = msgspec.structs.replace(status, phase=phase, reason=reason, message=message)
        cond = Condition(
            type="Complete" if phase == "Succeeded" else "Failed" if phase == "Failed" else "Running",
            status="True",
            reason=reason or phase,
            message=message,
            observed_generation=job.metadata.generation,
        )
        if phase not in ("Queued", "Pending"):
            conditions = list(old.conditions)
            set_condition(conditions, cond)
            status = msgspec.structs.replace(status, conditions=conditions)
        return status

    def _phase(
        self, job: Job, view: View, unplaced: str | None, completions: int
    ) -> tuple[str, str | None, str]:
        if job.spec.state == "Cancelled" and not view.active:
            return "Cancelled", "Cancelled", "the Job was cancelled"
        if self._halt_reason(job) == "DeadlineExceeded" and not view.active:
            return "Failed", "DeadlineExceeded", f"the Job ran past its timeout of {job.spec.timeout}"
        if self._over_backoff(job, view) and not view.active:
            limit = job.spec.backoff_limit if job.spec.backoff_limit is not None else DEFAULT_BACKOFF_LIMIT
            return (
                "Failed",
                "BackoffLimitExceeded",
                (
                    f"{view.failures} failed attempts exceeded backoffLimit {limit}; "
                    "see the attempts' exit codes"
                ),
            )
        if len(view.succeeded) >= completions:
            return "Succeeded", "Completed", f"{completions}/{completions} indexes succeeded"
        max_attempts = (job.spec.recovery.max_attempts if job.spec.recovery else None) or DEFAULT_MAX_ATTEMPTS
        exhausted = [i for i, n in view.infra.items() if n >= max_attempts and i not in view.succeeded]
        if exhausted and not view.active:
            return (
                "Failed",
                "CapacityLost",
                (f"index {exhausted[0]} lost its capacity {max_attempts} times (recovery.maxAttempts)"),
            )
        if job.spec.state == "Suspended" and not view.active:
            return "Suspended", "Suspended", "the Job is suspended"
        if any(a.status.phase == "Running" for a in view.active.values()):
            return (
                "Running",
                None,
                f"{len(view.active)} running, {len(view.succeeded)}/{completions} succeeded",
            )
        if view.active:
            return "Provisioning", None, f"{len(view.active)} starting"
        return "Queued", "Unschedulable" if unplaced else None, unplaced or "waiting for capacity"

    async def _write_status(self, job: Job, status: JobStatus) -> None:
        def change(current: Job) -> Job | None:
            # Keep billing's field: the cost is billing's to write, never the scheduler's.
            merged = msgspec.structs.replace(status, cost=current.status.cost)
            if merged == current.status:
                return None
            return msgspec.structs.replace(current, status=merged)

        try:
            await self.jobs.mutate(job.metadata.namespace, job.metadata.name or "", change)
        except NotFound:
            pass


def _lost(a: Attempt) -> Attempt | None:
    if a.status.phase in ATTEMPT_TERMINAL:
        return None
    return msgspec.structs.replace(
        a,
        status=msgspec.structs.replace(
            a.status,
            phase="Lost",
            reason="NodeLost",
            finish_time=now_rfc3339(),
            message=f"node {a.spec.node} stopped heartbeating",
        ),
    )


def _measures(succeeded: list[Attempt]) -> tuple[int | None, str | None]:
    """Wall seconds (the longest index: they run side by side) and mean throughput of the indexes."""
    walls = [a.status.wall_millis for a in succeeded if a.status.wall_millis is not None]
    units = [Decimal(a.status.units_per_second) for a in succeeded if a.status.units_per_second]
    wall = (max(walls) + 500) // 1000 if walls else None
    mean = str((sum(units, Decimal(0)) / len(units)).normalize()) if units else None
    return wall, mean


def compress(indexes: list[int]) -> str:
    """Kubernetes' completedIndexes form: [0,1,2,3,5] -> "0-3,5"."""
    out: list[str] = []
    start = prev = None
    for i in indexes:
        if start is None:
            start = prev = i
        elif prev is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
