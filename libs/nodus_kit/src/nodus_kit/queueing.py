"""A work queue keyed by object, as client-go's: dedup, no two workers on one key, capped backoff.

* adding a key already waiting is a no-op (dedup);
* adding a key while a worker processes it marks it dirty: it is queued again when that worker is done,
  so no change is lost and no key is processed twice at once;
* ``add_rate_limited`` re-adds after a per-key exponential backoff with jitter (client-go's has none: a
  burst of keys that failed together would all come back together); ``forget`` resets it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from nodus_kit.backingoff import Backoff

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down; workers return."""


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 60.0) -> None:
        self._queue: deque[K] = deque()
        self._waiting: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._cond = asyncio.Condition()
        self._shutdown = False
        self.base_delay, self.max_delay = base_delay, max_delay

    @property
    def is_shut_down(self) -> bool:
        return self._shutdown

    def __len__(self) -> int:
        return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (delayed keys do not count): tests await this."""
        return not self._queue and not self._processing

    def add(self, key: K) -> None:
        if self._shutdown:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._queue.append(key)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        old = self._timers.pop(key, None)
        if old is not None:
            # Keep the earlier of the two wake-ups: a sooner retry never hides behind a later one.
            if old.when() <= loop.time() + delay:
                self._timers[key] = old
                return
            old.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    @property
    def backoff(self) -> Backoff:
        # Made from the attributes at each use: a controller (and its tests) may change them on a live queue.
        return Backoff(self.base_delay, self.max_delay)

    def add_rate_limited(self, key: K, delay: float | None = None) -> float:
        """Count a failure of ``key`` and add it again after ``delay``, or after the backoff of its
        failures so far when None; the wait."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        wait = self.backoff.delay(n) if delay is None else delay
        self.add_after(key, wait)
        return wait

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        async with self._cond:
            while not self._queue:
                if self._shutdown:
                    raise ShutDown
                await self._cond.wait()
            key = self._queue.popleft()
        self._waiting.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def drop(self) -> None:
        """Forget every queued key: for a shut-down queue whose workers are gone (nothing will take
        them; a controller that runs again starts a new queue and lists everything again)."""
        self._queue.clear()
        self._waiting.clear()
        self._dirty.clear()

    async def shut_down(self) -> None:
        self._shutdown = True
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()
        async with self._cond:
            self._cond.notify_all()
