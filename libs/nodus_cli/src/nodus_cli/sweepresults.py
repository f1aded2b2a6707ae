"""``nodus sweep results NAME``: a Sweep's cells as a table with the best ones marked, and as CSV and a chart.

One request (``GET .../sweeps/NAME/results``, JSON) answers everything: the table, ``-o json`` (the
server's JSON as it came), ``-o csv`` and ``--csv FILE`` (the CSV written by
:func:`nodus_schema.results.results_csv`, the function the gateway's ``?format=csv`` uses, so the bytes are
the same) and ``--chart FILE.png`` (:mod:`nodus_cli.charting`). What is printed goes to stdout; a note per
file written goes to stderr, so ``-o json`` or ``-o csv`` stay clean in a pipe.

Exit codes as the other commands: 0 when everything asked for was printed and written, 1 when the server
refused (its Status printed with the fix) or a file could not be written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from nodus_cli import charting
from nodus_cli.client import ApiError, Client
from nodus_cli.config import Config
from nodus_cli.reporting import status_text
from nodus_cli.tables import NONE, phase_text, table, usd, wall
from nodus_schema.results import (
    BY_COST,
    BY_THROUGHPUT,
    SUCCEEDED,
    ResultCell,
    SweepResults,
    best_cells,
    results_csv,
)

OUTPUTS: Final = ("table", "json", "csv")
MARKS: Final = {BY_COST: "cost", BY_THROUGHPUT: "throughput"}
"""How the BEST column names a cell's marks."""


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------


def _header(res: SweepResults) -> str:
    succeeded = sum(1 for c in res.cells if c.phase == SUCCEEDED)
    return (
        f"Results of Sweep {res.metadata.name}  {phase_text(res.phase, res.reason)}  "
        f"{succeeded}/{len(res.cells)} cells succeeded  spent {usd(res.total_usd)}"
    )


def _row(cell: ResultCell, params: list[str]) -> list[str]:
    return [
        str(cell.index),
        cell.gpu or NONE,
        cell.region or NONE,
        *(cell.params.get(name) or NONE for name in params),
        str(cell.repetition),
        cell.phase,
        wall(cell.wall_seconds),
        cell.units_per_second or NONE,
        usd(cell.cost_usd),
        usd(cell.cost_per_million_units),
        ", ".join(MARKS.get(m, m) for m in cell.best),
    ]


def _best_line(what: str, cell: ResultCell | None) -> str:
    if cell is None:
        return f"best by {what}: {NONE} (no succeeded cell has reported it yet)"
    rate = f"{cell.units_per_second} units/s" if cell.units_per_second else f"{NONE} units/s"
    per_million = (
        f", {usd(cell.cost_per_million_units)} per million units" if cell.cost_per_million_units else ""
    )
    job = cell.object or f"cell {cell.index}"
    return f"best by {what}: #{cell.index} ({job}) {usd(cell.cost_usd)}, {rate}{per_million}"


def results_view(res: SweepResults) -> str:
    """The header, one row per cell (its parameters as columns, the best cells marked), the best cells."""
    if not res.cells:
        return f"{_header(res)}\n\nno cells yet: the sweep controller has not listed the cells of the matrix"
    params = sorted(res.params)
    headers = [
        "INDEX",
        "GPU",
        "REGION",
        *params,
        "REP",
        "PHASE",
        "WALL",
        "UNITS/S",
        "COST",
        "$/M UNITS",
        "BEST",
    ]
    by_cost, by_throughput = best_cells(res)
    lines = [_best_line("cost", by_cost), _best_line("throughput", by_throughput)]
    return "\n".join([_header(res), "", table(headers, [_row(c, params) for c in res.cells]), "", *lines])


# ---------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------


def _write(path: str, data: bytes) -> bool:
    try:
        Path(path).write_bytes(data)
    except OSError as e:
        _err(f"error: cannot write {path}: {e.strerror or e}")
        _err("fix: pick a path in a directory that exists and that you may write to.")
        return False
    return True


def _chart_note(res: SweepResults, path: str) -> str:
    chart = charting.layout(res)
    marks = []
    if chart.by_cost is not None:
        marks.append(f"best by cost #{chart.by_cost.cell.index} ringed")
    if chart.by_throughput is not None:
        marks.append(f"best by throughput #{chart.by_throughput.cell.index} crossed")
    detail = f"; {', '.join(marks)}" if marks else ""
    return f"wrote the chart of {len(chart.points)} succeeded cell(s) to {path}{detail}"


def _print(raw: dict[str, Any], res: SweepResults, output: str, csv_text: str) -> None:
    if output == "json":
        _out(json.dumps(raw, indent=2))
    elif output == "csv":
        sys.stdout.write(csv_text)
        sys.stdout.flush()
    else:
        _out(results_view(res))


def results(
    client: Client,
    config: Config,
    name: str,
    *,
    output: str = "table",
    csv_path: str | None = None,
    chart_path: str | None = None,
) -> int:
    """Print a Sweep's results (table, JSON or CSV) and write the CSV and the chart where asked."""
    try:
        raw = client.sweep_results(config.namespace, name)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    # Lenient on purpose: fields a newer server adds must not break an older CLI.
    res = msgspec.convert(raw, SweepResults)
    csv_text = results_csv(res)
    _print(raw, res, output, csv_text)
    ok = True
    if csv_path is not None:
        if _write(csv_path, csv_text.encode()):
            _err(f"wrote the results of {len(res.cells)} cell(s) as CSV to {csv_path}")
        else:
            ok = False
    if chart_path is not None:
        if _write(chart_path, charting.render(res)):
            _err(_chart_note(res, chart_path))
        else:
            ok = False
    return 0 if ok else 1
