"""Validation of Sweeps and Jobs: every documented rule, every error at once, each with its field path.

The gateway calls :func:`nodus_schema.defaulting.default_sweep` (or ``default_job``) and then validates the
result. The rules accept both the object as the user sent it and the defaulted one, and both give the same
errors at the same paths: defaulting only rewrites a field into its canonical form when that form is valid
(see ``defaulting.py``), so a bad ``resources.nodes``, ``activeDeadlineSeconds``, GPU string or bare secret
name is still where the user wrote it when these rules run, and the error names that field.

Paths are the wire (camelCase) paths, as Kubernetes reports them: ``spec.template.spec.inputs[2].name``.
Rules that read better as data are tables (enums, path lists, bounds); the rest are short functions, one
per part of the spec, each appending to one :class:`ErrorList`. This module holds the entry points, the
metadata and the Sweep's own rules; the JobSpec's are ``jobrules.py`` and ``jobparts.py``, the small checks
they share ``checks.py``, and the documented ranges ``ranges.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import msgspec

from nodus_schema.billing import Budget
from nodus_schema.checks import (
    DNS_SUBDOMAIN,
    NODUS_MANAGED_PATHS,
    OS_PATHS,
    PSEUDO_FS_PATHS,
    dns_label,
    enum,
    int_range,
    is_object_name,
    max_items,
    pattern,
    unique_at,
    usd,
)
from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.gpus import GPURequest, parse_gpu_parts
from nodus_schema.jobparts import MAX_COMPLETIONS, RESERVED_ENV, RESERVED_OUTPUT_NAME
from nodus_schema.jobrules import (
    ALLOWED_GPU_COUNTS,
    BETA_GANG_NODES,
    MIN_GANG_NODES,
    gpu_count,
    gpu_request_errors,
    total_gpus_topology,
    validate_job_spec,
)
from nodus_schema.jobs import SPEC_STATES, Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_schema.remembering import SPEC_MEMO_SIZE, Memo
from nodus_schema.sweeps import Sweep, SweepMatrix, SweepSpec, SweepStatus, count_cells, widest_cells_bytes
from nodus_schema.wire import API_VERSION

__all__ = [
    "ALLOWED_GPU_COUNTS",
    "BETA_GANG_NODES",
    "BUS_MAX_PAYLOAD",
    "MAX_BUDGET_NAME",
    "MAX_CELLS",
    "MAX_COMPLETIONS",
    "MAX_JOB_NAME",
    "MAX_SWEEP_BYTES",
    "MAX_SWEEP_NAME",
    "MIN_GANG_NODES",
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

MAX_MATRIX_GPUS: Final = 16

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

# Job names are DNS-1123 *labels* (<= 63), not subdomains: a Job's name becomes a label value
# (nodus.dev/sweep, job-name) and gang members' host names, both capped at 63, as the Kubernetes Job's is
# in practice. A Sweep's cells are the Jobs "<sweep>-<index>" with index < MAX_CELLS, so the Sweep name
# leaves room for "-1023": 63 - 5 = 58.
MAX_JOB_NAME: Final = 63
MAX_SWEEP_NAME: Final = MAX_JOB_NAME - len(f"-{MAX_CELLS - 1}")

_PARAM_NAME = re.compile(r"[A-Z0-9_]+")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

# ---------------------------------------------------------------------------------------------------------
# Object metadata
# ---------------------------------------------------------------------------------------------------------


def _qualified_name(errs: ErrorList, path: Path, key: str) -> None:
    """A label or annotation key: an optional DNS subdomain prefix and '/', then a name of <= 63."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or DNS_SUBDOMAIN.fullmatch(prefix) is None):
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
    dns_label(errs, p.child("name"), meta.name, max_name)
    if meta.generate_name is not None:
        # The server appends 5 random characters, as Kubernetes does; the prefix may end in '-'.
        dns_label(errs, p.child("generateName"), meta.generate_name.rstrip("-") or "x", max_name - 5)
    dns_label(errs, p.child("namespace"), meta.namespace)
    _labels(errs, p.child("labels"), meta.labels)
    _annotations(errs, p.child("annotations"), meta.annotations)
    return errs


def _type_meta(errs: ErrorList, api_version: str, kind: str, want_kind: str) -> None:
    if api_version != API_VERSION:
        errs.not_supported("apiVersion", api_version, (API_VERSION,))
    if kind != want_kind:
        errs.not_supported("kind", kind, (want_kind,))


# ---------------------------------------------------------------------------------------------------------
# Job
# ---------------------------------------------------------------------------------------------------------


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
    max_items(errs, path, gpus, MAX_MATRIX_GPUS)
    d = spec.template.spec.distributed
    for i, g in enumerate(gpus):
        gp = path.index(i)
        bad = gpu_request_errors(g, gp)
        errs.extend(bad)
        count = gpu_count(g)
        if bad or count is None or d is None:
            continue
        if d.gpus_per_node is not None and d.gpus_per_node != count:
            errs.invalid(
                gp, _show(g), f"has {count} GPUs per node, but the template's gang has {d.gpus_per_node}"
            )
        total_gpus_topology(errs, gp, d.total_gpus, count)
    unique_at(errs, path, [_gpu_key(g) for g in gpus])


def _show(value: GPURequest | str) -> str:
    return value if isinstance(value, str) else f"{','.join(value.type)}:{value.count or 1}"


def _matrix_params(errs: ErrorList, path: Path, m: SweepMatrix, spec: JobSpec) -> None:
    env_names = {e.name for e in spec.env}
    for name, values in m.params.items():
        pp = path.key(name)
        pattern(
            errs, pp, name, _PARAM_NAME, "upper case letters, digits and '_' (it becomes NODUS_PARAM_<NAME>)"
        )
        if not values:
            errs.required(pp, f"Required value: at least one value for {name}")
        unique_at(errs, pp, values)
        if f"NODUS_PARAM_{name}" in env_names:
            errs.forbidden(pp, f"the template's env already sets NODUS_PARAM_{name}; remove one of them")


def _matrix_regions(errs: ErrorList, path: Path, m: SweepMatrix, spec: JobSpec) -> None:
    """Each cell runs in one matrix region, so a region must be one the template allows: a matrix narrows
    placement.regions, never widens it (a template without regions allows any)."""
    for i, region in enumerate(m.regions):
        dns_label(errs, path.index(i), region)
    unique_at(errs, path, m.regions)
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


def sweep_spec_rules(errs: ErrorList, path: Path, spec: SweepSpec, *, in_pipeline: bool = False) -> None:
    """Every rule of a SweepSpec at ``path`` (a Sweep's spec, or a Pipeline stage's template.sweep)."""
    _sweep_spec(errs, path, spec, in_pipeline=in_pipeline)


def _sweep_spec(errs: ErrorList, path: Path, spec: SweepSpec, *, in_pipeline: bool = False) -> None:
    int_range(errs, path.child("maxParallel"), spec.max_parallel, 1, 256)
    int_range(errs, path.child("repetitions"), spec.repetitions, 1, 64)
    enum(errs, path.child("state"), spec.state, SPEC_STATES)
    usd(errs, path.child("maxCostUSD"), spec.max_cost_usd)
    tp = path.child("template")
    enum(errs, tp.child("kind"), spec.template.kind, ("Job",))
    tspec = spec.template.spec
    if tspec.state not in (None, "Running"):
        errs.forbidden(
            tp.child("spec").child("state"), "cells follow the Sweep's spec.state; leave this unset"
        )
    errs.extend(
        validate_job_spec(
            tspec, tp.child("spec"), gpu_swept=bool(spec.matrix.gpu), in_sweep=True, in_pipeline=in_pipeline
        )
    )
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
    usd(errs, spec.child("monthlyUSD"), budget.spec.monthly_usd)
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
