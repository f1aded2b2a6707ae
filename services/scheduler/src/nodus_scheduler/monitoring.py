"""Node lifecycle, its first step: a node whose heartbeats stopped is NotReady, and its runs are looked at.

Kubernetes runs this as its own controller (the node lifecycle controller), apart from the Job controller;
so does Nodus. The monitor looks at a node when its heartbeat would run out: its last beat plus
:data:`~nodus_scheduler.capacity.HEARTBEAT_GRACE`. A node that beat since is left alone (its beat set a
later look); one past the grace is marked NotReady (its agent sets it Ready again when it beats), and the
Jobs of its unfinished Attempts are queued, whose reconcile marks those runs Lost
(:mod:`nodus_scheduler.lifecycle`). A node deleted while it had runs has its Jobs queued too. The later
steps, out of placement and then deleted, are :mod:`nodus_scheduler.capacity` and
:mod:`nodus_scheduler.retiring`.

One timer for every node (issue #23): each change of a Node (mostly a heartbeat) files its next look in a
heap, and one loop sleeps until the earliest look that is still due, skipping the looks later beats
replaced. A beat costs a heap push; nothing walks the idle nodes (the controller this replaces made a
pass per beat and walked every node every resync).

Beats come on the bus (:mod:`nodus_scheduler.beating`, ADR-0042): a node whose silence began while this
replica was not listening is looked at again once it has listened for a grace. A beat from a node marked
NotReady (by this monitor, for beats it missed) writes the phase the beat says (Ready, or Draining) and
the beat's time back: the agent writes its record only every ``record_s``.

Safe to kill at any line: the leader looks at every node when it starts, the decision is made again from
the record, and NotReady and the revival are written by compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from nodus_kit.cancelling import cancel_and_wait
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore
from nodus_scheduler.beating import epoch_of
from nodus_scheduler.capacity import HEARTBEAT_GRACE
from nodus_scheduler.ruling import alive
from nodus_scheduler.viewing import ACTIVE_ON, JobKey, World, job_key
from nodus_schema.meta import format_time, parse_time
from nodus_schema.nodes import Node

MARGIN_S = 0.05
"""Looked at this long after the grace ends, so that the look finds it ended."""
_GRACE_S = HEARTBEAT_GRACE.total_seconds()


def look_at(node: Node) -> float:
    """When ``node``'s heartbeat runs out (epoch seconds): at once for a node without a readable beat."""
    beat = node.status.last_heartbeat_time
    try:
        return parse_time(beat).timestamp() + _GRACE_S + MARGIN_S if beat else 0.0
    except ValueError:
        return 0.0


class NodeMonitor:
    def __init__(self, world: World, nodes: ObjectStore[Node], *, lost: Callable[[JobKey], None]) -> None:
        self.world, self.nodes, self.lost = world, nodes, lost
        self._looks: list[tuple[float, str]] = []
        """(when, node): a heap; an entry whose time is no longer ``_due[node]`` was replaced."""
        self._due: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._sleeps_until = 0.0
        self._leading = False
        self._reviving: dict[str, asyncio.Task[None]] = {}
        world.nodes.add_handler(self._on_event)

    async def run(self) -> None:
        """While this replica leads: every node looked at once, then each when its heartbeat runs out."""
        await self.world.nodes.synced.wait()
        self._leading = True
        self.world.liveness.revive = self._revive
        try:
            for node in self.world.nodes:
                self._file(node.metadata.name or "", look_at(node))
            while True:
                for name in self._take_due(time.time()):
                    await self.look(name)
                await self._sleep()
        finally:
            self._leading = False
            self.world.liveness.revive = None
            await cancel_and_wait(list(self._reviving.values()))
            self._reviving.clear()
            self._looks.clear()
            self._due.clear()

    def _on_event(self, event: Event[Any]) -> None:
        if self._leading:
            node: Node = event.object
            self._file(node.metadata.name or "", 0.0 if event.type == "DELETED" else look_at(node))

    def _file(self, name: str, at: float) -> None:
        if self._due.get(name) == at:
            return
        self._due[name] = at
        heapq.heappush(self._looks, (at, name))
        if at < self._sleeps_until:
            self._wake.set()

    def _take_due(self, now: float) -> list[str]:
        """The nodes whose look is due at ``now``, and the heap rid of the looks later beats replaced."""
        looks, due = self._looks, []
        while looks and (looks[0][0] <= now or self._due.get(looks[0][1]) != looks[0][0]):
            at, name = heapq.heappop(looks)
            if self._due.get(name) == at:
                del self._due[name]
                due.append(name)
        return due

    async def _sleep(self) -> None:
        self._wake.clear()
        self._sleeps_until = self._looks[0][0] if self._looks else float("inf")
        wait = None if not self._looks else max(0.0, self._sleeps_until - time.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)
        self._sleeps_until = 0.0

    async def look(self, name: str) -> None:
        """Mark ``name`` NotReady if its heartbeat ran out, and queue the Jobs of its unfinished runs."""
        node = self.world.node(name)
        now = time.time()
        if node is not None and alive(node, datetime.fromtimestamp(now, UTC)):
            self._file(name, look_at(node))
            return
        liveness = self.world.liveness
        if node is not None and not liveness.may_judge(node, now):  # silent while not listening
            self._file(name, max(look_at(node), liveness.judged_from() + MARGIN_S))
            return
        if node is not None and node.status.phase != "NotReady":
            await self._mark_not_ready(name)
        for attempt in self.world.attempts.by_index(ACTIVE_ON, name):
            self.lost(job_key(attempt))

    async def _mark_not_ready(self, name: str) -> None:
        def change(node: Node) -> Node | None:
            if node.status.phase == "NotReady":
                return None
            return msgspec.structs.replace(
                node, status=msgspec.structs.replace(node.status, phase="NotReady")
            )

        with contextlib.suppress(Exception):  # the node may be gone, or its agent may have just beaten
            self.world.nodes.apply(await self.nodes.mutate(None, name, change))

    # -- a beat from a node marked NotReady ------------------------------------------------------------
    def _revive(self, name: str) -> None:
        if self._leading and name not in self._reviving:
            task = asyncio.create_task(self._write_revival(name), name=f"scheduler:revive:{name}")
            self._reviving[name] = task
            task.add_done_callback(lambda _: self._reviving.pop(name, None))

    async def _write_revival(self, name: str) -> None:
        """The phase and time of ``name``'s newest beat over a NotReady record older than that beat."""
        liveness = self.world.liveness

        def change(node: Node) -> Node | None:
            heard = int(liveness.heard.get(name, 0.0))
            if node.status.phase != "NotReady" or heard <= int(epoch_of(node.status.last_heartbeat_time)):
                return None  # Ready already, or NotReady said by its agent after this beat (it stopped)
            status = msgspec.structs.replace(
                node.status,
                phase=liveness.phases.get(name, "Ready"),
                last_heartbeat_time=format_time(datetime.fromtimestamp(heard, UTC)),
            )
            return msgspec.structs.replace(node, status=status)

        with contextlib.suppress(Exception):  # gone, or the bus is away: the next beat asks again
            self.world.nodes.apply(await self.nodes.mutate(None, name, change))
