"""The Sweep resource: a Job template fanned out over a matrix of GPUs, regions and parameters.

Sweep fans a Job template out over a matrix of GPUs, regions and parameters, and reports cost, wall time
and throughput per cell. Parameters reach a Job as NODUS_PARAM_<NAME>. Cell order: gpu values, then
regions, then params (names sorted, values as given), repetition innermost; cell ``i`` is the Job
``<sweep>-<i>``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema.costs import Cost, Estimate
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import JobSpec
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
