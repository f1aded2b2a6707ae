"""What an ObjectStore's bucket holds, in its own terms: keys, the headers that mark a write or a delete,
and the events and pages a reader gets.

A leaf: no import from the kit, so :mod:`nodus_kit.storing` and :mod:`nodus_kit.watching` both build
on it and neither needs the other's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import msgspec

KV_OP: Final = "KV-Operation"
"""nats-py's KV header: ``DEL`` or ``PURGE`` on a delete marker."""
MARKER_REASON: Final = "Nats-Marker-Reason"
"""Set by the server on the marker it writes when a message's TTL expires (subject delete markers)."""
NODUS_OP: Final = "Nodus-Op"
"""The store's own header on every write: ``create``, ``update`` or ``delete`` (ADDED vs MODIFIED)."""
CLUSTER: Final = "_"
"""The namespace token of a cluster-scoped object's key."""
META_PREFIX: Final = "_meta"
"""Keys under this prefix hold the store's own bookkeeping (the compacted revision); namespaces are DNS
labels and can never start with "_", so they never collide with objects."""
COMPACTED_KEY: Final = f"{META_PREFIX}.compacted"

T = TypeVar("T", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class Event(Generic[T]):
    """One change seen by a watch: ``type`` is ADDED, MODIFIED or DELETED; ``revision`` its sequence."""

    type: str
    object: T
    revision: int


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    resource_version: int
    continue_token: str | None
    remaining: int | None


def key_of(namespace: str | None, name: str) -> str:
    return f"{namespace or CLUSTER}.{name}"


def is_marker(headers: Mapping[str, str] | None) -> bool:
    """A delete or purge marker, or the server's marker for an expired TTL: no live object."""
    h = headers or {}
    return bool(h.get(KV_OP) in ("DEL", "PURGE") or h.get(MARKER_REASON))
