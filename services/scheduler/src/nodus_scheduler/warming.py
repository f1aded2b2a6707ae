"""Warm windows: nodes kept for a project after its runs end (``spec.scaledownWindow``, issue #21, ADR-0038).

The rules are :mod:`nodus_schema.warmth`'s; this module keeps the scheduler in step with them:

* **Opening** is the report's: the finish of a run whose Job keeps warm, on a node still Ready, is written
  with ``warmSinceMs``/``warmUntilMs`` in the same compare-and-set (:func:`finish_window`), so there is no
  moment in which the node looks free to another project.
* **Reserving** (every replica, from the informers): :meth:`WarmWindows.refresh` marks a node in the capacity
  index as kept warm for the keeper's namespace while its window is open; placement offers it to that
  project first and to nobody else (``placing.place_demand(warm_for=...)``).
* **Closing** (the leader): a window that ended, because it ran out, a run reused it, its node is no longer
  Ready or its Job was deleted, gets ``warmEndMs`` written (:meth:`WarmWindows.close_ended`). That write is
  what keeps the cost flat: only open windows stay in the informer's ``warm-on`` index, at most one per node,
  however many finished runs are stored. Billing ends a window too (the Job's cap or the project's credit);
  both write only an unset ``warmEndMs``, by compare-and-set.

Safe to kill at any line: nothing here is memory only but the marks in the capacity index, which the next
leader rebuilds from the informers; a close that did not happen is done by the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Final

from nodus_kit.errors import NotFound
from nodus_kit.storing import ObjectStore
from nodus_scheduler.capacity import CapacityIndex, Warm
from nodus_scheduler.viewing import ACTIVE_ON, WARM_ON, World
from nodus_schema.attempts import JOB_UID_LABEL, Attempt
from nodus_schema.messages import AttemptFinished
from nodus_schema.warmth import keeps_warm, scaledown_window, window_end_ms, with_end

log = logging.getLogger(__name__)

IDLE_LOOK_S: Final = 60.0
"""How often the closer looks with nothing due (a missed event is caught by then)."""

WindowOf = Callable[[Attempt, str, "str | None"], timedelta]
"""The warm window a run finishing with (phase, reason) opens (0: none)."""


def finish_window(report: AttemptFinished, window: timedelta) -> tuple[int, int] | None:
    """(warmSinceMs, warmUntilMs) of a run finishing as ``report`` says with ``window`` to keep, None for
    none. Since: the node's stop of the run (billing's stop), else the finish's time."""
    if window <= timedelta(0):
        return None
    since = report.stopped_ms if report.stopped_ms is not None else now_ms()
    return since, since + int(window.total_seconds() * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


class WarmWindows:
    """The scheduler's side of warm capacity: see the module docstring."""

    def __init__(
        self,
        world: World,
        capacity: CapacityIndex,
        attempts: ObjectStore[Attempt],
        *,
        kick: Callable[[], None] = lambda: None,
    ) -> None:
        self.world = world
        self.capacity = capacity
        self.attempts = attempts
        self.kick = kick  # the binder's: a node came free
        self._wake = asyncio.Event()

    # -- opening (the report consumer, every replica) ----------------------------------------------------
    def window_of(self, attempt: Attempt, phase: str, reason: str | None) -> timedelta:
        """The window the finishing ``attempt`` opens: its Job's scaledownWindow when the run ended with its
        node in hand (nodus_schema.warmth.keeps_warm) and the node is Ready; else none."""
        if attempt.spec.gang_size:
            return timedelta(0)  # a gang's nodes are not kept: ADR-0038
        job = self.world.jobs.get(attempt.metadata.namespace, attempt.spec.job)
        if job is None or job.metadata.uid != attempt.metadata.labels.get(JOB_UID_LABEL):
            return timedelta(0)
        if not keeps_warm(job.spec, phase, reason) or not self.capacity.is_ready(attempt.spec.node):
            return timedelta(0)
        return scaledown_window(job.spec)

    # -- reserving (every replica) -------------------------------------------------------------------
    def keeper_on(self, node: str, now: int) -> tuple[Attempt, int] | None:
        """The finished run whose window keeps ``node`` warm now, with the window's end; None if none."""
        best: tuple[Attempt, int] | None = None
        for keeper in self.world.warm_on(node):
            end = window_end_ms(keeper, self.world.reusers_of(keeper))
            if end is None or end <= now:
                self._wake.set()  # ended: the closer writes it down
                continue
            since = keeper.status.warm_since_ms or 0
            if best is None or since > (best[0].status.warm_since_ms or 0):
                best = (keeper, end)
        return best

    def refresh(self, node: str) -> None:
        """Mark ``node`` in the capacity index as its open window says (or as kept for nobody)."""
        found = self.keeper_on(node, now_ms())
        before = self.capacity.warm(node)
        if found is None:
            self.capacity.mark_warm(node, None)
        else:
            keeper, end = found
            self.capacity.mark_warm(
                node, Warm(keeper.metadata.namespace or "", end / 1000, keeper.metadata.name or "")
            )
        if before is not None and self.capacity.warm(node) is None:
            self.kick()  # kept for nobody now: waiting Jobs of any project may fit

    # -- closing (the leader) ------------------------------------------------------------------------
    def wake(self) -> None:
        """Something that may end a window happened (a Job deleted, a node changed): look now."""
        self._wake.set()

    async def run(self) -> None:
        """Close every window that ended, then wait for the next end (or an event that may end one)."""
        while True:
            try:
                await self.close_ended()
            except Exception:
                log.exception("closing warm windows failed; the next pass tries again")
            nxt = self.capacity.next_warm_end()
            wait = IDLE_LOOK_S if nxt is None else min(IDLE_LOOK_S, max(0.05, nxt - time.time()))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    async def close_ended(self) -> int:
        """Write ``warmEndMs`` on every window that ended; returns how many were written."""
        now = now_ms()
        closed = 0
        for node in list(self.world.attempts.index_values(WARM_ON)):
            for keeper in self.world.warm_on(node):
                end = self._ended_at(keeper, now)
                if end is not None and await self._close(keeper, end):
                    closed += 1
            self.refresh(node)
        return closed

    def _ended_at(self, keeper: Attempt, now: int) -> int | None:
        """When the keeper's window ended, if it did (None: still open)."""
        end = window_end_ms(keeper, self.world.reusers_of(keeper))
        if end is None:
            return None
        if end <= now:
            return end
        node = keeper.spec.node
        job = self.world.jobs.get(keeper.metadata.namespace, keeper.spec.job)
        gone = job is None or job.metadata.uid != keeper.metadata.labels.get(JOB_UID_LABEL)
        # A run on the node that did not come through the window (a gang member, an older leader's
        # placement): the node is not being kept any more.
        later = any(a.spec.warm_from is None for a in self.world.attempts.by_index(ACTIVE_ON, node))
        if gone or later or node not in self.capacity or not self.capacity.is_ready(node):
            return max(now, keeper.status.warm_since_ms or now)
        return None

    async def _close(self, keeper: Attempt, end: int) -> bool:
        try:
            written = await self.attempts.mutate(
                keeper.metadata.namespace, keeper.metadata.name or "", lambda a: with_end(a, end)
            )
        except NotFound:
            return False
        self.world.attempts.apply(written)
        return written.status.warm_end_ms == end
