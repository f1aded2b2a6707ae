"""Before the program starts, and around it while it runs: secrets, inputs, checkpoints, logs.

The runner (:mod:`nodus_agent.running`) calls these with a :class:`Toolkit`: what this agent can reach
(the bus for logs, the gateway's answers for a run's Secrets and Connections, the S3 store of checkpoints
and outputs). A part
the toolkit lacks is skipped, with the consequence said where it matters: no store means no checkpoint
and no restore (logged once per attempt), an input of kind ``output`` fails with what to configure.

Program paths (``/nodus/state``, ``/nodus/outputs``, ``/nodus/inputs``) map to the attempt directory's
own folders on this host, whatever the runtime: a container has them mounted there, a local process is
given the host paths in its env. Checkpoint and output paths outside those folders cannot be reached on
the host and are refused with a message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from nodus_agent import checkpointing, inputs, secrets
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.checkpointing import Checkpointer, CheckpointError, CheckpointInfo, Notify
from nodus_agent.granting import Grants, NotBound
from nodus_agent.inputcontext import InputContext, InputError, InputRecord, InputSettings, S3Credentials
from nodus_agent.logshipping import LogShipper
from nodus_agent.s3 import S3Settings
from nodus_agent.secrets import Resolved, SecretError, SecretReader
from nodus_agent.settings import AgentSettings
from nodus_kit.errors import NotFound
from nodus_schema.attempts import CheckpointRecord
from nodus_schema.configs import Connection, Secret
from nodus_schema.messages import StartAttempt

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


@dataclass
class Prepared:
    secrets: Resolved = field(default_factory=Resolved)
    secret_dirs: dict[str, Path] = field(default_factory=dict)
    inputs: list[InputRecord] = field(default_factory=list)
    restored: CheckpointRecord | None = None


class PrepareError(Exception):
    """The attempt cannot start: ``reason`` Error (the customer's to fix) or Lost (this node's)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


async def prepare(toolkit: Toolkit, settings: AgentSettings, msg: StartAttempt, adir: AttemptDir) -> Prepared:
    """Secret values, inputs and the restored checkpoint, in that order; PrepareError on a failure."""
    prepared = Prepared()
    prepared.secrets = await _secrets(toolkit, msg)
    prepared.secret_dirs = secrets.write_files(prepared.secrets, adir.secrets)
    if msg.inputs:
        prepared.inputs = await _inputs(toolkit, msg, adir)
    prepared.restored = await _restore(toolkit, msg, adir)
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


async def readers(toolkit: Toolkit, msg: StartAttempt) -> tuple[SecretReader, ConnectionReader]:
    """The run's Secret and Connection readers: the gateway's answer for this Attempt."""
    if toolkit.grants is None:
        raise PrepareError("Lost", "this node agent cannot read Secrets or Connections (no bus connection)")
    try:
        granted = await toolkit.grants.of(msg)
    except NotBound as e:  # finished or moved meanwhile: the scheduler knows already
        raise PrepareError("Lost", f"the run is no longer this node's: {e}") from None
    return granted.secrets, granted.connections


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
    names: set[str] = set()
    spec = conn.spec
    for ref in (
        spec.s3.access_key_id_ref if spec.s3 else None,
        spec.s3.secret_access_key_ref if spec.s3 else None,
        spec.postgres.password_ref if spec.postgres else None,
    ):
        if ref is not None and ref.name:
            names.add(ref.name)
    return conn, await _secret_map(secret_reader, namespace, names)


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
    msg: StartAttempt, settings: AgentSettings, last_cost: timedelta | None
) -> timedelta | None:
    """The time to the next Interval checkpoint, None when this attempt takes none. Only a Checkpointed
    Job is checkpointed on a schedule; a Restartable one keeps its own cursor and is saved before stops."""
    if msg.continuity != "Checkpointed" or not msg.job:
        return None
    policy = msg.checkpoint.interval if msg.checkpoint else None
    try:
        return checkpointing.checkpoint_interval(
            policy, last_cost=last_cost, interruptible=settings.interruptible
        )
    except ValueError as e:
        log.warning("checkpoint interval: %s; using auto", e)
        return checkpointing.checkpoint_interval(
            None, last_cost=last_cost, interruptible=settings.interruptible
        )


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
