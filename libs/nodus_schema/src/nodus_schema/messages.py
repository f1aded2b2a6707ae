"""Messages on the bus between services (not API objects). One struct per message (Temporal's rule),
so fields can be added without breaking anyone; tagged unions where one subject carries several kinds.

* ``nodus.assign.<node>``: :class:`StartAttempt` | :class:`StopAttempt` (scheduler -> node agent)
* ``nodus.report.<node>.<namespace>.<attempt>``: :class:`AttemptStarted` | :class:`AttemptProgress` |
  :class:`AttemptFinished` | :class:`AttemptCheckpointed` (node agent -> scheduler, billing)
* ``nodus.logs.<node>.<namespace>.<job>.<attempt>``: :class:`LogLines` (node agent -> api-gateway)
* ``nodus.events.<namespace>.<plural>.<name>``: :class:`ObjectEvent` (every controller -> operators,
  ``nodus tail``; Kubernetes' Events, on the bus)
* ``nodus.beat.<node>``: :class:`NodeBeat` (node agent -> scheduler; core NATS, kept by no stream: a
  node's liveness off the disk, ADR-0042)
"""

from __future__ import annotations

import enum

import msgspec

from nodus_schema.attempts import CheckpointRecord, MountRecord, OutputRecord, SourceRecord
from nodus_schema.jobs import (
    CheckpointPolicy,
    EnvVar,
    InitCommand,
    JobInput,
    JobOutput,
    Network,
    Resources,
    SecretMount,
    Sidecar,
    Source,
    VolumeMount,
)


class BusMessage(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", tag_field="type"):
    """Base of the bus messages: ``type`` names the kind on the wire."""


class AttemptMessage(BusMessage):
    """Base of the messages that name their run in full: project, Job, Attempt, index, attempt number
    and node (a StartAttempt, and the LogLines of the run it starts)."""

    namespace: str
    job: str
    attempt: str
    index: int
    attempt_no: int
    node: str


class StartAttempt(AttemptMessage, tag="StartAttempt"):
    image: str | None = None
    command: list[str] = msgspec.field(default_factory=list)
    args: list[str] = msgspec.field(default_factory=list)
    env: list[EnvVar] = msgspec.field(default_factory=list)
    working_dir: str | None = None
    completions: int = 1
    timeout_seconds: int | None = None
    continuity: str | None = None
    """The Job's recovery.continuity: Checkpointed (restore ``restore_from``'s latest checkpoint first),
    Restartable (the program resumes from its own progress cursor under /nodus/state) or Ephemeral."""
    restore_from: str | None = None
    """The earlier Attempt of this index whose state to restore (a replacement after lost capacity, or
    a resume after a suspension); None for a first run."""
    # Gangs (a distributed Job, ADR-0016): one StartAttempt per member; all None for a plain run. The
    # agent turns them into the env contract's NODUS_RANK, NODUS_WORLD_SIZE, NODUS_MASTER_ADDR, ... and the
    # launcher's own variables (MASTER_ADDR, WORLD_SIZE, RANK, ...; docs/gangs.md).
    gang: str | None = None
    """The gang attempt this member belongs to (``<job>-<uid8>-<index>-a<n>``), shared by its members."""
    node_rank: int | None = None
    """The member's rank among the gang's nodes, 0 to ``nodes`` - 1 (rank 0 is the master)."""
    nodes: int | None = None
    """The gang size: how many nodes (members) start together."""
    gpus_per_node: int | None = None
    """GPUs (and so launcher processes) per node."""
    rank: int | None = None
    """The global rank of this node's first process: ``node_rank`` × ``gpus_per_node``."""
    world_size: int | None = None
    """Processes in the whole gang: ``nodes`` × ``gpus_per_node``."""
    master_addr: str | None = None
    """The rank-0 member's node name: where the launcher's rendezvous (or the Ray head) listens."""
    master_port: int | None = None
    """The rendezvous port on the master: 29500 (torch) for most launchers, 6379 (the Ray GCS) for Ray and
    Verl."""
    launcher: str | None = None
    """Plain, Torchrun, Ray, Verl, Accelerate or Deepspeed (spec.distributed.launcher)."""
    # What the agent needs of the Job's spec beyond the command (#6). Secret values are never here: only
    # references; the agent asks the gateway for the values (nodus_schema.noding), which answers only
    # while the Attempt is bound to that node.
    job_uid: str | None = None
    """Keys the index's checkpoints and outputs, so a re-created Job of the same name starts clean."""
    inputs: list[JobInput] = msgspec.field(default_factory=list)
    outputs: list[JobOutput] = msgspec.field(default_factory=list)
    checkpoint: CheckpointPolicy | None = None
    resources: Resources | None = None
    secrets: list[SecretMount] = msgspec.field(default_factory=list)
    sidecars: list[Sidecar] = msgspec.field(default_factory=list)
    init_command: InitCommand | None = None
    network: Network | None = None
    image_pull_secrets: list[str] = msgspec.field(default_factory=list)
    # Code and data (ADR-0036): the Job's spec.source and spec.volumes as admitted (a read-only mount's
    # revision pinned by the gateway). The digests of revisions come with the grant (noding.RunSecrets).
    source: Source | None = None
    volumes: list[VolumeMount] = msgspec.field(default_factory=list)
    # Issue #21. complete_by_time: the Job's spec.completeByTime (RFC 3339), a hint that shortens the
    # ``auto`` checkpoint interval as it nears; it never stops the run. warm_reuse: the scheduler placed
    # this run on capacity kept warm for its project by an earlier run's scaledownWindow (the node's
    # image and cached Volume revisions are still there), so only the container starts.
    complete_by_time: str | None = None
    warm_reuse: bool = False


class StopReason(enum.StrEnum):
    """Why the scheduler stops an Attempt (``StopAttempt.reason``). The agent decides from this value (which
    checkpoint a stop takes, docs/checkpoints.md), never from text; on the wire it is the value's string."""

    JOB_DELETED = "JobDeleted"
    """The Job was deleted, or this Attempt belongs to an earlier Job of the same name."""
    JOB_FINISHED = "JobFinished"
    """The Job reached a terminal phase while this Attempt still ran."""
    CANCELLED = "Cancelled"
    """spec.state Cancelled."""
    SUSPENDED = "Suspended"
    """spec.state Suspended."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """The Job ran past spec.timeout."""
    MAX_COST_REACHED = "MaxCostReached"
    """Billing blocked the Job at its maxCostUSD cap (nodus_schema.billing.FUNDING_REASONS)."""
    INSUFFICIENT_CREDITS = "InsufficientCredits"
    """Billing blocked the Job: the project's credits cannot cover its next hold."""
    BUDGET_EXCEEDED = "BudgetExceeded"
    """Billing blocked the Job: a Budget of the project cannot take its next hold."""
    NODE_LOST = "NodeLost"
    """The node stopped heartbeating; it is told to stop in case it comes back."""
    ASSEMBLY_TIMEOUT = "AssemblyTimeout"
    """A gang attempt did not start every member within startupTimeout."""
    GANG_RESTART = "GangRestart"
    """Another member of the gang attempt failed, was lost or stopped: the whole gang starts again."""
    PREEMPTED = "Preempted"
    """Interruptible capacity is being reclaimed by its provider (nothing sends this yet: ADR-0017)."""
    UNKNOWN = "Unknown"
    """None given, or a reason this build does not know (a newer scheduler's): stopped all the same."""

    @classmethod
    def _missing_(cls, value: object) -> StopReason:
        # msgspec calls this for a value outside the enum: a stop from a newer scheduler must still stop the
        # run, not be dead-lettered as undecodable while the program runs on.
        return cls.UNKNOWN


class StopAttempt(BusMessage, tag="StopAttempt"):
    namespace: str
    attempt: str
    reason: StopReason = StopReason.UNKNOWN
    """Why it stops; the message's human text, if any, is never what the agent decides from."""
    checkpoint: bool = False
    """Take a checkpoint before stopping (a suspension of a Checkpointed Job keeps its progress)."""


Assignment = StartAttempt | StopAttempt


class AttemptStarted(BusMessage, tag="AttemptStarted"):
    namespace: str
    attempt: str
    node: str
    time: str
    started_ms: int | None = None
    """The node's clock (epoch ms) when it began the run: billing starts here (the Boot segment)."""
    program_ms: int | None = None
    """The node's clock (epoch ms) when the program was launched: Boot ends, Running begins."""
    source: SourceRecord | None = None
    """The code the run checked out or extracted (ADR-0036)."""
    mounts: list[MountRecord] = msgspec.field(default_factory=list)
    """The Volume revisions and Workspaces mounted, with cache hits."""


class AttemptProgress(BusMessage, tag="AttemptProgress"):
    namespace: str
    attempt: str
    node: str
    units_per_second: str


class AttemptFinished(BusMessage, tag="AttemptFinished"):
    namespace: str
    attempt: str
    node: str
    time: str
    exit_code: int | None
    wall_millis: int
    reason: str
    """Completed, Error (non-zero exit), Stopped (asked to stop), Lost (could not run), SourceUnavailable
    (spec.source could not be fetched: the repository, ref or blob is gone or unreachable; the program
    never ran, so the run is billed as a start that failed, never as Running)."""
    message: str | None = None
    units_per_second: str | None = None
    outputs: list[OutputRecord] = msgspec.field(default_factory=list)
    """What the index committed (Completed only)."""
    restored_from: CheckpointRecord | None = None
    """The checkpoint the run started from, if one was restored."""
    mean_units_per_second: str | None = None
    """The mean of every throughput the program reported over the run (unitsPerSecond is the last)."""
    started_ms: int | None = None
    """As AttemptStarted's (repeated: the finish alone is enough to bill the run exactly)."""
    stopped_ms: int | None = None
    """The node's clock (epoch ms) when the run was over (its program gone): billing stops here."""
    source: SourceRecord | None = None
    """As AttemptStarted's (also for a run whose checkout failed: the repo and ref it tried)."""
    mounts: list[MountRecord] = msgspec.field(default_factory=list)
    """As AttemptStarted's, with a writable mount's committed revision."""


class AttemptCheckpointed(BusMessage, tag="AttemptCheckpointed"):
    """A checkpoint was uploaded, verified and made the index's latest."""

    namespace: str
    attempt: str
    node: str
    checkpoint: CheckpointRecord


Report = AttemptStarted | AttemptProgress | AttemptFinished | AttemptCheckpointed


class LogLine(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    time: str
    """RFC 3339: the runtime's time of the line, or the time the agent read it."""
    text: str
    """The line without its newline, secrets masked."""
    stream: str | None = None
    """stdout or stderr when the runtime kept them apart; absent when they were merged."""


class LogLines(AttemptMessage, tag="LogLines"):
    """One batch of an attempt's log lines, in order, on ``nodus.logs.<node>.<ns>.<job>.<attempt>`` (agent
    -> api-gateway's ``jobs/<name>/log``)."""

    offset: int
    """Byte offset in the attempt's log file of the first line: batches of an attempt chain by offsets."""
    end: int
    """Byte offset just past the last line: the next batch starts here."""
    lines: list[LogLine] = msgspec.field(default_factory=list)


class ObjectEvent(BusMessage, tag="Event"):
    """One transition of an object, as a Kubernetes Event says it: a Job became Running, an Attempt was
    placed or lost its node. Published at least once (a deterministic message id per transition)."""

    namespace: str
    kind: str
    name: str
    uid: str
    reason: str
    """A CamelCase code: the new phase or the registered reason (Placed, NodeLost, DeadlineExceeded, …)."""
    message: str
    time: str
    severity: str = "Normal"
    """Normal, or Warning for what a user should look at (a failure, lost capacity)."""
    phase: str | None = None


BEAT_PREFIX = "nodus.beat"


def beat_subject(node: str) -> str:
    """``nodus.beat.<node>``: the node's liveness beats. The node is the subject's third token, which the
    bus's permissions tie to the agent's credential (an agent beats for its own node only)."""
    return f"{BEAT_PREFIX}.{node}"


class NodeBeat(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One heartbeat of a node agent, published each ``heartbeat_s`` as a core NATS message (ADR-0042):
    nothing stores it, so liveness costs no disk write; the Node record carries the time of its last
    refresh (every ``record_s``) and its changes. The scheduler keeps the newest beat of each node in
    memory, over the record's ``lastHeartbeatTime``."""

    time_ms: int
    """The agent's clock at the beat (epoch milliseconds); the scheduler never takes it past its own clock."""
    phase: str = "Ready"
    """What the agent says its node is: Ready, or Draining (a GPU fault). Written back by the scheduler
    over a NotReady the node monitor gave the node for beats it missed."""
