"""Every stream and KeyValue bucket of Nodus, declared in one table and created idempotently.

Services call :func:`ensure` at start; running it twice, or from several replicas at once, is safe: a
missing stream is created, an existing one is updated to the declared config. ``docs/bus.md`` lists the
same table for operators.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from nodus_kit.backingoff import Backoff

# What a cluster electing leaders answers: nothing in time, no responders, or a 503/500 API error.
TEMPORARY = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError, APIError)

# Every replica of every service declares at start: after a cluster restart they all ask at once.
RETRY_BACKOFF = Backoff(base=0.1, cap=2.0)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bucket:
    """A KeyValue bucket holding one resource: key ``<namespace>.<name>``, value the object's JSON."""

    name: str
    description: str
    history: int = 1
    # Per-message TTL (nats-server 2.11) serves leases; the marker TTL makes expiries visible to watches.
    msg_ttl: bool = False

    @property
    def stream(self) -> str:
        return f"KV_{self.name}"

    @property
    def subjects(self) -> list[str]:
        return [f"$KV.{self.name}.>"]

    def config(self, replicas: int) -> StreamConfig:
        return StreamConfig(
            name=self.stream,
            description=self.description,
            subjects=self.subjects,
            max_msgs_per_subject=self.history,
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW,
            num_replicas=replicas,
            allow_rollup_hdrs=True,
            deny_delete=True,
            allow_direct=True,
            allow_msg_ttl=self.msg_ttl or None,
            subject_delete_marker_ttl=60.0 if self.msg_ttl else None,
            # Creates that arrive together are stored as one atomic batch, one disk sync (ADR-0034).
            allow_atomic=True,
        )


@dataclass(frozen=True)
class Stream:
    """A stream of work or reports, consumed by durable consumers (at-least-once)."""

    name: str
    description: str
    subjects: list[str]
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age_s: float = 7 * 24 * 3600
    # Deduplication window for Nats-Msg-Id: a redelivered publish inside it is dropped by the server.
    duplicate_window_s: float = 120.0
    # A size cap (bytes) for streams that could fill a disk (logs): the oldest messages go first.
    max_bytes: int | None = None

    def config(self, replicas: int) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            description=self.description,
            subjects=self.subjects,
            retention=self.retention,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes,  # discard stays the default, OLD
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=self.duplicate_window_s,
            allow_atomic=True,
        )


BUCKETS: tuple[Bucket, ...] = (
    Bucket("sweeps", "Sweep objects (owner: api-gateway spec, sweep-controller status)"),
    Bucket("jobs", "Job objects, cells included (owner: api-gateway spec, scheduler status)"),
    Bucket("attempts", "Attempts: one run of one index on one node (owner: scheduler)"),
    Bucket("nodes", "Node records of registered agents (owner: node-agent)"),
    Bucket("accounts", "Billing books, one per project: credits, holds, caps, the ledger (owner: billing)"),
    Bucket("history", "Settled runs filed out of the billing books, one record per Job (owner: billing)"),
    Bucket("funding", "Funding of each Job: blocked (MaxCostReached, ...) or not (owner: billing)"),
    Bucket("budgets", "Budget objects: monthly limits per project (owner: api-gateway; billing enforces)"),
    Bucket("leases", "Leader-election leases of controller replicas", msg_ttl=True),
    Bucket("secrets", "Secret objects with their values; read by the api-gateway only (owner: api-gateway)"),
    Bucket("connections", "Connection objects: S3 and PostgreSQL endpoints (owner: api-gateway)"),
    Bucket("offerings", "Offering objects: the published price book (owner: scheduler)"),
    Bucket("tokens", "Bearer tokens by id: the hash of the secret and the roles (owner: api-gateway)"),
    Bucket("projects", "Projects: the namespaces objects live in (owner: api-gateway)"),
    Bucket("volumes", "Volume objects: revisioned datasets, revisions in status (owner: api-gateway)"),
    Bucket(
        "workspaces", "Workspace objects: project homes; the files live in the S3 store (owner: api-gateway)"
    ),
    Bucket(
        "blobs", "Records of uploaded blobs (tar.zst in the S3 store), key <ns>.<hex> (owner: api-gateway)"
    ),
    Bucket("serviceaccounts", "ServiceAccount objects: a role runs call the API with (owner: api-gateway)"),
    Bucket("pipelines", "Pipeline objects: DAGs of Job and Sweep stages (owner: sweep-controller)"),
)

STREAMS: tuple[Stream, ...] = (
    Stream(
        "NODUS_ASSIGNMENTS",
        "Work for node agents: start/stop an Attempt (scheduler -> node-agent)",
        ["nodus.assign.>"],
        retention=RetentionPolicy.WORK_QUEUE,
    ),
    Stream(
        "NODUS_REPORTS",
        "Reports from node agents: attempt phases, exits, throughput (node-agent -> scheduler, billing)",
        ["nodus.report.>"],
    ),
    Stream(
        "NODUS_BILLING",
        "Usage and charges (billing)",
        ["nodus.billing.>"],
    ),
    Stream(
        "NODUS_EVENTS",
        "Events about objects, for people and tools (every service)",
        ["nodus.events.>"],
        max_age_s=24 * 3600,
    ),
    Stream(
        "NODUS_LOGS",
        "Log lines of running attempts, in batches (node-agent -> api-gateway's jobs/<name>/log)",
        ["nodus.logs.>"],
        max_bytes=4 * 1024**3,
    ),
    Stream(
        "NODUS_DEAD",
        "Dead letters: messages a handler rejected for good, with the reason in headers",
        ["nodus.dead.>"],
        max_age_s=14 * 24 * 3600,
    ),
)


def bucket(name: str) -> Bucket:
    for b in BUCKETS:
        if b.name == name:
            return b
    raise KeyError(f"no bucket {name!r} is declared in nodus_kit.declaring.BUCKETS")


def replicas_for(server_info: Mapping[str, Any], configured: int | None) -> int:
    """How many replicas each stream gets: ``configured`` (``NODUS_STREAM_REPLICAS``) when set, else 3
    on a cluster of three servers or more, else 1.

    A clustered server's INFO names its cluster and lists the client URLs of every member it knows
    (itself included), which is how a service started without the setting finds it is on a cluster."""
    if configured is not None:
        return configured
    members = server_info.get("connect_urls") or []
    return 3 if server_info.get("cluster") and len(members) >= 3 else 1


async def ensure(
    js: JetStreamContext,
    buckets: tuple[Bucket, ...] = BUCKETS,
    streams: tuple[Stream, ...] = STREAMS,
    replicas: int = 1,
    deadline_s: float = 60.0,
    *,
    lower: bool = True,
) -> None:
    """Create or update every declared bucket and stream; safe to run concurrently and repeatedly.

    A cluster that has just started (or just lost a server) answers the JetStream API late or not at
    all for a few seconds while it elects leaders, and a service that declares its streams then must
    not exit for it: a temporary failure is tried again, with a growing pause, for ``deadline_s``.

    ``lower=False`` never takes replicas away from a stream that has more: for a count worked out from
    the cluster (:func:`replicas_for`), which reads low while a member is down, and must not turn R3
    streams into R1 because a service restarted during an outage."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    for cfg in [b.config(replicas) for b in buckets] + [s.config(replicas) for s in streams]:
        pauses = RETRY_BACKOFF.pauses()
        while True:
            try:
                await _ensure_stream(js, cfg, lower=lower)
                break
            except TEMPORARY as e:
                if isinstance(e, APIError) and e.code not in (None, 408, 500, 503) and not _unplaced(e):
                    raise
                pause = next(pauses)
                if loop.time() + pause >= end:
                    raise
                log.warning("declaring %s: %r; trying again", cfg.name, e)
                await asyncio.sleep(pause)  # a pause between tries, not a synchronisation


def _unplaced(e: APIError) -> bool:
    """10005 "no suitable peers for placement": an R3 stream asked of a cluster whose members have not all
    joined yet (it has just started, or one is down for a moment). Temporary: asked again, it places."""
    return e.err_code == 10005


async def _ensure_stream(js: JetStreamContext, cfg: StreamConfig, *, lower: bool = True) -> None:
    try:
        info = await js.stream_info(cfg.name or "")
        have = info.config.num_replicas or 1
        if not lower and have > (cfg.num_replicas or 1):
            cfg = dataclasses.replace(cfg, num_replicas=have)
    except NotFoundError:
        try:
            await js.add_stream(cfg)
            log.info("stream created", extra={"stream": cfg.name})
            return
        except BadRequestError as e:
            # Another replica created it between our look and our add (10058: name already in use).
            if e.err_code != 10058:
                raise
    await js.update_stream(cfg)
