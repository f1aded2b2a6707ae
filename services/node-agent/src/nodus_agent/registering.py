"""The agent's Node record in the ``nodes`` bucket: register, heartbeat, and say NotReady on the way out.

The agent is the sole writer of its Node (cluster-scoped: key ``_.<node>``). Every write goes through
``ObjectStore.mutate``, so a lost compare-and-set is re-read and retried; a Node deleted under a running
agent is simply registered again by the next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

import msgspec

from nodus_agent.inventory import Inventory
from nodus_agent.settings import AgentSettings
from nodus_kit.errors import AlreadyExists, NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec

log = logging.getLogger(__name__)

LABEL_OFFERING = "nodus.dev/offering"
LABEL_REGION_CLASS = "nodus.dev/region-class"
LABEL_POOL = "nodus.dev/pool"


def agent_version() -> str:
    try:
        return metadata.version("nodus-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


class Registration:
    """Keeps one Node record true to this agent."""

    def __init__(self, store: ObjectStore[Node], settings: AgentSettings, inventory: Inventory) -> None:
        self.store, self.settings, self.inventory = store, settings, inventory
        self.registered = False

    async def register(self) -> Node:
        """Create the Node, or take over the existing record (an agent restart keeps its name)."""
        while True:
            try:
                node = await self.store.mutate(None, self.settings.node, self._ready)
            except NotFound:
                try:
                    fresh = Node(metadata=ObjectMeta(name=self.settings.node))
                    node = await self.store.create(self._ready(fresh))
                except AlreadyExists:
                    continue  # created between our read and our create: take it over on the next pass
            self.registered = True
            return node

    async def beat(self) -> Node:
        try:
            return await self.store.mutate(None, self.settings.node, self._beat)
        except NotFound:
            log.warning("node record %s vanished: registering again", self.settings.node)
            return await self.register()

    async def heartbeat(self) -> None:
        """Beat every ``heartbeat_s`` until cancelled; a failed beat is logged and the loop goes on."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.beat()
            except Exception as e:  # the bus may be reconnecting: the next beat tries again
                log.warning("heartbeat failed: %s", e, extra={"node": self.settings.node})

    async def mark_not_ready(self) -> None:
        def not_ready(node: Node) -> Node:
            status = msgspec.structs.replace(node.status, phase="NotReady", last_heartbeat_time=now_rfc3339())
            return msgspec.structs.replace(node, status=status)

        try:
            await self.store.mutate(None, self.settings.node, not_ready)
        except NotFound:
            pass
        self.registered = False

    # -- the changes --------------------------------------------------------------------------------
    def _ready(self, node: Node) -> Node:
        s = self.settings
        labels = {**node.metadata.labels, LABEL_OFFERING: s.offering, LABEL_REGION_CLASS: s.region_class}
        if s.pool:
            labels[LABEL_POOL] = s.pool
        else:
            labels.pop(LABEL_POOL, None)
        spec = NodeSpec(
            offering=s.offering,
            region_class=s.region_class,
            pool=s.pool,
            unschedulable=node.spec.unschedulable,  # a cordon outlives an agent restart
            interruptible=True if s.interruptible else None,
        )
        status = msgspec.structs.replace(
            node.status,
            phase="Ready",
            gpus=list(self.inventory.gpus),
            fake_gpus=self.inventory.fake,
            agent_version=agent_version(),
            last_heartbeat_time=now_rfc3339(),
        )
        meta = msgspec.structs.replace(node.metadata, labels=labels)
        return msgspec.structs.replace(node, metadata=meta, spec=spec, status=status)

    def _beat(self, node: Node) -> Node:
        # Whole seconds (metav1.Time): beats inside one second write nothing (mutate skips equal objects).
        # The time, and Ready again if the scheduler marked the node NotReady for a missed beat; any other
        # phase is register's and mark_not_ready's (a Draining node stays Draining).
        phase = "Ready" if node.status.phase == "NotReady" else node.status.phase
        status = msgspec.structs.replace(node.status, phase=phase, last_heartbeat_time=now_rfc3339())
        return msgspec.structs.replace(node, status=status)
