"""The sweep controller's view of cell Jobs: every Job carrying a Sweep's label, by Sweep, in memory.

Listing the ``jobs`` bucket on every reconcile reads every Job of the namespace (a Sweep's cells cannot be
selected by subject), so a 1,000-cell Sweep would read a thousand Jobs per pass. Like the scheduler's cache
(``nodus_scheduler.caching``), this is an informer:

* list, then watch from the list's revision (a failed watch lists again, so nothing is missed);
* newer wins (by resourceVersion), and the controller's own creates are applied at once (write-through),
  so a reconcile right after a create counts the new cell even before the watch delivers it;
* the controller reconciles only once the first list is in (:attr:`CellIndex.synced`), so a restarted
  controller never creates a cell the store already holds because it had not read it yet (and a create
  that finds the cell is success anyway);
* each change calls the hook (the controller's work queue) after the view holds it;
* each cell is held with its index and its owners' uids worked out once, when it changes, so the cells a
  Sweep owns (:meth:`CellIndex.owned`) are found without reading every Job's labels on every pass.

Safe to lose: a new process lists again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.storing import Event, ObjectStore
from nodus_schema.jobs import Job
from nodus_schema.sweeps import CELL_LABEL, SWEEP_LABEL

log = logging.getLogger(__name__)

SweepKey = tuple[str, str]  # (namespace, Sweep name)


def _rv(job: Job) -> int:
    rv = job.metadata.resource_version
    return int(rv) if rv else 0


@dataclass(frozen=True, slots=True)
class _Cell:
    job: Job
    index: int | None  # None: a label that is not a number (never written by Nodus; such a Job is no cell)
    owners: frozenset[str]  # the uids of its owners


def _cell(job: Job) -> _Cell:
    label = job.metadata.labels.get(CELL_LABEL, "")
    return _Cell(
        job,
        int(label) if label.isdigit() else None,
        frozenset(o.uid for o in job.metadata.owner_references if o.uid),
    )


class CellIndex:
    def __init__(self, jobs: ObjectStore[Job]) -> None:
        self.store = jobs
        self._by_sweep: dict[SweepKey, dict[str, _Cell]] = {}
        self.hook: Callable[[SweepKey], None] = lambda key: None
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def cells_of(self, key: SweepKey) -> list[Job]:
        return [c.job for c in self._by_sweep.get(key, {}).values()]

    def owned(self, key: SweepKey, uid: str | None) -> dict[int, Job]:
        """The cells of Sweep ``key`` that the Sweep with ``uid`` owns, by index (a same-named Sweep
        created after a delete must not adopt the old one's cells)."""
        return {
            c.index: c.job
            for c in self._by_sweep.get(key, {}).values()
            if c.index is not None and uid in c.owners
        }

    def apply(self, job: Job, *, deleted: bool = False) -> None:
        """Take ``job`` if it is a cell and newer than what the view holds."""
        sweep = job.metadata.labels.get(SWEEP_LABEL)
        if not sweep:
            return
        key = (job.metadata.namespace or "", sweep)
        cells = self._by_sweep.setdefault(key, {})
        name = job.metadata.name or ""
        old = cells.get(name)
        if old is not None and _rv(old.job) > _rv(job):
            return
        if deleted:
            cells.pop(name, None)
            if not cells:
                self._by_sweep.pop(key, None)
        else:
            cells[name] = _cell(job)
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
                log.warning("cell index watch failed, listing again: %s", e)
                await asyncio.sleep(0.5)

    def _on_event(self, event: Event[Job]) -> None:
        self.apply(event.object, deleted=event.type == "DELETED")
