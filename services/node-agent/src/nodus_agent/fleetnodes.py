"""The simulated fleet's nodes and runs: a node's registration (the real agent's, labelled and cached, so a
beat is one write), and the state of one node, one run and one chunk of nodes' assignments (its durable
consumer's configuration; the kit's Consumer consumes it)."""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import msgspec
from nats.js.api import AckPolicy, ConsumerConfig

from nodus_agent.attemptdir import Record
from nodus_agent.fleetplanning import (
    NodeShape,
    Plan,
)
from nodus_agent.inventory import Inventory
from nodus_agent.registering import Registration
from nodus_agent.reporting import Reporter
from nodus_agent.settings import AgentSettings
from nodus_kit.errors import Conflict, NotFound
from nodus_kit.messaging import Consumer
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import Assignment
from nodus_schema.nodes import Node

ASSIGN_PREFIX = "nodus.assign."
LABEL_SIMULATED = "nodus.dev/simulated"
"""On every simulated Node: the fleet's name (``kubectl get nodes -l nodus.dev/simulated``)."""


class SimRegistration(Registration):
    """The real agent's registration, plus the simulated label and a cached Node: a beat is one write."""

    def __init__(
        self, store: ObjectStore[Node], settings: AgentSettings, inventory: Inventory, fleet: str
    ) -> None:
        super().__init__(store, settings, inventory)
        self.fleet = fleet
        self.node: Node | None = None

    async def register(self) -> Node:
        self.node = await super().register()
        return self.node

    async def beat(self) -> Node:
        cached = self.node
        if cached is not None:
            wanted = self._beat(cached)
            if wanted == cached:
                return cached  # same second as the last write: nothing to say
            try:
                self.node = await self.store.update(wanted)
                self._written = time.monotonic()
                return self.node
            except (Conflict, NotFound):
                pass  # someone else wrote it, or deleted it: the agent's own path re-reads or registers
        self.node = await super().beat()
        return self.node

    def _ready(self, node: Node) -> Node:
        ready = super()._ready(node)
        labels = {**ready.metadata.labels, LABEL_SIMULATED: self.fleet}
        return msgspec.structs.replace(ready, metadata=msgspec.structs.replace(ready.metadata, labels=labels))


@dataclass(eq=False)
class SimNode:
    name: str
    shape: NodeShape
    registration: SimRegistration
    reporter: Reporter
    alive: bool = True
    last_image: str | None = None
    """The image of the node's last run: a warm reuse of the same image skips the pull (the warm boot)."""


@dataclass(eq=False, slots=True)
class SimRun:
    node: SimNode
    namespace: str
    attempt: str
    plan: Plan
    rng: random.Random
    record: Record
    began: float = 0.0  # loop time the run started (once recorded)
    end_at: float = 0.0
    next_progress_at: float = math.inf
    progress_n: int = 0
    last_rate: Decimal | None = None
    handle: asyncio.TimerHandle | None = None
    done: bool = False
    """Its end is decided (timer fired, stopped, or vanished): nothing else may end it."""
    outcome: tuple[str, int | None, int, str | None, Decimal | None] | None = None
    ctx: contextvars.Context | None = None
    """The StartAttempt's context (request id, trace): the run's reports carry it, as the real agent's."""


@dataclass
class _Chunk:
    durable: str
    nodes: list[str]
    consumer: Consumer[Assignment] | None = None

    @property
    def subjects(self) -> list[str]:
        return [ASSIGN_PREFIX + n for n in self.nodes]

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subjects=self.subjects,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30.0,
            # No server-side max_deliver: an assignment for a vanished node waits for it (the fleet's
            # handler counts failures, fleet.MAX_DELIVER); enough pending room for every node's backlog.
            max_ack_pending=max(1000, 4 * len(self.nodes)),
        )


PostSync = Callable[[], None]
