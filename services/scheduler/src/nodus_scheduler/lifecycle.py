"""The Job lifecycle, level-triggered: read the Job and its Attempts, decide, write the status.

The decisions are pure functions of the Job and its Attempts (:mod:`nodus_scheduler.ruling`), a run's
StartAttempt is built by :mod:`nodus_scheduler.assigning`; this module reads, asks them, and writes. Each
reconcile reads the Job and its Attempts from the informers (:mod:`nodus_scheduler.viewing`), then:

1. stops what must not run (a deleted Job's runs, leftovers of an earlier Job of the same name, a finished
   Job's, a cancelled, suspended or timed-out Job's; a Checkpointed Job suspends with a checkpoint);
2. marks Lost the runs of nodes that stopped heartbeating (infrastructure, never the user's failure; the
   node monitor, :mod:`nodus_scheduler.monitoring`, queues their Jobs when it finds a node silent);
3. publishes again the assignment of a run still Pending, every :data:`REASSIGN_AFTER_S` (a crash between
   creating an Attempt and publishing its assignment only delays the start), resting a large Job between
   passes (:mod:`nodus_scheduler.pacing`);
4. tells the binder (:mod:`nodus_scheduler.binding`) which indexes want a run now, in its line;
5. writes the status: counters, phase and reason, conditions, and an event on every transition.

Safe to kill at any line: every decision is made again from the store on the next pass, and every write
is a compare-and-set or carries a deterministic id. The rules (ADR-0015):

* **Indexes**: each index succeeds exactly once; ``parallelism`` indexes run at once.
* **backoffLimit** counts customer failures (non-zero exit, OOM) across all indexes.
* **recovery.maxAttempts** counts, per index, the infrastructure losses in a row without progress: a run
  that lasted ``minProgressDuration`` before it was lost made progress, and the count starts again.
* **onInterruption: Fail** fails the Job on the first lost run instead of replacing it.
* **continuity**: a replacement (or a resumed run) of a Checkpointed or Restartable Job names the run it
  continues (``restoreFrom``); an Ephemeral Job starts over.
* **timeout** counts from the first Provisioning, without the time Suspended: on resume, as Kubernetes
  does, ``status.startTime`` moves forward by the time spent suspended.
* **queueTimeout**: a Job that waited that long for capacity with nothing running fails with
  CapacityUnavailable ("0s" waits for ever).
* **ttlSecondsAfterFinished** deletes the Job and its Attempts that long after it finished: the TTL
  controller's (:mod:`nodus_scheduler.expiring`), not this one's.

A distributed Job runs each index as a gang (ADR-0016, :mod:`nodus_scheduler.ganging`): N member Attempts
placed together or not at all, in one network class; torn down and placed again when they do not all start
within ``startupTimeout`` (up to ``maxAssemblyRetries`` times, then AssemblyTimeout); stopped together and
started again as a new gang attempt when any member fails (``backoffLimit``) or is lost
(``recovery.maxAttempts``: gangs count restarts). The rules above then count gang attempts, not members.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit import messaging, tracing
from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.errors import NotFound, TemporaryError
from nodus_kit.eventing import publish_event
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore
from nodus_scheduler.assigning import start_message, with_gang
from nodus_scheduler.binding import Binder, Choice, Demand
from nodus_scheduler.capacity import UNREACHABLE_GRACE, CapacityIndex
from nodus_scheduler.cataloging import catalog_for, pin_pricebook
from nodus_scheduler.funding import FundingView
from nodus_scheduler.ganging import (
    ASSEMBLY_TIMEOUT,
    GANG_INCOMPLETE,
    GangAttempt,
    Shape,
    choose_gang,
    gang_attempts,
    shape_of,
)
from nodus_scheduler.pacing import Pacing
from nodus_scheduler.placing import NoPlacement, Placement, place_in, rate_ceiling_of
from nodus_scheduler.ranging import within_ranges
from nodus_scheduler.ruling import (
    REASSIGN_AFTER_S,
    View,
    continuity_of,
    deadline_left,
    explain_placement,
    gang_check,
    halt_reason,
    job_status,
    lost_on,
    min_progress_of,
    next_check,
    previous_run,
    summarize,
    summarize_gangs,
    wanted_runs,
)
from nodus_scheduler.viewing import JobKey, World
from nodus_scheduler.warming import WarmWindows
from nodus_schema.attempts import (
    ATTEMPT_TERMINAL,
    GANG_LABEL,
    JOB_LABEL,
    JOB_UID_LABEL,
    RANK_LABEL,
    Attempt,
    AttemptPlacement,
    AttemptSpec,
    AttemptStatus,
    attempt_name,
    member_name,
)
from nodus_schema.billing import FUNDING_REASONS
from nodus_schema.catalog import Catalog
from nodus_schema.jobs import TERMINAL_PHASES, Job, JobStatus
from nodus_schema.messages import StopAttempt, StopReason
from nodus_schema.meta import (
    ObjectMeta,
    OwnerReference,
    now_rfc3339,
    parse_time,
)
from nodus_schema.nodes import Node
from nodus_schema.wire import API_VERSION

__all__ = ["JOB_LABEL", "Lifecycle"]

log = logging.getLogger(__name__)
SYNC_WAIT_S: Final = 10.0
"""How long a reconcile waits for the informers' first lists before it is retried later."""


# ---------------------------------------------------------------------------------------------------------
# The controller's reconcile
# ---------------------------------------------------------------------------------------------------------


class Lifecycle:
    """The Job lifecycle controller's reconcile, and the binder it feeds.

    ``world``: the scheduler's informers (its reads); ``requeue(key, delay_s)``: look at a Job again (the
    binder's verdicts and billing's retries come from outside the informers)."""

    def __init__(
        self,
        nc: NATS,
        catalog: Catalog,
        world: World,
        *,
        requeue: Callable[[JobKey, float], None] = lambda key, delay_s: None,
        gone_after: timedelta = UNREACHABLE_GRACE,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.jobs = ObjectStore(nc, "jobs", Job)
        self.attempts = ObjectStore(nc, "attempts", Attempt)
        self.catalog = catalog
        self.world = world
        self.requeue = requeue
        # Free and busy nodes by offering group, kept in step with the informers (see _on_attempt and
        # _on_node): placement judges each group once instead of every node (capacity.py, ADR-0014); gone
        # nodes leave (ADR-0035).
        self.capacity = CapacityIndex(unreachable=gone_after)
        self.funding = FundingView(nc, world.funding, requeue=requeue)
        self.binder = Binder(
            world,
            self.attempts,
            self._choose,
            self._assign,
            release=self._release,
            abandon=self._abandon,
            fund=self._fund,
            on_bound=lambda key: requeue(key, 0.0),
        )
        # Nodes kept warm for a project after its runs (scaledownWindow, issue #21): warming.py.
        self.warm = WarmWindows(world, self.capacity, self.attempts, kick=self.binder.kick)
        world.attempts.add_handler(self._on_attempt)
        world.nodes.add_handler(self._on_node)
        self._tasks: list[asyncio.Task[None]] = []
        # When this process last sent each Pending run's StartAttempt: a stuck run is sent again every
        # REASSIGN_AFTER_S, not on every pass of its Job (a restart sends stuck runs at once).
        self._sent: dict[tuple[str, str], float] = {}
        self.pacing = Pacing()

    @property
    def waiting(self) -> set[JobKey]:
        """Jobs in the binder's line (tests and the logs read it)."""
        return set(self.binder.line)

    # -- running -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start leading: the binder (the informers are the service's, on every replica)."""
        self._tasks = [
            asyncio.create_task(self.binder.run(), name="scheduler:binder"),
            asyncio.create_task(self.warm.run(), name="scheduler:warm-windows"),
        ]

    async def stop_leading(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        self.binder.line.clear()  # the next leader (maybe this one again) builds the line anew

    def _on_attempt(self, event: Event[Attempt]) -> None:
        a = event.object
        if event.type == "DELETED" or a.status.phase != "Pending":
            self._sent.pop((a.metadata.namespace or "", a.metadata.name or ""), None)
        self._release(a.spec.node)

    def _on_node(self, event: Event[Node]) -> None:
        name = event.object.metadata.name or ""
        if self.capacity.follow(name, self.world.node(name)):  # waiting Jobs may fit now
            self.binder.kick()
            self.warm.wake()  # a node kept warm that is no longer Ready ends its window

    def _release(self, node: str) -> None:
        """The node is as busy as the store says: busy while it has an unfinished Attempt."""
        if self.world.active_on(node) > 0:
            self.capacity.mark_busy(node)
        else:
            self.capacity.mark_free(node)
        self.warm.refresh(node)  # and kept warm for a project while a finished run's window is open

    def settled(self, job: Job) -> bool:
        """A Job with nothing to do until it changes: finished, or suspended (by its spec or billing's block),
        with no run still going. The controller's resync skips it, so stored history costs nothing."""
        phase = job.status.phase
        if phase not in TERMINAL_PHASES and not (
            phase == "Suspended" and (job.spec.state == "Suspended" or self.funding.blocked(job) is not None)
        ):
            return False
        key = (job.metadata.namespace or "", job.metadata.name or "")
        return all(a.status.phase in ATTEMPT_TERMINAL for a in self.world.attempts_of(key))

    # -- reconcile -----------------------------------------------------------------------------------
    async def reconcile(self, key: tuple[str, str]) -> float | None:
        if not self.world.synced and not await self.world.wait_synced(SYNC_WAIT_S):
            raise TemporaryError("the informers have not listed the store yet", delay=1.0)
        named = self.world.attempts_of(key)
        job = self.world.jobs.get(*key)
        if job is None and any(a.status.phase not in ATTEMPT_TERMINAL for a in named):
            # Deleted, or not shown yet: after a lost server the view of Jobs may resume after the view of
            # Attempts, and a Job's runs must never be stopped for a lag.
            job = await self.world.jobs.confirm(*key)
        if job is None:
            # The Job was deleted (or its Sweep was): nothing of it may keep running.
            self.pacing.forget(key)
            await self._stop(named, StopReason.JOB_DELETED)
            self.binder.drop(key)
            self.warm.wake()  # a window its runs kept ends with it
            return None
        if job.status.phase in TERMINAL_PHASES:
            self.pacing.forget(key)  # a finished Job's pass is short, and it is seldom passed again
        elif (wait := self.pacing.wait(key)) > 0:
            return wait  # a large Job rests between passes (pacing.py): this event is taken then
        else:
            self.pacing.passed(key, len(named))
        # A child of the Job's create, whatever event or resync brought it here (ADR-0032).
        with tracing.object_span("reconcile Job", job):
            return await self._reconcile(key, job, named)

    async def _reconcile(self, key: tuple[str, str], job: Job, named: list[Attempt]) -> float | None:
        # A value stored before admission checked ranges (a ttl of 2^63, a timeout past what a timedelta
        # holds) would fail every reconcile of the Job for ever: read it within the ranges (ranging.py).
        job = within_ranges(job)
        uid = job.metadata.uid
        attempts: list[Attempt] = []
        leftovers: list[Attempt] = []  # of an earlier Job of the same name: stop them, never count them
        for a in named:  # one pass: a large Job's reconcile reads every Attempt it has
            (attempts if a.metadata.labels.get(JOB_UID_LABEL) == uid else leftovers).append(a)
        if leftovers:
            await self._stop(leftovers, StopReason.JOB_DELETED)
        if job.status.phase in TERMINAL_PHASES:
            self.binder.drop(key)
            await self._stop(attempts, StopReason.JOB_FINISHED)
            return None  # ttlSecondsAfterFinished is the TTL controller's (expiring.py)
        now = datetime.now(UTC)
        if await self._mark_lost(attempts, now):
            attempts = [a for a in self.world.attempts_of(key) if a.metadata.labels.get(JOB_UID_LABEL) == uid]
        block = self.funding.blocked(job)
        halt = halt_reason(job, now, block)
        if halt:
            suspends = halt == "Suspended" or halt in FUNDING_REASONS
            await self._stop(attempts, halt, checkpoint=suspends and continuity_of(job) == "Checkpointed")
        shape = shape_of(job.spec)
        if shape is None:
            view = summarize(attempts, min_progress_of(job))
        else:
            if await self._tend_gangs(job, shape, attempts, now, halted=halt is not None):
                attempts = [
                    a for a in self.world.attempts_of(key) if a.metadata.labels.get(JOB_UID_LABEL) == uid
                ]
            view = summarize_gangs(attempts, shape, min_progress_of(job))
        await self._reassign_stuck(job, view, now)
        runs = wanted_runs(job, view, halt)
        self.binder.want(key, Demand(job, runs))
        status = job_status(
            job, view, self.binder.unplaced.get(key) if runs else None, now, self.catalog, block
        )
        await self._write_status(job, status)
        return next_check(job, status, now, gang_check(view, now))

    async def _reassign_stuck(self, job: Job, view: View, now: datetime) -> None:
        stuck = list(view.active.values())
        if view.gang is not None:
            # Every Pending member of a whole, healthy gang attempt; never one of an incomplete or broken one.
            shape, busy = view.gang, self.binder.in_flight
            stuck = [
                a
                for g in view.gangs
                if g.active and g.complete and g.trouble(now, shape, busy) is None
                for a in g.ranked
            ]
        clock = time.monotonic()
        for a in stuck:
            created = a.metadata.creation_timestamp
            sent = self._sent.get((a.metadata.namespace or "", a.metadata.name or ""))
            if (
                a.status.phase == "Pending"
                and created
                and (now - parse_time(created)).total_seconds() >= REASSIGN_AFTER_S
                and (sent is None or clock - sent >= REASSIGN_AFTER_S)
            ):
                await self._assign(job, a)

    # -- gangs ---------------------------------------------------------------------------------------
    async def _tend_gangs(
        self, job: Job, shape: Shape, attempts: list[Attempt], now: datetime, *, halted: bool = False
    ) -> bool:
        """Tear down every gang attempt that cannot go on (ADR-0016): incomplete ones are finished here
        (never assigned, nothing runs); timed-out assemblies are marked AssemblyTimeout, then stopped; a gang
        with a failed, lost or stopped member has the others stopped (GangRestart). The next gang attempt
        starts once every member has finished. A halted Job (suspended, cancelled, past its timeout) has had
        every member stopped already: only incomplete gang attempts are left to finish. Whether the store
        changed."""
        changed = False
        for g in gang_attempts(attempts, shape.nodes):
            trouble = g.trouble(now, shape, self.binder.in_flight)
            if trouble is None or (halted and trouble != GANG_INCOMPLETE):
                continue
            live = [a for a in g.ranked if a.status.phase not in ATTEMPT_TERMINAL]
            if trouble == GANG_INCOMPLETE:
                for a in live:
                    await self._abandon(a)
                changed = True
                message = f"gang attempt {g.name}: {len(g.members)}/{g.size} members were created; abandoned"
            elif trouble == ASSEMBLY_TIMEOUT:
                for a in live:
                    await self._end(a, ASSEMBLY_TIMEOUT)
                changed = True
                await self._stop(live, StopReason.ASSEMBLY_TIMEOUT)
                message = (
                    f"gang attempt {g.name}: {g.started}/{g.size} members started within startupTimeout "
                    f"{shape.startup_timeout}; stopping it to place it again"
                )
            else:
                await self._stop(live, StopReason.GANG_RESTART)
                message = f"gang attempt {g.name}: {g.describe()}; stopping the gang to start it again"
            await publish_event(
                self.nc, job, trouble, message, severity="Warning", once=f"{g.name}:{trouble}"
            )
        return changed

    async def _end(self, a: Attempt, why: str) -> None:
        """Mark a member with why its gang attempt ends (before it is told to stop), if it still runs."""

        def change(current: Attempt) -> Attempt | None:
            if current.status.phase in ATTEMPT_TERMINAL or current.status.ended_by:
                return None
            return msgspec.structs.replace(
                current, status=msgspec.structs.replace(current.status, ended_by=why)
            )

        with contextlib.suppress(NotFound):
            self.world.attempts.apply(
                await self.attempts.mutate(a.metadata.namespace, a.metadata.name or "", change)
            )

    async def _abandon(self, a: Attempt) -> None:
        """Finish a member of a gang attempt that was never created whole: it was never assigned, so it
        never ran, and the scheduler records it Stopped itself (the binder and _tend_gangs call this)."""

        def change(current: Attempt) -> Attempt | None:
            if current.status.phase in ATTEMPT_TERMINAL:
                return None
            return msgspec.structs.replace(
                current,
                status=msgspec.structs.replace(
                    current.status,
                    phase="Stopped",
                    reason=GANG_INCOMPLETE,
                    ended_by=GANG_INCOMPLETE,
                    finish_time=now_rfc3339(),
                    message="the other members of its gang attempt were never created; it never ran",
                ),
            )

        with contextlib.suppress(NotFound):
            self.world.attempts.apply(
                await self.attempts.mutate(a.metadata.namespace, a.metadata.name or "", change)
            )

    def _gang_of(self, job: Job, index: int, number: int) -> GangAttempt | None:
        """Gang attempt ``number`` of ``index``, as the informer holds it."""
        meta = job.metadata
        key = (meta.namespace or "", meta.name or "")
        mine = [
            a
            for a in self.world.attempts_of(key)
            if a.metadata.labels.get(JOB_UID_LABEL) == meta.uid and a.spec.index == index
        ]
        shape = shape_of(job.spec)
        found = [g for g in gang_attempts(mine, shape.nodes if shape else 1) if g.number == number]
        return found[0] if found else None

    def _gang_restore(self, job: Job, attempt: Attempt) -> str | None:
        """The member whose state this one restores: the same rank of the latest earlier gang attempt of its
        index that assembled (a gang that never assembled never took a checkpoint)."""
        meta = job.metadata
        key = (meta.namespace or "", meta.name or "")
        mine = [
            a
            for a in self.world.attempts_of(key)
            if a.metadata.labels.get(JOB_UID_LABEL) == meta.uid and a.spec.index == attempt.spec.index
        ]
        earlier = [
            g for g in gang_attempts(mine, attempt.spec.gang_size or 1) if g.number < attempt.spec.attempt
        ]
        for g in reversed(earlier):
            if g.assembled:
                member = g.members.get(attempt.spec.rank or 0)
                return member.metadata.name if member is not None else None
        return None

    # -- placing (called by the binder) ----------------------------------------------------------------
    def _choose(self, job: Job, index: int, attempt_no: int) -> Choice | str:
        # At the price book the Job was admitted under; a create bound to a dry-run's estimate is never
        # placed above its rate + 10 % (ADR-031).
        book = catalog_for(job, self.catalog)
        shape = shape_of(job.spec)
        if shape is not None:
            return self._choose_gang(job, shape, book, index, attempt_no)
        choice = place_in(
            self.capacity,
            job.spec,
            book,
            ceiling_micros=rate_ceiling_of(job.metadata),
            warm_for=job.metadata.namespace or "",
        )
        if isinstance(choice, NoPlacement):
            return choice.message
        self.capacity.mark_busy(choice.node.metadata.name or "")  # reserved until created or released
        meta = job.metadata
        previous = self.world.attempt(
            meta.namespace, attempt_name(meta.name or "", meta.uid or "", index, attempt_no - 1)
        )
        name = attempt_name(meta.name or "", meta.uid or "", index, attempt_no)
        return Choice(
            self._new_attempt(
                job, index, attempt_no, choice, name, explain_placement(choice.explain, previous)
            )
        )

    def _choose_gang(
        self, job: Job, shape: Shape, book: Catalog, index: int, attempt_no: int
    ) -> Choice | str:
        """Every member of gang attempt ``attempt_no`` of ``index``, their nodes reserved (ganging.py)."""
        picked = choose_gang(
            self.capacity,
            job.spec,
            book,
            shape,
            release=self._release,
            ceiling_micros=rate_ceiling_of(job.metadata),
        )
        if isinstance(picked, str):
            return picked
        meta = job.metadata
        gang = attempt_name(meta.name or "", meta.uid or "", index, attempt_no)
        master = picked[0].node.metadata.name or ""
        previous = self._gang_of(job, index, attempt_no - 1) if attempt_no > 1 else None
        replaces = f"; replaces {previous.name} ({previous.verdict() or 'unfinished'})" if previous else ""
        members = tuple(
            self._new_attempt(
                job,
                index,
                attempt_no,
                p,
                member_name(meta.name or "", meta.uid or "", index, attempt_no, rank),
                f"gang {gang} member {rank} of {len(picked)} ({shape.network}, master {master}): "
                f"{p.explain}{replaces}",
                labels={GANG_LABEL: gang, RANK_LABEL: str(rank)},
                rank=rank,
                gang_size=len(picked),
                master_node=master,
            )
            for rank, p in enumerate(picked)
        )
        return Choice(members[0], members=members)

    def _new_attempt(
        self,
        job: Job,
        index: int,
        attempt_no: int,
        choice: Placement,
        name: str,
        explain: str,
        *,
        labels: dict[str, str] | None = None,
        rank: int | None = None,
        gang_size: int | None = None,
        master_node: str | None = None,
    ) -> Attempt:
        meta, offering = job.metadata, choice.offering
        return Attempt(
            metadata=ObjectMeta(
                name=name,
                namespace=meta.namespace,
                labels={JOB_LABEL: meta.name or "", JOB_UID_LABEL: meta.uid or "", **(labels or {})},
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
                offering=offering.id,
                region_class=offering.region_class,
                rate_micros_per_hour=choice.rate_micros_per_hour,
                pricebook_version=choice.pricebook_version,
                gpu_variant=offering.variant,
                rank=rank,
                gang_size=gang_size,
                master_node=master_node,
                warm_from=choice.warm_from,
            ),
            status=AttemptStatus(
                phase="Pending",
                placement=AttemptPlacement(
                    offering=offering.id,
                    region_class=offering.region_class,
                    interruptible=choice.interruptible,
                    explain=explain,
                    warm_reuse=choice.warm_from is not None,
                ),
            ),
        )

    async def _fund(self, job: Job, attempts: tuple[Attempt, ...]) -> str | None:
        """Billing's hold, asked in the Job's trace (the binder's pass serves every Job at once)."""
        with tracing.object_span("fund", job, {"nodus.attempt": attempts[0].metadata.name}):
            return await self.funding.hold(job, attempts)

    async def _assign(self, job: Job, attempt: Attempt) -> None:
        """Publish the run's StartAttempt in the Job's trace: the agent's spans and reports join it."""
        attributes = {
            "nodus.attempt": attempt.metadata.name,
            "nodus.index": attempt.spec.index,
            "nodus.node": attempt.spec.node,
        }
        with tracing.object_span("assign", job, attributes):
            await self._publish_start(job, attempt)
        self._sent[(attempt.metadata.namespace or "", attempt.metadata.name or "")] = time.monotonic()

    async def _publish_start(self, job: Job, attempt: Attempt) -> None:
        left = deadline_left(job, datetime.now(UTC))
        # The agent enforces what is left of the Job's timeout on this run (the Job's clock, not the run's).
        timeout = None if left is None else max(1, math.ceil(left))
        continuity = continuity_of(job)
        gang = attempt.spec.rank is not None
        previous = (
            self._gang_restore(job, attempt) if gang else previous_run(self.world.attempts.get, attempt)
        )
        restore = previous if continuity in ("Checkpointed", "Restartable") else None
        message = start_message(job, attempt, timeout=timeout, continuity=continuity, restore_from=restore)
        if gang:
            message = with_gang(job, attempt, message, self.catalog)
        await messaging.publish(
            self.js,
            f"nodus.assign.{attempt.spec.node}",
            message,
            msg_id=f"{attempt.metadata.namespace}/{attempt.metadata.name}:start",
        )
        if gang:
            await publish_event(
                self.nc,
                attempt,
                "Placed",
                f"index {attempt.spec.index} gang attempt {attempt.spec.attempt} member {attempt.spec.rank} "
                f"of {attempt.spec.gang_size} placed on {attempt.spec.node} ({attempt.spec.offering})",
            )
        elif attempt.spec.attempt == 1 or previous is not None:
            await publish_event(
                self.nc,
                attempt,
                "Placed",
                f"index {attempt.spec.index} run {attempt.spec.attempt} placed on {attempt.spec.node} "
                f"({attempt.spec.offering})",
            )

    async def _stop(self, attempts: list[Attempt], reason: StopReason, *, checkpoint: bool = False) -> None:
        for a in attempts:
            if a.status.phase in ATTEMPT_TERMINAL:
                continue
            stop = StopAttempt(
                namespace=a.metadata.namespace or "",
                attempt=a.metadata.name or "",
                reason=reason,
                checkpoint=checkpoint,
            )
            await messaging.publish(
                self.js,
                f"nodus.assign.{a.spec.node}",
                stop,
                msg_id=f"{a.metadata.namespace}/{a.metadata.name}:stop",
            )

    async def _mark_lost(self, attempts: list[Attempt], now: datetime) -> bool:
        """Active Attempts on a node that stopped heartbeating are lost: infrastructure, not the user's.
        The node is told to stop them too, in case it comes back. Whether any was marked."""
        marked = False
        for a in attempts:
            if a.status.phase in ATTEMPT_TERMINAL:
                continue
            node = self.world.node(a.spec.node)
            if node is not None and not self.world.liveness.lost(node, now):
                continue  # alive, or silent while this replica was not listening (the monitor looks again)
            try:
                lost = await self.attempts.mutate(a.metadata.namespace, a.metadata.name or "", lost_on(node))
            except NotFound:
                continue
            self.world.attempts.apply(lost)
            marked = True
            await self._stop([a], StopReason.NODE_LOST)
            await publish_event(
                self.nc, lost, "NodeLost", f"node {a.spec.node} stopped heartbeating", severity="Warning"
            )
        return marked

    # -- status --------------------------------------------------------------------------------------
    async def _write_status(self, job: Job, status: JobStatus) -> None:
        old = job.status
        if (old.phase, old.reason) != (status.phase, status.reason):
            severity = "Warning" if status.phase == "Failed" or status.reason == "Unschedulable" else "Normal"
            await publish_event(
                self.nc,
                job,
                status.reason or status.phase or "",
                status.message or "",
                severity=severity,
                phase=status.phase,
                once=f"{old.phase}>{status.phase}:{status.reason}:{status.attempts}",
            )

        def change(current: Job) -> Job | None:
            if current.metadata.uid != job.metadata.uid:
                return None  # deleted and created again since the read: that Job is another's to judge
            # Keep billing's fields: the cost and recovery are billing's to write, never the scheduler's.
            # The estimate is the gateway's, but for the price book version pinned when it had none.
            estimate = pin_pricebook(current.status, self.catalog).estimate
            merged = msgspec.structs.replace(
                status, cost=current.status.cost, recovery=current.status.recovery, estimate=estimate
            )
            if merged == current.status:
                return None
            return msgspec.structs.replace(current, status=merged)

        if change(job) is None:
            # The informer's copy already says it: no read, no write. (Were the store newer, its event
            # would bring the Job back here to be judged against that revision.)
            return
        ns, name = job.metadata.namespace, job.metadata.name or ""
        with contextlib.suppress(NotFound):  # over the informer's copy as stored (not the ranged ``job``)
            seen = self.world.jobs.get(ns or "", name)
            self.world.jobs.apply(await self.jobs.mutate(ns, name, change, seen=seen))
