"""A Sweep's results, pure: rows in index order, the cost of a million units (exact), the best cells, CSV."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_schema import Sweep, decode, encode
from nodus_schema.quantities import usd_to_micros
from nodus_schema.results import (
    BY_COST,
    BY_THROUGHPUT,
    LEADING_COLUMNS,
    TRAILING_COLUMNS,
    SweepResults,
    best_cells,
    cost_per_million_units,
    csv_columns,
    results_csv,
    results_of,
)


def sweep(cells: list[dict[str, Any]], **status: Any) -> Sweep:
    raw = {
        "metadata": {"name": "lr", "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"], "BATCH": ["32", "64"]}},
            "template": {"spec": {"image": "busybox", "resources": {"gpu": "H100:1"}}},
        },
        "status": {"cells": cells, **status},
    }
    decoded = decode(raw, Sweep)
    assert decoded.value is not None, decoded.errors
    return decoded.value


def cell(index: int, **more: Any) -> dict[str, Any]:
    return {"index": index, "repetition": 0, "params": {"LR": "0.1", "BATCH": "32"}, **more}


DONE = {"phase": "Succeeded"}


# ---------------------------------------------------------------------------------------------------------
# The cost of a million units
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cost", "rate", "wall", "expected"),
    [
        ("0.42", "812.5", 60, "8.615385"),  # 8.6153846…: half up at the micro-dollar
        ("1.00", "1000000", 1, "1.00"),  # exactly a million units for a dollar
        ("0.000001", "1", 1, "1.00"),
        ("3", "3", 1, "1000000.00"),
        ("1", "3", 1, "333333.333333"),  # 333333.3333…: down
        ("2", "3", 1, "666666.666667"),  # 666666.6666…: up
        ("0.00", "500", 10, "0.00"),  # free work is defined, and free
        ("0.01", "1000000000", 3600, "0.00"),  # below half a micro-dollar: rounds to zero
        ("12345.678901", "0.5", 7, "3527336828.857143"),  # 3527336828.857142857…: up
        ("0.000001", "128", 1, "0.007813"),  # exactly 0.0078125: half up (half even would say 0.007812)
    ],
)
def test_cost_per_million_units_is_exact(cost: str, rate: str, wall: int, expected: str) -> None:
    assert cost_per_million_units(cost, rate, wall) == expected


@pytest.mark.parametrize(
    ("cost", "rate", "wall"),
    [
        (None, "10", 10),
        ("1.00", None, 10),
        ("1.00", "10", None),
        ("1.00", "10", 0),  # no time, no work
        ("1.00", "0", 10),  # no throughput, no work
        ("1.00", "0.000", 10),
        ("abc", "10", 10),  # what cannot be read shows as missing, never as a guess
        ("1.00", "1e3", 10),  # an exponent is not a decimal string on this API
        ("1.00", "-5", 10),
    ],
)
def test_cost_per_million_units_is_null_where_undefined(
    cost: str | None, rate: str | None, wall: int | None
) -> None:
    assert cost_per_million_units(cost, rate, wall) is None


@given(
    cost_micros=st.integers(min_value=0, max_value=10**12),
    rate=st.decimals(min_value=Decimal("0.001"), max_value=Decimal(10**9), places=3),
    wall=st.integers(min_value=1, max_value=10**7),
)
def test_cost_per_million_units_is_within_half_a_micro_dollar(
    cost_micros: int, rate: Decimal, wall: int
) -> None:
    cost = f"{cost_micros // 10**6}.{cost_micros % 10**6:06d}"
    text = cost_per_million_units(cost, str(rate), wall)
    assert text is not None
    exact = Decimal(cost_micros) / (rate * wall)  # µ$ per unit = $ per million units
    # The result is a canonical USD string within half a micro-dollar of the exact value.
    assert abs(usd_to_micros(text) - exact * 10**6) <= Decimal("0.5")


# ---------------------------------------------------------------------------------------------------------
# Rows and the best cells
# ---------------------------------------------------------------------------------------------------------


def test_rows_are_in_index_order_with_every_key() -> None:
    s = sweep(
        [
            cell(2, **DONE, costUSD="0.31", unitsPerSecond="300", wallSeconds=120, object="lr-2"),
            cell(0, **DONE, costUSD="0.42", unitsPerSecond="812.5", wallSeconds=60, object="lr-0"),
            cell(1, phase="Running", object="lr-1"),
            cell(3),
        ],
        best={"byCost": 2, "byThroughput": 0},
        phase="Running",
        cost={"totalUSD": "0.73"},
    )
    res = results_of(s)
    assert [c.index for c in res.cells] == [0, 1, 2, 3]
    assert res.metadata.name == "lr" and res.metadata.namespace == "team-a" and res.metadata.uid == "u-1"
    assert (res.phase, res.total_usd, res.params) == ("Running", "0.73", ["BATCH", "LR"])
    first = msgspec.to_builtins(res.cells[0])
    assert first == {
        "index": 0,
        "repetition": 0,
        "object": "lr-0",
        # The matrix does not sweep GPUs: the template's request, in string form.
        "gpu": "H100:1",
        "region": None,
        "params": {"LR": "0.1", "BATCH": "32"},
        "phase": "Succeeded",
        "wallSeconds": 60,
        "unitsPerSecond": "812.5",
        "costUSD": "0.42",
        "costPerMillionUnits": "8.615385",
        "best": [BY_THROUGHPUT],
    }
    assert res.cells[2].best == [BY_COST]
    # A cell before its Job exists is Pending, with nothing measured.
    pending = res.cells[3]
    assert (pending.phase, pending.object, pending.cost_per_million_units, pending.best) == (
        "Pending",
        None,
        None,
        [],
    )
    by_cost, by_throughput = best_cells(res)
    assert by_cost is res.cells[2] and by_throughput is res.cells[0]


def test_one_cell_can_be_best_both_ways() -> None:
    s = sweep(
        [cell(0, **DONE, costUSD="1", unitsPerSecond="1", wallSeconds=1)],
        best={"byCost": 0, "byThroughput": 0},
    )
    res = results_of(s)
    assert res.cells[0].best == [BY_COST, BY_THROUGHPUT]
    assert best_cells(res) == (res.cells[0], res.cells[0])


def test_best_is_the_controllers_word_and_an_unknown_index_is_dropped() -> None:
    cells = [
        cell(0, **DONE, costUSD="0.10", unitsPerSecond="5", wallSeconds=10),
        cell(1, **DONE, costUSD="0.05", unitsPerSecond="9", wallSeconds=10),
    ]
    # No best written yet: none, even though cell 1 would be best both ways (no second guessing).
    res = results_of(sweep(cells))
    assert res.best.by_cost is None and res.best.by_throughput is None
    assert best_cells(res) == (None, None) and all(c.best == [] for c in res.cells)
    # An index that names no cell (a status from before a change) marks nothing.
    res = results_of(sweep(cells, best={"byCost": 7, "byThroughput": 1}))
    assert (res.best.by_cost, res.best.by_throughput) == (None, 1)
    assert best_cells(res) == (None, res.cells[1])


def test_the_cells_gpu_and_region_win_over_the_template() -> None:
    s = sweep([cell(0, gpu="A100:2", region="eu-west")])
    row = results_of(s).cells[0]
    assert (row.gpu, row.region) == ("A100:2", "eu-west")


def test_json_is_camel_case_with_every_key_and_round_trips() -> None:
    res = results_of(sweep([cell(0, phase="Failed", costUSD="0.02")]))
    data = msgspec.json.decode(encode(res))
    assert list(data) == [
        "apiVersion",
        "kind",
        "metadata",
        "phase",
        "reason",
        "totalUSD",
        "params",
        "best",
        "cells",
    ]
    assert data["kind"] == "SweepResults" and data["best"] == {"byCost": None, "byThroughput": None}
    assert set(data["cells"][0]) == {
        "index",
        "repetition",
        "object",
        "gpu",
        "region",
        "params",
        "phase",
        "wallSeconds",
        "unitsPerSecond",
        "costUSD",
        "costPerMillionUnits",
        "best",
    }
    assert msgspec.json.decode(encode(res), type=SweepResults) == res


# ---------------------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------------------


def test_csv_has_a_column_per_param_sorted_and_empty_for_missing() -> None:
    s = sweep(
        [
            cell(0, **DONE, costUSD="0.42", unitsPerSecond="812.5", wallSeconds=60, object="lr-0"),
            # A parameter only one cell has is a column too; another cell leaves it empty.
            {"index": 1, "repetition": 1, "params": {"LR": "0.01", "A_FIRST": "x,y"}, "phase": "Failed"},
        ],
        best={"byCost": 0, "byThroughput": 0},
    )
    res = results_of(s)
    assert csv_columns(res) == [*LEADING_COLUMNS, "A_FIRST", "BATCH", "LR", *TRAILING_COLUMNS]
    text = results_csv(res)
    assert text.endswith("\r\n") and text.count("\r\n") == 3
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == [
        "index",
        "repetition",
        "object",
        "gpu",
        "region",
        "A_FIRST",
        "BATCH",
        "LR",
        "phase",
        "wallSeconds",
        "unitsPerSecond",
        "costUSD",
        "costPerMillionUnits",
        "best",
    ]
    assert rows[1] == [
        "0",
        "0",
        "lr-0",
        "H100:1",
        "",
        "",
        "32",
        "0.1",
        "Succeeded",
        "60",
        "812.5",
        "0.42",
        "8.615385",
        "byCost;byThroughput",
    ]
    # A value with a comma is quoted, not split; what is missing is empty (never "None" or "-").
    assert rows[2] == ["1", "1", "", "H100:1", "", "x,y", "", "0.01", "Failed", "", "", "", "", ""]
    assert '"x,y"' in text and "None" not in text


def test_csv_of_no_cells_is_the_header_alone() -> None:
    text = results_csv(results_of(sweep([])))
    assert text == ",".join([*LEADING_COLUMNS, "BATCH", "LR", *TRAILING_COLUMNS]) + "\r\n"


def test_csv_money_is_the_decimal_string_as_written() -> None:
    s = sweep([cell(0, **DONE, costUSD="0.100000", unitsPerSecond="0.5", wallSeconds=3)])
    rows = list(csv.reader(io.StringIO(results_csv(results_of(s)))))
    # 0.1 / 1.5 × 1e6 = 66666.666…; money is never printed through a float (no 0.30000000000000004).
    assert rows[1][TRAILING_COLUMNS.index("costUSD") - len(TRAILING_COLUMNS)] == "0.100000"
    assert rows[1][-2] == "66666.666667"
