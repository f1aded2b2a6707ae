"""The controller runtime: level-triggered reconcile loops over shared informers, as controller-runtime
and the Kubernetes Job controller run them.

A :class:`Controller` declares what it reconciles and what it reacts to, and reads everything from
informers (:mod:`nodus_kit.informing`) that every controller of the process shares:

* ``for_``: the informer of the kind it reconciles; each change of an object queues that object's key;
* ``owns``: kinds whose objects belong to one of ``for_`` (by ownerReference or by a label); a change
  queues the owner (:func:`owns`);
* ``watches``: any other kind, through a mapping function from a change to the keys it concerns
  (:func:`watches`);
* ``settled``: objects with nothing left to do until they change (a finished Job whose cost is final).
  They leave the work queue: the periodic resync, which walks the informer's memory (never the store),
  skips them, so a stack that holds 10,000 of them costs nothing per resync.

``reconcile(key)`` runs from N workers over a :class:`WorkQueue`. It must be idempotent and safe to kill
at any line: it reads the world (from the informers), compares it with what is wanted, and makes one step
towards it. Outcomes: return None -> done (backoff forgotten); return a number -> check again after that
many seconds; raise -> what :mod:`nodus_kit.settling` says of the error: a retryable one is requeued
after its delay (a TemporaryError's own, else a jittered capped backoff), a permanent one is logged and
dropped until the object changes or the next resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodus_kit import measuring, settling
from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.errors import NodusError
from nodus_kit.informing import Informer, key_of
from nodus_kit.keying import Event
from nodus_kit.queueing import ShutDown, WorkQueue

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]
Mapper = Callable[[Event[Any]], Iterable[Key]]
SYNC_WAIT_S = 60.0
"""How long a controller that starts waits for its informers' first lists before it works anyway (a
reconcile that needs an unsynced view says so and is retried)."""


def own_key(event: Event[Any]) -> Iterable[Key]:
    return [key_of(event.object)]


def never(obj: Any) -> bool:
    return False


@dataclass(frozen=True)
class Watched:
    """An informer whose changes queue keys of the controller: ``mapper`` says which, ``delay_s`` lets a
    burst of changes (a report per run start and finish) queue each key once rather than once each."""

    informer: Informer[Any]
    mapper: Mapper
    delay_s: float = 0.0
    settled: Callable[[Any], bool] = never
    """Owned objects with nothing left to do (a finished Attempt): their owner's absence wakes nothing."""


def owns(
    informer: Informer[Any],
    *,
    label: str | None = None,
    kind: str | None = None,
    delay_s: float = 0.0,
    settled: Callable[[Any], bool] = never,
) -> Watched:
    """Objects of ``informer`` owned by the controller's kind: the owner is named by ``label`` (an Attempt's
    ``nodus.dev/job``) or by the controller ownerReference of ``kind``; both in the object's namespace."""
    if (label is None) == (kind is None):
        raise ValueError("owns() takes one of label= and kind=")

    def owner(event: Event[Any]) -> Iterable[Key]:
        meta = event.object.metadata
        if label is not None:
            name = meta.labels.get(label)
        else:
            ref = next((o for o in meta.owner_references if o.controller), None)
            name = ref.name if ref is not None and ref.kind == kind else None
        return [(meta.namespace or "", name)] if name else []

    return Watched(informer, owner, delay_s, settled)


def watches(informer: Informer[Any], mapper: Mapper, *, delay_s: float = 0.0) -> Watched:
    """Objects of ``informer`` whose changes concern the keys ``mapper`` names."""
    return Watched(informer, mapper, delay_s)


@dataclass
class Controller:
    name: str
    reconcile: Reconcile
    for_: Informer[Any]
    owns: Sequence[Watched] = ()
    watches: Sequence[Watched] = ()
    settled: Callable[[Any], bool] = never
    orphans: Callable[[], Iterable[Key]] | None = None
    """Keys of objects gone from ``for_`` that left work behind where no owned object shows it (billing's
    book records of deleted Jobs): queued with the walk, at start and at every resync, from memory."""
    workers: int = 4
    resync_s: float = 30.0
    stop_grace_s: float = 5.0
    queue: WorkQueue[Key] = field(default_factory=WorkQueue)

    def __post_init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._running = False
        self.reconciles = 0
        self.failures = 0
        self.resyncs = 0
        """Resync walks done (tests await a number of them instead of sleeping)."""
        self.reconcile = measuring.metered_reconcile(self.name, self.reconcile)
        measuring.watch_queue(self)
        self.for_.add_handler(self._on_own)
        for source in (*self.owns, *self.watches):
            source.informer.add_handler(self._on_change(source))

    @property
    def informers(self) -> list[Informer[Any]]:
        seen: dict[int, Informer[Any]] = {id(self.for_): self.for_}
        for source in (*self.owns, *self.watches):
            seen.setdefault(id(source.informer), source.informer)
        return list(seen.values())

    # -- events --------------------------------------------------------------------------------------
    def _on_own(self, event: Event[Any]) -> None:
        if self._running:
            self.queue.add(key_of(event.object))

    def _on_change(self, source: Watched) -> Callable[[Event[Any]], None]:
        def handle(event: Event[Any]) -> None:
            if not self._running:
                return
            for key in source.mapper(event):
                self.queue.add_after(key, source.delay_s)

        return handle

    def enqueue(self, key: Key, delay_s: float = 0.0) -> None:
        """Queue ``key`` (for a trigger no informer sees: a report, an RPC); ignored when not running."""
        if self._running:
            self.queue.add_after(key, delay_s)

    def _enqueue_unsettled(self) -> None:
        """Queue every object of ``for_`` not settled, and the owner of every owned object not settled whose
        owner is gone (a Job deleted while no leader watched leaves runs to stop)."""
        for obj in self.for_:
            if not self.settled(obj):
                self.queue.add(key_of(obj))
        for source in self.owns:
            for owned in source.informer:
                if source.settled(owned):
                    continue
                for key in source.mapper(Event("MODIFIED", owned, 0)):
                    if self.for_.get(*key) is None:
                        self.queue.add(key)
        for key in self.orphans() if self.orphans is not None else ():
            self.queue.add(key)

    # -- running -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until :meth:`stop` (or cancellation); returns after in-flight reconciles finish.

        Can run again after it returned (a replica that lost its lease and won it back)."""
        if self.queue.is_shut_down:
            self.queue = WorkQueue(base_delay=self.queue.base_delay, max_delay=self.queue.max_delay)
        self._stopping.clear()
        for informer in self.informers:
            await informer.start()  # once per informer, whoever asks first
        for informer in self.informers:
            if not await informer.wait_synced(SYNC_WAIT_S):
                log.warning("informer %s not synced; working anyway", informer.name)
        self._running = True
        self._enqueue_unsettled()
        self._tasks = [asyncio.create_task(self._resync(), name=f"{self.name}:resync")]
        workers = [asyncio.create_task(self._work(), name=f"{self.name}:worker") for _ in range(self.workers)]
        try:
            await self._stopping.wait()
        finally:
            self._running = False
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
                self.queue.drop()  # what the workers left is redone by the next run's walk

    async def stop(self) -> None:
        self._stopping.set()

    async def _resync(self) -> None:
        """Every ``resync_s``, every object not settled is queued again, from memory: a safety net for
        a reconcile that forgot to ask for its next look, never the way changes are found."""
        while True:
            await asyncio.sleep(self.resync_s)
            self._enqueue_unsettled()
            self.resyncs += 1

    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                after = await self.reconcile(key)
            except Exception as e:
                self.failures += 1
                self._failed(key, e)
            else:
                self.reconciles += 1
                self.queue.forget(key)
                if after is not None and not self._settled(key):
                    self.queue.add_after(key, after)
            finally:
                self.queue.done(key)

    def _settled(self, key: Key) -> bool:
        """Whether ``key``'s object is settled now: it leaves the work queue even when its reconcile asked
        to look again later (a Suspended Job's periodic check), until it changes."""
        obj = self.for_.get(*key)
        return obj is not None and self.settled(obj)

    def _failed(self, key: Key, error: Exception) -> None:
        """The kit's one outcome mapping (settling): a retry is a requeue after its delay; "dead" drops the
        key until the object changes or the next resync (as Kubernetes' informers re-deliver)."""
        verdict = settling.of_error(error, self.queue.failures(key) + 1, backoff=self.queue.backoff)
        extra = {"controller": self.name}
        if verdict.action is settling.Action.RETRY:
            delay = self.queue.add_rate_limited(key, verdict.delay)
            if isinstance(error, NodusError):
                log.info("reconcile %s: %s; retry in %.2fs", key, error, delay, extra=extra)
            else:
                log.error("reconcile %s crashed; retry in %.2fs", key, delay, exc_info=error, extra=extra)
        else:
            self.queue.forget(key)
            log.error("reconcile %s failed for good: %s", key, verdict.reason, extra=extra)
