"""Node lifecycle, its first step: a node whose heartbeats stopped is NotReady, and its runs are looked at.

Kubernetes runs this as its own controller (the node lifecycle controller), apart from the Job controller;
so does Nodus. It reconciles Nodes: a node whose agent beat within
:data:`~nodus_scheduler.capacity.HEARTBEAT_GRACE` is looked at again when that grace would end (a missed
heartbeat is no event of its own, so the reconcile asks for its next look); one past it is marked NotReady
(its agent sets it Ready again when it beats), and the Jobs of its unfinished Attempts are queued, whose
reconcile marks those runs Lost (:mod:`nodus_scheduler.lifecycle`). A node deleted while it had runs has
its Jobs queued too. The later steps, out of placement and then deleted, are
:mod:`nodus_scheduler.capacity` and :mod:`nodus_scheduler.retiring`.

Safe to kill at any line: the decision is made again from the record, and NotReady is written by
compare-and-set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from nodus_kit.storing import ObjectStore
from nodus_scheduler.capacity import HEARTBEAT_GRACE
from nodus_scheduler.ruling import alive
from nodus_scheduler.viewing import ACTIVE_ON, JobKey, World, job_key
from nodus_schema.meta import parse_time
from nodus_schema.nodes import Node

MARGIN_S = 0.05
"""Looked at this long after the grace ends, so that the look finds it ended."""


class NodeMonitor:
    def __init__(self, world: World, nodes: ObjectStore[Node], *, lost: Callable[[JobKey], None]) -> None:
        self.world, self.nodes, self.lost = world, nodes, lost

    async def reconcile(self, key: tuple[str, str]) -> float | None:
        name = key[1]
        node = self.world.node(name)
        now = datetime.now(UTC)
        if node is not None and alive(node, now):
            beat = parse_time(node.status.last_heartbeat_time or "")
            return (beat + HEARTBEAT_GRACE - now).total_seconds() + MARGIN_S
        if node is not None and node.status.phase != "NotReady":
            await self._mark_not_ready(name)
        for attempt in self.world.attempts.by_index(ACTIVE_ON, name):
            self.lost(job_key(attempt))
        return None

    async def _mark_not_ready(self, name: str) -> None:
        def change(node: Node) -> Node | None:
            if node.status.phase == "NotReady":
                return None
            return msgspec.structs.replace(
                node, status=msgspec.structs.replace(node.status, phase="NotReady")
            )

        with contextlib.suppress(Exception):  # the node may be gone, or its agent may have just beaten
            self.world.nodes.apply(await self.nodes.mutate(None, name, change))
