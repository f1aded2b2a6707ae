"""A Sweep's results as people use them: one row per cell, the best cells, the cost of a million units, CSV.

Pure: no I/O, no floats. The sweep controller writes ``status.cells`` and ``status.best`` (ADR-0007);
this module only reads them, so the gateway (``GET .../sweeps/{name}/results``) and the CLI
(``nodus sweep results``) answer the same rows and the same CSV from the same Sweep:

* :func:`results_of` turns a Sweep into :class:`SweepResults`: every cell in index order with every
  key present, the derived ``costPerMillionUnits``, and which cells are best (``best`` on the cell and
  ``best.byCost`` / ``best.byThroughput`` on the results);
* :func:`results_csv` writes them as CSV: fixed columns around one column per parameter name (sorted),
  money as decimal strings, an empty cell where a value is missing.

``costPerMillionUnits`` = ``costUSD`` / (``unitsPerSecond`` × ``wallSeconds``) × 1,000,000: what a
million units of work cost on that cell, the number that compares cells of different speed and price. It
is computed exactly with :class:`~decimal.Decimal` and rounded half up to the micro-dollar (the smallest
amount the ledger knows), so it reads like every other USD string. It is null where it is not defined:
a cost or a throughput not reported (yet), a wall time of zero, or a throughput of zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation, localcontext
from typing import Final

import msgspec

from nodus_schema.gpus import GPURequest, format_gpu, has_string_form
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import MICROS_PER_USD, micros_to_usd, parse_decimal, parse_usd
from nodus_schema.sweeps import Sweep, SweepCell
from nodus_schema.wire import API_VERSION, Wire, csv_text

__all__ = [
    "BY_COST",
    "BY_THROUGHPUT",
    "LEADING_COLUMNS",
    "SUCCEEDED",
    "TRAILING_COLUMNS",
    "ResultCell",
    "ResultsBest",
    "SweepResults",
    "best_cells",
    "cost_per_million_units",
    "csv_columns",
    "csv_rows",
    "results_csv",
    "results_of",
]

BY_COST: Final = "byCost"
"""The mark of the cheapest succeeded cell (``status.best.byCost``)."""
BY_THROUGHPUT: Final = "byThroughput"
"""The mark of the succeeded cell with the most units per second (``status.best.byThroughput``)."""
SUCCEEDED: Final = "Succeeded"

LEADING_COLUMNS: Final = ("index", "repetition", "object", "gpu", "region")
"""The CSV's columns before the parameter columns (the JSON cell's keys)."""
TRAILING_COLUMNS: Final = (
    "phase",
    "wallSeconds",
    "unitsPerSecond",
    "costUSD",
    "costPerMillionUnits",
    "best",
)
"""The CSV's columns after the parameter columns; ``best`` lists the cell's marks, ``;``-separated."""

_MILLION: Final = 1_000_000
_MICRO: Final = Decimal(1).scaleb(-6)
# Wide enough that no division of the inputs the wire allows (64-character decimals) is cut short before
# the one rounding, to the micro-dollar, that is meant.
_WIDE: Final = Context(prec=200)


class ResultCell(Wire, omit_defaults=False):
    """One cell of a Sweep as its results show it: every key present, null where nothing was measured."""

    index: int
    """The cell's position; the cell Job is named <sweep>-<index>."""
    repetition: int
    """Counts from 0."""
    object: str | None = None
    """The cell Job's name; null before the Job exists."""
    gpu: str | None = None
    """The cell's GPU request in string form: the matrix's value, else the template's."""
    region: str | None = None
    """The cell's region, when the matrix sweeps regions."""
    params: dict[str, str] = msgspec.field(default_factory=dict)
    """The cell's parameter values (NODUS_PARAM_<NAME>)."""
    phase: str = "Pending"
    """The cell Job's phase; Pending before the Job exists."""
    wall_seconds: int | None = None
    """The cell's wall time from start to completion."""
    units_per_second: str | None = None
    """The throughput the program reported, as a decimal string."""
    cost_usd: str | None = msgspec.field(default=None, name="costUSD")
    """What the cell has cost, a decimal USD string."""
    cost_per_million_units: str | None = None
    """costUSD / (unitsPerSecond × wallSeconds) × 1,000,000, in USD rounded half up to the micro-dollar;
    null where any of them is missing or the work done is zero."""
    best: list[str] = msgspec.field(default_factory=list)
    """byCost and/or byThroughput when the cell is the best by that measure; empty otherwise."""


class ResultsBest(Wire, omit_defaults=False):
    """The indexes of the best succeeded cells; null while no cell qualifies."""

    by_cost: int | None = None
    """The index of the cheapest succeeded cell."""
    by_throughput: int | None = None
    """The index of the succeeded cell with the most units per second."""


class SweepResults(Wire, omit_defaults=False):
    """A Sweep's results (read-only): one row per cell in index order, and its best cells."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "SweepResults")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    """The Sweep's name, namespace (project) and uid."""
    phase: str | None = None
    """The Sweep's phase."""
    reason: str | None = None
    """The machine-readable reason for the phase, for example CellsFailed or MaxCostReached."""
    total_usd: str | None = msgspec.field(default=None, name="totalUSD")
    """What the whole Sweep has cost so far (status.cost.totalUSD)."""
    params: list[str] = msgspec.field(default_factory=list)
    """The parameter names, sorted: the CSV has one column for each, in this order."""
    best: ResultsBest = msgspec.field(default_factory=ResultsBest)
    cells: list[ResultCell] = msgspec.field(default_factory=list)
    """One entry per cell, in index order."""


# ---------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------


def cost_per_million_units(
    cost_usd: str | None, units_per_second: str | None, wall: int | None
) -> str | None:
    """What a million units cost on a cell, as a USD string rounded half up to the micro-dollar; None where
    undefined (a value missing or unreadable, or no work done)."""
    if cost_usd is None or units_per_second is None or wall is None or wall <= 0:
        return None
    try:
        cost = parse_usd(cost_usd)
        rate = parse_decimal(units_per_second, what="unitsPerSecond")
    except ValueError:
        # Written by the controller from what programs report: a value it could not read shows as missing.
        return None
    with localcontext(_WIDE):
        units = rate * wall
        if units <= 0:
            return None
        try:
            per_million = (cost * _MILLION / units).quantize(_MICRO, rounding=ROUND_HALF_UP)
        except InvalidOperation:  # beyond any real cost: not a number anyone could use
            return None
        return micros_to_usd(int(per_million * MICROS_PER_USD))


def _gpu_text(gpu: GPURequest | str | None) -> str | None:
    """The template's GPU request as one string (what the CLI's tables print for it)."""
    if gpu is None or isinstance(gpu, str):
        return gpu
    if has_string_form(gpu):
        return format_gpu(gpu)
    return ",".join(gpu.type) + f":{gpu.count or 1}" if gpu.type else None


def _template_gpu(sweep: Sweep) -> str | None:
    resources = sweep.spec.template.spec.resources
    return _gpu_text(resources.gpu) if resources else None


def _marks(index: int, by_cost: int | None, by_throughput: int | None) -> list[str]:
    marks = [BY_COST] if index == by_cost else []
    return [*marks, BY_THROUGHPUT] if index == by_throughput else marks


def _row(cell: SweepCell, template_gpu: str | None, best: ResultsBest) -> ResultCell:
    return ResultCell(
        index=cell.index,
        repetition=cell.repetition,
        object=cell.object,
        gpu=cell.gpu or template_gpu,
        region=cell.region,
        params=dict(cell.params),
        phase=cell.phase or "Pending",
        wall_seconds=cell.wall_seconds,
        units_per_second=cell.units_per_second,
        cost_usd=cell.cost_usd,
        cost_per_million_units=cost_per_million_units(
            cell.cost_usd, cell.units_per_second, cell.wall_seconds
        ),
        best=_marks(cell.index, best.by_cost, best.by_throughput),
    )


def _best(sweep: Sweep, indexes: set[int]) -> ResultsBest:
    """status.best as the controller wrote it, less an index that names no cell (never a guess of ours:
    the rules of "best", ties included, are the controller's)."""
    best = sweep.status.best
    if best is None:
        return ResultsBest()
    return ResultsBest(
        by_cost=best.by_cost if best.by_cost in indexes else None,
        by_throughput=best.by_throughput if best.by_throughput in indexes else None,
    )


def _param_names(sweep: Sweep) -> list[str]:
    """The matrix's parameter names and any a cell carries, sorted (a column even before any cell)."""
    names = set(sweep.spec.matrix.params)
    for cell in sweep.status.cells:
        names.update(cell.params)
    return sorted(names)


def results_of(sweep: Sweep) -> SweepResults:
    """The Sweep's results: every cell in index order, its cost per million units, and the best cells."""
    cells = sorted(sweep.status.cells, key=lambda c: c.index)
    best = _best(sweep, {c.index for c in cells})
    template_gpu = _template_gpu(sweep)
    meta = sweep.metadata
    cost = sweep.status.cost
    return SweepResults(
        metadata=ObjectMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid),
        phase=sweep.status.phase,
        reason=sweep.status.reason,
        total_usd=cost.total_usd if cost else None,
        params=_param_names(sweep),
        best=best,
        cells=[_row(c, template_gpu, best) for c in cells],
    )


def best_cells(results: SweepResults) -> tuple[ResultCell | None, ResultCell | None]:
    """The (by cost, by throughput) best cells of the results; None where there is none."""
    by_index = {c.index: c for c in results.cells}
    best = results.best
    return (
        by_index.get(best.by_cost) if best.by_cost is not None else None,
        by_index.get(best.by_throughput) if best.by_throughput is not None else None,
    )


# ---------------------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------------------


def csv_columns(results: SweepResults) -> list[str]:
    """The header: the leading columns, one column per parameter name (sorted), the trailing columns.

    Parameter names are upper case (the matrix's rule), so they never collide with the camelCase columns.
    """
    return [*LEADING_COLUMNS, *sorted(results.params), *TRAILING_COLUMNS]


def _text(value: str | int | None) -> str:
    return "" if value is None else str(value)


def _csv_row(cell: ResultCell, params: Sequence[str]) -> list[str]:
    return [
        str(cell.index),
        str(cell.repetition),
        _text(cell.object),
        _text(cell.gpu),
        _text(cell.region),
        *(cell.params.get(name, "") for name in params),
        cell.phase,
        _text(cell.wall_seconds),
        _text(cell.units_per_second),
        _text(cell.cost_usd),
        _text(cell.cost_per_million_units),
        ";".join(cell.best),
    ]


def csv_rows(results: SweepResults) -> list[list[str]]:
    """The CSV's rows without the header, one per cell in index order."""
    params = sorted(results.params)
    return [_csv_row(c, params) for c in results.cells]


def results_csv(results: SweepResults) -> str:
    """The results as CSV: the header of :func:`csv_columns`, then one row per cell in index order."""
    return csv_text(csv_columns(results), csv_rows(results))
