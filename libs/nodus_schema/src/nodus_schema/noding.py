"""What a node agent may ask for, and why: the Node authorizer of Nodus (docs/production.md, ADR-0026).

A node agent runs customers' code, so it is the least trusted process of Nodus. Like a kubelet under
Kubernetes' Node authorizer it reads nothing by itself: it may not get or scan the ``jobs``, ``secrets``
or ``connections`` buckets. What a run needs beyond its StartAttempt comes through two requests on
subjects that name the asking node (its credential may publish only its own):

* ``nodus.rpc.node.<node>.secrets`` (:class:`RunSecretsRequest` -> :class:`RunSecrets`): the Secrets
  and Connections of one Attempt, answered only while that Attempt is bound to ``<node>`` and not
  finished, and only those its Job names (:func:`needs`). It is also how an agent checks that a
  StartAttempt is about an Attempt that exists and is its own before it runs anything. For a Job with
  ``spec.serviceAccountName`` the answer carries the run's API token (:class:`ServiceAccountGrant`,
  ADR-0037): this reply, on the agent's own inbox, is the only bus message that ever holds it.
* ``nodus.rpc.node.<node>.commit`` (:class:`VolumeCommitRequest` -> :class:`VolumeCommitReply`): a
  writable Volume mount's content, uploaded by the agent as a blob, becomes the Volume's next revision;
  answered only while the Attempt is bound to ``<node>``, its Job mounts that Volume writable and holds
  its writer claim (ADR-0036).
* ``nodus.rpc.node.<node>.retention`` (:class:`RetentionRequest` -> :class:`RetentionReply`): whether the
  checkpoints of Job folders found in the store are past keeping (:func:`expired`), so the agent that
  holds the retention lease deletes them without reading any Job.

The gateway answers both (it already reads those buckets to serve the API). Pure: no I/O here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import msgspec

from nodus_schema.configs import Connection, Secret
from nodus_schema.jobs import TERMINAL_PHASES, EnvVar, Job, JobSpec
from nodus_schema.meta import parse_time
from nodus_schema.quantities import parse_duration

__all__ = [
    "DEFAULT_RETAIN",
    "NODE_RPC_PREFIX",
    "GrantedRevision",
    "JobFolder",
    "RetentionReply",
    "RetentionRequest",
    "RunSecrets",
    "RunSecretsRequest",
    "ServiceAccountGrant",
    "VolumeCommitReply",
    "VolumeCommitRequest",
    "commit_subject",
    "connection_secrets",
    "expired",
    "needs",
    "node_of_subject",
    "retention_of",
    "retention_subject",
    "secrets_subject",
]

NODE_RPC_PREFIX: Final = "nodus.rpc.node"
DEFAULT_RETAIN: Final = timedelta(hours=168)
"""The reference's default recovery.checkpoint.retainAfterFinish."""


def secrets_subject(node: str) -> str:
    return f"{NODE_RPC_PREFIX}.{node}.secrets"


def commit_subject(node: str) -> str:
    return f"{NODE_RPC_PREFIX}.{node}.commit"


def retention_subject(node: str) -> str:
    return f"{NODE_RPC_PREFIX}.{node}.retention"


def node_of_subject(subject: str) -> str | None:
    """The node a ``nodus.rpc.node.<node>.<what>`` subject names (the server's only proof of who asks:
    the bus lets each agent publish on its own node's subjects only)."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != NODE_RPC_PREFIX or not parts[3]:
        return None
    return parts[3]


class _Message(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    pass


class RunSecretsRequest(_Message):
    namespace: str
    attempt: str


class RunSecrets(_Message):
    """The Attempt is bound to the asking node; what its Job names, values included (never logged)."""

    job: str
    job_uid: str
    secrets: list[Secret] = msgspec.field(default_factory=list)
    connections: list[Connection] = msgspec.field(default_factory=list)
    missing: list[str] = msgspec.field(default_factory=list)
    """``Secret/<name>``, ``Connection/<name>`` or ``Volume/<name>`` the Job names that do not exist (the
    agent's message says which to create)."""
    revisions: list[GrantedRevision] = msgspec.field(default_factory=list)
    """One per Volume the Job mounts (spec.volumes and volume inputs): its pinned revision's blob."""
    service_account: ServiceAccountGrant | None = None
    """The run's API token when its Job names a ServiceAccount that exists (else ``ServiceAccount/<name>``
    is in ``missing``); never logged, never written anywhere but the program's env and files."""


class ServiceAccountGrant(_Message):
    """What a program needs to call the API as its Job's ServiceAccount (ADR-0037)."""

    name: str
    """The ServiceAccount."""
    token: str
    """``nodus-sa.<namespace>.<attempt>.<mac>``: valid while the Attempt runs and the account exists."""
    url: str
    """The gateway as runs reach it (NODUS_PUBLIC_URL)."""
    ca_pem: str | None = None
    """The CA bundle that signs the gateway's certificate (NODUS_PUBLIC_CA); None: the system's CAs."""


class GrantedRevision(_Message):
    """A Volume revision a run mounts: which blob holds it. For a writable mount, the revision it starts
    from (the latest when granted; None and no digest when the Volume has none yet)."""

    volume: str
    revision: int | None = None
    digest: str | None = None
    size_bytes: int = 0


class VolumeCommitRequest(_Message):
    namespace: str
    attempt: str
    volume: str
    digest: str
    """The blob the agent uploaded (the mount's content as tar.zst)."""
    size_bytes: int


class VolumeCommitReply(_Message):
    revision: int
    """The revision the content became (the same one again for a repeated request)."""


class JobFolder(_Message):
    namespace: str
    name: str
    uid8: str


class RetentionRequest(_Message):
    folders: list[JobFolder] = msgspec.field(default_factory=list)


class RetentionReply(_Message):
    expired: list[bool] = msgspec.field(default_factory=list)
    """One per folder, in order: True when its checkpoints may be deleted."""


MAX_FOLDERS: Final = 256
"""Folders per retention request: one reply stays far under the bus's message size."""


# -- what a Job names ---------------------------------------------------------------------------------
def _env_secrets(env: list[EnvVar]) -> set[str]:
    names: set[str] = set()
    for var in env:
        ref = var.value_from.secret_key_ref if var.value_from else None
        if ref is not None and ref.name:
            names.add(ref.name)
    return names


def needs(spec: JobSpec) -> tuple[set[str], set[str]]:
    """(Secret names, Connection names) a run of ``spec`` may read: env and sidecar references, mounted
    Secrets, image pull Secrets; listed Connections and those its inputs and output sinks use. The
    Secrets a Connection refers to are added by :func:`connection_secrets` once it is read."""
    secrets = _env_secrets(spec.env)
    for sidecar in spec.sidecars:
        secrets |= _env_secrets(sidecar.env)
    for mount in spec.secrets:
        name = mount if isinstance(mount, str) else mount.name
        if name:
            secrets.add(name)
    secrets.update(n for n in spec.image_pull_secrets if n)
    connections = {c for c in spec.connections if c}
    connections.update(i.bucket.connection for i in spec.inputs if i.bucket and i.bucket.connection)
    connections.update(o.sink.connection for o in spec.outputs if o.sink and o.sink.connection)
    return secrets, connections


def connection_secrets(conn: Connection) -> set[str]:
    """The Secrets a Connection's credentials are kept in."""
    spec = conn.spec
    refs = (
        spec.s3.access_key_id_ref if spec.s3 else None,
        spec.s3.secret_access_key_ref if spec.s3 else None,
        spec.postgres.password_ref if spec.postgres else None,
        spec.git.token_ref if spec.git else None,
    )
    return {r.name for r in refs if r is not None and r.name}


# -- retention ----------------------------------------------------------------------------------------
def retention_of(job: Job) -> timedelta:
    policy = job.spec.recovery.checkpoint if job.spec.recovery else None
    value = policy.retain_after_finish if policy else None
    try:
        return parse_duration(value) if value else DEFAULT_RETAIN
    except ValueError:
        return DEFAULT_RETAIN


def expired(job: Job | None, uid8: str, now: datetime) -> bool:
    """Are the checkpoints in folder ``<name>-<uid8>`` past keeping? ``job``: the Job of that name now,
    None when there is none."""
    if job is None or (job.metadata.uid or "")[:8] != uid8:
        return True  # deleted (or replaced by a new Job of the same name): nothing can restore them
    if job.status.phase not in TERMINAL_PHASES or not job.status.completion_time:
        return False
    try:
        return now >= parse_time(job.status.completion_time) + retention_of(job)
    except (ValueError, OverflowError):
        return False  # a time we cannot read keeps the checkpoints: deleting is the one way to lose data
