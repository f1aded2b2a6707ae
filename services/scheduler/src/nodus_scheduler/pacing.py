"""Passes over one large Job spaced by its size, so its reconciles cannot take the whole process.

A Job's reconcile reads every Attempt it has (ruling.summarize): a Job of 1,000 indexes costs about a
millisecond a pass, and while its runs start and finish it is woken by every one of their events. Passed
at once each time, ten such Jobs kept the scheduler busy reconciling (two passes per placement, each over
every Attempt of the Job, finished ones too: a cost that grew with the Job's history) instead of placing.
A Job now rests after a pass for :data:`REST_PER_ATTEMPT_S` per Attempt it has (20 ms at 1,000): the
events that come meanwhile are taken together by the next pass, as the sweep controller does with a
Sweep's cells. A Job of a few runs rests for microseconds, so the pace of small Jobs does not change.
"""

from __future__ import annotations

import time
from typing import Final

from nodus_scheduler.viewing import JobKey

REST_PER_ATTEMPT_S: Final = 20e-6
MIN_ATTEMPTS: Final = 50
"""Jobs with fewer Attempts never rest: their passes are cheap."""


class Pacing:
    def __init__(self) -> None:
        self._next: dict[JobKey, float] = {}

    def wait(self, key: JobKey) -> float:
        """Seconds until the Job's next pass may run (0: now)."""
        ready = self._next.get(key)
        if ready is None:
            return 0.0
        left = ready - time.monotonic()
        if left <= 0:
            del self._next[key]
            return 0.0
        return left

    def passed(self, key: JobKey, attempts: int) -> None:
        """A pass over a Job with ``attempts`` Attempts has run."""
        if attempts >= MIN_ATTEMPTS:
            self._next[key] = time.monotonic() + attempts * REST_PER_ATTEMPT_S

    def forget(self, key: JobKey) -> None:
        self._next.pop(key, None)
