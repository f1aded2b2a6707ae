"""Node: one registered node agent, its offering, its GPUs and its heartbeat (owner: the node agent)."""

from __future__ import annotations

import msgspec

from nodus_schema.meta import Condition, ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

NODE_PHASES = ("Ready", "NotReady", "Draining")


class GPUDevice(Wire):
    index: int
    uuid: str
    variant: str
    memory: str
    healthy: bool = True


class NodeSpec(Wire):
    offering: str
    """The offering id of the price book this node is a node of (``h100-sxm-80g-x1-us``)."""
    region_class: str
    pool: str | None = None
    """The BYOC Pool the node belongs to; only Jobs with that ``placement.pool`` run on it, and Jobs without
    a pool run only on nodes without one."""
    unschedulable: bool | None = None
    interruptible: bool | None = None
    """True when the node is interruptible capacity (the provider may reclaim it): it is placed only for
    Jobs whose ``placement.interruptible`` is Allow or Prefer, at the offering's interruptible rate."""


class NodeStatus(Wire):
    phase: str | None = None
    gpus: list[GPUDevice] = msgspec.field(default_factory=list)
    last_heartbeat_time: str | None = None
    agent_version: str | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)
    fake_gpus: bool | None = None
    """True when the GPUs are a fake inventory (no NVML): local stacks and tests."""


class Node(Wire):
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Node")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=lambda: NodeSpec(offering="", region_class=""))
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)
