"""What each subject of the bus carries (docs/bus.md), as data: the subject tree, the stream that stores
it, and the msgspec type its messages decode to.

``nodus tail`` reads it to decode whatever it sees; anything else that must tell a subject's message
type can too. Pure: no I/O. The first entry whose pattern matches a subject wins, so the specific ones
(a bucket's ``_meta.compacted``, the dead letters of a known stream) come before the general ones.

Buckets whose values are not nodus_schema types (billing's books, the gateway's token records, leases)
are named but have no type here: their messages are shown as the JSON they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from nodus_schema.access import Project
from nodus_schema.attempts import Attempt
from nodus_schema.billing import (
    AccountRequest,
    Budget,
    Funding,
    GrantRequest,
    HoldRequest,
    UsageRequest,
)
from nodus_schema.configs import Connection, Secret
from nodus_schema.estimating import EstimateRequest, QuoteRequest
from nodus_schema.jobs import Job
from nodus_schema.messages import Assignment, LogLines, NodeBeat, ObjectEvent, Report
from nodus_schema.nodes import Node
from nodus_schema.noding import (
    RetentionRequest,
    RunSecretsRequest,
    VolumeCommitRequest,
    commit_subject,
    retention_subject,
    secrets_subject,
)
from nodus_schema.offerings import Offering
from nodus_schema.pipelines import Pipeline
from nodus_schema.serviceaccounts import ServiceAccount
from nodus_schema.sweeps import Sweep
from nodus_schema.volumes import Blob, Volume, Workspace

UNKNOWN: Final = "?"


@dataclass(frozen=True, slots=True)
class Stream:
    """A JetStream stream and the subjects it stores."""

    name: str
    subject: str
    work_queue: bool = False
    """A work queue takes no consumer that overlaps its durables' filters: only core subscribers see it."""


@dataclass(frozen=True, slots=True)
class Subject:
    """One row of docs/bus.md's subject table."""

    pattern: str
    """NATS wildcards: ``*`` one token, ``>`` the rest."""
    type_name: str
    """The message type's name (a union's name; a decoded message names its own kind)."""
    type: Any
    """What ``msgspec.json.decode`` takes for it; None where nodus_schema has no type for it."""
    stream: str | None
    """The stream storing it; None for core request/reply subjects."""
    secret: bool = False
    """Its values must not be printed (Secrets)."""


KV_TYPES: Final[dict[str, tuple[str, Any]]] = {
    "sweeps": ("Sweep", Sweep),
    "jobs": ("Job", Job),
    "attempts": ("Attempt", Attempt),
    "nodes": ("Node", Node),
    "accounts": ("BillingBook", None),
    "history": ("BillingHistory", None),
    "funding": ("Funding", Funding),
    "budgets": ("Budget", Budget),
    "leases": ("LeaseRecord", None),
    "secrets": ("Secret", Secret),
    "connections": ("Connection", Connection),
    "offerings": ("Offering", Offering),
    "tokens": ("TokenRecord", None),
    "projects": ("Project", Project),
    "volumes": ("Volume", Volume),
    "workspaces": ("Workspace", Workspace),
    "blobs": ("Blob", Blob),
    "serviceaccounts": ("ServiceAccount", ServiceAccount),
    "pipelines": ("Pipeline", Pipeline),
}
"""Bucket -> the type of its values (docs/bus.md, "KeyValue buckets")."""

RPC_TYPES: Final[dict[str, tuple[str, Any]]] = {
    "nodus.rpc.scheduler.estimate": ("EstimateRequest", EstimateRequest),
    "nodus.rpc.billing.quote": ("QuoteRequest", QuoteRequest),
    "nodus.rpc.billing.hold": ("HoldRequest", HoldRequest),
    "nodus.rpc.billing.account": ("AccountRequest", AccountRequest),
    "nodus.rpc.billing.grant": ("GrantRequest", GrantRequest),
    "nodus.rpc.billing.usage": ("UsageRequest", UsageRequest),
}
"""Request subject -> its request type (replies go to an inbox, not to the subject)."""

STREAMS: Final[tuple[Stream, ...]] = (
    Stream("NODUS_ASSIGNMENTS", "nodus.assign.>", work_queue=True),
    Stream("NODUS_REPORTS", "nodus.report.>"),
    Stream("NODUS_BILLING", "nodus.billing.>"),
    Stream("NODUS_EVENTS", "nodus.events.>"),
    Stream("NODUS_LOGS", "nodus.logs.>"),
    Stream("NODUS_DEAD", "nodus.dead.>"),
    *(Stream(f"KV_{bucket}", f"$KV.{bucket}.>") for bucket in KV_TYPES),
)


def _kv_subjects() -> list[Subject]:
    out = []
    for bucket, (name, typ) in KV_TYPES.items():
        stream = f"KV_{bucket}"
        out.append(Subject(f"$KV.{bucket}._meta.compacted", "CompactedRevision", int, stream))
        out.append(Subject(f"$KV.{bucket}.>", name, typ, stream, secret=bucket == "secrets"))
    return out


SUBJECTS: Final[tuple[Subject, ...]] = (
    *_kv_subjects(),
    Subject("nodus.assign.*", "Assignment", Assignment, "NODUS_ASSIGNMENTS"),
    Subject("nodus.report.*.*.*", "Report", Report, "NODUS_REPORTS"),
    Subject("nodus.logs.*.*.*.*", "LogLines", LogLines, "NODUS_LOGS"),
    Subject("nodus.events.*.*.*", "ObjectEvent", ObjectEvent, "NODUS_EVENTS"),
    # A dead letter keeps the original body: its type is its stream's.
    Subject("nodus.dead.NODUS_ASSIGNMENTS.*", "Assignment", Assignment, "NODUS_DEAD"),
    Subject("nodus.dead.NODUS_REPORTS.*", "Report", Report, "NODUS_DEAD"),
    Subject("nodus.dead.*.*", "DeadLetter", None, "NODUS_DEAD"),
    Subject("nodus.billing.>", UNKNOWN, None, "NODUS_BILLING"),
    *(Subject(subject, name, typ, None) for subject, (name, typ) in RPC_TYPES.items()),
    # Node agents' requests (nodus_schema.noding): the node's name is the fourth token.
    Subject(secrets_subject("*"), "RunSecretsRequest", RunSecretsRequest, None),
    Subject(retention_subject("*"), "RetentionRequest", RetentionRequest, None),
    Subject(commit_subject("*"), "VolumeCommitRequest", VolumeCommitRequest, None),
    # Liveness beats (core NATS, no stream): the node's name is the third token.
    Subject("nodus.beat.*", "NodeBeat", NodeBeat, None),
)


def matches(pattern: str, subject: str) -> bool:
    """Whether the concrete ``subject`` is one of ``pattern``'s."""
    return covers(pattern, subject)


def covers(pattern: str, filter_subject: str) -> bool:
    """Whether every subject ``filter_subject`` (itself perhaps with wildcards) matches is one of
    ``pattern``'s: ``nodus.report.>`` covers ``nodus.report.n1.*.*`` but not ``nodus.>``."""
    want, have = pattern.split("."), filter_subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have):
            return False
        if have[i] == ">":
            return False
        if token != "*" and (have[i] == "*" or have[i] != token):
            return False
    return len(have) == len(want)


def subject_type(subject: str) -> Subject | None:
    """The row of a concrete subject; None for a subject outside the documented tree."""
    for row in SUBJECTS:
        if matches(row.pattern, subject):
            return row
    return None


def stream_for(filter_subject: str) -> Stream | None:
    """The stream that stores every subject ``filter_subject`` matches; None if none does (a core
    subject, or a filter wider than one stream, such as ``nodus.>``)."""
    for stream in STREAMS:
        if covers(stream.subject, filter_subject):
            return stream
    return None
