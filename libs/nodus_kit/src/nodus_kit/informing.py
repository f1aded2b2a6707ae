"""The informer: one process's view of a kind, in memory, kept current by list then watch (client-go's
SharedIndexInformer, on an :class:`~nodus_kit.storing.ObjectStore`).

Every controller of a process reads the same informer instead of the store, so a reconcile costs no
request and a resync costs no list: an idle stack that holds 10,000 finished Jobs does nothing per resync
but walk a dict (issue #19).

* **List, then watch from the list's revision**: nothing written between the two is missed. When the
  first list is in, :attr:`Informer.synced` is set (client-go's HasSynced, the LISTED marker): a controller
  that acts before it could create what the store already holds.
* **A relist replaces**: when the watch fails (the server restarted, a compaction made its revision
  expire: 410), the informer lists again and the list *replaces* the view: what the view holds that the
  list does not is gone, and handlers get a DELETED for it (client-go's ``Replace`` and its
  DeletedFinalStateUnknown). Without this an object deleted while the watch was down stays for ever as a
  ghost (a node that looks busy, a cell that looks alive).
* **Newer wins**: an object is replaced only by a higher resourceVersion, so a late event never undoes a
  controller's own write, which it hands to :meth:`Informer.apply` at once (write-through) so that its
  next reconcile sees it before the watch does. A delete leaves a tombstone (its revision) until the next
  relist, so an older event cannot bring the object back.
* **Indexes**: ``indexers`` name functions from an object to the index values it files under (its owner,
  its node, its Job, a label); :meth:`Informer.by_index` answers "every Attempt of this Job" without a
  scan.
* **Handlers** run after the view holds the change, in the watch's order; a handler's failure is logged
  and never stops the view from following the store.

Safe to lose: a new process lists again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import msgspec

from nodus_kit.cancelling import cancel_and_wait, cancel_swallowed
from nodus_kit.errors import NotFound
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
Key = tuple[str, str]  # (namespace, name); namespace "" for a cluster-scoped kind
Indexer = Callable[[Any], Iterable[str]]
Handler = Callable[[Event[Any]], None]
RETRY_S = 0.5
"""How long a failed list or watch waits before the informer lists again."""


def key_of(obj: Any) -> Key:
    meta = obj.metadata
    return (meta.namespace or "", meta.name or "")


def revision_of(obj: Any) -> int:
    rv = obj.metadata.resource_version
    return int(rv) if rv else 0


def by_label(label: str) -> Indexer:
    """An indexer by the value of one label (objects without it are not filed)."""

    def index(obj: Any) -> Iterable[str]:
        value = obj.metadata.labels.get(label)
        return (value,) if value else ()

    return index


def by_controller(kind: str) -> Indexer:
    """An indexer by the name of the object's controller of ``kind`` (its ownerReference with
    ``controller: true``, as metav1.GetControllerOf); the uid is the reconciler's to check."""

    def index(obj: Any) -> Iterable[str]:
        ref = next((o for o in obj.metadata.owner_references if o.controller), None)
        return (ref.name,) if ref is not None and ref.kind == kind and ref.name else ()

    return index


class Informer(Generic[T]):
    """Objects of one store by key, with indexes; see the module's docstring."""

    def __init__(
        self,
        store: ObjectStore[T],
        *,
        namespace: str | None = None,
        indexers: dict[str, Indexer] | None = None,
        name: str = "",
        transform: Callable[[T], T] | None = None,
    ) -> None:
        self.store = store
        self.transform = transform
        """Applied to every object as the view takes it (client-go's SetTransform): the scheduler lays the
        heartbeats it heard over the Nodes' records. It must keep the object's key and revision."""
        self.namespace = namespace
        self.name = name or store.bucket
        self.synced = asyncio.Event()
        self._objects: dict[Key, T] = {}
        self._gone: dict[Key, int] = {}  # tombstones: the revision each key was deleted at
        self._indexers = dict(indexers or {})
        self._indexes: dict[str, dict[str, dict[Key, T]]] = {n: {} for n in self._indexers}
        self._handlers: list[Handler] = []
        self._task: asyncio.Task[None] | None = None
        self.relists = 0

    # -- reading -------------------------------------------------------------------------------------
    def get(self, namespace: str | None, name: str) -> T | None:
        return self._objects.get((namespace or "", name))

    async def confirm(self, namespace: str | None, name: str) -> T | None:
        """The object as the view holds it; when the view holds none, as the store does (taken into the
        view: newer wins), or None when the store has none either.

        For a controller about to act on an object's absence (stop its runs, file its history): each
        informer follows its own watch, and after a lost server one may resume seconds before another,
        so an object can be missing from one view while another already shows its children. Absent from
        the store as well, it is gone (a read per absence, not per pass)."""
        held = self.get(namespace, name)
        if held is not None:
            return held
        try:
            stored = await self.store.get(namespace, name)
        except NotFound:
            return None
        self.apply(stored)
        return self.get(namespace, name) or stored

    def __len__(self) -> int:
        return len(self._objects)

    def __bool__(self) -> bool:
        return True  # an informer is never "false" for holding nothing (``if informer:`` means it exists)

    def __iter__(self) -> Iterator[T]:
        """The objects now held (a snapshot: handlers may change the view while a caller walks it)."""
        return iter(list(self._objects.values()))

    def keys(self) -> list[Key]:
        return list(self._objects)

    def by_index(self, index: str, value: str) -> list[T]:
        return list(self._indexes[index].get(value, {}).values())

    def index_values(self, index: str) -> list[str]:
        return list(self._indexes[index])

    async def wait_synced(self, timeout: float) -> bool:
        """Whether the first list came in within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self.synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- handlers ------------------------------------------------------------------------------------
    def add_handler(self, handler: Handler) -> None:
        """Call ``handler`` with every change from now on, after the view holds it."""
        self._handlers.append(handler)

    def _notify(self, event: Event[Any]) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:  # the view must keep following the store whatever a handler does
                log.exception("informer handler failed", extra={"informer": self.name})

    # -- writing -------------------------------------------------------------------------------------
    def apply(self, obj: T, *, deleted: bool = False) -> bool:
        """Take ``obj`` if it is newer than what the view holds (and than its tombstone); whether it was.
        Controllers call it with what their own writes returned (write-through). A write-through may jump
        over revisions another writer made in between: their events are never told, only the newest state
        (a level-triggered reader needs no more)."""
        key, rv = key_of(obj), revision_of(obj)
        old = self._objects.get(key)
        if old is not None and revision_of(old) >= rv:
            return False  # older, or the echo of a write already taken through apply: nothing to tell
        if old is None and self._gone.get(key, -1) >= rv:
            return False  # an event older than the delete the view already took
        if deleted:
            self._remove(key)
            self._gone[key] = rv
            self._notify(Event("DELETED", obj, rv))
        else:
            if self.transform is not None:
                obj = self.transform(obj)
            self._put(key, obj)
            self._gone.pop(key, None)
            self._notify(Event("ADDED" if old is None else "MODIFIED", obj, rv))
        return True

    def retransform(self, namespace: str | None, name: str) -> bool:
        """Run :attr:`transform` again over the object held at (namespace, name), as when what it lays
        over the record changed (a heartbeat heard); handlers hear MODIFIED at the same revision when the
        result is another object. Whether they did."""
        key = (namespace or "", name)
        old = self._objects.get(key)
        if old is None or self.transform is None:
            return False
        new = self.transform(old)
        if new is old:
            return False
        self._put(key, new)
        self._notify(Event("MODIFIED", new, revision_of(new)))
        return True

    def _put(self, key: Key, obj: T) -> None:
        self._remove(key)
        self._objects[key] = obj
        for name, indexer in self._indexers.items():
            for value in indexer(obj):
                self._indexes[name].setdefault(value, {})[key] = obj

    def _remove(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is None:
            return
        for name, indexer in self._indexers.items():
            index = self._indexes[name]
            for value in indexer(old):
                filed = index.get(value)
                if filed is not None:
                    filed.pop(key, None)
                    if not filed:
                        del index[value]

    def replace(self, items: Iterable[T], revision: int) -> None:
        """Make the view what a list at ``revision`` says (client-go's Replace): new and changed objects
        are applied; what the view holds at or below that revision and the list lacks was deleted while
        nobody watched, and handlers hear DELETED for it. An object newer than the list (a controller's
        own write, applied while the list was in flight) stays: the watch from ``revision`` tells its fate.
        """
        listed: set[Key] = set()
        for obj in items:
            listed.add(key_of(obj))
            self.apply(obj)
        for key, obj in list(self._objects.items()):
            if key not in listed and revision_of(obj) <= revision:
                self._remove(key)
                self._notify(Event("DELETED", obj, revision))
        # Tombstones at or below the list's revision are answered by the list itself.
        self._gone = {k: rv for k, rv in self._gone.items() if rv > revision}

    # -- following the store -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None

    async def start(self) -> None:
        """Follow the store (once; a second call does nothing). The view is kept when stopped, and the
        next start's list replaces it."""
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name=f"informer:{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _follow(self) -> None:
        while True:
            try:
                page = await self.store.list(self.namespace)
                self.replace(page.items, page.resource_version)
                self.relists += 1
                self.synced.set()
                async with self.store.watch(self.namespace, resource_version=page.resource_version) as w:
                    async for event in w:
                        self.apply(event.object, deleted=event.type == "DELETED")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if cancel_swallowed():  # cancelled inside nats-py on Python 3.11: end, do not retry for ever
                    raise asyncio.CancelledError from e
                if self.store.nc.is_closed:  # closed for good (the process is stopping): nothing to follow
                    log.info("informer of %s: connection closed; it stops following", self.name)
                    return
                log.warning("informer of %s: watch failed, listing again: %s", self.name, e)
                await asyncio.sleep(RETRY_S)
