"""Binding: the line of Jobs waiting for capacity, and the one task that gives them nodes, in order.

The lifecycle decides *what* a Job needs (which indexes want a run now, :class:`Demand`); the binder
decides *where*, for every waiting Job at once, in the order the Jobs joined the line (creation time, then
uid). A Job that cannot be placed does not hold the line: the next one may fit capacity it cannot use
(Kubernetes' scheduler does the same). A suspended Job leaves the line and comes back to its old place
when resumed, since its place is its creation time.

Binding one index is: choose a node from the capacity index, reserve it there, create the Attempt
(compare-and-set on a deterministic name), then publish its assignment. A pass chooses up to
:data:`BATCH` indexes before it writes, then writes their Attempts together and their assignments
together: the choices are in memory (reserved nodes are busy for the next choice), the writes overlap.

Safe to kill at any line: an Attempt is created before its assignment is published, and the lifecycle
publishes the assignment of any Attempt still Pending again (the agent and the stream's duplicate window
drop repeats); a reservation is memory only, so it dies with the process and its node is free again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from nodus_kit.errors import AlreadyExists
from nodus_kit.storing import ObjectStore
from nodus_scheduler.caching import Cache, JobKey
from nodus_schema.attempts import Attempt
from nodus_schema.jobs import Job

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Indexes chosen before their Attempts are written together."""


@dataclass
class Demand:
    """What one Job wants now: runs for these (index, attempt number) pairs, in this order."""

    job: Job
    runs: list[tuple[int, int]]

    @property
    def place_in_line(self) -> tuple[str, str]:
        meta = self.job.metadata
        return (meta.creation_timestamp or "", meta.uid or "")


@dataclass(frozen=True, slots=True)
class Choice:
    """A node chosen for one run: the Attempt to create (not yet stored)."""

    attempt: Attempt


# choose(job, index, attempt_no) -> the Attempt to create (its node now reserved), or why no node fits
Chooser = Callable[[Job, int, int], "Choice | str"]
Assigner = Callable[[Job, Attempt], Awaitable[None]]
# release(node): a reserved node whose Attempt was not created is as busy as the store says again
Releaser = Callable[[str], None]


@dataclass
class Binder:
    cache: Cache
    attempts: ObjectStore[Attempt]
    choose: Chooser
    assign: Assigner
    release: Releaser = lambda node: None
    on_bound: Callable[[JobKey], None] = lambda key: None
    """Called for each Job that got runs (its status changes) or whose reason for waiting changed."""
    line: dict[JobKey, Demand] = field(default_factory=dict)
    unplaced: dict[JobKey, str] = field(default_factory=dict)
    """Why each waiting Job's next run has no node, as of the last pass."""
    bound: int = 0
    """Runs bound since start (for the benchmark and the logs)."""

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
        await self.cache.synced.wait()
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self.bind_pass()
            except Exception:
                log.exception("binding pass failed; the next kick tries again")

    async def bind_pass(self) -> int:
        """Bind what fits, for the whole line; the number of runs bound."""
        total = 0
        while True:
            chosen = self._choose_batch()
            if not chosen:
                return total
            total += await self._write(chosen)

    def _choose_batch(self) -> list[tuple[JobKey, Job, Attempt]]:
        chosen: list[tuple[JobKey, Job, Attempt]] = []
        for key, demand in sorted(self.line.items(), key=lambda kv: kv[1].place_in_line):
            while demand.runs and len(chosen) < BATCH:
                index, attempt_no = demand.runs[0]
                choice = self.choose(demand.job, index, attempt_no)  # reserves the node it chose
                if isinstance(choice, str):
                    if self.unplaced.get(key) != choice:
                        self.unplaced[key] = choice
                        self.on_bound(key)
                    break  # this Job waits; the next in line may fit what is left
                demand.runs.pop(0)
                chosen.append((key, demand.job, choice.attempt))
            if not demand.runs:
                self.line.pop(key, None)
                self.unplaced.pop(key, None)
            if len(chosen) >= BATCH:
                break
        return chosen

    async def _write(self, chosen: list[tuple[JobKey, Job, Attempt]]) -> int:
        created = await asyncio.gather(*(self._create(a) for _, _, a in chosen), return_exceptions=True)
        stored: list[tuple[JobKey, Job, Attempt]] = []
        for (key, job, attempt), result in zip(chosen, created, strict=True):
            if isinstance(result, Attempt):
                self.cache.apply(result)  # write-through: the store's view now holds the node busy
                stored.append((key, job, result))
                continue
            self.release(attempt.spec.node)
            if not isinstance(result, AlreadyExists):
                log.error("could not create attempt %s: %s", attempt.metadata.name, result)
        await asyncio.gather(*(self.assign(job, a) for _, job, a in stored), return_exceptions=True)
        for key in {key for key, _, _ in stored}:
            self.on_bound(key)
        self.bound += len(stored)
        return len(stored)

    async def _create(self, attempt: Attempt) -> Attempt:
        return await self.attempts.create(attempt)
