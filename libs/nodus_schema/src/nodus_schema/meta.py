"""Kubernetes object and list metadata, conditions, watch events and server-side tables (meta.k8s.io/v1).

These follow apimachinery's metav1 types field by field so that kubectl and client-go read them unchanged.
Timestamps are RFC 3339 strings on the wire (``"2026-11-30T05:00:00Z"``) and stay ``str`` in the structs;
:func:`now_rfc3339`, :func:`format_time`, :func:`format_second` and :func:`parse_time` convert.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Generic, TypeVar

import msgspec

from nodus_schema.wire import Wire

__all__ = [
    "CONDITION_STATUSES",
    "WATCH_EVENT_TYPES",
    "Condition",
    "ListMeta",
    "ManagedFieldsEntry",
    "ObjectList",
    "ObjectMeta",
    "OwnerReference",
    "ShardInfo",
    "Table",
    "TableColumnDefinition",
    "TableRow",
    "WatchEvent",
    "find_condition",
    "format_time",
    "list_kind",
    "now_rfc3339",
    "parse_time",
    "set_condition",
]

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------------------

# RFC 3339 date-time, strictly: fromisoformat alone would also take "2026-11-30" or a space separator.
_NANOS = re.compile(r"\.([0-9]{6})[0-9]+")
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def format_time(dt: datetime) -> str:
    """An aware datetime as metav1.Time writes it: UTC, whole seconds, ``Z`` (``2026-11-30T05:00:00Z``)."""
    if dt.tzinfo is None:
        raise ValueError("format_time needs an aware datetime (with a time zone)")
    # By the whole second, exactly (timedelta arithmetic: a float timestamp rounds near year 9999).
    return format_second((dt - _EPOCH) // _SECOND)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND: Final = timedelta(seconds=1)


@functools.lru_cache(maxsize=1024)
def format_second(second: int) -> str:
    """An epoch second as metav1.Time writes it (``2026-11-30T05:00:00Z``). Remembered: controllers stamp
    the current second many times over (a Job's conditions, its events, every write of an object, a pass
    over many objects, the node beats heard), and formatting was most of the call's cost."""
    d = _EPOCH + timedelta(seconds=second)
    # Four digits of year always (strftime writes year 999 as "999", which no RFC 3339 reader takes).
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}Z"


def now_rfc3339() -> str:
    """The current time as an RFC 3339 string, as metav1.Time serialises (whole seconds, UTC)."""
    return format_second(int(time.time()))


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime; raises ValueError with a human message."""
    if not isinstance(text, str):
        raise ValueError(f'time {text!r} is not an RFC 3339 timestamp such as "2026-11-30T05:00:00Z"')
    return _parse_time(text)


@functools.lru_cache(maxsize=8192)
def _parse_time(text: str) -> datetime:
    # Cached: controllers compare the same few timestamps (heartbeats, creation times; whole seconds)
    # on every pass over every object; a datetime is immutable, so sharing one is safe. Errors are not
    # cached (lru_cache keeps results only).
    if _RFC3339.fullmatch(text) is None:
        raise ValueError(f'time {text!r} is not an RFC 3339 timestamp such as "2026-11-30T05:00:00Z"')
    norm = text.upper().replace("Z", "+00:00")
    # Python keeps microseconds: cut nanosecond fractions down (truncation, as Go's MicroTime would).
    norm = _NANOS.sub(r".\1", norm)
    try:
        return datetime.fromisoformat(norm).astimezone(UTC)
    except ValueError as e:
        raise ValueError(f"time {text!r} is not a valid date and time: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# Object metadata
# ---------------------------------------------------------------------------------------------------------


class ManagedFieldsEntry(Wire):
    """A workflow-id, a FieldSet and the group version of the resource that the fieldset applies to."""

    api_version: str | None = None
    fields_type: str | None = None
    fields_v1: dict[str, Any] | None = None
    """FieldsV1 is the set of fields this manager owns (arbitrary JSON, as in Kubernetes)."""
    manager: str | None = None
    operation: str | None = None
    subresource: str | None = None
    time: str | None = None


class OwnerReference(Wire):
    """Identifies an owning object; deleting the owner deletes the dependent (a Sweep owns its cell Jobs)."""

    api_version: str
    kind: str
    name: str
    uid: str
    block_owner_deletion: bool | None = None
    controller: bool | None = None


class ObjectMeta(Wire):
    """Kubernetes ObjectMeta: name, namespace (the project), labels, versions and ownership."""

    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    creation_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    deletion_timestamp: str | None = None
    finalizers: list[str] = msgspec.field(default_factory=list)
    generate_name: str | None = None
    generation: int | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    managed_fields: list[ManagedFieldsEntry] = msgspec.field(default_factory=list)
    name: str | None = None
    namespace: str | None = None
    owner_references: list[OwnerReference] = msgspec.field(default_factory=list)
    resource_version: str | None = None
    """The JetStream KV revision of the object, as an opaque string."""
    self_link: str | None = None
    uid: str | None = None


class ShardInfo(Wire):
    """ShardInfo describes the shard a list response was served from."""

    selector: str | None = None


class ListMeta(Wire):
    """Kubernetes ListMeta: the list's resourceVersion and the continue token of a paged list."""

    continue_: str | None = msgspec.field(default=None, name="continue")
    remaining_item_count: int | None = None
    resource_version: str | None = None
    self_link: str | None = None
    shard_info: ShardInfo | None = None


# ---------------------------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------------------------

CONDITION_STATUSES: Final = ("True", "False", "Unknown")


class Condition(Wire):
    """A metav1.Condition: one aspect of an object's state (type, True/False/Unknown, reason, message)."""

    type: str
    status: str
    """Status is True, False or Unknown."""
    last_transition_time: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    reason: str | None = None


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of ``type_`` in ``conditions``, or None."""
    for c in conditions:
        if c.type == type_:
            return c
    return None


def set_condition(conditions: list[Condition], new: Condition, *, now: str | None = None) -> bool:
    """Add or update ``new`` in place, as apimachinery's SetStatusCondition does; True if anything changed.

    ``lastTransitionTime`` moves only when ``status`` changes (defaulting to ``now`` or the current time).
    """
    existing = find_condition(conditions, new.type)
    stamp = new.last_transition_time or now or now_rfc3339()
    if existing is None:
        conditions.append(msgspec.structs.replace(new, last_transition_time=stamp))
        return True
    changed = False
    if existing.status != new.status:
        existing.status = new.status
        existing.last_transition_time = stamp
        changed = True
    for attr in ("reason", "message", "observed_generation"):
        value = getattr(new, attr)
        if getattr(existing, attr) != value:
            setattr(existing, attr, value)
            changed = True
    return changed


# ---------------------------------------------------------------------------------------------------------
# Watch events and tables
# ---------------------------------------------------------------------------------------------------------

WATCH_EVENT_TYPES: Final = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")


class WatchEvent(Wire, Generic[T]):
    """One event of a watch stream (metav1.WatchEvent): ``{"type": "ADDED", "object": {...}}``.

    Generic in the object: ``WatchEvent[Sweep]`` decodes it, ``WatchEvent[msgspec.Raw]`` defers decoding
    (an ERROR event carries a Status, a BOOKMARK only metadata).
    """

    type: str
    """Type is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""
    object: T


class TableColumnDefinition(Wire):
    """One column of a server-side Table, as kubectl get prints it."""

    name: str
    type: str
    """Type is an OpenAPI type: string, integer, number, boolean, date."""
    description: str | None = None
    format: str | None = None
    priority: int | None = None
    """Priority 0 is shown by default; higher ones only with -o wide."""


class TableRow(Wire):
    """One row of a Table: cells in column order, and optionally the object (or its metadata)."""

    cells: list[str | int | bool | None] = msgspec.field(default_factory=list)
    conditions: list[Condition] = msgspec.field(default_factory=list)
    object: dict[str, Any] | None = None


class Table(Wire):
    """meta.k8s.io/v1 Table: the server-side printing of a list for ``kubectl get``."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: "meta.k8s.io/v1")
    kind: str = msgspec.field(default_factory=lambda: "Table")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    column_definitions: list[TableColumnDefinition] = msgspec.field(default_factory=list)
    rows: list[TableRow] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# Lists
# ---------------------------------------------------------------------------------------------------------


class ObjectList(Wire, Generic[T], omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A Kubernetes list of any kind (``{"apiVersion", "kind": "SweepList", "metadata", "items"}``).

    apiVersion and kind are required so that they are always on the wire; the concrete lists
    (``SweepList``, ``JobList``) default them instead.
    """

    api_version: str
    kind: str
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[T] = msgspec.field(default_factory=list)


def list_kind(kind: str) -> str:
    """The kind of a list of ``kind`` objects, as Kubernetes names it (``Sweep`` → ``SweepList``)."""
    return f"{kind}List"
