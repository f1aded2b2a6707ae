"""Rules of a JobSpec: its GPUs, resources and gang, placement, recovery and network, counts and times, and
:func:`validate_job_spec`, which runs every rule of a JobSpec (``jobparts.py`` holds the container, inputs,
outputs and the fields Nodus does not support yet).
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import Final

from nodus_schema.checks import (
    byte_quantity,
    collected_path,
    cpu,
    dns_label,
    duration,
    enum,
    int_range,
    max_items,
    pattern,
    read_duration,
    unique_at,
    usd,
)
from nodus_schema.fielding import ErrorList, Path
from nodus_schema.gpus import GPURequest, parse_gpu_parts
from nodus_schema.jobparts import (
    MAX_COMPLETIONS,
    container,
    inputs,
    not_supported_yet,
    outputs,
    unavailable,
    writers,
)
from nodus_schema.jobparts import volumes as volume_rules
from nodus_schema.jobs import (
    CHECKPOINT_FORMATS,
    CHECKPOINT_INTEGRATIONS,
    CONTINUITIES,
    EGRESS_POLICIES,
    INTERCONNECTS,
    INTERRUPTIBLE,
    LAUNCHERS,
    NETWORKS,
    ON_INTERRUPTION,
    PROFILES,
    SPEC_STATES,
    TRANSPORTS,
    CheckpointPolicy,
    Distributed,
    Egress,
    JobSpec,
    Placement,
    Recovery,
    Resources,
)
from nodus_schema.meta import parse_time
from nodus_schema.quantities import MAX_INT32
from nodus_schema.ranges import MAX_BACKOFF_LIMIT, MAX_MAX_ATTEMPTS, MAX_SCALEDOWN_WINDOW

__all__ = [
    "ALLOWED_GPU_COUNTS",
    "BETA_GANG_NODES",
    "MAX_GANG_NODES",
    "MAX_GPU_TYPES",
    "MAX_PARALLELISM",
    "MIN_GANG_NODES",
    "gpu_count",
    "gpu_request_errors",
    "total_gpus_topology",
    "validate_job_spec",
]

ALLOWED_GPU_COUNTS: Final = (1, 2, 4, 8)
MAX_GPU_TYPES: Final = 8
MIN_GANG_NODES, MAX_GANG_NODES, BETA_GANG_NODES = 2, 16, 8
MIN_TOTAL_GPUS, MAX_TOTAL_GPUS = 2, 64
MAX_CHECKPOINT_PATHS, MAX_EGRESS_ALLOW = 64, 128
MAX_PARALLELISM: Final = 256

_EGRESS_HOST = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GPU_COUNT_HINT = "must be 1, 2, 4 or 8 GPUs per node"
_UNSUPPORTED_INTEGRATIONS: Final = {"HFTrainer": "Nodus does not hook the Hugging Face Trainer's checkpoints"}

# ---------------------------------------------------------------------------------------------------------
# GPUs, resources and gangs
# ---------------------------------------------------------------------------------------------------------


def _gpu_types(errs: ErrorList, path: Path, types: list[str]) -> None:
    if not types:
        errs.required(path, 'Required value: list 1 to 8 accelerator ids or families, such as ["H100"]')
        return
    max_items(errs, path, types, MAX_GPU_TYPES)
    for i, t in enumerate(types):
        pattern(errs, path.index(i), t, _GPU_TYPE, "an accelerator id or family such as 'H100' or 'a100-80g'")
    unique_at(errs, path, types)


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
    enum(errs, p.child("interconnect"), value.interconnect, INTERCONNECTS)
    byte_quantity(errs, p.child("minMemory"), value.min_memory)
    return errs


def gpu_count(value: GPURequest | str | None) -> int | None:
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
    cpu(errs, path.child("cpu"), res.cpu)
    byte_quantity(errs, path.child("memory"), res.memory)
    byte_quantity(errs, path.child("disk"), res.disk)
    if res.gpu is not None:
        errs.extend(gpu_request_errors(res.gpu, path.child("gpu")))
    if res.nodes is not None and res.nodes < 1:
        errs.invalid(path.child("nodes"), res.nodes, "must be at least 1")  # above 1: a gang (_gang)


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
    int_range(errs, path.child("totalGPUs"), d.total_gpus, MIN_TOTAL_GPUS, MAX_TOTAL_GPUS)
    if d.gpus_per_node is not None and d.gpus_per_node not in ALLOWED_GPU_COUNTS:
        errs.invalid(path.child("gpusPerNode"), d.gpus_per_node, _GPU_COUNT_HINT)
    enum(errs, path.child("launcher"), d.launcher, LAUNCHERS)
    enum(errs, path.child("network"), d.network, NETWORKS)
    enum(errs, path.child("transport"), d.transport, TRANSPORTS)
    int_range(errs, path.child("maxAssemblyRetries"), d.max_assembly_retries, 0, 5)
    duration(errs, path.child("startupTimeout"), d.startup_timeout, "5m", "60m")


def total_gpus_topology(errs: ErrorList, path: Path, total: int | None, per_node: int | None) -> None:
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
    count = gpu_count(gpu)
    per_node = d.gpus_per_node if d is not None else None
    if per_node is not None and count is not None and per_node != count:
        errs.invalid(dp.child("gpusPerNode"), per_node, f"must equal spec.resources.gpu.count ({count})")
    if d is not None:
        total_gpus_topology(errs, dp.child("totalGPUs"), d.total_gpus, per_node or count)


# ---------------------------------------------------------------------------------------------------------
# Placement, recovery, network
# ---------------------------------------------------------------------------------------------------------


def _names(errs: ErrorList, path: Path, names: list[str]) -> None:
    for i, n in enumerate(names):
        dns_label(errs, path.index(i), n)
    unique_at(errs, path, names)


def _placement(errs: ErrorList, path: Path, pl: Placement | None) -> None:
    if pl is None:
        return
    if pl.dedicated is False:
        errs.invalid(path.child("dedicated"), False, "only true is accepted; leave it unset otherwise")
    enum(errs, path.child("interruptible"), pl.interruptible, INTERRUPTIBLE)
    enum(errs, path.child("profile"), pl.profile, PROFILES)
    usd(errs, path.child("maxRateUSDPerHour"), pl.max_rate_usd_per_hour)
    _names(errs, path.child("offerings"), pl.offerings)
    dns_label(errs, path.child("pool"), pl.pool)
    duration(errs, path.child("queueTimeout"), pl.queue_timeout)
    _names(errs, path.child("regions"), pl.regions)


def _checkpoint(errs: ErrorList, path: Path, cp: CheckpointPolicy) -> None:
    enum(errs, path.child("format"), cp.format, CHECKPOINT_FORMATS)
    enum(errs, path.child("integration"), cp.integration, CHECKPOINT_INTEGRATIONS)
    if cp.integration in _UNSUPPORTED_INTEGRATIONS:
        not_supported_yet(
            errs,
            path.child("integration"),
            f"integration {cp.integration} is",
            _UNSUPPORTED_INTEGRATIONS[cp.integration],
            "use Auto instead, and have the program save its checkpoints under /nodus/state",
        )
    if cp.interval is not None and cp.interval != "auto":
        duration(errs, path.child("interval"), cp.interval, "1m", "6h")
    byte_quantity(errs, path.child("maxSize"), cp.max_size, hi="2Ti")
    pp = path.child("paths")
    max_items(errs, pp, cp.paths, MAX_CHECKPOINT_PATHS)
    for i, p in enumerate(cp.paths):
        collected_path(errs, pp.index(i), p, "checkpoint paths")
    unique_at(errs, pp, cp.paths)
    duration(errs, path.child("retainAfterFinish"), cp.retain_after_finish)


def _recovery(errs: ErrorList, path: Path, rec: Recovery | None) -> None:
    if rec is None:
        return
    enum(errs, path.child("continuity"), rec.continuity, CONTINUITIES)
    enum(errs, path.child("onInterruption"), rec.on_interruption, ON_INTERRUPTION)
    int_range(errs, path.child("maxAttempts"), rec.max_attempts, 1, MAX_MAX_ATTEMPTS)
    duration(errs, path.child("minProgressDuration"), rec.min_progress_duration)
    if rec.checkpoint is None:
        return
    if rec.continuity is not None and rec.continuity != "Checkpointed":
        errs.forbidden(
            path.child("checkpoint"),
            f"checkpoints are only taken with continuity Checkpointed, not {rec.continuity}",
        )
    _checkpoint(errs, path.child("checkpoint"), rec.checkpoint)


def _egress(errs: ErrorList, path: Path, eg: Egress) -> None:
    enum(errs, path.child("policy"), eg.policy, EGRESS_POLICIES)
    # An unset policy becomes AllowList when allow or presets are given (defaulting), so only a policy the
    # user set to something else conflicts with them.
    listed = eg.policy is None or eg.policy == "AllowList"
    for field, items in (("allow", eg.allow), ("presets", eg.presets)):
        if items and not listed:
            errs.forbidden(path.child(field), f"only with policy AllowList, not {eg.policy}")
    ap = path.child("allow")
    max_items(errs, ap, eg.allow, MAX_EGRESS_ALLOW)
    for i, host in enumerate(eg.allow):
        if len(host) > 253 or _EGRESS_HOST.fullmatch(host) is None:
            errs.invalid(ap.index(i), host, "must be a lower case DNS name or a *.suffix pattern")
    unique_at(errs, ap, eg.allow)
    _names(errs, path.child("presets"), eg.presets)
    if eg.presets:
        not_supported_yet(
            errs,
            path.child("presets"),
            "egress presets are",
            "Nodus has no curated host lists",
            "use policy Deny (no network) or Open instead",
        )
    if listed and (eg.allow or (eg.policy == "AllowList" and not eg.presets)):
        # No runtime filters by DNS name (ADR-0018: the docker runtime cuts the network off or leaves it
        # open), so an allow list would run Open: refused until an egress proxy enforces it. (Presets
        # alone are refused above; defaulting turns them into policy AllowList.)
        not_supported_yet(
            errs,
            ap if eg.allow else path.child("policy"),
            "egress policy AllowList is",
            "no node enforces a list of allowed hosts yet",
            "use policy Deny (no network) or Open instead",
        )


# ---------------------------------------------------------------------------------------------------------
# Counts, times, money
# ---------------------------------------------------------------------------------------------------------


def _timeout_alias(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    ads = spec.active_deadline_seconds
    if ads is None:
        return
    int_range(errs, path.child("activeDeadlineSeconds"), ads, 1)
    if spec.timeout is None or not 1 <= ads <= MAX_INT32:
        return
    timeout = read_duration(spec.timeout)
    if isinstance(timeout, str):
        return  # reported at spec.timeout
    if timeout != timedelta(seconds=ads):
        errs.invalid(
            path.child("activeDeadlineSeconds"),
            ads,
            f"is an alias of timeout and disagrees with spec.timeout {spec.timeout!r}; set only one of them",
        )


def _scaledown_window(errs: ErrorList, path: Path, value: str | None) -> None:
    duration(errs, path, value, "0s", MAX_SCALEDOWN_WINDOW)


def _counts_and_times(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    int_range(errs, path.child("completions"), spec.completions, 1, MAX_COMPLETIONS)
    most = min(spec.completions if spec.completions and spec.completions > 0 else 1, MAX_PARALLELISM)
    if spec.parallelism is not None and not 1 <= spec.parallelism <= most:
        errs.invalid(
            path.child("parallelism"),
            spec.parallelism,
            f"must be between 1 and min(completions, 256) = {most}",
        )
    int_range(errs, path.child("backoffLimit"), spec.backoff_limit, 0, MAX_BACKOFF_LIMIT)
    int_range(errs, path.child("ttlSecondsAfterFinished"), spec.ttl_seconds_after_finished, 0)
    enum(errs, path.child("state"), spec.state, SPEC_STATES)
    duration(errs, path.child("timeout"), spec.timeout, positive=True)
    _timeout_alias(errs, path, spec)
    _scaledown_window(errs, path.child("scaledownWindow"), spec.scaledown_window)
    duration(errs, path.child("expectedDuration"), spec.expected_duration, positive=True)
    if spec.complete_by_time is not None:
        try:
            parse_time(spec.complete_by_time)
        except (ValueError, OverflowError) as e:
            errs.invalid(path.child("completeByTime"), spec.complete_by_time, str(e))
    usd(errs, path.child("maxCostUSD"), spec.max_cost_usd)


# ---------------------------------------------------------------------------------------------------------
# JobSpec
# ---------------------------------------------------------------------------------------------------------


def validate_job_spec(
    spec: JobSpec,
    path: Path | str = "spec",
    *,
    gpu_swept: bool = False,
    in_sweep: bool = False,
    in_pipeline: bool = False,
) -> ErrorList:
    """Every rule of a JobSpec. ``gpu_swept`` is set for a Sweep template whose matrix sets the GPUs: the
    template then needs no GPU request of its own, and the Sweep checks each matrix value against the gang.
    ``in_sweep``: the spec is a Sweep's template (its cells run side by side). ``in_pipeline``: the spec is
    a Pipeline stage's (``fromStage`` inputs allowed)."""
    errs = ErrorList()
    p = path if isinstance(path, Path) else Path(path)
    _counts_and_times(errs, p, spec)
    container(errs, p, spec)
    _resources(errs, p.child("resources"), spec.resources)
    _gang(errs, p, spec, gpu_swept=gpu_swept)
    inputs(errs, p.child("inputs"), spec.inputs, in_pipeline=in_pipeline)
    outputs(errs, p.child("outputs"), spec.outputs)
    volume_rules(errs, p.child("volumes"), spec.volumes)
    writers(errs, p, spec, in_sweep=in_sweep)
    _placement(errs, p.child("placement"), spec.placement)
    _recovery(errs, p.child("recovery"), spec.recovery)
    if spec.network is not None and spec.network.egress is not None:
        _egress(errs, p.child("network").child("egress"), spec.network.egress)
    unavailable(errs, p, spec)
    return errs
