"""Node liveness heard on the bus (ADR-0042): the beats laid over the Nodes' records.

A node agent beats every ``heartbeat_s`` on ``nodus.beat.<node>`` (core NATS: nothing stores a beat, so
an idle node costs no disk write), and writes its Node record only on a change and every ``record_s``.
This is Kubernetes' split of the node Lease from NodeStatus, for the same reason (a write per node per
beat, each synced, was most of what 1,000 idle nodes cost). Every scheduler replica hears every beat and
keeps the newest per node; its Nodes informer lays it over the record's ``lastHeartbeatTime``
(:meth:`Liveness.overlay`, the informer's transform), so placement, the node monitor, Lost marking and
the retirer read one heartbeat time, never older than the record's and never past this clock.

A beat nobody heard is not a silence: this process hears beats only since it subscribed, and none while
its connection is down. Until one grace has passed since it began (or came back) to listen, a Ready or
Draining node whose last known beat is older than that moment is not judged (:meth:`Liveness.may_judge`):
its record may be ``record_s`` old while its agent beats on. A node that beat since, or whose record
says NotReady already, is judged as always.

Whoever sends a beat: the subject's node token is what the bus lets that credential publish (an agent its
own node only); the body's time is taken no later than this clock (a beat cannot keep a node alive past
its silence), and a beat for a node without a record is dropped (its agent registers it first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nodus_kit.informing import Informer
from nodus_kit.keying import Event
from nodus_scheduler.ruling import alive
from nodus_schema.messages import BEAT_PREFIX, NodeBeat, beat_subject
from nodus_schema.meta import format_second, parse_time
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

GAP_S = 15.0
"""How long after it begins to listen (or its connection comes back) a silence is not yet trusted: the
heartbeat grace (nodus_scheduler.capacity.HEARTBEAT_GRACE), within which every live agent beats."""
BEAT_PHASES = frozenset({"Ready", "Draining"})
_decode = msgspec.json.Decoder(NodeBeat).decode


def epoch_of(text: str | None) -> float:
    """A record's ``lastHeartbeatTime`` as epoch seconds; 0 when absent or unreadable."""
    if not text:
        return 0.0
    try:
        return parse_time(text).timestamp()
    except ValueError:
        return 0.0


class Liveness:
    """The newest beat of each node, laid over the Nodes informer's records."""

    def __init__(self) -> None:
        self.heard: dict[str, float] = {}
        """Node -> its newest beat heard (epoch seconds; the agent's clock, never past this one's)."""
        self.phases: dict[str, str] = {}
        """Node -> the phase its newest beat said (Ready or Draining)."""
        self.since = 0.0
        """When this process began to hear beats, or heard them again after a reconnect (0: it does not)."""
        self.revive: Callable[[str], None] | None = None
        """Set by the node monitor while it leads: a beat heard from a node whose record says NotReady."""
        self.nodes: Informer[Node] | None = None
        self._records: dict[str, float] = {}
        """Node -> its record's own ``lastHeartbeatTime`` (epoch seconds)."""
        self._made: dict[str, Node] = {}
        """Node -> the copy :meth:`overlay` last made (a transform of it again is no record)."""
        self._nc: NATS | None = None
        self._reconnects = 0
        self._sub: Subscription | None = None
        self.beats = 0
        """Beats taken (the benchmarks and tests read it)."""

    # -- the informer's transform ---------------------------------------------------------------------
    def overlay(self, node: Node) -> Node:
        """``node`` with the newest beat heard as its ``lastHeartbeatTime`` where that is a later second than
        its record's (metav1.Time is whole seconds)."""
        name = node.metadata.name or ""
        if self._made.get(name) is not node:  # a record: from the store, or a write-through
            self._records[name] = epoch_of(node.status.last_heartbeat_time)
            self._made.pop(name, None)
        heard = int(self.heard.get(name, 0.0))
        if heard <= int(self._records[name]):
            return node
        stamp = format_second(heard)  # remembered by the second: the beats of a second share it
        if stamp == node.status.last_heartbeat_time:
            return node
        made = msgspec.structs.replace(
            node, status=msgspec.structs.replace(node.status, last_heartbeat_time=stamp)
        )
        self._made[name] = made
        return made

    def record_beat(self, name: str) -> float:
        """The record's own ``lastHeartbeatTime`` of ``name`` (epoch seconds; 0 when unknown)."""
        return self._records.get(name, 0.0)

    def _on_node(self, event: Event[Node]) -> None:
        if event.type == "DELETED":
            name = event.object.metadata.name or ""
            for held in (self.heard, self.phases, self._records, self._made):
                held.pop(name, None)

    # -- hearing --------------------------------------------------------------------------------------
    def attach(self, nodes: Informer[Node]) -> None:
        """Lay the beats over ``nodes``, whose transform :meth:`overlay` must be."""
        self.nodes = nodes
        nodes.add_handler(self._on_node)

    async def start(self, nc: NATS) -> None:
        """Hear every node's beats from now on (after :meth:`attach`)."""
        if self._sub is not None:
            return
        self._nc = nc
        self._reconnects = nc.stats["reconnects"]
        self._sub = await nc.subscribe(beat_subject("*"), cb=self._on_beat)
        self.since = time.time()

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception as e:  # the connection is closing: nothing left to hear
                log.debug("beats: unsubscribe failed: %s", e)

    async def _on_beat(self, msg: Msg) -> None:
        self.take(msg.subject[len(BEAT_PREFIX) + 1 :], msg.data)

    def take(self, name: str, data: bytes, now: float | None = None) -> bool:
        """Take one beat of node ``name``; whether it was news (a later beat of a node with a record)."""
        nodes = self.nodes
        if nodes is None or "." in name or nodes.get(None, name) is None:
            return False
        try:
            beat = _decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        at = min(beat.time_ms / 1000.0, time.time() if now is None else now)
        if at <= self.heard.get(name, 0.0):
            return False  # a late or repeated beat
        self.heard[name] = at
        self.phases[name] = beat.phase if beat.phase in BEAT_PHASES else "Ready"
        self.beats += 1
        nodes.retransform(None, name)
        node = nodes.get(None, name)
        # A beat after the NotReady was written (not one its agent sent before saying it stops).
        revived = node is not None and node.status.phase == "NotReady"
        if revived and int(at) > int(self.record_beat(name)) and self.revive is not None:
            self.revive(name)
        return True

    # -- judging --------------------------------------------------------------------------------------
    def may_judge(self, node: Node, now: float) -> bool:
        """Whether a silence of ``node`` at ``now`` is one this process would have heard end: it listens,
        is connected, and has listened for :data:`GAP_S` since it began or came back, or the node's last
        known beat is after that moment. A node whose record says NotReady (its agent said it stops, or a
        monitor judged it before) is judged as it is. A process that hears no beats (tests of the rules)
        judges all."""
        nc = self._nc
        if nc is None or node.status.phase == "NotReady":
            return True
        if not nc.is_connected:
            return False
        reconnects = nc.stats["reconnects"]
        if reconnects != self._reconnects:  # beats were missed while it was away: listen again first
            self._reconnects, self.since = reconnects, now
        if now >= self.since + GAP_S:
            return True
        name = node.metadata.name or ""
        return max(self.heard.get(name, 0.0), epoch_of(node.status.last_heartbeat_time)) >= self.since

    def lost(self, node: Node, now: datetime) -> bool:
        """Whether ``node`` is lost at ``now``: no beat within the grace, and a silence this process would
        have heard end (:meth:`may_judge`)."""
        return not alive(node, now) and self.may_judge(node, now.timestamp())

    def judged_from(self) -> float:
        """When every silence may be judged (epoch seconds): the node monitor looks again then."""
        return self.since + GAP_S
