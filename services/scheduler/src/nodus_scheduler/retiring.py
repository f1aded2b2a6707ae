"""Retiring nodes: the scheduler deletes the Node records that stopped or killed agents left behind.

An agent that stops says NotReady on its way out; one that is killed just stops heartbeating, and the
node monitor (:mod:`nodus_scheduler.monitoring`) marks its node NotReady and its runs Lost after
:data:`~nodus_scheduler.capacity.HEARTBEAT_GRACE`. Either way the record stays. Like Kubernetes' node
lifecycle controller, the scheduler then acts in two steps, each counted from the node's last heartbeat
(:func:`~nodus_scheduler.capacity.gone_at`):

* past ``NODUS_NODE_UNREACHABLE_GRACE_S`` (default 600 s) the node leaves placement: the capacity index
  drops it, so it is neither offered work nor counted in a waiting Job's ``0/N nodes: ...``
  (:mod:`nodus_scheduler.capacity`; estimates leave it out too);
* past ``NODUS_NODE_DELETE_AFTER_S`` (default 86400 s) this module's :class:`Retirer` deletes its record.

The retirer is a controller of its own, run only by the replica that holds the scheduler's lease
(``service.py``). Every :func:`check_period` it judges the Nodes of the scheduler's informer. Safe to kill at
any line, and idempotent: it keeps no state, decides from the record alone, and deletes by
compare-and-set on the revision it judged, so a node whose agent wrote since (a heartbeat, a
registration) is kept and judged again on the next look; a record already deleted (NotFound) is what was
wanted. An agent that comes back later simply registers its Node again (``nodus_agent.registering``).
ADR-0035 records the design.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from nats.aio.client import Client as NATS

from nodus_kit.configuring import read_settings
from nodus_kit.errors import Conflict, NotFound
from nodus_kit.eventing import publish_event
from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_scheduler.capacity import UNREACHABLE_GRACE, unreachable
from nodus_scheduler.settings import DELETE_AFTER, DELETE_AFTER_ENV, UNREACHABLE_GRACE_ENV, SchedulerSettings
from nodus_schema.nodes import Node

__all__ = [
    "DELETE_AFTER",
    "DELETE_AFTER_ENV",
    "NODE_DELETED",
    "UNREACHABLE_GRACE_ENV",
    "NodeTimes",
    "Retirer",
    "check_period",
]

log = logging.getLogger(__name__)

NODE_DELETED: Final = "NodeDeleted"
"""The reason of the event on ``nodus.events._.nodes.<node>`` when the retirer deletes a node."""


@dataclass(frozen=True, slots=True)
class NodeTimes:
    """The scheduler's two periods of a NotReady node, from its settings."""

    unreachable_grace: timedelta = UNREACHABLE_GRACE
    """NotReady for longer: out of placement and of its explanations."""
    delete_after: timedelta = DELETE_AFTER
    """NotReady for longer: the record is deleted."""

    @classmethod
    def of(cls, settings: SchedulerSettings) -> NodeTimes:
        return cls(
            timedelta(seconds=settings.unreachable_grace_s), timedelta(seconds=settings.delete_after_s)
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeTimes:
        """``NODUS_NODE_UNREACHABLE_GRACE_S`` and ``NODUS_NODE_DELETE_AFTER_S`` (seconds, more than 0), read
        with the rest of the scheduler's settings (a bad one of those is refused too)."""
        return cls.of(read_settings(SchedulerSettings, env))


def check_period(delete_after: timedelta) -> float:
    """How often the retirer looks: a tenth of the delete period, at least every 60 s, at most every 0.5 s."""
    return min(60.0, max(0.5, delete_after.total_seconds() / 10))


class Retirer:
    """Deletes the Nodes of the informer ``view`` that have been NotReady for longer than ``delete_after``."""

    def __init__(
        self,
        nc: NATS,
        nodes: ObjectStore[Node],
        view: Informer[Node],
        *,
        delete_after: timedelta = DELETE_AFTER,
        check_s: float | None = None,
        judge: Callable[[Node, float], bool] | None = None,
    ) -> None:
        self.nc, self.nodes, self.view = nc, nodes, view
        self.judge = judge
        """Whether a node's silence at a time may be judged (``Liveness.may_judge``); None: always."""
        self.delete_after = delete_after
        self.check_s = check_period(delete_after) if check_s is None else check_s
        self.deleted = 0
        """Nodes this retirer deleted (the logs and tests read it)."""

    async def run(self) -> None:
        """Look every ``check_s`` until cancelled (the leader stops leading); a failed look is logged and the
        next one tries again."""
        await self.view.synced.wait()
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("retiring nodes failed; the next look tries again")
            await asyncio.sleep(self.check_s)

    async def sweep(self, now: datetime | None = None) -> list[str]:
        """Delete every node of the view NotReady for longer than ``delete_after`` at ``now``; the names of
        those this call deleted."""
        now = now or datetime.now(UTC)
        at = now.timestamp()
        due = [
            n
            for n in self.view
            if unreachable(n, now, self.delete_after) and (self.judge is None or self.judge(n, at))
        ]
        return [n.metadata.name or "" for n in due if await self.retire(n)]

    async def retire(self, node: Node) -> bool:
        """Delete ``node`` if its record is still the revision judged; whether this call deleted it."""
        meta = node.metadata
        name = meta.name or ""
        if not meta.resource_version:
            return False  # no revision to compare and set on: never delete blind
        try:
            deleted = await self.nodes.delete(None, name, resource_version=meta.resource_version)
        except NotFound:
            return False  # deleted already (by an operator, or by this retirer before a crash)
        except Conflict:
            return False  # its agent wrote since the judgement: kept, and judged again next time
        self.view.apply(deleted, deleted=True)  # placement forgets it now, not at the watch's event
        self.deleted += 1
        since = node.status.last_heartbeat_time or meta.creation_timestamp or "its creation"
        seconds = f"{self.delete_after.total_seconds():g}"
        log.info("node deleted", extra={"node": name, "lastHeartbeat": since, "deleteAfterS": seconds})
        await publish_event(
            self.nc,
            deleted,
            NODE_DELETED,
            f"node {name} deleted: no heartbeat since {since}, NotReady for longer than "
            f"{DELETE_AFTER_ENV}={seconds}; its agent registers it again if it comes back",
            severity="Warning",
        )
        return True
