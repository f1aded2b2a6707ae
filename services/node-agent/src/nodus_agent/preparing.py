"""Before the program starts, and around it while it runs: secrets, inputs, mounts, source, checkpoints, logs.

The runner (:mod:`nodus_agent.running`) calls these with a :class:`Toolkit`: what this agent can reach
(the bus for logs, the gateway's answers for a run's Secrets and Connections, the S3 store of checkpoints
and outputs). A part
the toolkit lacks is skipped, with the consequence said where it matters: no store means no checkpoint
and no restore (logged once per attempt), an input of kind ``output`` fails with what to configure, and
Volumes and uploaded blobs cannot be read (Lost: another node may have a store).

What the program sees besides the attempt's own folders is a :class:`~nodus_agent.mountplan.MountPlan`:
the Volume mounts (:mod:`nodus_agent.mounting`) and the checkout of ``spec.source``
(:mod:`nodus_agent.sourcing`), in that order, so a checkout's mount comes first and a Volume mounted
inside it lands on top. The plan is saved beside the record: a re-adopted run still commits and reports.

Program paths (``/nodus/state``, ``/nodus/outputs``, ``/nodus/inputs``) map to the attempt directory's
own folders on this host, whatever the runtime: a container has them mounted there, a local process is
given the host paths in its env. Checkpoint and output paths outside those folders cannot be reached on
the host and are refused with a message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from nodus_agent import checkpointing, inputs, mounting, secrets, sourcing
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.checkpointing import Checkpointer, CheckpointError, CheckpointInfo, Notify
from nodus_agent.granting import Granted, Grants, NotBound
from nodus_agent.inputcontext import (
    InputContext,
    InputError,
    InputRecord,
    InputSettings,
    S3Credentials,
    secret_value,
)
from nodus_agent.logshipping import LogShipper
from nodus_agent.mountplan import MountPlan
from nodus_agent.s3 import S3Settings
from nodus_agent.secrets import Resolved, SecretError, SecretReader
from nodus_agent.settings import AgentSettings
from nodus_agent.sourcing import GitCredential, SourceContext, SourceError
from nodus_agent.volumecache import VolumeCache
from nodus_kit.errors import NotFound
from nodus_schema.attempts import CheckpointRecord, SourceRecord
from nodus_schema.configs import Connection, Secret
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import parse_time
from nodus_schema.noding import connection_secrets

log = logging.getLogger(__name__)

STATE, OUTPUTS, INPUTS = "/nodus/state", "/nodus/outputs", "/nodus/inputs"
KEEP_STATE = ("Checkpointed", "Restartable")
"""Continuities whose /nodus/state travels to a replacement Attempt (Ephemeral starts over)."""


class ConnectionReader(Protocol):
    async def get(self, namespace: str | None, name: str) -> Connection: ...


@dataclass
class Toolkit:
    """What this agent can reach beyond its runtime; None where it has no such thing."""

    nc: Any | None = None
    """The bus, for log shipping."""
    grants: Grants | None = None
    """The gateway's answers: a run's Secrets and Connections, and whether a run is this node's. None
    only in tests of the runner alone (the agent service always has it)."""
    store: S3Settings | None = None
    """The S3 store of checkpoints and outputs."""
    s3: Any | None = None
    """An open aiobotocore client of ``store``."""
    inputs: InputSettings = field(default_factory=InputSettings)
    interruptible: bool = False
    cache: VolumeCache | None = None
    """The node's cache of extracted Volume revisions (one per agent process)."""
    committer: Any | None = None
    """Asks the gateway to make a writable mount's upload the Volume's next revision
    (:class:`nodus_agent.volumecommit.Committer`); None without a bus."""


@dataclass
class Prepared:
    secrets: Resolved = field(default_factory=Resolved)
    secret_dirs: dict[str, Path] = field(default_factory=dict)
    inputs: list[InputRecord] = field(default_factory=list)
    restored: CheckpointRecord | None = None
    plan: MountPlan = field(default_factory=MountPlan)
    """The checkout and the Volume mounts, for the runtime, the reports and the commit at the end."""


class PrepareError(Exception):
    """The attempt cannot start: ``reason`` Error (the customer's to fix), SourceUnavailable (its code
    cannot be fetched; ``source`` says what was tried) or Lost (this node's)."""

    def __init__(self, reason: str, message: str, *, source: SourceRecord | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.source = reason, message, source


async def prepare(toolkit: Toolkit, settings: AgentSettings, msg: StartAttempt, adir: AttemptDir) -> Prepared:
    """Secret values, inputs, Volume mounts, the checkout of spec.source and the restored checkpoint, in
    that order; PrepareError on a failure."""
    prepared = Prepared()
    prepared.secrets = await _secrets(toolkit, msg)
    prepared.secret_dirs = secrets.write_files(prepared.secrets, adir.secrets)
    if msg.inputs:
        prepared.inputs = await _inputs(toolkit, msg, adir)
    try:
        if uses_volumes(msg):
            await _mounts(toolkit, msg, adir, prepared.plan)
        if msg.source is not None:
            await _source(toolkit, settings, msg, adir, prepared.plan)
        if prepared.plan.mounts or prepared.plan.records:
            adir.save_plan(prepared.plan)
        prepared.restored = await _restore(toolkit, msg, adir)
    except BaseException:  # a failure or a stop: nothing will read the cached revisions
        mounting.release(prepared.plan)
        raise
    return prepared


async def for_adoption(toolkit: Toolkit, msg: StartAttempt) -> Prepared:
    """What a re-adopted run needs again: the secret values, so its log is still masked (best effort:
    a Secret deleted meanwhile leaves nothing to mask with, and the run goes on)."""
    try:
        return Prepared(secrets=await _secrets(toolkit, msg))
    except PrepareError as e:
        log.warning("re-adopted attempt %s: secrets not resolved (%s)", msg.attempt, e.message)
        return Prepared()


# -- secrets ------------------------------------------------------------------------------------------------
def _uses_secrets(msg: StartAttempt) -> bool:
    return bool(msg.secrets) or any(v.value_from is not None for v in msg.env)


async def granted(toolkit: Toolkit, msg: StartAttempt) -> Granted:
    """The gateway's answer for this Attempt: its Secrets, Connections and Volume revisions."""
    if toolkit.grants is None:
        raise PrepareError("Lost", "this node agent cannot read Secrets or Connections (no bus connection)")
    try:
        return await toolkit.grants.of(msg)
    except NotBound as e:  # finished or moved meanwhile: the scheduler knows already
        raise PrepareError("Lost", f"the run is no longer this node's: {e}") from None


async def readers(toolkit: Toolkit, msg: StartAttempt) -> tuple[SecretReader, ConnectionReader]:
    """The run's Secret and Connection readers: the gateway's answer for this Attempt."""
    answer = await granted(toolkit, msg)
    return answer.secrets, answer.connections


async def _secrets(toolkit: Toolkit, msg: StartAttempt) -> Resolved:
    if not _uses_secrets(msg):
        return Resolved()
    reader, _ = await readers(toolkit, msg)
    try:
        return await secrets.resolve(reader, msg)
    except SecretError as e:
        raise PrepareError("Error", str(e)) from None


async def _secret_map(reader: SecretReader, namespace: str, names: set[str]) -> dict[str, Secret]:
    found: dict[str, Secret] = {}
    for name in names:
        try:
            found[name] = await reader.get(namespace, name)
        except NotFound:
            continue  # the resolver names what is missing
    return found


async def connection_with_secrets(
    toolkit: Toolkit, msg: StartAttempt, name: str
) -> tuple[Connection, dict[str, Secret]]:
    """A Connection of the Job's project and the Secrets it refers to; PrepareError if it is missing."""
    namespace = msg.namespace
    secret_reader, connection_reader = await readers(toolkit, msg)
    try:
        conn = await connection_reader.get(namespace, name)
    except NotFound:
        raise PrepareError(
            "Error", f"Connection {namespace}/{name} does not exist: create it in the Job's project"
        ) from None
    return conn, await _secret_map(secret_reader, namespace, connection_secrets(conn))


# -- inputs -------------------------------------------------------------------------------------------------
async def _inputs(toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir) -> list[InputRecord]:
    connections: dict[str, S3Credentials] = {}
    for inp in msg.inputs:
        name = inp.bucket.connection if inp.bucket is not None else None
        if name and name not in connections:
            conn, found = await connection_with_secrets(toolkit, msg, name)
            try:
                connections[name] = S3Credentials.from_connection(conn, found)
            except ValueError as e:
                raise PrepareError("Error", str(e)) from None
    ctx = InputContext(
        namespace=msg.namespace, connections=connections, outputs=toolkit.store, settings=toolkit.inputs
    )
    try:
        return await inputs.materialise(msg.inputs, adir.inputs, ctx)
    except InputError as e:
        raise PrepareError("Lost" if e.retryable else "Error", str(e)) from None


# -- Volumes and Workspaces ----------------------------------------------------------------------------
def uses_volumes(msg: StartAttempt) -> bool:
    return bool(msg.volumes) or any(i.volume is not None or i.from_workspace is not None for i in msg.inputs)


def mount_context(toolkit: Toolkit) -> mounting.MountContext:
    """What :mod:`nodus_agent.mounting` reads and writes with; PrepareError (Lost) where this node lacks a
    part: another node may have it."""
    if toolkit.s3 is None or toolkit.store is None or toolkit.cache is None:
        raise PrepareError(
            "Lost",
            "this node has no store configured (NODUS_AGENT_S3_BUCKET): it cannot mount Volumes or "
            "Workspaces",
        )
    return mounting.MountContext(
        toolkit.s3, toolkit.store.bucket, toolkit.cache, toolkit.committer, toolkit.inputs.max_bytes
    )


async def _mounts(toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, plan: MountPlan) -> None:
    ctx = mount_context(toolkit)
    revisions = (await granted(toolkit, msg)).revisions
    try:
        await mounting.prepare_mounts(ctx, msg, adir, revisions, plan)
    except mounting.MountError as e:
        raise PrepareError("Lost" if e.retryable else "Error", str(e)) from None


async def retain_mounts(toolkit: Toolkit, plan: MountPlan) -> None:
    """A re-adopted run holds its cached revisions again, so they are not evicted under it (best effort:
    a node without a store or cache has nothing to hold)."""
    if plan.records and toolkit.s3 is not None and toolkit.store is not None and toolkit.cache is not None:
        try:
            await mounting.retain(mount_context(toolkit), plan)
        except Exception as e:  # the run goes on: only eviction protection is lost
            log.warning("re-adopted run: its cache entries are not held (%s)", e)


async def commit_mounts(toolkit: Toolkit, msg: StartAttempt, plan: MountPlan) -> tuple[str, str] | None:
    """The writable mounts of a successful index made their Volumes' next revisions (the records in
    ``plan`` updated); else (reason, message) to finish with: Error, or Lost where a retry may work."""
    try:
        await mounting.commit_mounts(mount_context(toolkit), msg, plan)
    except PrepareError as e:
        return e.reason, e.message
    except mounting.MountError as e:
        return ("Lost" if e.retryable else "Error"), str(e)
    return None


# -- source -------------------------------------------------------------------------------------------------
async def _source(
    toolkit: Toolkit, settings: AgentSettings, msg: StartAttempt, adir: AttemptDir, plan: MountPlan
) -> None:
    ctx = SourceContext(
        git_host=settings.git_host,
        timeout_s=settings.git_timeout_s,
        ca_bundle=settings.ca_bundle,
        credential=await _git_credential(toolkit, settings, msg),
        s3=toolkit.s3,
        bucket=toolkit.store.bucket if toolkit.store is not None else None,
        max_bytes=settings.max_input_bytes,
    )
    try:
        await sourcing.checkout(ctx, msg, adir, plan)
    except SourceError as e:
        raise PrepareError(e.reason, e.message, source=e.tried) from None


async def _git_credential(
    toolkit: Toolkit, settings: AgentSettings, msg: StartAttempt
) -> GitCredential | None:
    """The token of the Git Connection (listed by the Job) whose url prefixes the repository's, the
    longest such prefix if several; None for a blob, a repository none applies to, or a runner alone."""
    git = msg.source.git if msg.source is not None else None
    if git is None or toolkit.grants is None:
        return None
    try:
        url = sourcing.repo_url(git.repo or "", settings.git_host)
    except ValueError:
        return None  # the checkout says what is wrong with the repository
    answer = await granted(toolkit, msg)
    candidates = [
        c
        for c in answer.connections.items.values()
        if c.spec.type == "Git" and c.spec.git is not None and c.spec.git.url
        if sourcing.prefixes(c.spec.git.url, url)
    ]
    if not candidates:
        return None
    conn = max(candidates, key=lambda c: len(c.spec.git.url or "") if c.spec.git else 0)
    spec, name = conn.spec.git, conn.metadata.name or ""
    assert spec is not None
    if spec.token_ref is None:
        return None  # a Connection for a public host: nothing to send
    found = await _secret_map(answer.secrets, msg.namespace, connection_secrets(conn))
    try:
        token = secret_value(found, spec.token_ref, f"Connection {name!r} tokenRef")
    except ValueError as e:
        raise PrepareError("Error", str(e)) from None
    return GitCredential(
        connection=name, url=spec.url or "", username=spec.username or sourcing.DEFAULT_USERNAME, token=token
    )


# -- checkpoints ----------------------------------------------------------------------------------------
def host_paths(msg: StartAttempt, adir: AttemptDir) -> dict[str, Path]:
    """The checkpoint policy's paths (default /nodus/state) on this host; ValueError for one outside the
    attempt's folders."""
    policy = msg.checkpoint
    wanted = list(policy.paths) if policy is not None and policy.paths else [STATE]
    return {p: to_host(p, adir) for p in wanted}


def to_host(program_path: str, adir: AttemptDir) -> Path:
    roots = {STATE: adir.state, OUTPUTS: adir.outputs, INPUTS: adir.inputs}
    clean = program_path.rstrip("/") or "/"
    for root, host in roots.items():
        if clean == root:
            return host
        if clean.startswith(root + "/"):
            rest = clean[len(root) + 1 :]
            if ".." in rest.split("/"):
                break
            return host / rest
    raise ValueError(
        f"{program_path}: only paths under /nodus/state and /nodus/outputs can be checkpointed or "
        "collected (the node reaches nothing else of the program's file system)"
    )


def job_key(msg: StartAttempt) -> str:
    """The Job's folder in the store: its name and the first 8 of its uid, so a Job deleted and created
    again with the same name never restores the old one's state."""
    return f"{msg.job}-{msg.job_uid[:8]}" if msg.job_uid else msg.job


def _checkpointer(
    toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, notify: Notify | None
) -> Checkpointer:
    assert toolkit.s3 is not None and toolkit.store is not None
    policy = msg.checkpoint
    return Checkpointer(
        toolkit.s3,
        toolkit.store.bucket,
        namespace=msg.namespace,
        job=job_key(msg),
        index=msg.index,
        attempt=msg.attempt,
        rank=msg.node_rank,
        max_size=checkpointing.parse_max_size(policy.max_size if policy else None),
        control_dir=adir.state / ".nodus",
        notify=notify,
    )


def checkpoints_enabled(toolkit: Toolkit, msg: StartAttempt) -> bool:
    return toolkit.s3 is not None and msg.continuity in KEEP_STATE and bool(msg.job)


def checkpoint_interval(
    msg: StartAttempt,
    settings: AgentSettings,
    last_cost: timedelta | None,
    now: datetime | None = None,
) -> timedelta | None:
    """The time to the next Interval checkpoint, None when this attempt takes none. Only a Checkpointed
    Job is checkpointed on a schedule; a Restartable one keeps its own cursor and is saved before stops.
    Under ``auto``, the Job's ``completeByTime`` shortens it as it nears (as of ``now``, default: the
    clock; :func:`checkpointing.toward_deadline`)."""
    if msg.continuity != "Checkpointed" or not msg.job:
        return None
    policy = msg.checkpoint.interval if msg.checkpoint else None
    deadline = _deadline(msg)
    when = now or datetime.now(UTC)
    try:
        return checkpointing.checkpoint_interval(
            policy, last_cost=last_cost, interruptible=settings.interruptible, deadline=deadline, now=when
        )
    except ValueError as e:
        log.warning("checkpoint interval: %s; using auto", e)
        return checkpointing.checkpoint_interval(
            None, last_cost=last_cost, interruptible=settings.interruptible, deadline=deadline, now=when
        )


def _deadline(msg: StartAttempt) -> datetime | None:
    """The StartAttempt's completeByTime; None when unset or unreadable (a hint: never a reason to fail)."""
    if not msg.complete_by_time:
        return None
    try:
        return parse_time(msg.complete_by_time)
    except (ValueError, OverflowError) as e:
        log.warning("completeByTime ignored: %s", e, extra={"attempt": msg.attempt})
        return None


async def take_checkpoint(
    toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, reason: str, notify: Notify
) -> CheckpointRecord | None:
    """One checkpoint of the policy's paths; None when this agent has no store or the Job keeps no
    state. Raises CheckpointError (latest unchanged) when it fails."""
    if not checkpoints_enabled(toolkit, msg):
        return None
    try:
        paths = host_paths(msg, adir)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    info = await _checkpointer(toolkit, msg, adir, notify).take(paths, reason)
    log.info(
        "checkpoint %d taken: %d bytes in %d ms (%s)",
        info.sequence,
        info.size_bytes,
        info.duration_millis,
        ", ".join(info.paths),
        extra={"attempt": msg.attempt, "reason": reason},
    )
    return record_of(info)


async def _restore(toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir) -> CheckpointRecord | None:
    """The index's latest checkpoint into the new Attempt's folders, for a replacement or a resume."""
    if msg.restore_from is None or msg.continuity not in KEEP_STATE:
        return None
    if not checkpoints_enabled(toolkit, msg):
        log.warning(
            "no checkpoint store configured: attempt %s starts without its predecessor's state", msg.attempt
        )
        return None
    try:
        info = await _checkpointer(toolkit, msg, adir, None).restore(host_paths(msg, adir))
    except ValueError as e:
        raise PrepareError("Error", str(e)) from None
    except checkpointing.CheckpointTooLarge as e:
        raise PrepareError("Error", str(e)) from None
    except CheckpointError as e:
        raise PrepareError("Lost", f"could not restore the checkpoint: {e}") from None
    except Exception as e:  # the store unreachable: another node may do better, later
        raise PrepareError("Lost", f"could not restore the checkpoint: {e}") from None
    return record_of(info) if info is not None else None


def record_of(info: CheckpointInfo) -> CheckpointRecord:
    return CheckpointRecord(
        sequence=info.sequence,
        uri=info.uri,
        size_bytes=info.size_bytes,
        sha256=info.sha256,
        duration_millis=info.duration_millis,
        reason=info.reason,
        paths=list(info.paths),
        consistent=info.consistent,
        time=info.time,
    )


# -- logs ---------------------------------------------------------------------------------------------------
async def start_log_shipper(
    toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, prepared: Prepared
) -> LogShipper | None:
    """Ship the attempt's log to the bus while it runs (None without a bus or for a re-adopted run whose
    Job is not known)."""
    if toolkit.nc is None or not msg.job:
        return None
    return await LogShipper(toolkit.nc, msg, adir.log, secrets=prepared.secrets.values()).start()
