"""Validation of Sweeps and Jobs: every documented rule, every error at once, each with its field path.

The gateway calls :func:`nodus_schema.defaulting.default_sweep` (or ``default_job``) and then validates the
result. The rules accept both the object as the user sent it and the defaulted one, and both give the same
errors at the same paths: defaulting only rewrites a field into its canonical form when that form is valid
(see ``defaulting.py``), so a bad ``resources.nodes``, ``activeDeadlineSeconds``, GPU string or bare secret
name is still where the user wrote it when these rules run, and the error names that field.

Paths are the wire (camelCase) paths, as Kubernetes reports them: ``spec.template.spec.inputs[2].name``.
Rules that read better as data are tables (enums, path lists, bounds); the rest are short functions, one
per part of the spec, each appending to one :class:`ErrorList`.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from nodus_schema.billing import Budget
from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.gpus import GPURequest, parse_gpu_parts
from nodus_schema.jobs import (
    CHECKPOINT_FORMATS,
    CHECKPOINT_INTEGRATIONS,
    CONTINUITIES,
    EGRESS_POLICIES,
    FROM_RANKS,
    INTERCONNECTS,
    INTERRUPTIBLE,
    LAUNCHERS,
    NETWORKS,
    ON_INTERRUPTION,
    PROFILES,
    SINK_MODES,
    SPEC_STATES,
    TRANSPORTS,
    CheckpointPolicy,
    Distributed,
    Egress,
    EnvVar,
    InitCommand,
    Job,
    JobInput,
    JobOutput,
    JobSpec,
    Placement,
    Recovery,
    Resources,
    SecretMount,
    Sidecar,
    Source,
    VolumeMount,
)
from nodus_schema.meta import ObjectMeta, parse_time
from nodus_schema.quantities import parse_bytes, parse_cpu_millis, parse_duration, parse_usd
from nodus_schema.remembering import SPEC_MEMO_SIZE, Memo
from nodus_schema.sweeps import Sweep, SweepMatrix, SweepSpec, SweepStatus, count_cells, widest_cells_bytes
from nodus_schema.wire import API_VERSION

__all__ = [
    "ALLOWED_GPU_COUNTS",
    "BUS_MAX_PAYLOAD",
    "MAX_BUDGET_NAME",
    "MAX_CELLS",
    "MAX_COMPLETIONS",
    "MAX_JOB_NAME",
    "MAX_SWEEP_BYTES",
    "MAX_SWEEP_NAME",
    "NODUS_MANAGED_PATHS",
    "OS_PATHS",
    "PSEUDO_FS_PATHS",
    "RESERVED_ENV",
    "RESERVED_OUTPUT_NAME",
    "STATUS_BESIDES_CELLS",
    "count_cells",
    "gpu_request_errors",
    "is_object_name",
    "validate_budget",
    "validate_job",
    "validate_job_spec",
    "validate_object_meta",
    "validate_sweep",
    "widest_sweep_bytes",
]

# ---------------------------------------------------------------------------------------------------------
# Limits (from the reference unless a comment says otherwise)
# ---------------------------------------------------------------------------------------------------------

ALLOWED_GPU_COUNTS: Final = (1, 2, 4, 8)
MAX_GPU_TYPES: Final = 8
MAX_MATRIX_GPUS: Final = 16
MAX_COMPLETIONS: Final = 10_000
"""A Job's completions (so its indexes) are 1 to 10000, as the reference says."""

# A Sweep is one KV value, its status with one row per cell included, and a KV value is one bus message
# (ADR-0025). nats-server's max_payload is 1 MiB unless set, and nothing in the stack sets it.
BUS_MAX_PAYLOAD: Final = 1024 * 1024
MAX_SWEEP_BYTES: Final = BUS_MAX_PAYLOAD - 64 * 1024
"""The most a Sweep's JSON may take at its widest: the rest of a message is room for its headers (the KV
operation, the expected sequence, trace context) and for what the store adds after validation (uid,
creationTimestamp, generation, deletionTimestamp, finalizers)."""
STATUS_BESIDES_CELLS: Final = 32 * 1024
"""What the status takes besides its cells at most: conditions, cost, estimate, best, phase, message, times
(a realistic full one is under 4 KiB; tests/schema/test_sweep_size.py measures it)."""
MAX_CELLS: Final = 1_024
"""A matrix (times repetitions) expands to at most this many cells, so that the Sweep's status fits one bus
message with realistic rows (about 410 bytes each, filled: ~410 KiB of cells at the cap; ADR-0025).
1024 is every one of the 16 GPU values the matrix takes times the 64 repetitions. Long param values can
make fewer cells too large: :func:`widest_sweep_bytes` refuses those."""

MIN_GANG_NODES, MAX_GANG_NODES, BETA_GANG_NODES = 2, 16, 8
MIN_TOTAL_GPUS, MAX_TOTAL_GPUS = 2, 64
MAX_OUTPUTS, MAX_CHECKPOINT_PATHS, MAX_EGRESS_ALLOW = 32, 64, 128
MAX_PARALLELISM: Final = 256

# Job names are DNS-1123 *labels* (<= 63), not subdomains: a Job's name becomes a label value
# (nodus.dev/sweep, job-name) and gang members' host names, both capped at 63, as the Kubernetes Job's is
# in practice. A Sweep's cells are the Jobs "<sweep>-<index>" with index < MAX_CELLS, so the Sweep name
# leaves room for "-1023": 63 - 5 = 58.
MAX_JOB_NAME: Final = 63
MAX_SWEEP_NAME: Final = MAX_JOB_NAME - len(f"-{MAX_CELLS - 1}")

RESERVED_OUTPUT_NAME: Final = "outputs"
"""Everything under /nodus/outputs is collected as the output named "outputs"; a declared one would clash."""
RESERVED_OUTPUT_PREFIX: Final = "nodus."
RESERVED_SIDECAR_NAME: Final = "main"
"""The Job's own container is "main" (logs, status); a sidecar of that name would be ambiguous."""

RESERVED_ENV: Final = frozenset(
    {
        "NODUS_INDEX",
        "JOB_COMPLETION_INDEX",
        "NODUS_JOB",
        "NODUS_NAMESPACE",
        "NODUS_ATTEMPT",
        "NODUS_REPORT",
        # A gang member's place in the gang (docs/gangs.md); the launchers' own variables (MASTER_ADDR,
        # RANK, ...) are set for gang Jobs only, and a Job's own value is overwritten there.
        "NODUS_GANG",
        "NODUS_RANK",
        "NODUS_WORLD_SIZE",
        "NODUS_GPUS_PER_NODE",
        "NODUS_MASTER_ADDR",
        "NODUS_MASTER_PORT",
        "NODUS_LAUNCHER",
    }
)
"""The env contract the agent sets at run time; a user value would be silently overwritten, so it is refused.
NODUS_PARAM_<NAME> is not reserved: it is how a Sweep's cell Job carries its parameters."""

# Paths. Three lists, because "system path" means different things for different fields:
PSEUDO_FS_PATHS: Final = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Kernel and runtime file systems: refused, with everything beneath them, for every path field."""
OS_PATHS: Final = (
    "/",
    "/bin",
    "/boot",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/sbin",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local",
    "/usr/sbin",
    "/var",
)
"""The image's OS trees: mounting or restoring *onto* one hides the OS, so they are refused as mount points
and checkpoint paths. Paths beneath them stay allowed (``/usr/src/app`` and ``/etc/myapp`` are common)."""
NODUS_MANAGED_PATHS: Final = ("/nodus",)
"""The agent mounts /nodus/inputs, /nodus/outputs and /nodus/state; a volume may not mount at or beneath."""
READ_ONLY_PATHS: Final = ("/nodus/inputs",)
"""Inputs are mounted read-only: nothing may be restored (checkpoints) or checked out (git) there."""

# ---------------------------------------------------------------------------------------------------------
# Patterns
# ---------------------------------------------------------------------------------------------------------

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAM_NAME = re.compile(r"[A-Z0-9_]+")
_INPUT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_OUTPUT_NAME = re.compile(r"[a-z0-9._-]{1,64}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_BLOB = re.compile(r"sha256:[0-9a-f]{64}")
_GIT_OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
# A ref may not start with "-" (it would reach git as an option) and has no spaces or control characters.
_GIT_REF = re.compile(r"[A-Za-z0-9._/+@^~{}][A-Za-z0-9._/+@^~{}-]{0,254}")
_EGRESS_HOST = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_S3_URI = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.+)")
_SQL_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")

_ENV_NAME_HINT = "a letter or underscore, then letters, digits and underscores (^[A-Za-z_][A-Za-z0-9_]*$)"
_DNS_LABEL_HINT = "lower case letters, digits and '-', starting and ending with a letter or digit"


# ---------------------------------------------------------------------------------------------------------
# Small checks shared by the rules
# ---------------------------------------------------------------------------------------------------------


def _enum(errs: ErrorList, path: Path, value: str | None, allowed: Sequence[str]) -> None:
    if value is not None and value not in allowed:
        errs.not_supported(path, value, tuple(allowed))


def _int_range(errs: ErrorList, path: Path, value: int | None, lo: int, hi: int | None = None) -> None:
    if value is None:
        return
    if hi is None and value < lo:
        errs.invalid(path, value, f"must be at least {lo}")
    elif hi is not None and not lo <= value <= hi:
        errs.invalid(path, value, f"must be between {lo} and {hi}")


def _pattern(errs: ErrorList, path: Path, value: str, pattern: re.Pattern[str], hint: str) -> bool:
    if pattern.fullmatch(value) is None:
        errs.invalid(path, value, f"must be {hint}")
        return False
    return True


def _required(errs: ErrorList, path: Path, value: object, what: str) -> bool:
    """Report a missing (None or empty) value; True when present."""
    if value is None or value == "" or value == []:
        errs.required(path, f"Required value: {what}")
        return False
    return True


def _dns_label(errs: ErrorList, path: Path, value: str | None, max_len: int = 63) -> None:
    if value is None:
        return
    if len(value) > max_len:
        errs.invalid(path, value, f"must be no more than {max_len} characters")
    _pattern(errs, path, value, _DNS_LABEL, f"a DNS-1123 label: {_DNS_LABEL_HINT}")


def _object_name(errs: ErrorList, path: Path, value: str | None) -> None:
    """A reference to another object (Secret, Volume, Connection, ...): a DNS-1123 subdomain."""
    if value is None:
        return
    if len(value) > 253:
        errs.invalid(path, value, "must be no more than 253 characters")
    _pattern(
        errs, path, value, _DNS_SUBDOMAIN, "a DNS-1123 subdomain: lower case letters, digits, '-' and '.'"
    )


def is_object_name(value: str) -> bool:
    """Whether ``value`` is a valid name for a referenced object (a DNS-1123 subdomain)."""
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def _sha256(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is not None:
        _pattern(errs, path, value, _SHA256_HEX, "a SHA-256 digest: 64 lower case hex digits")


def _unique(errs: ErrorList, items: Iterable[tuple[Path, str | None]]) -> None:
    """Report the second and later occurrences of a value (the first one is the one that stays)."""
    seen: set[str] = set()
    for path, value in items:
        if value is None:
            continue
        if value in seen:
            errs.duplicate(path, value)
        seen.add(value)


def _unique_at(errs: ErrorList, path: Path, values: Sequence[str | None], field: str | None = None) -> None:
    """:func:`_unique` for ``values[i]`` at ``path[i]`` (or ``path[i].field``); paths built only for a
    duplicate."""
    if len(values) < 2:
        return
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value is None:
            continue
        if value in seen:
            at = path.index(i)
            errs.duplicate(at if field is None else at.child(field), value)
        seen.add(value)


def _max_items(errs: ErrorList, path: Path, items: Sequence[object], limit: int) -> None:
    if len(items) > limit:
        errs.too_many(path, len(items), limit)


def _duration(
    errs: ErrorList,
    path: Path,
    value: str | None,
    lo: str = "0s",
    hi: str | None = None,
    *,
    positive: bool = False,
) -> timedelta | None:
    """Parse a Go duration and check it against [lo, hi]; ``positive`` refuses zero."""
    if value is None:
        return None
    try:
        d = parse_duration(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return None
    if positive and d <= timedelta(0):
        errs.invalid(path, value, "must be greater than 0s")
    elif hi is not None and not parse_duration(lo) <= d <= parse_duration(hi):
        errs.invalid(path, value, f"must be between {lo} and {hi}")
    elif d < parse_duration(lo):
        errs.invalid(path, value, f"must be at least {lo}")
    return d


def _usd(errs: ErrorList, path: Path, value: str | None) -> Decimal | None:
    """A USD amount: a non-negative decimal string with at most 6 places (never a JSON number)."""
    if value is None:
        return None
    try:
        return parse_usd(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return None


def _bytes(errs: ErrorList, path: Path, value: str | None, hi: str | None = None) -> None:
    if value is None:
        return
    try:
        n = parse_bytes(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return
    if n <= 0:
        errs.invalid(path, value, "must be greater than 0")
    elif hi is not None and n > parse_bytes(hi):
        errs.invalid(path, value, f"must be at most {hi}")


def _cpu(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is None:
        return
    try:
        millis = parse_cpu_millis(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return
    if millis <= 0:
        errs.invalid(path, value, "must be greater than 0")


def _under(path: str, roots: Iterable[str]) -> str | None:
    """The first root that ``path`` equals or lies beneath."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return None


def _abs_path(errs: ErrorList, path: Path, value: str | None) -> bool:
    """An absolute, normalised path outside the kernel file systems; True when usable for more checks."""
    if value is None:
        return False
    if not value.startswith("/"):
        errs.invalid(path, value, "must be an absolute path (starting with '/')")
        return False
    # normpath keeps a leading "//" (POSIX allows it a meaning), so refuse it explicitly: "//proc" is /proc.
    if value.startswith("//") or (posixpath.normpath(value) != value and value != "/"):
        errs.invalid(
            path, value, f"must be a normalised path, such as {posixpath.normpath('/' + value.lstrip('/'))!r}"
        )
        return False
    root = _under(value, PSEUDO_FS_PATHS)
    if root is not None:
        errs.forbidden(path, f"{value!r} is under the system path {root!r}; choose a path of your own")
        return False
    return True


def _target_path(errs: ErrorList, path: Path, value: str | None, *, extra: Sequence[str]) -> None:
    """A path Nodus writes to (a mount point, a checkpoint restore, a checkout): not onto an OS tree, not
    under ``extra`` (managed or read-only paths)."""
    if not _abs_path(errs, path, value):
        return
    assert value is not None
    if value in OS_PATHS:
        errs.forbidden(path, f"{value!r} is a system path and would hide the image's files; choose another")
        return
    root = _under(value, extra)
    if root is not None:
        errs.forbidden(path, f"{value!r} is under {root!r}, which Nodus manages; choose another path")


def _https_url(errs: ErrorList, path: Path, value: str) -> None:
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname:
        errs.invalid(path, value, "must be an https:// URL with a host")
    elif parts.username is not None or parts.password is not None:
        errs.forbidden(path, "credentials in a URL end up in logs; put them in a Secret instead")


# ---------------------------------------------------------------------------------------------------------
# Object metadata
# ---------------------------------------------------------------------------------------------------------


def _qualified_name(errs: ErrorList, path: Path, key: str) -> None:
    """A label or annotation key: an optional DNS subdomain prefix and '/', then a name of <= 63."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        errs.invalid(path, key, "prefix must be a DNS-1123 subdomain (e.g. 'example.com/')")
    if len(name) > 63 or _LABEL_NAME.fullmatch(name) is None:
        errs.invalid(
            path,
            key,
            "name part must be 63 characters or less, of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
        )


def _labels(errs: ErrorList, path: Path, labels: dict[str, str]) -> None:
    for key, value in labels.items():
        _qualified_name(errs, path.key(key), key)
        if value and (len(value) > 63 or _LABEL_NAME.fullmatch(value) is None):
            errs.invalid(
                path.key(key),
                value,
                "a label value must be empty or 63 characters or less of letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit",
            )


_MAX_ANNOTATIONS_BYTES: Final = 256 * 1024  # Kubernetes' TotalAnnotationSizeLimitB


def _annotations(errs: ErrorList, path: Path, annotations: dict[str, str]) -> None:
    for key in annotations:
        _qualified_name(errs, path.key(key), key)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > _MAX_ANNOTATIONS_BYTES:
        errs.add(
            path, CauseType.TOO_LONG, f"Too long: {size} bytes; must have at most {_MAX_ANNOTATIONS_BYTES}"
        )


def validate_object_meta(meta: ObjectMeta, path: Path | str = "metadata", *, max_name: int = 63) -> ErrorList:
    """Name (or generateName), namespace, labels and annotations, as Kubernetes checks them.

    ``max_name`` is the longest name the kind allows (63 for Jobs, :data:`MAX_SWEEP_NAME` for Sweeps).
    """
    errs = ErrorList()
    p = path if isinstance(path, Path) else Path(path)
    if meta.name is None and meta.generate_name is None:
        errs.required(p.child("name"), "Required value: name or generateName is required")
    _dns_label(errs, p.child("name"), meta.name, max_name)
    if meta.generate_name is not None:
        # The server appends 5 random characters, as Kubernetes does; the prefix may end in '-'.
        _dns_label(errs, p.child("generateName"), meta.generate_name.rstrip("-") or "x", max_name - 5)
    _dns_label(errs, p.child("namespace"), meta.namespace)
    _labels(errs, p.child("labels"), meta.labels)
    _annotations(errs, p.child("annotations"), meta.annotations)
    return errs


def _type_meta(errs: ErrorList, api_version: str, kind: str, want_kind: str) -> None:
    if api_version != API_VERSION:
        errs.not_supported("apiVersion", api_version, (API_VERSION,))
    if kind != want_kind:
        errs.not_supported("kind", kind, (want_kind,))


# ---------------------------------------------------------------------------------------------------------
# GPUs, resources and gangs
# ---------------------------------------------------------------------------------------------------------

_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GPU_COUNT_HINT = "must be 1, 2, 4 or 8 GPUs per node"


def _gpu_types(errs: ErrorList, path: Path, types: list[str]) -> None:
    if not types:
        errs.required(path, 'Required value: list 1 to 8 accelerator ids or families, such as ["H100"]')
        return
    _max_items(errs, path, types, MAX_GPU_TYPES)
    for i, t in enumerate(types):
        _pattern(
            errs, path.index(i), t, _GPU_TYPE, "an accelerator id or family such as 'H100' or 'a100-80g'"
        )
    _unique_at(errs, path, types)


def _gpu_string(errs: ErrorList, path: Path, value: str) -> None:
    """The "H100:1" form: every problem is reported at the string's own path, where the user wrote it."""
    for message in _gpu_string_problems(value):
        errs.invalid(path, value, message)


def _gpu_string_problems(value: str) -> tuple[str, ...]:
    """What is wrong with a GPU string, as messages (kept per short string: pure, and read often)."""
    if isinstance(value, str) and len(value) <= _CACHED_GPU_LEN:
        return _cached_gpu_string_problems(value)
    return _gpu_string_problems_of(value)


def _gpu_string_problems_of(value: str) -> tuple[str, ...]:
    try:
        count, types = parse_gpu_parts(value)
    except ValueError as e:
        return (str(e),)
    out = []
    if count not in ALLOWED_GPU_COUNTS:
        out.append(f"asks for {count} GPUs per node; the count {_GPU_COUNT_HINT}")
    if len(types) > MAX_GPU_TYPES:
        out.append(f"lists {len(types)} types; at most {MAX_GPU_TYPES}")
    if len(set(types)) != len(types):
        out.append("lists a type twice")
    return tuple(out)


_CACHED_GPU_LEN: Final = 64
_cached_gpu_string_problems = functools.lru_cache(maxsize=1024)(_gpu_string_problems_of)


def gpu_request_errors(value: GPURequest | str, path: Path | str) -> ErrorList:
    """Every problem with one GPU request, in the object or the string form."""
    errs = ErrorList()
    p = path if isinstance(path, Path) else Path(path)
    if isinstance(value, str):
        _gpu_string(errs, p, value)
        return errs
    if value.count is not None and value.count not in ALLOWED_GPU_COUNTS:
        errs.invalid(p.child("count"), value.count, _GPU_COUNT_HINT)
    _gpu_types(errs, p.child("type"), value.type)
    _enum(errs, p.child("interconnect"), value.interconnect, INTERCONNECTS)
    _bytes(errs, p.child("minMemory"), value.min_memory)
    return errs


def _gpu_count(value: GPURequest | str | None) -> int | None:
    """The GPUs per node a valid request asks for (1 when unset, as the string form reads); else None."""
    if value is None:
        return None
    if isinstance(value, str):
        return None if _gpu_string_problems(value) else parse_gpu_parts(value)[0]
    if gpu_request_errors(value, ""):
        return None
    return value.count if value.count is not None else 1


def _resources(errs: ErrorList, path: Path, res: Resources | None) -> None:
    if res is None:
        return
    _cpu(errs, path.child("cpu"), res.cpu)
    _bytes(errs, path.child("memory"), res.memory)
    _bytes(errs, path.child("disk"), res.disk)
    if res.gpu is not None:
        errs.extend(gpu_request_errors(res.gpu, path.child("gpu")))
    _int_range(errs, path.child("nodes"), res.nodes, 1)


def _gang_nodes(errs: ErrorList, path: Path, nodes: int | None) -> None:
    if nodes is None:
        return
    if not MIN_GANG_NODES <= nodes <= MAX_GANG_NODES:
        errs.invalid(path, nodes, f"a gang has {MIN_GANG_NODES} to {MAX_GANG_NODES} nodes")
    elif nodes > BETA_GANG_NODES:
        errs.forbidden(path, f"{nodes} nodes: the beta caps gangs at {BETA_GANG_NODES} nodes")


def _distributed_fields(errs: ErrorList, path: Path, d: Distributed, *, shorthand: bool) -> None:
    if d.nodes is not None and d.total_gpus is not None:
        errs.invalid(path.child("totalGPUs"), d.total_gpus, "set exactly one of nodes and totalGPUs")
    elif d.nodes is None and d.total_gpus is None and not shorthand:
        errs.required(path, "Required value: exactly one of nodes and totalGPUs")
    _gang_nodes(errs, path.child("nodes"), d.nodes)
    _int_range(errs, path.child("totalGPUs"), d.total_gpus, MIN_TOTAL_GPUS, MAX_TOTAL_GPUS)
    if d.gpus_per_node is not None and d.gpus_per_node not in ALLOWED_GPU_COUNTS:
        errs.invalid(path.child("gpusPerNode"), d.gpus_per_node, _GPU_COUNT_HINT)
    _enum(errs, path.child("launcher"), d.launcher, LAUNCHERS)
    _enum(errs, path.child("network"), d.network, NETWORKS)
    _enum(errs, path.child("transport"), d.transport, TRANSPORTS)
    _int_range(errs, path.child("maxAssemblyRetries"), d.max_assembly_retries, 0, 5)
    _duration(errs, path.child("startupTimeout"), d.startup_timeout, "5m", "60m")


def _total_gpus_topology(errs: ErrorList, path: Path, total: int | None, per_node: int | None) -> None:
    """totalGPUs must split into whole nodes, and into a gang the beta accepts."""
    if total is None or per_node is None or not MIN_TOTAL_GPUS <= total <= MAX_TOTAL_GPUS:
        return
    if total % per_node:
        errs.invalid(path, total, f"must be a multiple of the {per_node} GPUs per node")
        return
    nodes = total // per_node
    if nodes < MIN_GANG_NODES:
        errs.invalid(path, total, f"is one node of {per_node} GPUs; a gang needs at least 2 nodes")
    elif nodes > BETA_GANG_NODES:
        errs.forbidden(
            path, f"{total} GPUs at {per_node} per node is {nodes} nodes; the beta caps gangs at 8"
        )


def _gang(errs: ErrorList, path: Path, spec: JobSpec, *, gpu_swept: bool) -> None:
    """spec.distributed, and resources.nodes > 1 (its shorthand) where defaulting has not folded it."""
    res_nodes = spec.resources.nodes if spec.resources is not None else None
    shorthand = res_nodes is not None and res_nodes > 1
    d = spec.distributed
    if shorthand:
        nodes_path = path.child("resources").child("nodes")
        _gang_nodes(errs, nodes_path, res_nodes)
        if d is not None and d.total_gpus is not None:
            errs.invalid(
                nodes_path, res_nodes, "conflicts with spec.distributed.totalGPUs; set one gang size"
            )
        elif d is not None and d.nodes is not None and d.nodes != res_nodes:
            errs.invalid(nodes_path, res_nodes, f"conflicts with spec.distributed.nodes ({d.nodes})")
    if d is None and not shorthand:
        return
    dp = path.child("distributed")
    if d is not None:
        _distributed_fields(errs, dp, d, shorthand=shorthand)
    if gpu_swept:
        return  # the Sweep checks each matrix GPU value against the gang instead
    gpu = spec.resources.gpu if spec.resources is not None else None
    if gpu is None:
        errs.required(path.child("resources").child("gpu"), "Required value: a distributed Job needs GPUs")
        return
    count = _gpu_count(gpu)
    per_node = d.gpus_per_node if d is not None else None
    if per_node is not None and count is not None and per_node != count:
        errs.invalid(dp.child("gpusPerNode"), per_node, f"must equal spec.resources.gpu.count ({count})")
    if d is not None:
        _total_gpus_topology(errs, dp.child("totalGPUs"), d.total_gpus, per_node or count)


# ---------------------------------------------------------------------------------------------------------
# The container: image, env, secrets, source, init command, sidecars
# ---------------------------------------------------------------------------------------------------------

_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def _env_var(errs: ErrorList, path: Path, e: EnvVar) -> None:
    if _required(errs, path.child("name"), e.name, "an environment variable name"):
        assert e.name is not None
        if _pattern(errs, path.child("name"), e.name, _ENV_NAME, _ENV_NAME_HINT) and e.name in RESERVED_ENV:
            errs.forbidden(path.child("name"), f"{e.name} is set by Nodus at run time")
    if e.value is not None and e.value_from is not None:
        errs.invalid(path.child("valueFrom"), "secretKeyRef", "set exactly one of value and valueFrom")
    elif e.value is None and e.value_from is None:
        errs.required(path, "Required value: set exactly one of value and valueFrom")
    if e.value_from is None:
        return
    ref = e.value_from.secret_key_ref
    rp = path.child("valueFrom").child("secretKeyRef")
    if not _required(errs, rp, ref, "valueFrom needs a secretKeyRef with name and key"):
        return
    assert ref is not None
    if _required(errs, rp.child("name"), ref.name, "the Secret's name"):
        _object_name(errs, rp.child("name"), ref.name)
    if _required(errs, rp.child("key"), ref.key, "the key within the Secret") and ref.key is not None:
        _pattern(errs, rp.child("key"), ref.key, _SECRET_KEY, "letters, digits, '-', '_' or '.'")


def _env_list(errs: ErrorList, path: Path, env: list[EnvVar]) -> None:
    for i, e in enumerate(env):
        _env_var(errs, path.index(i), e)
    _unique_at(errs, path, [e.name for e in env], "name")


def _secrets(errs: ErrorList, path: Path, secrets: list[SecretMount | str]) -> None:
    names: list[tuple[Path, str | None]] = []
    for i, s in enumerate(secrets):
        sp = path.index(i)
        if isinstance(s, str):
            _object_name(errs, sp, s)  # the bare form: the error names the item the user wrote
            names.append((sp, s))
            continue
        if _required(errs, sp.child("name"), s.name, "the Secret's name"):
            _object_name(errs, sp.child("name"), s.name)
        _int_range(errs, sp.child("version"), s.version, 1)
        names.append((sp.child("name"), s.name))
    _unique(errs, names)


def _git_path(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is None:
        return
    if value.startswith("/"):
        _target_path(errs, path, value, extra=NODUS_MANAGED_PATHS)
    elif ".." in value.split("/") or posixpath.normpath(value) != value:
        errs.invalid(path, value, "a relative checkout path must be normalised and stay below workingDir")


def _source(errs: ErrorList, path: Path, src: Source | None) -> None:
    if src is None:
        return
    if src.git is not None and src.blob is not None:
        errs.invalid(path.child("blob"), src.blob, "set exactly one of git and blob")
    elif src.git is None and src.blob is None:
        errs.required(path, "Required value: exactly one of git and blob")
    if src.blob is not None:
        _pattern(errs, path.child("blob"), src.blob, _BLOB, "sha256:<64 lower case hex digits>")
    git = src.git
    if git is None:
        return
    gp = path.child("git")
    if _required(errs, gp.child("repo"), git.repo, "owner/name or an https:// URL") and git.repo is not None:
        if "://" in git.repo:
            _https_url(errs, gp.child("repo"), git.repo)
        else:
            _pattern(errs, gp.child("repo"), git.repo, _GIT_OWNER_NAME, "owner/name or an https:// URL")
    if git.ref is not None:
        _pattern(errs, gp.child("ref"), git.ref, _GIT_REF, "a branch, tag or commit (no spaces, not '-...')")
    _git_path(errs, gp.child("path"), git.path)


def _init_command(errs: ErrorList, path: Path, init: InitCommand | None) -> None:
    if init is None:
        return
    _required(errs, path.child("command"), init.command, "the preflight's argv")
    timeout = _duration(errs, path.child("timeout"), init.timeout, positive=True)
    if timeout is not None and timeout > parse_duration("30m"):
        errs.invalid(path.child("timeout"), init.timeout, "must be at most 30m")


def _sidecars(errs: ErrorList, path: Path, sidecars: list[Sidecar]) -> None:
    for i, s in enumerate(sidecars):
        sp = path.index(i)
        if _required(errs, sp.child("name"), s.name, "a sidecar name"):
            _dns_label(errs, sp.child("name"), s.name)
            if s.name == RESERVED_SIDECAR_NAME:
                errs.forbidden(sp.child("name"), f'"{RESERVED_SIDECAR_NAME}" is the Job\'s own container')
        if s.image is not None:
            _required(errs, sp.child("image"), s.image, "an image, or leave it unset for the Job's image")
        _env_list(errs, sp.child("env"), s.env)
        _duration(errs, sp.child("startupTimeout"), s.startup_timeout, positive=True)
    _unique_at(errs, path, [s.name for s in sidecars], "name")


def _container(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    # An image is always required: Nodus has no default runtime image, and Kubernetes requires one too.
    # imageRef (a reference the platform resolves) stands in for it.
    if not spec.image and not spec.image_ref:
        errs.required(path.child("image"), "Required value: the container image (or imageRef)")
    if spec.working_dir is not None:
        _abs_path(errs, path.child("workingDir"), spec.working_dir)
    _env_list(errs, path.child("env"), spec.env)
    _secrets(errs, path.child("secrets"), spec.secrets)
    for field, names in (("imagePullSecrets", spec.image_pull_secrets), ("connections", spec.connections)):
        for i, n in enumerate(names):
            _object_name(errs, path.child(field).index(i), n)
        _unique_at(errs, path.child(field), names)
    _object_name(errs, path.child("serviceAccountName"), spec.service_account_name)
    _source(errs, path.child("source"), spec.source)
    _init_command(errs, path.child("initCommand"), spec.init_command)
    _sidecars(errs, path.child("sidecars"), spec.sidecars)


# ---------------------------------------------------------------------------------------------------------
# Inputs, outputs, volumes
# ---------------------------------------------------------------------------------------------------------


def _input_sources(inp: JobInput) -> list[str]:
    candidates = (
        ("volume", inp.volume),
        ("output", inp.output),
        ("bucket", inp.bucket),
        ("url", inp.url),
        ("fromWorkspace", inp.from_workspace),
        ("fromStage", inp.from_stage),
    )
    return [name for name, value in candidates if value is not None]


_INPUT_SOURCE_NAMES = "url, bucket or output"
"""The input kinds the node agent materialises (ADR-0020)."""

_UNSUPPORTED_INPUTS: Final = {
    "volume": "Volumes",
    "fromWorkspace": "Workspaces",
    "fromStage": "Pipelines",
}
"""Kinds the reference lists whose objects Nodus does not have yet. Refused, never dropped: a Job that ran
without an input it asked for would fail late and cost money, or quietly compute the wrong thing."""


def _input_source(errs: ErrorList, path: Path, inp: JobInput) -> None:
    sources = _input_sources(inp)
    if not sources:
        errs.required(path, f"Required value: exactly one of {_INPUT_SOURCE_NAMES}")
    for extra in sources[1:]:
        errs.forbidden(path.child(extra), f"an input has exactly one source, and {sources[0]} is set")
    for kind in sources:
        if kind in _UNSUPPORTED_INPUTS:
            errs.forbidden(
                path.child(kind),
                f"{kind} inputs are not supported yet (Nodus has no {_UNSUPPORTED_INPUTS[kind]}); "
                f"use {_INPUT_SOURCE_NAMES} instead: an https:// file, an S3 object or prefix, "
                "or another Job's committed output",
            )
    if inp.volume is not None:
        vp = path.child("volume")
        if _required(errs, vp.child("name"), inp.volume.name, "the Volume's name"):
            _object_name(errs, vp.child("name"), inp.volume.name)
        _int_range(errs, vp.child("revision"), inp.volume.revision, 1)
    if inp.output is not None:
        op = path.child("output")
        if _required(errs, op.child("job"), inp.output.job, "the producing Job"):
            _dns_label(errs, op.child("job"), inp.output.job)
        if _required(errs, op.child("name"), inp.output.name, "the output's name") and inp.output.name:
            _pattern(
                errs, op.child("name"), inp.output.name, _OUTPUT_NAME, "an output name (^[a-z0-9._-]{1,64}$)"
            )
        _int_range(errs, op.child("index"), inp.output.index, 0, MAX_COMPLETIONS - 1)
    _remote_input(errs, path, inp)


def _remote_input(errs: ErrorList, path: Path, inp: JobInput) -> None:
    if inp.bucket is not None:
        bp = path.child("bucket")
        if _required(errs, bp.child("uri"), inp.bucket.uri, "s3://bucket/key") and inp.bucket.uri:
            _pattern(errs, bp.child("uri"), inp.bucket.uri, _S3_URI, "an object URI s3://bucket/key")
        _object_name(errs, bp.child("connection"), inp.bucket.connection)
        _sha256(errs, bp.child("sha256"), inp.bucket.sha256)
    if inp.url is not None:
        up = path.child("url")
        if _required(errs, up.child("url"), inp.url.url, "an https:// URL") and inp.url.url:
            _https_url(errs, up.child("url"), inp.url.url)
        _sha256(errs, up.child("sha256"), inp.url.sha256)
    if inp.from_workspace is not None:
        wp = path.child("fromWorkspace")
        if _required(errs, wp.child("name"), inp.from_workspace.name, "the Workspace's name"):
            _object_name(errs, wp.child("name"), inp.from_workspace.name)
        sub = inp.from_workspace.path
        if sub is not None and (sub.startswith("/") or ".." in sub.split("/")):
            errs.invalid(wp.child("path"), sub, "must be a subdirectory of the home: relative, without '..'")
    if inp.from_stage is not None:
        sp = path.child("fromStage")
        _required(errs, sp.child("stage"), inp.from_stage.stage, "the producing stage")
        _required(errs, sp.child("output"), inp.from_stage.output, "the stage's output name")


def _inputs(errs: ErrorList, path: Path, inputs: list[JobInput]) -> None:
    for i, inp in enumerate(inputs):
        ip = path.index(i)
        if _required(errs, ip.child("name"), inp.name, "an input name") and inp.name is not None:
            _pattern(
                errs,
                ip.child("name"),
                inp.name,
                _INPUT_NAME,
                "a letter, then up to 63 letters, digits or '_'",
            )
        _input_source(errs, ip, inp)
    _unique_at(errs, path, [inp.name for inp in inputs], "name")


def _output_name(errs: ErrorList, path: Path, name: str | None) -> None:
    if not _required(errs, path, name, "an output name") or name is None:
        return
    if not _pattern(errs, path, name, _OUTPUT_NAME, "1 to 64 of lower case letters, digits, '.', '_' or '-'"):
        return
    if name.startswith(RESERVED_OUTPUT_PREFIX):
        errs.forbidden(path, f'the "{RESERVED_OUTPUT_PREFIX}" prefix is reserved for Nodus')
    elif name == RESERVED_OUTPUT_NAME:
        errs.forbidden(path, '"outputs" is the implicit output of /nodus/outputs; choose another name')


def _output(errs: ErrorList, path: Path, out: JobOutput) -> None:
    _output_name(errs, path.child("name"), out.name)
    if _required(errs, path.child("path"), out.path, "an absolute file or directory path"):
        _abs_path(errs, path.child("path"), out.path)
        if out.path == "/":
            errs.forbidden(path.child("path"), "collecting the whole file system is not an output")
    _enum(errs, path.child("fromRanks"), out.from_ranks, FROM_RANKS)
    if out.sink is not None:
        kp = path.child("sink")
        if _required(
            errs, kp.child("connection"), out.sink.connection, "a Postgres, Neon or Supabase Connection"
        ):
            _object_name(errs, kp.child("connection"), out.sink.connection)
        if _required(errs, kp.child("table"), out.sink.table, "the destination table") and out.sink.table:
            _pattern(
                errs, kp.child("table"), out.sink.table, _SQL_TABLE, "a table name, optionally schema.table"
            )
        _enum(errs, kp.child("mode"), out.sink.mode, SINK_MODES)


def _outputs(errs: ErrorList, path: Path, outputs: list[JobOutput]) -> None:
    _max_items(errs, path, outputs, MAX_OUTPUTS)
    for i, out in enumerate(outputs):
        _output(errs, path.index(i), out)
    _unique_at(errs, path, [o.name for o in outputs], "name")


def _volumes(errs: ErrorList, path: Path, volumes: list[VolumeMount]) -> None:
    for i, v in enumerate(volumes):
        vp = path.index(i)
        if _required(errs, vp.child("volume"), v.volume, "the Volume's name"):
            _object_name(errs, vp.child("volume"), v.volume)
        if _required(errs, vp.child("mountPath"), v.mount_path, "an absolute mount point"):
            _target_path(errs, vp.child("mountPath"), v.mount_path, extra=NODUS_MANAGED_PATHS)
        _int_range(errs, vp.child("revision"), v.revision, 1)
        if v.revision is not None and not v.read_only:
            errs.forbidden(vp.child("revision"), "a revision can only be pinned with readOnly: true")
    _unique_at(errs, path, [v.mount_path for v in volumes], "mountPath")


# ---------------------------------------------------------------------------------------------------------
# Placement, recovery, network
# ---------------------------------------------------------------------------------------------------------


def _names(errs: ErrorList, path: Path, names: list[str]) -> None:
    for i, n in enumerate(names):
        _dns_label(errs, path.index(i), n)
    _unique_at(errs, path, names)


def _placement(errs: ErrorList, path: Path, pl: Placement | None) -> None:
    if pl is None:
        return
    if pl.dedicated is False:
        errs.invalid(path.child("dedicated"), False, "only true is accepted; leave it unset otherwise")
    _enum(errs, path.child("interruptible"), pl.interruptible, INTERRUPTIBLE)
    _enum(errs, path.child("profile"), pl.profile, PROFILES)
    _usd(errs, path.child("maxRateUSDPerHour"), pl.max_rate_usd_per_hour)
    _names(errs, path.child("offerings"), pl.offerings)
    _dns_label(errs, path.child("pool"), pl.pool)
    _duration(errs, path.child("queueTimeout"), pl.queue_timeout)
    _names(errs, path.child("regions"), pl.regions)


def _checkpoint_interval(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is not None and value != "auto":
        _duration(errs, path, value, "1m", "6h")


def _checkpoint(errs: ErrorList, path: Path, cp: CheckpointPolicy) -> None:
    _enum(errs, path.child("format"), cp.format, CHECKPOINT_FORMATS)
    _enum(errs, path.child("integration"), cp.integration, CHECKPOINT_INTEGRATIONS)
    _checkpoint_interval(errs, path.child("interval"), cp.interval)
    _bytes(errs, path.child("maxSize"), cp.max_size, hi="2Ti")
    _max_items(errs, path.child("paths"), cp.paths, MAX_CHECKPOINT_PATHS)
    for i, p in enumerate(cp.paths):
        _target_path(errs, path.child("paths").index(i), p, extra=READ_ONLY_PATHS)
    _unique_at(errs, path.child("paths"), cp.paths)
    _duration(errs, path.child("retainAfterFinish"), cp.retain_after_finish)


def _recovery(errs: ErrorList, path: Path, rec: Recovery | None) -> None:
    if rec is None:
        return
    _enum(errs, path.child("continuity"), rec.continuity, CONTINUITIES)
    _enum(errs, path.child("onInterruption"), rec.on_interruption, ON_INTERRUPTION)
    _int_range(errs, path.child("maxAttempts"), rec.max_attempts, 1, 32)
    _duration(errs, path.child("minProgressDuration"), rec.min_progress_duration)
    if rec.checkpoint is None:
        return
    if rec.continuity is not None and rec.continuity != "Checkpointed":
        errs.forbidden(
            path.child("checkpoint"),
            f"checkpoints are only taken with continuity Checkpointed, not {rec.continuity}",
        )
    _checkpoint(errs, path.child("checkpoint"), rec.checkpoint)


def _egress(errs: ErrorList, path: Path, eg: Egress) -> None:
    _enum(errs, path.child("policy"), eg.policy, EGRESS_POLICIES)
    # An unset policy becomes AllowList when allow or presets are given (defaulting), so only a policy the
    # user set to something else conflicts with them.
    listed = eg.policy is None or eg.policy == "AllowList"
    for field, items in (("allow", eg.allow), ("presets", eg.presets)):
        if items and not listed:
            errs.forbidden(path.child(field), f"only with policy AllowList, not {eg.policy}")
    ap = path.child("allow")
    _max_items(errs, ap, eg.allow, MAX_EGRESS_ALLOW)
    for i, host in enumerate(eg.allow):
        if len(host) > 253 or _EGRESS_HOST.fullmatch(host) is None:
            errs.invalid(ap.index(i), host, "must be a lower case DNS name or a *.suffix pattern")
    _unique_at(errs, ap, eg.allow)
    _names(errs, path.child("presets"), eg.presets)


# ---------------------------------------------------------------------------------------------------------
# Counts, times, money
# ---------------------------------------------------------------------------------------------------------


def _timeout_alias(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    ads = spec.active_deadline_seconds
    if ads is None:
        return
    _int_range(errs, path.child("activeDeadlineSeconds"), ads, 1)
    if spec.timeout is None or ads < 1:
        return
    try:
        timeout = parse_duration(spec.timeout)
    except ValueError:
        return  # reported at spec.timeout
    if timeout != timedelta(seconds=ads):
        errs.invalid(
            path.child("activeDeadlineSeconds"),
            ads,
            f"is an alias of timeout and disagrees with spec.timeout {spec.timeout!r}; set only one of them",
        )


def _counts_and_times(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    _int_range(errs, path.child("completions"), spec.completions, 1, MAX_COMPLETIONS)
    most = min(spec.completions if spec.completions and spec.completions > 0 else 1, MAX_PARALLELISM)
    if spec.parallelism is not None and not 1 <= spec.parallelism <= most:
        errs.invalid(
            path.child("parallelism"),
            spec.parallelism,
            f"must be between 1 and min(completions, 256) = {most}",
        )
    _int_range(errs, path.child("backoffLimit"), spec.backoff_limit, 0, 100)
    _int_range(errs, path.child("ttlSecondsAfterFinished"), spec.ttl_seconds_after_finished, 0)
    _enum(errs, path.child("state"), spec.state, SPEC_STATES)
    _duration(errs, path.child("timeout"), spec.timeout, positive=True)
    _timeout_alias(errs, path, spec)
    _duration(errs, path.child("scaledownWindow"), spec.scaledown_window, "0s", "20m")
    _duration(errs, path.child("expectedDuration"), spec.expected_duration, positive=True)
    if spec.complete_by_time is not None:
        try:
            parse_time(spec.complete_by_time)
        except ValueError as e:
            errs.invalid(path.child("completeByTime"), spec.complete_by_time, str(e))
    _usd(errs, path.child("maxCostUSD"), spec.max_cost_usd)


# ---------------------------------------------------------------------------------------------------------
# JobSpec and Job
# ---------------------------------------------------------------------------------------------------------


def validate_job_spec(spec: JobSpec, path: Path | str = "spec", *, gpu_swept: bool = False) -> ErrorList:
    """Every rule of a JobSpec. ``gpu_swept`` is set for a Sweep template whose matrix sets the GPUs: the
    template then needs no GPU request of its own, and the Sweep checks each matrix value against the gang."""
    errs = ErrorList()
    p = path if isinstance(path, Path) else Path(path)
    _counts_and_times(errs, p, spec)
    _container(errs, p, spec)
    _resources(errs, p.child("resources"), spec.resources)
    _gang(errs, p, spec, gpu_swept=gpu_swept)
    _inputs(errs, p.child("inputs"), spec.inputs)
    _outputs(errs, p.child("outputs"), spec.outputs)
    _volumes(errs, p.child("volumes"), spec.volumes)
    _placement(errs, p.child("placement"), spec.placement)
    _recovery(errs, p.child("recovery"), spec.recovery)
    if spec.network is not None and spec.network.egress is not None:
        _egress(errs, p.child("network").child("egress"), spec.network.egress)
    return errs


def validate_job(job: Job) -> list[FieldError]:
    """Every rule of a Job (type, metadata, spec); the status is the controllers' and is not checked."""
    errs = ErrorList()
    _type_meta(errs, job.api_version, job.kind, "Job")
    errs.extend(validate_object_meta(job.metadata, max_name=MAX_JOB_NAME))
    errs.extend(_remembered(_spec_key("Job", job.spec), lambda e: e.extend(validate_job_spec(job.spec))))
    return errs.as_list()


# ---------------------------------------------------------------------------------------------------------
# Sweep
# ---------------------------------------------------------------------------------------------------------


def _gpu_key(value: GPURequest | str) -> str | None:
    """A canonical form to find duplicate matrix GPU values, or None for a value that does not parse.

    Defaults count as written (count 1, not exact, interconnect Any): two values that differ only in
    spelling a default out would run the same cells twice."""
    if isinstance(value, str):
        try:
            count, types = parse_gpu_parts(value)
        except ValueError:
            return None
        value = GPURequest(count=count, type=list(types))
    exact, interconnect = bool(value.exact), value.interconnect or "Any"
    return f"{sorted(value.type)}:{value.count or 1}:{exact}:{interconnect}:{value.min_memory}"


def _matrix_gpus(errs: ErrorList, path: Path, spec: SweepSpec) -> None:
    gpus = spec.matrix.gpu
    _max_items(errs, path, gpus, MAX_MATRIX_GPUS)
    d = spec.template.spec.distributed
    for i, g in enumerate(gpus):
        gp = path.index(i)
        bad = gpu_request_errors(g, gp)
        errs.extend(bad)
        count = _gpu_count(g)
        if bad or count is None or d is None:
            continue
        if d.gpus_per_node is not None and d.gpus_per_node != count:
            errs.invalid(
                gp, _show(g), f"has {count} GPUs per node, but the template's gang has {d.gpus_per_node}"
            )
        _total_gpus_topology(errs, gp, d.total_gpus, count)
    _unique_at(errs, path, [_gpu_key(g) for g in gpus])


def _show(value: GPURequest | str) -> str:
    return value if isinstance(value, str) else f"{','.join(value.type)}:{value.count or 1}"


def _matrix_params(errs: ErrorList, path: Path, m: SweepMatrix, spec: JobSpec) -> None:
    env_names = {e.name for e in spec.env}
    for name, values in m.params.items():
        pp = path.key(name)
        _pattern(
            errs, pp, name, _PARAM_NAME, "upper case letters, digits and '_' (it becomes NODUS_PARAM_<NAME>)"
        )
        if not values:
            errs.required(pp, f"Required value: at least one value for {name}")
        _unique_at(errs, pp, values)
        if f"NODUS_PARAM_{name}" in env_names:
            errs.forbidden(pp, f"the template's env already sets NODUS_PARAM_{name}; remove one of them")


def _matrix_regions(errs: ErrorList, path: Path, m: SweepMatrix, spec: JobSpec) -> None:
    """Each cell runs in one matrix region, so a region must be one the template allows: a matrix narrows
    placement.regions, never widens it (a template without regions allows any)."""
    _names(errs, path, m.regions)
    allowed = spec.placement.regions if spec.placement is not None else []
    supported = ", ".join(f'"{a}"' for a in allowed)
    for i, region in enumerate(m.regions):
        if allowed and region not in allowed:
            errs.add(
                path.index(i),
                CauseType.NOT_SUPPORTED,
                f"Unsupported value: {region!r}: supported values: {supported} (a matrix region narrows the "
                "template's spec.template.spec.placement.regions and cannot widen it: add the region there, "
                "or drop it here)",
            )


def _matrix(errs: ErrorList, path: Path, spec: SweepSpec) -> None:
    _matrix_gpus(errs, path.child("gpu"), spec)
    _matrix_regions(errs, path.child("regions"), spec.matrix, spec.template.spec)
    _matrix_params(errs, path.child("params"), spec.matrix, spec.template.spec)
    cells = count_cells(spec)
    if cells > MAX_CELLS:
        errs.add(
            path,
            CauseType.TOO_MANY,
            f"Too many: the matrix expands to {cells} cells ({_dims(spec)}); must be at most {MAX_CELLS} "
            "(ADR-0025): remove values, lower spec.repetitions, or split it into several Sweeps",
        )


def _dims(spec: SweepSpec) -> str:
    """The factors of the cell count, for the message: "2 gpu x 100 LR x 2 repetitions"."""
    m = spec.matrix
    parts = [f"{n} {what}" for n, what in ((len(m.gpu), "gpu"), (len(m.regions), "regions")) if n]
    parts += [f"{len(v)} {k}" for k, v in sorted(m.params.items())]
    parts.append(f"{spec.repetitions or 1} repetitions")
    return " x ".join(parts)


_size_encoder: Final = msgspec.json.Encoder()


def widest_sweep_bytes(sweep: Sweep, key: bytes | None = None) -> int:
    """The most the Sweep's JSON can take once every cell has reported: the object without its status as it
    is now, :data:`STATUS_BESIDES_CELLS` and every cell row at its widest (``sweeps.widest_cells_bytes``).
    ``key``: the spec's :func:`_spec_key`, if made already."""
    bare = _size_encoder.encode(msgspec.structs.replace(sweep, status=SweepStatus()))
    return len(bare) + STATUS_BESIDES_CELLS + _widest_cells(sweep.spec, key)


def _widest_cells(spec: SweepSpec, key: bytes | None = None) -> int:
    """``widest_cells_bytes``, once per distinct spec (``key``: the spec's :func:`_spec_key`, if made
    already): it depends on the spec alone and walks every matrix value, ~10 µs of a create for
    examples/sweep.yaml."""
    return _widest_memo.get(key or _spec_key("Sweep", spec), lambda: widest_cells_bytes(spec))


def _stored_size(errs: ErrorList, sweep: Sweep, key: bytes) -> None:
    """A Sweep whose status would outgrow one bus message at its widest is refused now, not when a cell's
    row makes the controller's write fail (ADR-0025). Over the cell cap it is refused for that alone."""
    if count_cells(sweep.spec) > MAX_CELLS:
        return
    size = widest_sweep_bytes(sweep, key)
    if size > MAX_SWEEP_BYTES:
        cells = widest_cells_bytes(sweep.spec)
        errs.add(
            "spec.matrix",
            CauseType.TOO_LONG,
            f"Too long: the Sweep would take up to {size} bytes once its {count_cells(sweep.spec)} cells "
            f"({_dims(sweep.spec)}) report ({cells} of them the cell rows, which repeat each cell's gpu, "
            f"region and params); must be at most {MAX_SWEEP_BYTES} (ADR-0025): shorten the param values, "
            "remove values, or split it into several Sweeps",
        )


def _sweep_spec(errs: ErrorList, path: Path, spec: SweepSpec) -> None:
    _int_range(errs, path.child("maxParallel"), spec.max_parallel, 1, 256)
    _int_range(errs, path.child("repetitions"), spec.repetitions, 1, 64)
    _enum(errs, path.child("state"), spec.state, SPEC_STATES)
    _usd(errs, path.child("maxCostUSD"), spec.max_cost_usd)
    tp = path.child("template")
    _enum(errs, tp.child("kind"), spec.template.kind, ("Job",))
    tspec = spec.template.spec
    if tspec.state not in (None, "Running"):
        errs.forbidden(
            tp.child("spec").child("state"), "cells follow the Sweep's spec.state; leave this unset"
        )
    errs.extend(validate_job_spec(tspec, tp.child("spec"), gpu_swept=bool(spec.matrix.gpu)))
    _matrix(errs, path.child("matrix"), spec)


def validate_sweep(sweep: Sweep) -> list[FieldError]:
    """Every rule of a Sweep: type, metadata, the Sweep's own fields, the matrix and the whole template."""
    errs = ErrorList()
    _type_meta(errs, sweep.api_version, sweep.kind, "Sweep")
    errs.extend(validate_object_meta(sweep.metadata, max_name=MAX_SWEEP_NAME))
    key = _spec_key("Sweep", sweep.spec)
    errs.extend(_remembered(key, lambda e: _sweep_spec(e, Path("spec"), sweep.spec)))
    _stored_size(errs, sweep, key)
    return errs.as_list()


# ---------------------------------------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------------------------------------

MAX_BUDGET_NAME: Final = 63


def validate_budget(budget: Budget) -> list[FieldError]:
    """Every rule of a Budget: type, metadata, a monthly USD amount (as maxCostUSD is written) and a selector
    of label pairs (keys and values as labels take them); the status is billing's and is not checked."""
    errs = ErrorList()
    _type_meta(errs, budget.api_version, budget.kind, "Budget")
    errs.extend(validate_object_meta(budget.metadata, max_name=MAX_BUDGET_NAME))
    spec = Path("spec")
    _usd(errs, spec.child("monthlyUSD"), budget.spec.monthly_usd)
    _labels(errs, spec.child("selector"), budget.spec.selector)
    return errs.as_list()


# ---------------------------------------------------------------------------------------------------------
# Specs seen before
# ---------------------------------------------------------------------------------------------------------

# Checking a spec is ~50 µs of the gateway's CPU for a Sweep like examples/sweep.yaml; encoding it to look
# it up is ~1 µs (remembering.py says why the same spec comes back).
_memo: Memo[bytes, tuple[FieldError, ...]] = Memo(SPEC_MEMO_SIZE)
_widest_memo: Memo[bytes, int] = Memo(SPEC_MEMO_SIZE)
_memo_encoder: Final = msgspec.json.Encoder()


def _spec_key(kind: str, spec: Any) -> bytes:
    """The key of a spec in the memos: its kind and its JSON. Every value the rules read is in the JSON, as
    written (1 and 1.0 differ), so two specs with one key are the same spec to every rule."""
    return kind.encode() + b"\0" + _memo_encoder.encode(spec)


def _remembered(key: bytes, check: Callable[[ErrorList], None]) -> tuple[FieldError, ...]:
    """The errors ``check`` finds in the spec whose :func:`_spec_key` is ``key``, found once per distinct
    spec (least recently used out). FieldErrors are immutable, so sharing is safe."""

    def found() -> tuple[FieldError, ...]:
        errs = ErrorList()
        check(errs)
        return tuple(errs.as_list())

    return _memo.get(key, found)
