"""Binding: the line of Jobs waiting for capacity, and the one task that gives them nodes, in order.

The lifecycle decides *what* a Job needs (which indexes want a run now, :class:`Demand`); the binder
decides *where*, for every waiting Job at once, in the order of the line (:mod:`nodus_scheduler.ordering`):
the order the Jobs joined it (creation time, then uid) across projects, earliest ``completeByTime`` first
among the places a project and profile already hold. A Job that cannot be placed does not hold the line:
the next one may fit capacity it cannot use (Kubernetes' scheduler does the same). A suspended Job leaves
the line and comes back to its old place when resumed, since its place is its creation time.

Binding one index is: choose a node from the capacity index, reserve it there, have billing fund it (a
hold named after the Attempt, :mod:`nodus_scheduler.funding`), create the Attempt
(compare-and-set on a deterministic name), then publish its assignment. A pass chooses up to
:data:`BATCH` Attempts before it writes, then writes their Attempts together and their assignments
together: the choices are in memory (reserved nodes are busy for the next choice), the writes overlap.

A gang (a distributed Job, ADR-0016) binds all or nothing: its choice reserves every member's node at
once, and its members are assigned only once every one of them was created. If one create fails, the
members that were created are abandoned (finished by the lifecycle, never assigned) and every node is
released; a crash between the creates leaves an incomplete gang attempt the lifecycle abandons too.

Safe to kill at any line: an Attempt is created before its assignment is published, and the lifecycle
publishes the assignment of any Attempt still Pending again (the agent and the stream's duplicate window
drop repeats); a reservation is memory only, so it dies with the process and its node is free again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final

from nodus_kit import measuring
from nodus_kit.errors import AlreadyExists
from nodus_kit.storing import ObjectStore
from nodus_scheduler.ordering import Place, in_line, place_of
from nodus_scheduler.viewing import JobKey, World
from nodus_schema.attempts import GANG_LABEL, Attempt
from nodus_schema.jobs import Job

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Indexes chosen before their Attempts are written together."""
WRITES_IN_FLIGHT: Final = 4
"""Batches being written at once (see Binder.bind_pass)."""


@dataclass
class Demand:
    """What one Job wants now: runs for these (index, attempt number) pairs, in this order."""

    job: Job
    runs: list[tuple[int, int]]

    @cached_property
    def place(self) -> Place:
        """Its place, group and deadline (:mod:`nodus_scheduler.ordering`), worked out once per Demand."""
        return place_of(self.job)


@dataclass(frozen=True, slots=True)
class Choice:
    """A node chosen for one run: the Attempt to create (not yet stored); for a gang, every member's."""

    attempt: Attempt
    members: tuple[Attempt, ...] = ()
    """A gang's member Attempts, rank 0 (``attempt``) first: created all, or none assigned."""

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        return self.members or (self.attempt,)


# choose(job, index, attempt_no) -> the Attempt(s) to create (their nodes now reserved), or why none fits
Chooser = Callable[[Job, int, int], "Choice | str"]
Assigner = Callable[[Job, Attempt], Awaitable[None]]
# release(node): a reserved node whose Attempt was not created is as busy as the store says again
Releaser = Callable[[str], None]
# abandon(attempt): a created member of a gang whose other members were not: finish it, never assign it
Abandoner = Callable[[Attempt], Awaitable[None]]
# fund(job, attempts): billing's hold for each run before it is created; None, or why it is not funded
Funder = Callable[[Job, tuple[Attempt, ...]], Awaitable[str | None]]
Unit = tuple[JobKey, Job, tuple[Attempt, ...]]
"""What one choice binds: a Job's one run, or every member of one gang attempt."""


async def _keep(_: Attempt) -> None:
    return None


async def _free(_: Job, __: tuple[Attempt, ...]) -> str | None:
    return None


@dataclass
class Binder:
    world: World
    attempts: ObjectStore[Attempt]
    choose: Chooser
    assign: Assigner
    release: Releaser = lambda node: None
    abandon: Abandoner = _keep
    fund: Funder = _free
    on_bound: Callable[[JobKey], None] = lambda key: None
    """Called for each Job that got runs (its status changes) or whose reason for waiting changed."""
    line: dict[JobKey, Demand] = field(default_factory=dict)
    unplaced: dict[JobKey, str] = field(default_factory=dict)
    """Why each waiting Job's next run has no node, as of the last pass."""
    bound: int = 0
    """Runs bound since start (for the benchmark and the logs)."""
    in_flight: set[str] = field(default_factory=set)
    """Gang attempts whose members are being created now (the lifecycle leaves them alone meanwhile)."""

    def __post_init__(self) -> None:
        self._kick = asyncio.Event()

    # -- the line ------------------------------------------------------------------------------------
    def want(self, key: JobKey, demand: Demand) -> None:
        """Put (or update) a Job in the line; an empty demand takes it out."""
        if not demand.runs:
            self.drop(key)
            return
        self.line[key] = demand
        self.kick()

    def drop(self, key: JobKey) -> None:
        self.line.pop(key, None)
        self.unplaced.pop(key, None)

    def kick(self) -> None:
        """Capacity or demand changed: run a pass soon (passes coalesce)."""
        self._kick.set()

    # -- passes --------------------------------------------------------------------------------------
    async def run(self) -> None:
        while not await self.world.wait_synced(60.0):
            log.warning("binder waiting for the informers' first lists")
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self.bind_pass()
            except Exception:
                log.exception("binding pass failed; the next kick tries again")

    async def bind_pass(self) -> int:
        """Bind what fits, for the whole line; the number of runs bound.

        Up to :data:`WRITES_IN_FLIGHT` batches are written at once: the next batch is chosen while the
        last ones wait for their acknowledgements (each write waits for the store's fsync), which is safe
        because every chosen node stays reserved until its Attempt is stored or released."""
        total = 0
        writing: set[asyncio.Task[int]] = set()
        try:
            while True:
                chosen = self._choose_batch()
                if not chosen:
                    break
                writing.add(asyncio.create_task(self._write(chosen)))
                if len(writing) >= WRITES_IN_FLIGHT:
                    done, writing = await asyncio.wait(writing, return_when=asyncio.FIRST_COMPLETED)
                    total += sum(t.result() for t in done)
            return total + sum(await asyncio.gather(*writing))
        finally:
            for task in writing:  # cancelled mid-pass (the leader stops): do not leave writers behind
                task.cancel()

    def _choose_batch(self) -> list[Unit]:
        chosen: list[Unit] = []
        n = 0
        for key in in_line((k, d.place) for k, d in self.line.items()):
            demand = self.line[key]
            while demand.runs and n < BATCH:
                index, attempt_no = demand.runs[0]
                choice = self.choose(demand.job, index, attempt_no)  # reserves the node(s) it chose
                if isinstance(choice, str):
                    if self.unplaced.get(key) != choice:
                        measuring.SCHEDULER_PLACEMENT_FAILURES.labels("Unschedulable").inc()
                        self.unplaced[key] = choice
                        self.on_bound(key)
                    break  # this Job waits; the next in line may fit what is left
                demand.runs.pop(0)
                chosen.append((key, demand.job, choice.attempts))
                n += len(choice.attempts)
            if not demand.runs:
                self.line.pop(key, None)
                self.unplaced.pop(key, None)
            if n >= BATCH:
                break
        return chosen

    async def _write(self, chosen: list[Unit]) -> int:
        gangs = {_gang(unit) for _, _, unit in chosen if len(unit) > 1}
        self.in_flight |= gangs
        try:
            return await self._write_units(chosen)
        finally:
            self.in_flight -= gangs

    async def _write_units(self, chosen: list[Unit]) -> int:
        chosen = await self._funded(chosen)
        flat = [a for _, _, unit in chosen for a in unit]
        created = iter(await asyncio.gather(*(self._create(a) for a in flat), return_exceptions=True))
        stored: list[Unit] = []
        for key, job, unit in chosen:
            results = [next(created) for _ in unit]
            made = [r for r in results if isinstance(r, Attempt)]
            measuring.SCHEDULER_ATTEMPTS_CREATED.inc(len(made))
            for stored_attempt in made:
                self.world.attempts.apply(
                    stored_attempt
                )  # write-through: the store's view now holds the node busy
            for attempt, result in zip(unit, results, strict=True):
                if isinstance(result, Attempt):
                    continue
                self.release(attempt.spec.node)
                if not isinstance(result, AlreadyExists):
                    log.error("could not create attempt %s: %s", attempt.metadata.name, result)
            if len(made) == len(unit):
                stored.append((key, job, tuple(made)))
                continue
            # A gang is created whole or not at all: what was created is finished, never assigned.
            for orphan in made:
                try:
                    await self.abandon(orphan)
                except Exception as e:  # the lifecycle abandons an incomplete gang attempt on its own
                    log.warning("could not abandon %s: %s", orphan.metadata.name, e)
        await asyncio.gather(
            *(self.assign(job, a) for _, job, unit in stored for a in unit), return_exceptions=True
        )
        for key in {key for key, _, _ in stored}:
            self.on_bound(key)
        bound = sum(len(unit) for _, _, unit in stored)
        self.bound += bound
        return bound

    async def _funded(self, chosen: list[Unit]) -> list[Unit]:
        """The units billing funds (a hold per run, asked before the run exists: ADR-0024); the nodes of
        the others are released and their Jobs learn why they wait."""
        answers = await asyncio.gather(
            *(self.fund(job, unit) for _, job, unit in chosen), return_exceptions=True
        )
        funded: list[Unit] = []
        for (key, job, unit), answer in zip(chosen, answers, strict=True):
            if answer is None:
                funded.append((key, job, unit))
                continue
            why = answer if isinstance(answer, str) else f"could not ask billing for a hold: {answer}"
            measuring.SCHEDULER_PLACEMENT_FAILURES.labels(
                "Unfunded" if isinstance(answer, str) else "BillingUnavailable"
            ).inc()
            for attempt in unit:
                self.release(attempt.spec.node)
            self.unplaced[key] = why
            self.on_bound(key)
        return funded

    async def _create(self, attempt: Attempt) -> Attempt:
        return await self.attempts.create(attempt)


def _gang(unit: tuple[Attempt, ...]) -> str:
    return unit[0].metadata.labels.get(GANG_LABEL, unit[0].metadata.name or "")
