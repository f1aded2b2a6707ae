"""The sweep controller's view of cell Jobs: every Job named as a cell (``<sweep>-<index>``), by Sweep and
index, with its controller's uid, in memory.

Listing the ``jobs`` bucket on every reconcile reads every Job of the namespace (a Sweep's cells cannot be
selected by subject), so a 1,000-cell Sweep would read a thousand Jobs per pass. Like the scheduler's cache
(``nodus_scheduler.caching``), this is an informer:

* list, then watch from the list's revision (a failed watch lists again, so nothing is missed);
* newer wins (by resourceVersion), and the controller's own creates are applied at once (write-through),
  so a reconcile right after a create counts the new cell even before the watch delivers it;
* the controller reconciles only once the first list is in (:attr:`CellIndex.synced`), so a restarted
  controller never creates a cell the store already holds because it had not read it yet (and a create
  that finds the cell is success anyway);
* each change calls the hook (the controller's work queue) after the view holds it.

Ownership is Kubernetes' ControllerRef (``metav1.GetControllerOf``), never labels: a cell of the Sweep with
uid U is the Job named ``<sweep>-<i>`` whose controller ownerReference (the first with ``controller:
true``) is ``kind: Sweep``, ``name: <sweep>``, ``uid: U``. The labels (``nodus.dev/sweep``,
``nodus.dev/cell``) are for people and selectors; anyone who may write Jobs can set them, so they decide
nothing here. The view holds every Job with a cell's name, labelled or not, so that a name taken by a Job
the Sweep does not control (one a user created first, one of an earlier Sweep of the same name) is known
without a request (:meth:`CellIndex.taken`), and its delete wakes the Sweep up, which then creates its own
cell. Each Job's slot (Sweep name and index, from its name) and controller uid are worked out once, when it
changes, so a pass finds its cells (:meth:`CellIndex.owned`) without reading every Job's metadata.

Safe to lose: a new process lists again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nodus_kit.cancelling import cancel_and_wait, cancel_swallowed
from nodus_kit.storing import Event, ObjectStore
from nodus_schema.jobs import Job
from nodus_schema.meta import OwnerReference
from nodus_schema.sweeps import SWEEP_LABEL

log = logging.getLogger(__name__)

SweepKey = tuple[str, str]  # (namespace, Sweep name)
SWEEP_GROUP = "nodus.dev"


def _rv(job: Job) -> int:
    rv = job.metadata.resource_version
    return int(rv) if rv else 0


def slot_of(name: str) -> tuple[str, int] | None:
    """(Sweep name, index) of a Job named as a cell, ``<sweep>-<index>``; None for any other name.

    The index is the last ``-`` segment, decimal without leading zeros (``a-1-2`` is cell 2 of Sweep
    ``a-1``; ``a-01`` is no cell's name)."""
    sweep, dash, digits = name.rpartition("-")
    if not (sweep and dash and digits.isascii() and digits.isdigit()) or str(int(digits)) != digits:
        return None
    return sweep, int(digits)


def controller_of(job: Job) -> OwnerReference | None:
    """The Job's controller ownerReference: the first with ``controller: true``, as metav1.GetControllerOf."""
    return next((o for o in job.metadata.owner_references if o.controller), None)


def sweep_controller_uid(job: Job, sweep: str) -> str | None:
    """The uid of the Sweep named ``sweep`` that controls ``job``; None if its controller is anything else
    (none, another kind, a Sweep of another name)."""
    ref = controller_of(job)
    if ref is None or ref.kind != "Sweep" or ref.name != sweep or not ref.uid:
        return None
    if ref.api_version.partition("/")[0] != SWEEP_GROUP:
        return None
    return ref.uid


def controlled_by(job: Job, sweep: str, uid: str | None) -> bool:
    """Whether the Sweep ``sweep`` with ``uid`` controls ``job`` (the only Jobs it ever acts on)."""
    return bool(uid) and sweep_controller_uid(job, sweep) == uid


def _related(job: Job) -> bool:
    """A Job that says it belongs to a Sweep, by label or by any ownerReference."""
    return SWEEP_LABEL in job.metadata.labels or any(o.kind == "Sweep" for o in job.metadata.owner_references)


@dataclass(frozen=True, slots=True)
class _Slot:
    job: Job
    controller: str | None  # the uid of the Sweep of its name that controls it (None: no such Sweep)


class CellIndex:
    def __init__(self, jobs: ObjectStore[Job]) -> None:
        self.store = jobs
        self._by_sweep: dict[SweepKey, dict[int, _Slot]] = {}
        self.hook: Callable[[SweepKey], None] = lambda key: None
        self.interest: Callable[[SweepKey], bool] = lambda key: True
        """Whether a change of a Job that claims no Sweep (no Sweep label, no Sweep ownerReference) but
        has a cell's name wakes that Sweep (the reconciler: a Sweep it knows). Jobs that claim a Sweep
        always do."""
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def owned(self, key: SweepKey, uid: str | None) -> dict[int, Job]:
        """The cells of the Sweep ``key`` with ``uid``, by index: the Jobs with its cells' names that it
        controls. A same-named Sweep created after a delete never adopts the old one's cells."""
        if not uid:
            return {}
        return {i: s.job for i, s in self._by_sweep.get(key, {}).items() if s.controller == uid}

    def taken(self, key: SweepKey, uid: str | None) -> dict[int, Job]:
        """The Jobs that hold a cell's name of the Sweep ``key`` with ``uid`` without being its cells, by
        index: no controller, another controller, or an earlier Sweep of the same name."""
        return {i: s.job for i, s in self._by_sweep.get(key, {}).items() if not uid or s.controller != uid}

    def dependents(self, key: SweepKey) -> list[Job]:
        """The Jobs with the cells' names of Sweep ``key`` that a Sweep of that name controls (any uid)."""
        return [s.job for s in self._by_sweep.get(key, {}).values() if s.controller is not None]

    def apply(self, job: Job, *, deleted: bool = False) -> None:
        """Take ``job`` if it has a cell's name and is newer than what the view holds."""
        name = job.metadata.name or ""
        slot = slot_of(name)
        if slot is None:
            return
        sweep, index = slot
        key = (job.metadata.namespace or "", sweep)
        cells = self._by_sweep.setdefault(key, {})
        old = cells.get(index)
        if old is not None and _rv(old.job) > _rv(job):
            return
        if deleted:
            cells.pop(index, None)
        else:
            cells[index] = _Slot(job, sweep_controller_uid(job, sweep))
        if not cells:
            self._by_sweep.pop(key, None)
        if not (_related(job) or (old is not None and _related(old.job)) or self.interest(key)):
            return
        try:
            self.hook(key)
        except Exception:  # the view must keep following the store whatever a hook does
            log.exception("cell index hook failed")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name="sweeps:cells")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        self.synced.clear()
        self._by_sweep.clear()

    async def _follow(self) -> None:
        while True:
            try:
                page = await self.store.list()
                self._by_sweep.clear()
                for job in page.items:
                    self.apply(job)
                self.synced.set()
                async with self.store.watch(resource_version=page.resource_version) as w:
                    async for event in w:
                        self._on_event(event)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if cancel_swallowed():  # cancelled inside nats-py on Python 3.11: end, do not retry for ever
                    raise asyncio.CancelledError from e
                log.warning("cell index watch failed, listing again: %s", e)
                await asyncio.sleep(0.5)

    def _on_event(self, event: Event[Job]) -> None:
        self.apply(event.object, deleted=event.type == "DELETED")
