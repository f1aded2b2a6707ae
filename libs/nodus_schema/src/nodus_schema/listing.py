"""List types of kinds that the API serves read-only and that had no list of their own (Attempt, Node)."""

from __future__ import annotations

import msgspec

from nodus_schema.attempts import Attempt
from nodus_schema.meta import ListMeta
from nodus_schema.nodes import Node
from nodus_schema.wire import API_VERSION, Wire

__all__ = ["AttemptList", "NodeList"]


class AttemptList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Attempts."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "AttemptList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Attempt] = msgspec.field(default_factory=list)


class NodeList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Nodes."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "NodeList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Node] = msgspec.field(default_factory=list)
