"""The Sweep resource: a Job template fanned out over a matrix of GPUs, regions and parameters.

Sweep fans a Job template out over a matrix of GPUs, regions and parameters, and reports cost, wall time
and throughput per cell. Parameters reach a Job as NODUS_PARAM_<NAME>. Cell order: gpu values, then
regions, then params (names sorted, values as given), repetition innermost; cell ``i`` is the Job
``<sweep>-<i>``.

A Sweep is stored as one KV value, status and all, so its size is bounded (ADR-0025):
:func:`widest_cells_bytes` is what ``status.cells`` can take once every cell has reported, computed from the
matrix alone; validation refuses a Sweep that would not fit the bus's message limit at its widest.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from nodus_schema.costs import Cost, Estimate
from nodus_schema.gpus import GPURequest, parse_gpu
from nodus_schema.jobs import PHASES, JobSpec
from nodus_schema.meta import Condition, ListMeta, ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "CELL_LABEL",
    "SWEEP_LABEL",
    "Sweep",
    "SweepBest",
    "SweepCell",
    "SweepList",
    "SweepMatrix",
    "SweepSpec",
    "SweepStatus",
    "SweepTemplate",
    "cell_gpu_text",
    "count_cells",
    "widest_cells_bytes",
]

SWEEP_LABEL: Final = "nodus.dev/sweep"
"""Label on every cell Job: the Sweep's name."""
CELL_LABEL: Final = "nodus.dev/cell"
"""Label on every cell Job: the cell index, as a decimal string."""


class SweepMatrix(Wire):
    """SweepMatrix lists the values of each swept dimension. An empty dimension keeps the template's value."""

    gpu: list[GPURequest | str] = msgspec.field(default_factory=list)
    """Overrides resources.gpu per cell, at most 16 values, objects or the "H100:1" form."""
    params: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """Maps an env var name (upper case, digits, underscores) to its values; cells get NODUS_PARAM_<NAME>."""
    regions: list[str] = msgspec.field(default_factory=list)
    """Narrows placement.regions to one region per cell; it may narrow, never widen, the template's."""


class SweepTemplate(Wire):
    """SweepTemplate is the object every cell creates."""

    kind: str | None = None
    """The cell kind: Job."""
    spec: JobSpec = msgspec.field(default_factory=JobSpec)


class SweepSpec(Wire):
    """SweepSpec describes a Sweep. Everything is immutable after create except maxParallel, maxCostUSD
    (raise only) and state."""

    matrix: SweepMatrix = msgspec.field(default_factory=SweepMatrix)
    max_cost_usd: str | None = msgspec.field(default=None, name="maxCostUSD")
    """One cap shared by every cell. Reaching it suspends every running cell with MaxCostReached."""
    max_parallel: int | None = None
    """How many cells may run at once, 1 to 256; the default is 4."""
    repetitions: int | None = None
    """Runs every combination this many times, 1 to 64; the default is 1."""
    state: str | None = None
    """Running (the default), Suspended or Cancelled. It propagates to the cells."""
    template: SweepTemplate = msgspec.field(default_factory=SweepTemplate)


class SweepBest(Wire):
    """SweepBest points at the best succeeded cells, by index (0 is a valid index and is written)."""

    by_cost: int | None = None
    """The index of the cheapest succeeded cell."""
    by_throughput: int | None = None
    """The index of the succeeded cell with the most units per second."""


class SweepCell(Wire):
    """SweepCell is one cell of the matrix and what it measured.

    ``index`` and ``repetition`` are required (no default) so that 0 is always on the wire.
    """

    index: int
    """The cell's position; the cell Job is named <sweep>-<index>."""
    repetition: int
    """Counts from 0."""
    cost_usd: str | None = msgspec.field(default=None, name="costUSD")
    """What the cell has cost."""
    gpu: str | None = None
    """The cell's GPU request in string form, when the matrix sweeps GPUs."""
    object: str | None = None
    """The cell Job's name."""
    params: dict[str, str] = msgspec.field(default_factory=dict)
    phase: str | None = None
    """The cell Job's phase; Pending before the Job exists."""
    region: str | None = None
    """The cell's region, when the matrix sweeps regions."""
    units_per_second: str | None = None
    """The throughput the program reported, as a decimal string."""
    wall_seconds: int | None = None
    """The cell's wall time from start to completion."""
    lost_gpu_seconds: int | None = msgspec.field(default=None, name="lostGPUSeconds")
    """A Nodus extension: GPU-seconds of work the cell lost with its capacity (its Job's
    status.recovery.lostGPUSeconds); absent when nothing was lost."""
    recovery_usd: str | None = msgspec.field(default=None, name="recoveryUSD")
    """A Nodus extension: what recovering from those losses cost (status.recovery.recoveryUSD)."""


class SweepStatus(Wire):
    """SweepStatus is what Nodus observed about a Sweep (written by the sweep controller)."""

    best: SweepBest | None = None
    cells: list[SweepCell] = msgspec.field(default_factory=list)
    """One entry per cell, in index order."""
    completion_time: str | None = None
    """When the Sweep reached a terminal phase."""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    cost: Cost | None = None
    estimate: Estimate | None = None
    message: str | None = None
    """Explains the phase in a sentence."""
    observed_generation: int | None = None
    phase: str | None = None
    """The lifecycle phase, from the run-to-completion vocabulary (PHASES)."""
    reason: str | None = None
    """The machine-readable reason for the phase, for example CellsFailed or MaxCostReached."""
    start_time: str | None = None
    """When the first cell Job was created."""


class Sweep(Wire):
    """Sweep fans a Job template out over a matrix and reports cost, wall time and throughput per cell."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Sweep")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: SweepSpec = msgspec.field(default_factory=SweepSpec)
    status: SweepStatus = msgspec.field(default_factory=SweepStatus)


class SweepList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Sweeps, as GET .../sweeps returns."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "SweepList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Sweep] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# What a cell row shows, and how large status.cells can get
# ---------------------------------------------------------------------------------------------------------


_DEFAULT_INTERCONNECT: Final = "Any"  # defaulting.DEFAULT_GPU_INTERCONNECT (defaulting imports this module)


def cell_gpu_text(req: GPURequest) -> str:
    """A cell's GPU as ``status.cells[].gpu`` shows it: the string form with its count (``"H100:8"``).

    What has no string form follows in parentheses (``"H100:8 (exact, interconnect NVLink)"``), so two
    matrix values that differ only there never read alike in the cells or in the results table. The
    defaults (not exact, interconnect Any) are left out: a value that spells them out asks for the same."""
    extras = ["exact"] if req.exact else []
    if req.interconnect not in (None, _DEFAULT_INTERCONNECT):
        extras.append(f"interconnect {req.interconnect}")
    if req.min_memory is not None:
        extras.append(f"minMemory {req.min_memory}")
    text = f"{','.join(req.type)}:{req.count or 1}"
    return f"{text} ({', '.join(extras)})" if extras else text


def count_cells(spec: SweepSpec) -> int:
    """How many cell Jobs the matrix expands to (an empty dimension counts once, as it keeps the template's
    value); a parameter without values counts once too (it is an error reported on its own)."""
    m = spec.matrix
    dims = [len(m.gpu), len(m.regions), *(len(v) for v in m.params.values()), spec.repetitions or 1]
    return math.prod(max(d, 1) for d in dims)


# The widest values the sweep controller copies into a row from a cell Job, which the matrix does not fix:
WIDEST_OBJECT: Final = 63
"""A cell Job's name is a Job name, a DNS label of at most 63 characters."""
WIDEST_COST_USD: Final = "9999999999.999999"
"""Ten billion dollars to the micro-dollar: no cell costs more."""
WIDEST_UNITS_PER_SECOND: Final = 40
"""The scheduler writes a Job's throughput as a normalised Decimal of 28 significant digits at most
(``0.000001234567890123456789012345678`` or ``1.234567890123456789012345678E+30``: 35 characters)."""
WIDEST_WALL_SECONDS: Final = 10**12 - 1
"""Thirty thousand years."""

_json = msgspec.json.Encoder()


def _json_len(value: object) -> int:
    return len(_json.encode(value))


def _row_gpu_text(value: GPURequest | str) -> str:
    """The row's text for a matrix GPU value; a string that does not parse (refused on its own) as written."""
    if isinstance(value, GPURequest):
        return cell_gpu_text(value)
    try:
        return cell_gpu_text(parse_gpu(value))
    except ValueError:
        return value


def _digits_total(n: int) -> int:
    """How many digits the numbers 0 .. n-1 take together."""
    total, width, start = 0, 1, 0
    while start < n:
        end = min(n, 10**width)
        total += (end - start) * width
        start, width = end, width + 1
    return total


def widest_cells_bytes(spec: SweepSpec) -> int:
    """The bytes of ``status.cells`` (the JSON list) once every cell has reported its widest values.

    Exact for the matrix's part (the gpu, region and params of every cell, the index and repetition digits)
    and the widest values above for the rest, without expanding the matrix: every value of a dimension
    appears in ``cells / len(dimension)`` rows. A field after the first adds ``,"name":value`` to a row."""
    m, reps = spec.matrix, max(spec.repetitions or 1, 1)  # as count_cells counts them
    n = count_cells(spec)
    bare = SweepCell(
        index=0,
        repetition=0,
        cost_usd=WIDEST_COST_USD,
        object="x" * WIDEST_OBJECT,
        phase=max(PHASES, key=len),
        units_per_second="9" * WIDEST_UNITS_PER_SECOND,
        wall_seconds=WIDEST_WALL_SECONDS,
        lost_gpu_seconds=WIDEST_WALL_SECONDS,
        recovery_usd=WIDEST_COST_USD,
    )
    # One digit each of index and repetition is in the bare row; the rest of their digits come on top.
    total = n * _json_len(bare) + (_digits_total(n) - n) + (n // reps) * (_digits_total(reps) - reps)
    if m.gpu:
        texts = [_row_gpu_text(g) for g in m.gpu]
        total += (n // len(m.gpu)) * sum(len(b',"gpu":') + _json_len(t) for t in texts)
    if m.regions:
        total += (n // len(m.regions)) * sum(len(b',"region":') + _json_len(r) for r in m.regions)
    swept = {name: values for name, values in m.params.items() if values}
    if swept:
        # ,"params":{} once, a comma between entries, and "NAME":"value" for each of the cell's params.
        total += n * (len(b',"params":{}') + len(swept) - 1)
        for name, values in swept.items():
            total += (n // len(values)) * sum(_json_len(name) + 1 + _json_len(v) for v in values)
    return total + 2 + (n - 1)  # the brackets and the commas between rows
