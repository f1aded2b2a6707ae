"""The Job resource: JobSpec with every part, JobStatus, and the allowed values of its enum-like fields.

Typing rule for every spec type, so that validation can report *every* bad value with its path instead of
the decoder failing on the first: enum-like fields are plain ``str | None`` (the rules check membership in
the tuples below), quantities, durations and USD amounts are ``str | None`` (the rules parse them with
:mod:`nodus_schema.quantities`), integers are ``int | None``. Optional fields default to None, lists to
``[]`` and maps to ``{}``; with ``omit_defaults`` none of them reach the wire when unset.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from nodus_schema.attempts import OutputRecord
from nodus_schema.costs import Cost, Estimate
from nodus_schema.gpus import GPURequest
from nodus_schema.meta import Condition, ListMeta, ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "CHECKPOINT_FORMATS",
    "CHECKPOINT_INTEGRATIONS",
    "CONTINUITIES",
    "EGRESS_POLICIES",
    "FROM_RANKS",
    "INTERCONNECTS",
    "INTERRUPTIBLE",
    "LAUNCHERS",
    "NETWORKS",
    "ON_INTERRUPTION",
    "PHASES",
    "PROFILES",
    "SINK_MODES",
    "SPEC_STATES",
    "TERMINAL_PHASES",
    "TRANSPORTS",
    "BucketInput",
    "CheckpointFormat",
    "CheckpointIntegration",
    "CheckpointPolicy",
    "Continuity",
    "Distributed",
    "Egress",
    "EgressPolicy",
    "EnvVar",
    "EnvVarSource",
    "FromRanks",
    "GitSource",
    "InitCommand",
    "Interconnect",
    "Interruptible",
    "Job",
    "JobInput",
    "JobList",
    "JobOutput",
    "JobSpec",
    "JobStatus",
    "Launcher",
    "Network",
    "NetworkScope",
    "OnInterruption",
    "OutputInput",
    "OutputSink",
    "Phase",
    "Placement",
    "Profile",
    "Recovery",
    "Resources",
    "SecretKeySelector",
    "SecretMount",
    "Sidecar",
    "SinkMode",
    "Source",
    "SpecState",
    "StageInput",
    "Transport",
    "URLInput",
    "VolumeInput",
    "VolumeMount",
    "WorkspaceInput",
]

# ---------------------------------------------------------------------------------------------------------
# Allowed values. Each is a Literal type (for code that builds values) and a tuple (for the validator).
# ---------------------------------------------------------------------------------------------------------

Phase = Literal[
    "Pending", "Queued", "Provisioning", "Running", "Suspended", "Succeeded", "Failed", "Cancelled"
]
PHASES: Final[tuple[Phase, ...]] = (
    "Pending",
    "Queued",
    "Provisioning",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
    "Cancelled",
)
TERMINAL_PHASES: Final[tuple[Phase, ...]] = ("Succeeded", "Failed", "Cancelled")

SpecState = Literal["Running", "Suspended", "Cancelled"]
SPEC_STATES: Final[tuple[SpecState, ...]] = ("Running", "Suspended", "Cancelled")

Launcher = Literal["Plain", "Torchrun", "Ray", "Verl", "Accelerate", "Deepspeed"]
LAUNCHERS: Final[tuple[Launcher, ...]] = ("Plain", "Torchrun", "Ray", "Verl", "Accelerate", "Deepspeed")

NetworkScope = Literal["Colocated", "Regional", "Global"]
NETWORKS: Final[tuple[NetworkScope, ...]] = ("Colocated", "Regional", "Global")

Transport = Literal["Direct", "Auto"]
TRANSPORTS: Final[tuple[Transport, ...]] = ("Direct", "Auto")

Interruptible = Literal["Never", "Allow", "Prefer"]
INTERRUPTIBLE: Final[tuple[Interruptible, ...]] = ("Never", "Allow", "Prefer")

Profile = Literal["Balanced", "Cost", "Speed"]
PROFILES: Final[tuple[Profile, ...]] = ("Balanced", "Cost", "Speed")

Continuity = Literal["Checkpointed", "Restartable", "Ephemeral"]
CONTINUITIES: Final[tuple[Continuity, ...]] = ("Checkpointed", "Restartable", "Ephemeral")

OnInterruption = Literal["Resume", "Fail"]
ON_INTERRUPTION: Final[tuple[OnInterruption, ...]] = ("Resume", "Fail")

CheckpointFormat = Literal["Snapshot", "Dcp"]
CHECKPOINT_FORMATS: Final[tuple[CheckpointFormat, ...]] = ("Snapshot", "Dcp")

CheckpointIntegration = Literal["Auto", "None", "HFTrainer"]
CHECKPOINT_INTEGRATIONS: Final[tuple[CheckpointIntegration, ...]] = ("Auto", "None", "HFTrainer")

EgressPolicy = Literal["Deny", "AllowList", "Open"]
EGRESS_POLICIES: Final[tuple[EgressPolicy, ...]] = ("Deny", "AllowList", "Open")

FromRanks = Literal["Zero", "All"]
FROM_RANKS: Final[tuple[FromRanks, ...]] = ("Zero", "All")

SinkMode = Literal["Append", "Replace"]
SINK_MODES: Final[tuple[SinkMode, ...]] = ("Append", "Replace")

Interconnect = Literal["Any", "NVLink"]
INTERCONNECTS: Final[tuple[Interconnect, ...]] = ("Any", "NVLink")

# ---------------------------------------------------------------------------------------------------------
# Parts of a JobSpec
# ---------------------------------------------------------------------------------------------------------


class Distributed(Wire):
    """Distributed runs the Job as a gang of nodes that start together and restart together (Beta)."""

    gpus_per_node: int | None = None
    """1, 2, 4 or 8; equals resources.gpu.count when both are set."""
    launcher: str | None = None
    """Plain (env contract only), Torchrun, Ray, Verl, Accelerate or Deepspeed."""
    max_assembly_retries: int | None = None
    """How many times a timed-out assembly is re-placed (0-5, default 2)."""
    network: str | None = None
    """Colocated (one provider and region), Regional (one region class) or Global."""
    nodes: int | None = None
    """The gang size (2-16; the beta caps it at 8). Exactly one of nodes and totalGPUs."""
    startup_timeout: str | None = None
    """The gang assembly budget (5m-60m, default 15m)."""
    total_gpus: int | None = msgspec.field(default=None, name="totalGPUs")
    """Resolved into status.topology at admission (2-64)."""
    transport: str | None = None
    """Direct (private or direct paths only) or Auto (relayed paths allowed)."""


class SecretKeySelector(Wire):
    """SecretKeySelector selects one key of a Secret."""

    key: str | None = None
    name: str | None = None


class EnvVarSource(Wire):
    """EnvVarSource names where an env value comes from."""

    secret_key_ref: SecretKeySelector | None = None


class EnvVar(Wire):
    """EnvVar is one environment variable: a literal value or a Secret key.

    Name matches ^[A-Za-z_][A-Za-z0-9_]*$.
    """

    name: str | None = None
    value: str | None = None
    value_from: EnvVarSource | None = None


class InitCommand(Wire):
    """InitCommand is a preflight run before the command."""

    command: list[str] = msgspec.field(default_factory=list)
    timeout: str | None = None
    """At most 30m."""


class BucketInput(Wire):
    """BucketInput is an object in customer storage."""

    connection: str | None = None
    """An S3 Connection that can read it."""
    sha256: str | None = msgspec.field(default=None, name="sha256")
    """Checked at end of stream when set."""
    uri: str | None = msgspec.field(default=None, name="uri")
    """s3://bucket/key."""


class StageInput(Wire):
    """StageInput names an output of a Pipeline stage."""

    output: str | None = None
    stage: str | None = None


class WorkspaceInput(Wire):
    """WorkspaceInput mounts a Workspace home."""

    name: str | None = None
    path: str | None = None
    """A subdirectory of the home."""


class OutputInput(Wire):
    """OutputInput names a committed output of another Job."""

    index: int | None = None
    """Selects an index of an Indexed Job (default 0)."""
    job: str | None = None
    name: str | None = None


class URLInput(Wire):
    """URLInput is a file downloaded over HTTPS."""

    sha256: str | None = msgspec.field(default=None, name="sha256")
    url: str | None = msgspec.field(default=None, name="url")
    """https:// only."""


class VolumeInput(Wire):
    """VolumeInput names a Volume revision."""

    name: str | None = None
    revision: int | None = None


class JobInput(Wire):
    """One input, mounted read-only at /nodus/inputs/<name>: exactly one of volume, output, bucket, url,
    fromWorkspace (and fromStage in Pipelines). Name matches ^[A-Za-z][A-Za-z0-9_]{0,63}$, unique."""

    bucket: BucketInput | None = None
    from_stage: StageInput | None = None
    from_workspace: WorkspaceInput | None = None
    name: str | None = None
    output: OutputInput | None = None
    url: URLInput | None = msgspec.field(default=None, name="url")
    volume: VolumeInput | None = None


class Egress(Wire):
    """Egress is the outbound network policy."""

    allow: list[str] = msgspec.field(default_factory=list)
    """DNS names or *.suffix patterns (AllowList only; at most 128)."""
    policy: str | None = None
    """Deny, AllowList or Open."""
    presets: list[str] = msgspec.field(default_factory=list)
    """Curated host lists such as python-packages or huggingface."""


class Network(Wire):
    """Network sets egress for the container."""

    egress: Egress | None = None


class OutputSink(Wire):
    """OutputSink loads an output into a customer database table."""

    connection: str | None = None
    """A Postgres, Neon or Supabase Connection."""
    mode: str | None = None
    """Append (default) or Replace."""
    table: str | None = None


class JobOutput(Wire):
    """JobOutput is a declared output, collected when an index succeeds."""

    from_ranks: str | None = None
    """Zero (rank 0 only) or All (every rank under rank-<n>/)."""
    name: str | None = None
    """Matches ^[a-z0-9._-]{1,64}$; the nodus. prefix is reserved."""
    path: str | None = None
    """An absolute file or directory path; directories are archived as tar.zst."""
    sink: OutputSink | None = None


class Placement(Wire):
    """Placement constrains where work may run."""

    dedicated: bool | None = None
    """Reserved; only true is accepted."""
    interruptible: str | None = None
    """Never, Allow (the scheduler decides by expected cost) or Prefer."""
    max_rate_usd_per_hour: str | None = msgspec.field(default=None, name="maxRateUSDPerHour")
    """Filters out offerings above this customer rate."""
    offerings: list[str] = msgspec.field(default_factory=list)
    pool: str | None = None
    """A BYOC Pool in the project."""
    profile: str | None = None
    """Balanced, Cost or Speed."""
    queue_timeout: str | None = None
    """How long to wait for capacity before failing with CapacityUnavailable (default 24h; 0s = forever)."""
    regions: list[str] = msgspec.field(default_factory=list)
    """Region classes (us, eu, ...); empty means any."""


class CheckpointPolicy(Wire):
    """CheckpointPolicy configures checkpoints."""

    format: str | None = None
    """Snapshot, or Dcp for torch.distributed.checkpoint (the default for distributed Jobs)."""
    integration: str | None = None
    """Auto, None or HFTrainer."""
    interval: str | None = None
    """auto or a duration from 1m to 6h."""
    max_size: str | None = None
    """Checked before upload (default 1Ti, at most 2Ti)."""
    paths: list[str] = msgspec.field(default_factory=list)
    """Saved together in one checkpoint (at most 64; default /nodus/state)."""
    retain_after_finish: str | None = None
    """Keeps checkpoints this long after the Job finishes (default 168h)."""


class Recovery(Wire):
    """Recovery says how progress survives lost capacity."""

    checkpoint: CheckpointPolicy | None = None
    continuity: str | None = None
    """Checkpointed (restore the latest checkpoint), Restartable (progress cursor) or Ephemeral."""
    max_attempts: int | None = None
    """Infrastructure replacements each index may use (1-32; gangs count restarts)."""
    min_progress_duration: str | None = None
    """The run time that counts as progress (default 2m)."""
    on_interruption: str | None = None
    """Resume, or Fail to fail instead of recovering or suspending."""


class Resources(Wire):
    """Resources are capacity floors. For GPU work the offering's host shape applies if larger."""

    cpu: str | None = None
    """The vCPU floor (a quantity)."""
    disk: str | None = None
    """The ephemeral disk floor (a quantity)."""
    gpu: GPURequest | str | None = None
    """The accelerators, as an object or in the "H100:1" string form."""
    memory: str | None = None
    """The host memory floor (a quantity)."""
    nodes: int | None = None
    """Above 1 is shorthand for spec.distributed.nodes and is stored in that form."""


class SecretMount(Wire):
    """SecretMount mounts one Secret, optionally pinned to a version. The bare name is accepted on write."""

    name: str | None = None
    version: int | None = None
    """Pins a version; unset pins the latest at admission."""


class Sidecar(Wire):
    """Sidecar is a helper container with native-sidecar semantics."""

    command: list[str] = msgspec.field(default_factory=list)
    env: list[EnvVar] = msgspec.field(default_factory=list)
    image: str | None = None
    """Defaults to the Job's image."""
    name: str | None = None
    """Unique within the Job."""
    startup_timeout: str | None = None


class GitSource(Wire):
    """GitSource is a repository checkout."""

    path: str | None = None
    """The checkout path (default workingDir)."""
    ref: str | None = None
    """A branch, tag or commit."""
    repo: str | None = None
    """owner/name or an https:// URL."""


class Source(Wire):
    """Source is the code for the container: exactly one of git and blob."""

    blob: str | None = None
    """sha256:<digest> of an uploaded archive."""
    git: GitSource | None = None


class VolumeMount(Wire):
    """VolumeMount mounts a Volume."""

    mount_path: str | None = None
    """The absolute mount point; system paths are refused."""
    read_only: bool | None = None
    revision: int | None = None
    """Pins a revision; only with readOnly."""
    volume: str | None = None


# ---------------------------------------------------------------------------------------------------------
# JobSpec
# ---------------------------------------------------------------------------------------------------------


class JobSpec(Wire):
    """JobSpec describes a Job.

    Everything is immutable after create except parallelism, backoffLimit, timeout, maxCostUSD (raise
    only), recovery.maxAttempts, recovery.checkpoint.interval and retainAfterFinish, ttlSecondsAfterFinished
    and state.
    """

    active_deadline_seconds: int | None = None
    """Accepted as an alias of timeout on write and folded into it."""
    args: list[str] = msgspec.field(default_factory=list)
    backoff_limit: int | None = None
    """Customer failures (non-zero exits, OOM) across all indexes retried before the Job fails (0-100)."""
    command: list[str] = msgspec.field(default_factory=list)
    complete_by_time: str | None = None
    """A finish-by hint for placement and checkpoint cadence (RFC 3339). It never stops the Job."""
    completions: int | None = None
    """How many indexes must succeed (1-10000). Each index gets NODUS_INDEX and JOB_COMPLETION_INDEX."""
    connections: list[str] = msgspec.field(default_factory=list)
    distributed: Distributed | None = None
    env: list[EnvVar] = msgspec.field(default_factory=list)
    expected_duration: str | None = None
    """The declared runtime the estimate uses first."""
    image: str | None = None
    image_pull_secrets: list[str] = msgspec.field(default_factory=list)
    image_ref: str | None = None
    init_command: InitCommand | None = None
    inputs: list[JobInput] = msgspec.field(default_factory=list)
    """Materialized read-only under /nodus/inputs/<name>."""
    max_cost_usd: str | None = msgspec.field(default=None, name="maxCostUSD")
    """Caps what the Job may spend. Reaching it suspends the Job; it can only be raised."""
    network: Network | None = None
    outputs: list[JobOutput] = msgspec.field(default_factory=list)
    """At most 32; everything under /nodus/outputs is also collected as the output named "outputs"."""
    parallelism: int | None = None
    """How many indexes run at once (1 to min(completions, 256))."""
    placement: Placement | None = None
    recovery: Recovery | None = None
    resources: Resources | None = None
    scaledown_window: str | None = None
    """Keeps the capacity warm for reuse this long after the Job ends (0s-20m)."""
    secrets: list[SecretMount | str] = msgspec.field(default_factory=list)
    service_account_name: str | None = None
    sidecars: list[Sidecar] = msgspec.field(default_factory=list)
    source: Source | None = None
    state: str | None = None
    """Running (the default), Suspended, or Cancelled, which stops the Job for good."""
    timeout: str | None = None
    """Wall-clock limit from the first Provisioning, excluding Suspended time; then DeadlineExceeded."""
    ttl_seconds_after_finished: int | None = None
    """Deletes the Job, its outputs and checkpoints this long after it finishes."""
    volumes: list[VolumeMount] = msgspec.field(default_factory=list)
    working_dir: str | None = None


# ---------------------------------------------------------------------------------------------------------
# JobStatus and the Job
# ---------------------------------------------------------------------------------------------------------


class LostRun(Wire):
    """One run that lost its capacity: what it cost, and the work lost since its last checkpoint."""

    attempt: str
    index: int
    reason: str | None = None
    cost_usd: str | None = msgspec.field(default=None, name="costUSD")
    """What the run was charged (nothing, when Nodus covered it)."""
    lost_seconds: int = 0
    """From its last checkpoint (or the program's start, without one) until the node's last heartbeat."""
    gpus: int = 1
    lost_usd: str | None = msgspec.field(default=None, name="lostUSD")
    """What the lost seconds cost at the run's rate: work paid for and done again."""
    checkpoint_time: str | None = None
    """The checkpoint the replacement restored from (none: it started over)."""


class RecoveryStatus(Wire):
    """Recovery accounting (a Nodus extension, written by billing): what lost capacity cost the Job."""

    lost_runs: int = 0
    lost_gpu_seconds: int = 0
    """GPU-seconds of work done since the last checkpoint by runs that lost their capacity."""
    lost_usd: str | None = msgspec.field(default=None, name="lostUSD")
    """What the lost GPU-seconds cost: work paid for and done again."""
    restore_usd: str | None = msgspec.field(default=None, name="restoreUSD")
    """What the replacements' starts cost (their Restore segments: checkpoint download and restart)."""
    recovery_usd: str | None = msgspec.field(default=None, name="recoveryUSD")
    """What recovering from the losses cost in total: lostUSD + restoreUSD."""
    covered_usd: str | None = msgspec.field(default=None, name="coveredUSD")
    """What Nodus paid instead of charging: the lost runs' Boot and the time from their node's last
    heartbeat to the loss."""
    runs: list[LostRun] = msgspec.field(default_factory=list)
    """The lost runs, oldest first (at most the last 100)."""


class JobStatus(Wire):
    """JobStatus is what Nodus observed about a Job (written by the scheduler; cost and recovery by billing).

    Counters follow the Kubernetes Job (active, succeeded, failed, completedIndexes); attempts counts the
    Attempts started (one Attempt is one run of one index on one node).
    """

    active: int | None = None
    """Indexes running now."""
    attempts: int | None = None
    """Attempts started across all indexes."""
    completed_indexes: str | None = None
    """The succeeded indexes, compressed as Kubernetes does: "0-3,5"."""
    completion_time: str | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)
    cost: Cost | None = None
    estimate: Estimate | None = None
    failed: int | None = None
    """Failed attempts that counted against backoffLimit."""
    message: str | None = None
    """Explains the phase in a sentence."""
    observed_generation: int | None = None
    phase: str | None = None
    """One of PHASES."""
    reason: str | None = None
    """A registered CamelCase code, for example DeadlineExceeded or MaxCostReached."""
    start_time: str | None = None
    succeeded: int | None = None
    """Indexes that succeeded."""
    topology: str | None = None
    """The resolved gang topology, "<nodes>x<gpusPerNode>" (e.g. "2x8")."""
    units_per_second: str | None = None
    """The throughput the program reported, as a decimal string."""
    wall_seconds: int | None = None
    """Wall time from start to completion."""
    outputs: list[OutputRecord] = msgspec.field(default_factory=list)
    """What the indexes committed when they succeeded (where each output is stored, its size and
    sha256), once the Job has finished."""
    recovery: RecoveryStatus | None = None
    """What lost capacity cost: lost runs, their cost, and the GPU time lost since each one's last
    checkpoint (written by billing, with status.cost)."""


class Job(Wire):
    """Job runs a program to completion on GPU capacity: one or more indexes, each retried on failure."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Job")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: JobSpec = msgspec.field(default_factory=JobSpec)
    status: JobStatus = msgspec.field(default_factory=JobStatus)


class JobList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Jobs."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "JobList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Job] = msgspec.field(default_factory=list)
