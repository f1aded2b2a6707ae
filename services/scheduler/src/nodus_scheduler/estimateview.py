"""What an estimate reads from the scheduler's informers (:class:`~nodus_scheduler.viewing.World`), so that
the estimate endpoint (:class:`~nodus_scheduler.answering.Estimator`) answers from memory, and what it
works out once for many estimates:

* :class:`CapacityView` and :class:`Capacity`: the live nodes, the busy set and the nodes kept warm, read
  from the informers and their indexes, and the capacity indexes an estimate places against, built once
  and kept until a Node or an Attempt changes (or :data:`CAPACITY_MAX_AGE_S` passes). A burst of creates
  then pays for one index of the nodes, not two per create (``placing.place`` and the warm plan's
  ``fitting_ready`` each build one of every node per call), and placement's cache of judged requests
  (``CapacityIndex.plans``) answers every create of the same shape after the first;
* :func:`candidates`: the price book's candidates for a request, remembered per request shape;
* :func:`warm_in` and :class:`InformedHistory`: the nodes kept warm and the run history, from memory.

Each answers what the lists of the buckets it replaces answer (:func:`~nodus_scheduler.warmplanning.kept_
warm`, :meth:`RunHistory.refresh`, ``placing.place`` over the listed nodes): a node's readiness still
follows the clock (``place_demand`` expires heartbeats at each request's ``now``).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any, Final

from nodus_kit.informing import Informer
from nodus_scheduler.capacity import CapacityIndex, unreachable
from nodus_scheduler.placing import (
    Candidate,
    NoPlacement,
    Placement,
    demand_of,
    place_in,
    price_book_candidates,
)
from nodus_scheduler.recalling import RunHistory
from nodus_scheduler.viewing import WARM_ON, World
from nodus_schema.catalog import Catalog
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.nodes import Node

CAPACITY_MAX_AGE_S: Final = 0.25
"""The longest one :class:`Capacity` serves estimates without a change of a Node or an Attempt: what moves
with the clock alone (a node NotReady past the unreachable grace, a warm window that ran out) is seen this
late at most. Heartbeats going stale are seen at once (placement expires them at each request's time)."""


class Capacity:
    """The nodes an estimate may use (by name, as a list of the bucket orders them), the busy set and the
    nodes kept warm, read at one moment, with the capacity indexes over them built when first asked for."""

    def __init__(self, nodes: list[Node], busy: set[str], warm: dict[str, str], now: datetime) -> None:
        self.nodes, self.busy, self.warm, self.at = nodes, busy, warm, now
        self._free: CapacityIndex | None = None
        self._open: dict[str | None, CapacityIndex] = {}

    def place(self, spec: JobSpec, catalog: Catalog, now: datetime) -> Placement | NoPlacement:
        """``placing.place(spec, nodes, busy | warm nodes, catalog, now)``, against one index of them."""
        if self._free is None:
            self._free = CapacityIndex.of(self.nodes, self.busy | set(self.warm), self.at)
        return place_in(self._free, spec, catalog, now)

    def open_to(self, namespace: str, now: datetime) -> CapacityIndex:
        """The index the warm plan counts fitting nodes in: every node not kept warm for another project,
        busy or not (warmplanning.plan_warm), with readiness at ``now``."""
        key = namespace if self.warm else None  # without warm nodes it is every node, for every project
        index = self._open.get(key)
        if index is None:
            nodes = [n for n in self.nodes if self.warm.get(n.metadata.name or "") in (None, namespace)]
            index = self._open[key] = CapacityIndex.of(nodes, now=self.at)
        index.expire(now)  # as an index built at ``now`` judges the heartbeats
        return index


class CapacityView:
    """The :class:`Capacity` of now from the scheduler's informers, kept while nothing it read changed."""

    def __init__(self, world: World, gone_after: timedelta) -> None:
        self.world, self.gone_after = world, gone_after
        self._capacity: Capacity | None = None
        self._built = 0.0
        world.nodes.add_handler(self._changed)
        world.attempts.add_handler(self._changed)

    def _changed(self, _event: Any) -> None:
        self._capacity = None

    def now(self, now: datetime) -> Capacity | None:
        """The capacity at ``now``; None until the informers have listed (then the endpoint lists)."""
        world = self.world
        if not (world.nodes.synced.is_set() and world.attempts.synced.is_set()):
            return None
        held = self._capacity
        if held is not None and time.monotonic() - self._built < CAPACITY_MAX_AGE_S and held.at <= now:
            return held
        nodes = sorted(
            (n for n in world.nodes if not unreachable(n, now, self.gone_after)),
            key=lambda n: n.metadata.name or "",
        )
        busy = world.busy()
        self._capacity = Capacity(nodes, busy, warm_in(world, busy, now), now)
        self._built = time.monotonic()
        return self._capacity


# Per catalog object (one per price book version, kept alive by the Estimator) and request shape (the
# Demand placement judges): the price book's candidates, judged once.
_candidates: dict[tuple[int, Any], tuple[Catalog, tuple[list[Candidate], Counter[str]]]] = {}
_MAX_CANDIDATES: Final = 4096


def candidates(spec: JobSpec, catalog: Catalog) -> tuple[list[Candidate], Counter[str]]:
    """``placing.price_book_candidates(spec, catalog)``, remembered (callers only read what it returns)."""
    key = (id(catalog), demand_of(spec))
    held = _candidates.get(key)
    if held is None or held[0] is not catalog:
        if len(_candidates) >= _MAX_CANDIDATES:
            _candidates.clear()
        held = _candidates[key] = (catalog, price_book_candidates(spec, catalog))
    return held[1]


def warm_in(world: World, busy: set[str], now: datetime) -> dict[str, str]:
    """:func:`~nodus_scheduler.warmplanning.kept_warm` from the informer's indexes: only the Attempts filed
    under ``warm-on`` (a window not ended early), in the order a list of the bucket gives them (by key,
    the last on a node wins, as there), reused ones (``warm-from``) and busy nodes left out."""
    now_ms = int(now.timestamp() * 1000)
    keepers = [a for node in world.attempts.index_values(WARM_ON) for a in world.warm_on(node)]
    keepers.sort(key=lambda a: f"{a.metadata.namespace or ''}.{a.metadata.name}")
    out: dict[str, str] = {}
    for a in keepers:
        st = a.status
        if st.warm_until_ms is None or st.warm_end_ms is not None or st.warm_until_ms <= now_ms:
            continue
        if a.spec.node in busy or world.reusers_of(a):
            continue
        out[a.spec.node] = a.metadata.namespace or ""
    return out


class InformedHistory(RunHistory):
    """The run history summarised from the scheduler's informer of Jobs (memory) on each refresh, instead
    of a list of the whole jobs bucket over the bus; before the informer's first list, from a list."""

    def __init__(self, jobs: Informer[Job]) -> None:
        super().__init__(jobs.store)
        self.informer = jobs

    async def refresh(self) -> None:
        if not self.informer.synced.is_set():
            await super().refresh()
            return
        self.load(iter(self.informer))
