"""The scheduler's view of the world: every Node and Attempt in memory, kept current by watches.

Placement decides from this view (which nodes are free, what each index of each Job has run) instead of
listing the buckets on every decision, which is what lets one scheduler place thousands of indexes a
second. The view is an informer, as Kubernetes' controllers use:

* **List, then watch from the list's revision**: nothing written between the two is missed; a watch that
  fails starts again from a fresh list.
* **Newer wins**: an object is replaced only by a higher revision (``metadata.resourceVersion``), so a
  late watch event never undoes the scheduler's own write, which it applies at once (write-through:
  :meth:`Cache.apply`). Its next decision therefore sees what it just did, even before the watch does.
* **Synced before use**: the lifecycle waits for :attr:`Cache.synced` (the first full list) before it
  reconciles, so a scheduler that has just restarted never starts a run the store already holds.
* **Hooks**: every change calls the hooks (the lifecycle's work queue and the binder's kick), after the
  view holds the change, so a reconcile it triggers sees it.

Everything here is safe to lose: killing the process loses only the view, and a new one lists again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from nodus_kit.cancelling import cancel_and_wait, cancel_swallowed
from nodus_kit.storing import Event, ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_LABEL, Attempt
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (namespace, Job name)
Hook = Callable[[str, Any], None]  # (kind "Node" | "Attempt", object)


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait until each has finished (again and again: see nodus_kit.cancelling)."""
    await cancel_and_wait(tasks)


def _rv(obj: Any) -> int:
    rv = obj.metadata.resource_version
    return int(rv) if rv else 0


def job_key(a: Attempt) -> JobKey:
    return (a.metadata.namespace or "", a.metadata.labels.get(JOB_LABEL, a.spec.job))


class Cache:
    """Nodes by name; Attempts by (namespace, name) and by Job; how many active Attempts each node runs."""

    def __init__(self, nodes: ObjectStore[Node], attempts: ObjectStore[Attempt]) -> None:
        self._stores: dict[str, ObjectStore[Any]] = {"Node": nodes, "Attempt": attempts}
        self.nodes: dict[str, Node] = {}
        self.attempts: dict[tuple[str, str], Attempt] = {}
        self._by_job: dict[JobKey, dict[str, Attempt]] = {}
        self.active_on: Counter[str] = Counter()  # node name -> active (non-terminal) Attempts on it
        self.hooks: list[Hook] = []
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- reading -------------------------------------------------------------------------------------
    def attempts_of(self, key: JobKey) -> list[Attempt]:
        return list(self._by_job.get(key, {}).values())

    def busy(self) -> set[str]:
        """Nodes with an active Attempt (one run per node at a time)."""
        return {n for n, count in self.active_on.items() if count > 0}

    def jobs(self) -> Iterator[JobKey]:
        return iter(list(self._by_job))

    # -- writing -------------------------------------------------------------------------------------
    def apply(self, obj: Any, *, deleted: bool = False) -> bool:
        """Take ``obj`` (a Node or an Attempt) if it is newer than what the view holds; whether it was."""
        if isinstance(obj, Node):
            return self._apply_node(obj, deleted)
        if isinstance(obj, Attempt):
            return self._apply_attempt(obj, deleted)
        raise TypeError(f"the scheduler's cache holds Nodes and Attempts, not {type(obj).__name__}")

    def _apply_node(self, node: Node, deleted: bool) -> bool:
        name = node.metadata.name or ""
        old = self.nodes.get(name)
        if old is not None and _rv(old) > _rv(node):
            return False
        if deleted:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = node
        self._notify("Node", node)
        return True

    def _apply_attempt(self, a: Attempt, deleted: bool) -> bool:
        key = (a.metadata.namespace or "", a.metadata.name or "")
        old = self.attempts.get(key)
        if old is not None and _rv(old) > _rv(a):
            return False
        if old is not None and old.status.phase not in ATTEMPT_TERMINAL:
            self.active_on[old.spec.node] -= 1
        jobs = self._by_job.setdefault(job_key(a), {})
        if deleted:
            self.attempts.pop(key, None)
            jobs.pop(key[1], None)
            if not jobs:
                self._by_job.pop(job_key(a), None)
        else:
            self.attempts[key] = a
            jobs[key[1]] = a
            if a.status.phase not in ATTEMPT_TERMINAL:
                self.active_on[a.spec.node] += 1
        self._notify("Attempt", a)
        return True

    def _notify(self, kind: str, obj: Any) -> None:
        for hook in self.hooks:
            try:
                hook(kind, obj)
            except Exception:  # a hook's failure must not stop the view from following the store
                log.exception("cache hook failed")

    # -- following the store -------------------------------------------------------------------------
    @property
    def following(self) -> bool:
        return bool(self._tasks)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow(kind), name=f"cache:{kind}") for kind in self._stores]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []
        self._listed.clear()
        self.synced.clear()

    async def _follow(self, kind: str) -> None:
        store = self._stores[kind]
        while True:
            try:
                page = await store.list()
                for obj in page.items:
                    self.apply(obj)
                self._listed.add(kind)
                if self._listed == set(self._stores):
                    self.synced.set()
                async with store.watch(resource_version=page.resource_version) as w:
                    async for event in w:
                        self._on_event(event)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if cancel_swallowed():  # cancelled inside nats-py on Python 3.11: end, do not retry for ever
                    raise asyncio.CancelledError from e
                log.warning("cache watch of %s failed, listing again: %s", kind, e)
                await asyncio.sleep(0.5)

    def _on_event(self, event: Event[Any]) -> None:
        self.apply(event.object, deleted=event.type == "DELETED")
