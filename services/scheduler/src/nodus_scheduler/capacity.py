"""The in-memory capacity index: every node, grouped by what placement can tell apart, kept up to date by
small changes instead of relisting.

A *group* is the nodes of one (offering, region class, pool, interruptible): everything the matching rules
of the reference read is the same for all of them, so placement judges a request once per group (tens of
groups) instead of once per node (thousands), and counts refusals from group sizes. Inside a group a node
is in exactly one state:

* **drained**: its agent took it out of placement (phase ``Draining``, e.g. on a GPU fault, ADR-0022),
  whatever its heartbeat says: counted apart, so "why does my Job wait" names the drain;
* **not ready**: its phase is not Ready, it is ``unschedulable``, or its last heartbeat is older than
  :data:`HEARTBEAT_GRACE` (15 s);
* **busy**: ready, with an unfinished Attempt on it (the scheduler marks it), or **kept warm** for one
  project by a finished run's scaledownWindow (:meth:`CapacityIndex.mark_warm`, issue #21): counted busy
  for everyone, offered first to that project's runs (:meth:`Group.first_warm`);
* **free**: ready and not busy; these are kept in a heap by name, so the pick is deterministic (the
  smallest name of the best group).

A node whose agent is gone for good is in no group at all: with an ``unreachable`` grace (the scheduler's
``NODUS_NODE_UNREACHABLE_GRACE_S``, default :data:`UNREACHABLE_GRACE`), a node NotReady for longer than
that (:func:`gone_at`) leaves the index, so placement neither offers it work nor counts it in its
``0/N nodes: ...``. A new heartbeat brings it back; its record is deleted later still
(:mod:`nodus_scheduler.retiring`).

Changes, each O(1) apart from one heap push when a node becomes free (O(log n), amortised):
:meth:`CapacityIndex.upsert` (a node was added or its record changed: phase, heartbeat, offering, …),
:meth:`CapacityIndex.remove`, :meth:`CapacityIndex.mark_busy`, :meth:`CapacityIndex.mark_free`, and
:meth:`CapacityIndex.expire`, which turns nodes whose heartbeat has gone stale not ready and drops the ones
gone past the unreachable grace (heaps of deadlines, so only the expired ones are touched). Busy is kept
by node name, so marking a node busy before its record arrives (an Attempt listed before its node) works.

The index knows nothing of prices or requests; :mod:`nodus_scheduler.placing` judges the groups against a
price book version and picks the node.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from nodus_schema.meta import parse_time
from nodus_schema.nodes import Node

__all__ = [
    "HEARTBEAT_GRACE",
    "UNREACHABLE_GRACE",
    "CapacityIndex",
    "Group",
    "GroupKey",
    "Warm",
    "gone_at",
    "unreachable",
]

HEARTBEAT_GRACE: Final = timedelta(seconds=15)
"""A node whose last heartbeat is older than this is not offered work (its agent may be gone)."""
UNREACHABLE_GRACE: Final = timedelta(minutes=10)
"""How long a node may be NotReady before it leaves placement and its explanations (the default of the
scheduler's ``NODUS_NODE_UNREACHABLE_GRACE_S``)."""

GroupKey = tuple[str, str, str | None, bool]
"""(offering id, region class, pool, interruptible) of a node."""

_NEVER: Final = float("-inf")
_NEVER_GONE: Final = float("inf")


class Group:
    """The nodes of one (offering, region class, pool, interruptible), counted by state."""

    __slots__ = (
        "_free",
        "_heap",
        "_in_heap",
        "_warm",
        "busy",
        "drained",
        "interruptible",
        "key",
        "not_ready",
        "offering",
        "pool",
        "region_class",
        "total",
    )

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.offering, self.region_class, self.pool, self.interruptible = key
        self.total = 0
        self.not_ready = 0
        self.drained = 0
        self.busy = 0
        self._free: set[str] = set()
        self._heap: list[str] = []
        self._in_heap: set[str] = set()
        self._warm: dict[str, set[str]] = {}
        """Nodes of this group kept warm, by the namespace they are kept for (busy or not)."""

    @property
    def free(self) -> int:
        return len(self._free)

    def first_free(self) -> str | None:
        """The smallest name among the free nodes (stale heap entries are dropped on the way)."""
        heap, free = self._heap, self._free
        while heap:
            name = heap[0]
            if name in free:
                return name
            heapq.heappop(heap)
            self._in_heap.discard(name)
        return None

    def warm_for(self, namespace: str) -> set[str]:
        """The nodes of this group kept warm for ``namespace`` (some may be busy or not ready)."""
        return self._warm.get(namespace, set())

    def _add(self, name: str, ready: bool, busy: bool, drained: bool = False) -> None:
        self.total += 1
        if drained:
            self.drained += 1
        elif not ready:
            self.not_ready += 1
        elif busy:
            self.busy += 1
        else:
            self._free.add(name)
            if name not in self._in_heap:
                self._in_heap.add(name)
                heapq.heappush(self._heap, name)

    def _drop(self, name: str, ready: bool, busy: bool, drained: bool = False) -> None:
        self.total -= 1
        if drained:
            self.drained -= 1
        elif not ready:
            self.not_ready -= 1
        elif busy:
            self.busy -= 1
        else:
            self._free.discard(name)  # its heap entry goes stale and is dropped when it reaches the top

    def __repr__(self) -> str:
        return (
            f"Group({self.key}, total={self.total}, free={self.free}, busy={self.busy}, "
            f"not_ready={self.not_ready}, drained={self.drained})"
        )


class Warm:
    """A node kept warm for one project until ``until`` (epoch s), by the finished run ``keeper``."""

    __slots__ = ("keeper", "namespace", "until")

    def __init__(self, namespace: str, until: float, keeper: str) -> None:
        self.namespace, self.until, self.keeper = namespace, until, keeper

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Warm) and (self.namespace, self.until, self.keeper) == (
            other.namespace,
            other.until,
            other.keeper,
        )

    def __hash__(self) -> int:
        return hash((self.namespace, self.until, self.keeper))


class _Entry:
    __slots__ = ("alive_until", "drained", "gone_at", "group", "node", "ready", "schedulable")

    def __init__(
        self, node: Node, group: Group, schedulable: bool, alive_until: float, ready: bool, drained: bool
    ) -> None:
        self.node = node
        self.group = group
        self.schedulable = schedulable
        self.alive_until = alive_until
        self.ready = ready
        self.drained = drained
        self.gone_at = _NEVER_GONE


DRAINING: Final = "Draining"
"""The phase a node agent gives its node to take it out of placement (a GPU fault); it keeps beating."""


def key_of(node: Node) -> GroupKey:
    spec = node.spec
    return (spec.offering, spec.region_class, spec.pool or None, bool(spec.interruptible))


def _alive_until(node: Node, grace_s: float) -> float:
    beat = node.status.last_heartbeat_time
    if not beat:
        return _NEVER
    try:
        return parse_time(beat).timestamp() + grace_s
    except ValueError:
        return _NEVER


def _ts(now: datetime | None) -> float:
    return (now or datetime.now(UTC)).timestamp()


def gone_at(node: Node, after: timedelta) -> datetime | None:
    """When ``node`` will have been NotReady for ``after``, counted from its agent's last word: its last
    heartbeat (an agent that stops says NotReady with the time it stopped), else the record's creation.
    A node whose agent did not say NotReady is still Ready for :data:`HEARTBEAT_GRACE` after its last beat,
    so it is never gone before that. None when the record has no time to count from."""
    for text in (node.status.last_heartbeat_time, node.metadata.creation_timestamp):
        if not text:
            continue
        try:
            since = parse_time(text)
        except ValueError:
            continue
        return since + (after if node.status.phase == "NotReady" else max(after, HEARTBEAT_GRACE))
    return None


def unreachable(node: Node, now: datetime, after: timedelta) -> bool:
    """Whether ``node`` has been NotReady for longer than ``after`` at ``now`` (see :func:`gone_at`)."""
    at = gone_at(node, after)
    return at is not None and now > at


class CapacityIndex:
    """Every known node, grouped, with its state; see the module docstring."""

    def __init__(self, *, grace: timedelta = HEARTBEAT_GRACE, unreachable: timedelta | None = None) -> None:
        """``unreachable``: a node NotReady for longer leaves the index (None: it stays, not ready)."""
        self._grace_s = grace.total_seconds()
        self._unreachable = unreachable
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[GroupKey, Group] = {}
        self._busy: set[str] = set()
        self._warm: dict[str, Warm] = {}
        """Nodes kept warm for a project (scaledownWindow): busy for every other project until ``until``."""
        self._warm_ends: list[tuple[float, str]] = []
        """(until, name) of every warm node: a heap, as _deadlines."""
        self._deadlines: list[tuple[float, str]] = []
        self._gone: list[tuple[float, str]] = []
        """(gone_at, name) of every node that would leave the index: a heap, as _deadlines."""
        self.generation = 0
        """Bumped whenever a group is created: placement's cached judgements of the groups are then stale."""
        self.plans: dict[Any, Any] = {}
        """Placement's cache of judged requests (see placing.place_demand); cleared with a new generation."""

    @classmethod
    def of(
        cls,
        nodes: Iterable[Node],
        busy: Iterable[str] = (),
        now: datetime | None = None,
        *,
        unreachable: timedelta | None = None,
    ) -> CapacityIndex:
        """An index of ``nodes`` with the ``busy`` names marked, readiness judged at ``now``."""
        index = cls(unreachable=unreachable)
        index._busy.update(busy)
        for node in nodes:
            index.upsert(node, now)
        return index

    # -- reading ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def node(self, name: str) -> Node | None:
        entry = self._entries.get(name)
        return entry.node if entry is not None else None

    def groups(self) -> Iterator[Group]:
        return iter(self._groups.values())

    def is_busy(self, name: str) -> bool:
        return name in self._busy

    def warm(self, name: str) -> Warm | None:
        """Whom ``name`` is kept warm for, if anyone (whether or not a run is on it now)."""
        return self._warm.get(name)

    def _reserved(self, name: str) -> bool:
        """Busy for placement: a run on it, or kept warm for a project."""
        return name in self._busy or name in self._warm

    def first_warm(self, group: Group, namespace: str) -> str | None:
        """The smallest name of ``group`` kept warm for ``namespace``, ready and with no run on it."""
        names = [
            n
            for n in group.warm_for(namespace)
            if n not in self._busy and (e := self._entries.get(n)) is not None and e.ready
        ]
        return min(names) if names else None

    def is_ready(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.ready

    # -- changes ---------------------------------------------------------------------------------------

    def follow(self, name: str, node: Node | None) -> bool:
        """Take the view's record of ``name`` (None: gone); whether placement sees another node now: it
        came, went, or changed what it offers or whether it takes work. A heartbeat that changes nothing
        else (most Node writes) is not."""
        before, was_ready = self.node(name), self.is_ready(name)
        if node is not None:
            self.upsert(node)
        else:
            self.remove(name)
        after = self.node(name)
        if before is None or after is None or was_ready != self.is_ready(name):
            return True
        return before.spec is not after.spec and before.spec != after.spec

    def upsert(self, node: Node, now: datetime | None = None) -> None:
        """Add ``node`` or take its new record (phase, heartbeat, offering, pool, …); readiness at ``now``.
        A node NotReady past the unreachable grace at ``now`` is removed instead."""
        name = node.metadata.name or ""
        t = _ts(now)
        alive_until = _alive_until(node, self._grace_s)
        gone = self._gone_at(node, alive_until)
        if gone < t:
            self.remove(name)
            return
        entry = self._entries.get(name)
        if entry is not None and self._only_beat(entry, node, alive_until, gone, alive_until >= t):
            return
        spec = node.spec
        schedulable = node.status.phase == "Ready" and not spec.unschedulable
        drained = node.status.phase == DRAINING
        ready = schedulable and alive_until >= t
        group = self._group(key_of(node))
        busy = self._reserved(name)
        if entry is None:
            entry = _Entry(node, group, schedulable, alive_until, ready, drained)
            self._entries[name] = entry
        else:
            entry.group._drop(name, entry.ready, busy, entry.drained)
            self._unlist_warm(name, entry.group)
            entry.node, entry.group, entry.schedulable, entry.ready = node, group, schedulable, ready
            entry.alive_until, entry.drained = alive_until, drained
        group._add(name, ready, busy, drained)
        self._list_warm(name, group)
        entry.gone_at = gone
        self._file(name, entry)

    def _only_beat(self, entry: _Entry, node: Node, alive_until: float, gone: float, alive: bool) -> bool:
        """Take ``node`` as a heartbeat of ``entry`` when that is all it changed (the same spec, metadata
        and phase objects: a beat laid over the record, nodus_scheduler.beating) and readiness stays; the
        deadlines are filed as :meth:`upsert` files them. Whether it was."""
        old = entry.node
        if old.spec is not node.spec or old.metadata is not node.metadata:
            return False
        if old.status.phase != node.status.phase or (entry.schedulable and alive) != entry.ready:
            return False
        entry.node, entry.alive_until, entry.gone_at = node, alive_until, gone
        self._file(node.metadata.name or "", entry)
        return True

    def _file(self, name: str, entry: _Entry) -> None:
        """File ``entry``'s deadlines: readiness running out, and leaving the index."""
        if entry.ready:
            heapq.heappush(self._deadlines, (entry.alive_until, name))
        if entry.gone_at != _NEVER_GONE:
            heapq.heappush(self._gone, (entry.gone_at, name))
        if max(len(self._deadlines), len(self._gone)) > 4 * len(self._entries) + 1024:
            self._compact()

    def _gone_at(self, node: Node, alive_until: float) -> float:
        """:func:`gone_at` as a timestamp, from the heartbeat already parsed (upserts are mostly beats)."""
        after = self._unreachable
        if after is None:
            return _NEVER_GONE
        if alive_until == _NEVER:  # no heartbeat (or an unreadable one): counted from the creation
            at = gone_at(node, after)
            return _NEVER_GONE if at is None else at.timestamp()
        seconds = after.total_seconds()
        floor = seconds if node.status.phase == "NotReady" else max(seconds, self._grace_s)
        return alive_until - self._grace_s + floor

    def remove(self, name: str) -> None:
        """Forget a node (its record was deleted, or it is gone past the unreachable grace). Its busy mark
        stays until :meth:`mark_free`."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            entry.group._drop(name, entry.ready, self._reserved(name), entry.drained)
            self._unlist_warm(name, entry.group)

    def _restate(self, name: str, change: Callable[[], None]) -> None:
        """Apply ``change`` (to the busy or warm marks) and move the node between free and busy to match."""
        before = self._reserved(name)
        entry = self._entries.get(name)
        if entry is not None:
            self._unlist_warm(name, entry.group)
        change()
        after = self._reserved(name)
        if entry is not None:
            if before != after:
                entry.group._drop(name, entry.ready, before, entry.drained)
                entry.group._add(name, entry.ready, after, entry.drained)
            self._list_warm(name, entry.group)

    def mark_busy(self, name: str) -> None:
        """An unfinished Attempt is on ``name`` (known or not yet)."""
        if name not in self._busy:
            self._restate(name, lambda: self._busy.add(name))

    def mark_free(self, name: str) -> None:
        """No unfinished Attempt is on ``name`` any more (it may still be kept warm)."""
        if name in self._busy:
            self._restate(name, lambda: self._busy.discard(name))

    def mark_warm(self, name: str, warm: Warm | None) -> None:
        """``name`` is kept warm as ``warm`` says (None: for nobody), until ``warm.until`` at the latest."""
        if self._warm.get(name) == warm:
            return

        def change() -> None:
            if warm is None:
                self._warm.pop(name, None)
            else:
                self._warm[name] = warm
                heapq.heappush(self._warm_ends, (warm.until, name))

        self._restate(name, change)

    def _list_warm(self, name: str, group: Group) -> None:
        warm = self._warm.get(name)
        if warm is not None:
            group._warm.setdefault(warm.namespace, set()).add(name)

    def _unlist_warm(self, name: str, group: Group) -> None:
        warm = self._warm.get(name)
        if warm is not None:
            names = group._warm.get(warm.namespace)
            if names is not None:
                names.discard(name)
                if not names:
                    del group._warm[warm.namespace]

    def next_warm_end(self) -> float | None:
        """When the soonest warm window runs out (epoch s), None when no node is kept warm."""
        ends = self._warm_ends
        while ends:
            until, name = ends[0]
            warm = self._warm.get(name)
            if warm is not None and warm.until == until:
                return until
            heapq.heappop(ends)  # ended or renewed since
        return None

    def set_busy(self, names: Iterable[str]) -> None:
        """Make exactly ``names`` busy (a resync from the list of unfinished Attempts)."""
        wanted = set(names)
        for name in self._busy - wanted:
            self.mark_free(name)
        for name in wanted - self._busy:
            self.mark_busy(name)

    def expire(self, now: datetime | None = None) -> None:
        """Nodes whose last heartbeat is older than the grace at ``now`` become not ready; nodes NotReady
        past the unreachable grace leave the index."""
        limit = _ts(now)
        ends = self._warm_ends
        while ends and ends[0][0] <= limit:
            until, name = heapq.heappop(ends)
            warm = self._warm.get(name)
            if warm is not None and warm.until == until:  # else ended or renewed since
                self.mark_warm(name, None)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < limit:
            until, name = heapq.heappop(deadlines)
            entry = self._entries.get(name)
            if entry is None or not entry.ready or entry.alive_until != until:
                continue  # gone, already not ready, or heartbeating since (a later deadline is queued)
            busy = self._reserved(name)
            entry.group._drop(name, True, busy)
            entry.ready = False
            entry.group._add(name, False, busy)
        gone = self._gone
        while gone and gone[0][0] < limit:
            at, name = heapq.heappop(gone)
            entry = self._entries.get(name)
            if entry is not None and entry.gone_at == at:  # else removed, or heartbeating since
                self.remove(name)

    def _compact(self) -> None:
        """Drop superseded deadlines (heartbeats replace each other faster than they expire)."""
        self._deadlines = [(e.alive_until, n) for n, e in self._entries.items() if e.ready]
        heapq.heapify(self._deadlines)
        self._gone = [(e.gone_at, n) for n, e in self._entries.items() if e.gone_at != _NEVER_GONE]
        heapq.heapify(self._gone)

    def _group(self, key: GroupKey) -> Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(key)
            self.generation += 1
            self.plans.clear()
        return group
