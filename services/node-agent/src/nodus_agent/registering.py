"""The agent's Node record in the ``nodes`` bucket: register, heartbeat, and say NotReady on the way out.

The agent is the sole writer of its Node (cluster-scoped: key ``_.<node>``). Every write goes through
``ObjectStore.mutate``, so a lost compare-and-set is re-read and retried; a Node deleted under a running
agent is simply registered again by the next record refresh.

Liveness off the disk (ADR-0042, Kubernetes' node Lease for the same reason): each ``heartbeat_s`` the
agent publishes a :class:`~nodus_schema.messages.NodeBeat` on ``nodus.beat.<node>``, a core NATS message
that nothing stores; the record itself is written on a change and every ``record_s`` (its
``lastHeartbeatTime``), so an idle node costs the bus no write between refreshes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from importlib import metadata

import msgspec

from nodus_agent.inventory import Inventory
from nodus_agent.settings import AgentSettings
from nodus_kit.errors import AlreadyExists, NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import NodeBeat, beat_subject
from nodus_schema.meta import Condition, ObjectMeta, now_rfc3339
from nodus_schema.nodes import Node, NodeSpec

log = logging.getLogger(__name__)

LABEL_OFFERING = "nodus.dev/offering"
LABEL_REGION_CLASS = "nodus.dev/region-class"
LABEL_POOL = "nodus.dev/pool"

GPU_HEALTHY = "GPUHealthy"
"""The Node condition of the GPU health watch (gpuhealth.py): False, with the fault as its reason, while
the node drains; True on a real GPU host that has seen no fault since its agent started."""
DRAINING = "Draining"


@dataclass(frozen=True)
class Drain:
    """Why this agent took its node out of placement; kept until the agent restarts."""

    reason: str
    """A CamelCase code: XidCriticalError, DoubleBitEccError, RowRemapPending, GpuLost, ..."""
    message: str
    gpus: frozenset[int]
    """Indexes of the GPUs found faulty (``healthy: false`` on the Node)."""
    since: str


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
        self.drain: Drain | None = None
        """Set by :meth:`drain_node`; every later write (register, beats) keeps the node Draining."""
        self._written = 0.0
        """When the record was last written (monotonic): the next refresh is ``record_s`` after it."""

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
            # The first refresh at a random point of the interval: a fleet registered at once does not
            # refresh every record in the same second ever after.
            self._written = time.monotonic() - random.uniform(0.0, self.settings.record_s)
            return node

    async def beat(self) -> Node:
        """Write the record's heartbeat (the refresh): Ready again over a NotReady, drained if draining,
        registered again if the record was deleted."""
        try:
            node = await self.store.mutate(None, self.settings.node, self._beat)
        except NotFound:
            log.warning("node record %s vanished: registering again", self.settings.node)
            return await self.register()
        self._written = time.monotonic()
        return node

    async def pulse(self) -> None:
        """One liveness beat on ``nodus.beat.<node>``: a core message, stored nowhere."""
        beat = NodeBeat(time_ms=int(time.time() * 1000), phase=DRAINING if self.drain else "Ready")
        await self.store.nc.publish(beat_subject(self.settings.node), msgspec.json.encode(beat))

    def record_due(self) -> bool:
        """Whether the record's refresh is due (``record_s`` since it was last written)."""
        return time.monotonic() - self._written >= self.settings.record_s

    async def tick(self) -> None:
        """What one heartbeat does: the record's refresh when it is due, else a beat on the bus."""
        if self.record_due():
            await self.beat()
        else:
            await self.pulse()

    async def heartbeat(self) -> None:
        """Tick every ``heartbeat_s`` until cancelled; a failed beat is logged and the loop goes on."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.tick()
            except Exception as e:  # the bus may be reconnecting: the next beat tries again
                log.warning("heartbeat failed: %s", e, extra={"node": self.settings.node})

    async def drain_node(self, reason: str, message: str, gpu: int | None = None) -> Node | None:
        """Take the node out of placement: phase Draining, condition GPUHealthy=False with ``reason`` and
        ``message``, the GPU ``gpu`` marked unhealthy. The first fault's reason stays; later ones add
        their GPU. Remembered in memory first, so a write the bus refuses now is made by the next
        heartbeat; None when that write failed. Restarting the agent registers the node Ready again."""
        bad = frozenset() if gpu is None else frozenset({gpu})
        if self.drain is None:
            self.drain = Drain(reason=reason, message=message, gpus=bad, since=now_rfc3339())
        else:
            self.drain = dataclasses.replace(self.drain, gpus=self.drain.gpus | bad)
        try:
            return await self.store.mutate(None, self.settings.node, self._drained)
        except Exception as e:  # NotFound (the next beat registers it, drained) or the bus is away
            log.warning("could not write the drain yet (%s): the next heartbeat will", e)
            return None

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
            # A restarted agent has seen no fault yet: a drain ends here (gpuhealth re-drains at once if
            # the GPU still reports a pending retirement or remap). A fake inventory has no health.
            conditions=_set_condition(node.status.conditions, None if self.inventory.fake else _HEALTHY),
        )
        meta = msgspec.structs.replace(node.metadata, labels=labels)
        ready = msgspec.structs.replace(node, metadata=meta, spec=spec, status=status)
        return self._drained(ready) if self.drain is not None else ready

    def _beat(self, node: Node) -> Node:
        # Whole seconds (metav1.Time): beats inside one second write nothing (mutate skips equal objects).
        # The time, and Ready again if the scheduler marked the node NotReady for a missed beat; any other
        # phase is register's and mark_not_ready's (a Draining node stays Draining).
        phase = "Ready" if node.status.phase == "NotReady" else node.status.phase
        status = msgspec.structs.replace(node.status, phase=phase, last_heartbeat_time=now_rfc3339())
        beaten = msgspec.structs.replace(node, status=status)
        return self._drained(beaten) if self.drain is not None else beaten

    def _drained(self, node: Node) -> Node:
        """``node`` as :attr:`drain` says: Draining, GPUHealthy False, the faulty GPUs unhealthy."""
        drain = self.drain
        assert drain is not None, "only called while draining"
        condition = Condition(
            type=GPU_HEALTHY,
            status="False",
            reason=drain.reason,
            message=drain.message,
            last_transition_time=drain.since,
        )
        gpus = [
            msgspec.structs.replace(g, healthy=False) if g.index in drain.gpus else g
            for g in node.status.gpus
        ]
        status = msgspec.structs.replace(
            node.status,
            phase=DRAINING,
            gpus=gpus,
            conditions=_set_condition(node.status.conditions, condition),
        )
        return msgspec.structs.replace(node, status=status)


_HEALTHY = Condition(
    type=GPU_HEALTHY, status="True", reason="NoFaultSeen", message="no GPU fault seen since the agent started"
)


def _set_condition(conditions: list[Condition], wanted: Condition | None) -> list[Condition]:
    """``conditions`` with the GPUHealthy one replaced by ``wanted`` (None: removed). The transition time
    moves only when the status changes, as metav1.Condition's does."""
    old = next((c for c in conditions if c.type == GPU_HEALTHY), None)
    rest = [c for c in conditions if c.type != GPU_HEALTHY]
    if wanted is None:
        return rest
    if old is not None and old.status == wanted.status:
        since = old.last_transition_time
    else:
        since = wanted.last_transition_time or now_rfc3339()
    return [*rest, msgspec.structs.replace(wanted, last_transition_time=since)]
