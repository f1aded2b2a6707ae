"""Attempt: one run of one index of a Job on one node (owner: the scheduler; reports come from the agent).

Infrastructure loss starts a new Attempt (counts against ``recovery.maxAttempts``); a customer failure
(non-zero exit, OOM) counts against ``backoffLimit``.

A gang (a ``distributed`` Job, ADR-0016) runs each index as a *gang attempt* of N members, one Attempt per
member and node: ``<job>-<uid8>-<index>-a<n>-m<rank>`` (:func:`member_name`), all labelled with the gang
attempt's name (:data:`GANG_LABEL`, ``<job>-<uid8>-<index>-a<n>``) and their rank (:data:`RANK_LABEL`).
The members of one gang attempt share the attempt number ``n``: a gang restarts as a whole, so ``n`` counts
gang attempts.
"""

from __future__ import annotations

import msgspec

from nodus_schema.meta import ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

# Labels on Attempts and ledger entries: the Job's name, and its uid (so the runs and charges of a deleted
# Job never count for a new Job of the same name).
JOB_LABEL = "nodus.dev/job"
JOB_UID_LABEL = "nodus.dev/job-uid"
# Labels on the member Attempts of a gang: the gang attempt they belong to, and the member's rank.
GANG_LABEL = "nodus.dev/gang"
RANK_LABEL = "nodus.dev/gang-rank"

ATTEMPT_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Lost", "Stopped")
ATTEMPT_TERMINAL = ("Succeeded", "Failed", "Lost", "Stopped")


class AttemptSpec(Wire):
    job: str
    index: int
    attempt: int
    """1-based count of attempts of this index."""
    node: str
    offering: str
    region_class: str
    rate_micros_per_hour: int
    pricebook_version: str
    gpu_variant: str | None = None
    rank: int | None = None
    """Gangs: the member's rank in its gang attempt, 0 to gangSize - 1 (its node rank); None otherwise."""
    gang_size: int | None = None
    """Gangs: how many members (nodes) the gang attempt has."""
    master_node: str | None = None
    """Gangs: the node of the rank-0 member, where the launcher's rendezvous listens (MASTER_ADDR)."""
    warm_from: str | None = None
    """The finished Attempt (same namespace) whose warm window this run reuses (scaledownWindow, issue #21):
    its node was kept warm for this project, and this run's creation ends that window."""


class AttemptPlacement(Wire):
    """Where the scheduler put the run, and why there (the same explain shape as an estimate's preview)."""

    explain: str | None = None
    interruptible: bool | None = None
    offering: str | None = None
    region_class: str | None = None
    warm_reuse: bool | None = None
    """True when the run reused capacity kept warm for its project (scaledownWindow): only its container
    started, on a node that still had the image and the Volume revisions."""


class CheckpointRecord(Wire):
    """One checkpoint of an index, as the agent took it (docs/checkpoints.md)."""

    sequence: int = 0
    """Grows by one per checkpoint of the index, across its Attempts."""
    uri: str | None = None
    """``s3://<bucket>/<key>`` of the archive (tar.zst)."""
    size_bytes: int | None = None
    sha256: str | None = None
    duration_millis: int | None = None
    reason: str | None = None
    """Interval, Suspend, Preemption, CapReached or Stop: what asked for it."""
    paths: list[str] = msgspec.field(default_factory=list)
    """What it covers (the policy's paths, as the program sees them)."""
    consistent: bool | None = None
    """True when the program said it was ready before the snapshot (the checkpoint contract)."""
    time: str | None = None


class SourceRecord(Wire):
    """The code an Attempt ran (spec.source, ADR-0036): the commit a git ref resolved to on the node, or the
    uploaded blob's digest. A Sweep's cells each say which code they ran."""

    repo: str | None = None
    """The repository's URL as fetched (never with a token in it)."""
    ref: str | None = None
    commit: str | None = None
    """The full commit id the checkout is at."""
    blob: str | None = None
    millis: int | None = None
    """How long the checkout or the blob's download and extraction took."""


class MountRecord(Wire):
    """One Volume revision or Workspace an Attempt had mounted (ADR-0036)."""

    name: str = ""
    """The Volume (spec.volumes[].volume, inputs[].volume.name) or the Workspace (fromWorkspace.name)."""
    kind: str = "Volume"
    """Volume or Workspace."""
    mount_path: str | None = None
    """Where the program saw it: the mountPath, or /nodus/inputs/<input>."""
    revision: int | None = None
    digest: str | None = None
    read_only: bool = True
    cache_hit: bool | None = None
    """True when the node's cache already held the revision and nothing was downloaded."""
    size_bytes: int | None = None
    millis: int | None = None
    committed_revision: int | None = None
    """A writable mount: the revision its content became when the index succeeded."""


class OutputRecord(Wire):
    """One output an index committed when it succeeded (docs/checkpoints.md, "Outputs")."""

    name: str = ""
    index: int | None = None
    uri: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    archive: bool | None = None
    """True for a directory stored as one tar.zst; a file is stored as it is."""
    rank: int | None = None
    """fromRanks All: the rank whose files these are."""
    rows_loaded: int | None = None
    """The rows a sink loaded from it, when the output has a sink."""


class AttemptStatus(Wire):
    phase: str = "Pending"
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    finish_time: str | None = None
    exit_code: int | None = None
    wall_millis: int | None = None
    units_per_second: str | None = None
    placement: AttemptPlacement | None = None
    ended_by: str | None = None
    """Gangs: why the scheduler ended this member's gang attempt before it finished (``AssemblyTimeout``:
    not every member started within startupTimeout; ``GangIncomplete``: not every member was created).
    Written before the member is told to stop, so the reason outlives a restart of the scheduler."""
    checkpoint: CheckpointRecord | None = None
    """The latest checkpoint this Attempt took."""
    restored_from: CheckpointRecord | None = None
    """The checkpoint restored into this Attempt before its command started."""
    outputs: list[OutputRecord] = msgspec.field(default_factory=list)
    """What the index committed when this Attempt succeeded."""
    source: SourceRecord | None = None
    """The code this Attempt ran (the commit of spec.source.git, or the blob)."""
    mounts: list[MountRecord] = msgspec.field(default_factory=list)
    """The Volume revisions and Workspaces it had mounted, with cache hits."""
    billing_start_ms: int | None = None
    """The node's clock (epoch ms) when it began the run (reported): billing's start, the Boot segment's."""
    program_start_ms: int | None = None
    """The node's clock (epoch ms) when the program was launched (reported): Boot ends, Running begins."""
    billing_stop_ms: int | None = None
    """The node's clock (epoch ms) when the run was over (reported), or the node's last heartbeat for a run
    lost with its node (written by the scheduler): billing's stop. Both ends are from one clock, so identical
    runs are billed identically (docs/billing.md)."""
    # The warm window after the run (scaledownWindow, issue #21, ADR-0038; rules in nodus_schema.warmth).
    warm_since_ms: int | None = None
    """When the node began to be kept warm for the project (billing's stop of the run), epoch ms; written by
    the scheduler with the finish when the Job set a scaledownWindow and the node is still Ready."""
    warm_until_ms: int | None = None
    """When the window runs out if nothing ends it sooner: ``warm_since_ms`` + the Job's scaledownWindow."""
    warm_end_ms: int | None = None
    """When the window was ended before it ran out: the Job's cap or the project's credit reached (billing),
    its node lost or its Job deleted (the scheduler). A reuse ends it too, at the reusing run's creation,
    which is read from that run (``spec.warmFrom``), not written here."""


class Attempt(Wire):
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Attempt")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: AttemptSpec = msgspec.field(
        default_factory=lambda: AttemptSpec(
            job="",
            index=0,
            attempt=1,
            node="",
            offering="",
            region_class="",
            rate_micros_per_hour=0,
            pricebook_version="",
        )
    )
    status: AttemptStatus = msgspec.field(default_factory=AttemptStatus)


def attempt_name(job: str, job_uid: str, index: int, attempt: int) -> str:
    """``<job>-<uid8>-<index>-a<n>``: the Job's uid keeps the runs of a re-created same-named Job apart
    (attempt names key the agent's records and the ledger)."""
    return f"{job}-{job_uid[:8]}-{index}-a{attempt}"


def member_name(job: str, job_uid: str, index: int, attempt: int, rank: int) -> str:
    """``<job>-<uid8>-<index>-a<n>-m<rank>``: one member of gang attempt ``n`` of an index; the members of one
    gang attempt share the prefix, which is the gang attempt's name (:func:`attempt_name`)."""
    return f"{attempt_name(job, job_uid, index, attempt)}-m{rank}"
