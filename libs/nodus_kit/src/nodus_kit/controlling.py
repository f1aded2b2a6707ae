"""The controller runtime: level-triggered reconcile loops, as the Kubernetes Job controller runs.

A :class:`Controller` watches one or more ObjectStores, maps each event to keys (the object itself,
or its owner), and runs ``reconcile(key)`` from N workers over a :class:`WorkQueue`. A periodic resync
lists everything again, so a missed event, a crash between two writes, or a lost watch only delays
convergence. ``reconcile`` must be idempotent and safe to kill at any line: it reads the world, compares
it with what is wanted, and makes one step towards it.

Outcomes: return None -> done (backoff forgotten); return a number -> check again after that many
seconds; raise a retryable error -> requeue with capped backoff; raise a permanent one -> log, drop
until the object changes or the next resync (as Kubernetes' informers re-deliver on resync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nodus_kit import measuring
from nodus_kit.cancelling import cancel_and_wait, cancel_swallowed
from nodus_kit.errors import NodusError
from nodus_kit.queueing import ShutDown, WorkQueue
from nodus_kit.storing import Event, ObjectStore

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]
Mapper = Callable[[Event[Any]], Iterable[Key]]


def own_key(event: Event[Any]) -> Iterable[Key]:
    meta = event.object.metadata
    return [(meta.namespace or "", meta.name)]


@dataclass
class Source:
    """A store to watch and how its events map to the controller's keys (e.g. a cell Job -> its Sweep)."""

    store: ObjectStore[Any]
    mapper: Mapper = own_key
    namespace: str | None = None


@dataclass
class Controller:
    name: str
    reconcile: Reconcile
    sources: list[Source]
    workers: int = 4
    resync_s: float = 30.0
    stop_grace_s: float = 5.0
    queue: WorkQueue[Key] = field(default_factory=WorkQueue)

    def __post_init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.reconciles = 0
        self.failures = 0
        self.reconcile = measuring.metered_reconcile(self.name, self.reconcile)
        measuring.watch_queue(self)

    async def run(self) -> None:
        """Run until :meth:`stop` (or cancellation); returns after in-flight reconciles finish.

        Can run again after it returned (a replica that lost its lease and won it back)."""
        if self.queue.is_shut_down:
            self.queue = WorkQueue(base_delay=self.queue.base_delay, max_delay=self.queue.max_delay)
        self._stopping.clear()
        self._tasks = [asyncio.create_task(self._watch(s), name=f"{self.name}:watch") for s in self.sources]
        self._tasks.append(asyncio.create_task(self._resync(), name=f"{self.name}:resync"))
        workers = [asyncio.create_task(self._work(), name=f"{self.name}:worker") for _ in range(self.workers)]
        try:
            await self._stopping.wait()
        finally:
            for t in self._tasks:
                t.cancel()
            try:
                await self.queue.shut_down()
                # In-flight reconciles may finish (they are safe to kill at any line, but a finished one
                # leaves less to redo); past the grace they are cancelled, so a stop never hangs on one.
                if workers:
                    await asyncio.wait(workers, timeout=self.stop_grace_s)
            finally:
                # Also when run() itself is cancelled during the grace (a lost lease cancels the leader's
                # task): no worker may go on reconciling after run() has returned.
                await cancel_and_wait([*self._tasks, *workers])
                self.queue.drop()  # what the workers left is redone by the next run's list

    async def stop(self) -> None:
        self._stopping.set()

    async def _watch(self, source: Source) -> None:
        """List+watch for ever; a watch that fails is restarted from a fresh list (never a gap)."""
        while True:
            try:
                async with source.store.watch(source.namespace) as w:
                    async for event in w:
                        for key in source.mapper(event):
                            self.queue.add(key)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if cancel_swallowed():  # cancelled inside nats-py on Python 3.11: end, do not retry for ever
                    raise asyncio.CancelledError from e
                log.warning("watch failed, restarting: %s", e, extra={"controller": self.name})
                await asyncio.sleep(0.5)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            for source in self.sources:
                with contextlib.suppress(Exception):
                    page = await source.store.list(source.namespace)
                    for obj in page.items:
                        for key in source.mapper(Event("MODIFIED", obj, 0)):
                            self.queue.add(key)

    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                after = await self.reconcile(key)
            except NodusError as e:
                self.failures += 1
                if e.retryable:
                    delay = self.queue.add_rate_limited(key)
                    log.info(
                        "reconcile %s: %s; retry in %.2fs", key, e, delay, extra={"controller": self.name}
                    )
                else:
                    self.queue.forget(key)
                    log.error("reconcile %s failed for good: %s", key, e, extra={"controller": self.name})
            except Exception:
                self.failures += 1
                delay = self.queue.add_rate_limited(key)
                log.exception(
                    "reconcile %s crashed; retry in %.2fs", key, delay, extra={"controller": self.name}
                )
            else:
                self.reconciles += 1
                self.queue.forget(key)
                if after is not None:
                    self.queue.add_after(key, after)
            finally:
                self.queue.done(key)
