"""``nodus sweep results`` against a real gateway, and its chart (a PNG drawn with matplotlib).

The Sweep is created through the gateway; its status is written straight into the ``sweeps`` bucket, as
the sweep controller writes it. The CLI then prints the table (best cells marked), JSON and CSV, and
writes the CSV (the same bytes as the API's ``?format=csv``) and the chart. The chart is checked as a
user sees it: a PNG that decodes (Pillow) to 800 × 500, its axes' labels and scales, its legend, and the
marks' colours where the best cells are drawn (matplotlib's own transform says where that is).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from matplotlib.figure import Figure
from nats.aio.client import Client as NATS
from PIL import Image

from nodus_cli import charting, main
from nodus_cli.sweepresults import results_view
from nodus_kit.storing import ObjectStore
from nodus_schema import Sweep, decode
from nodus_schema.costs import Cost
from nodus_schema.results import SweepResults, results_csv, results_of
from nodus_schema.sweeps import SweepBest, SweepCell, SweepStatus

TOKEN = "cli-test-token-0123456789"  # the gateway_url fixture's admin token (tests/cli/conftest.py)
V1 = "/apis/nodus.dev/v1"

SWEEP = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Sweep",
    "metadata": {"name": "lr"},
    "spec": {
        "matrix": {"gpu": ["H100:1", "A100:1"], "params": {"LR": ["0.1", "0.01"]}},
        "template": {"spec": {"image": "busybox", "command": ["true"], "resources": {"gpu": "H100:1"}}},
    },
}


def _cell(index: int, gpu: str, lr: str, phase: str, **measured: Any) -> SweepCell:
    return SweepCell(
        index=index, repetition=0, gpu=gpu, params={"LR": lr}, object=f"lr-{index}", phase=phase, **measured
    )


# Cell 2 is the cheapest, cell 0 the fastest, cell 1 failed, cell 3 is in between.
STATUS = SweepStatus(
    phase="Failed",
    reason="CellsFailed",
    best=SweepBest(by_cost=2, by_throughput=0),
    cost=Cost(total_usd="1.55"),
    cells=[
        _cell(0, "H100:1", "0.1", "Succeeded", wall_seconds=60, units_per_second="812.5", cost_usd="0.42"),
        _cell(1, "H100:1", "0.01", "Failed", wall_seconds=5, cost_usd="0.03"),
        _cell(2, "A100:1", "0.1", "Succeeded", wall_seconds=120, units_per_second="300", cost_usd="0.31"),
        _cell(3, "A100:1", "0.01", "Succeeded", wall_seconds=90, units_per_second="500", cost_usd="0.79"),
    ],
)


# ---------------------------------------------------------------------------------------------------------
# The chart, pure
# ---------------------------------------------------------------------------------------------------------


def results(status: SweepStatus = STATUS) -> SweepResults:
    decoded = decode(SWEEP, Sweep)
    assert decoded.value is not None
    sweep = msgspec.structs.replace(decoded.value, status=status)
    return results_of(
        msgspec.structs.replace(sweep, metadata=msgspec.structs.replace(sweep.metadata, name="lr"))
    )


def decode_png(data: bytes) -> Image.Image:
    """The PNG decoded (Pillow checks its chunks' CRCs and its zlib stream), as RGB."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    Image.open(io.BytesIO(data)).verify()
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.convert("RGB")


def rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def pixel_of(fig: Figure, cost: float, units_per_second: float) -> tuple[int, int]:
    """Where a value pair is on the PNG: matplotlib's data-to-display transform (origin bottom left)."""
    x, y = fig.axes[0].transData.transform((cost, units_per_second))
    return round(x), charting.HEIGHT - round(y)


def at(fig: Figure, point: charting.Point | None) -> tuple[int, int]:
    assert point is not None
    return pixel_of(fig, float(point.cost), float(point.units_per_second))


def count_near(png: Image.Image, centre: tuple[int, int], radius: int, color: str) -> int:
    """How many pixels of the square of ``radius`` around ``centre`` are ``color`` (give or take
    anti-aliasing)."""
    want, (cx, cy) = rgb(color), centre
    return sum(
        1
        for y in range(max(cy - radius, 0), min(cy + radius + 1, png.height))
        for x in range(max(cx - radius, 0), min(cx + radius + 1, png.width))
        if all(abs(a - b) <= 24 for a, b in zip(png.getpixel((x, y)), want, strict=True))
    )


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_the_chart_marks_the_best_cells_with_a_ring_and_a_cross() -> None:
    res = results()
    fig, data = charting.draw(res)
    png = decode_png(data)
    assert png.size == (charting.WIDTH, charting.HEIGHT)
    chart = charting.layout(res)
    # One point per succeeded cell with a cost and a throughput: the failed cell 1 is not on it.
    assert sorted(p.cell.index for p in chart.points) == [0, 2, 3]
    cheapest, fastest, other = at(fig, chart.point(2)), at(fig, chart.point(0)), at(fig, chart.point(3))
    # x grows with cost and y (downwards in pixels) shrinks with throughput: cheap is left, fast is up.
    assert cheapest[0] < fastest[0] < other[0] and fastest[1] < other[1] < cheapest[1]
    # The cheapest cell is ringed, the fastest crossed; the other cell has neither mark.
    assert (
        count_near(png, cheapest, 14, charting.RING) > 30
        and count_near(png, cheapest, 14, charting.CROSS) == 0
    )
    assert (
        count_near(png, fastest, 14, charting.CROSS) > 30 and count_near(png, fastest, 14, charting.RING) == 0
    )
    assert count_near(png, other, 14, charting.RING) == count_near(png, other, 14, charting.CROSS) == 0
    # Every point lies inside the axes.
    box = fig.axes[0].get_window_extent()
    assert all(
        box.x0 < x < box.x1 and box.y0 < charting.HEIGHT - y < box.y1 for x, y in (cheapest, fastest, other)
    )
    assert chart.x_axis is not None and (chart.x_axis.low, chart.x_axis.high) == (
        Decimal("0.31"),
        Decimal("0.79"),
    )
    assert chart.y_axis is not None and (chart.y_axis.low, chart.y_axis.high) == (
        Decimal(300),
        Decimal("812.5"),
    )


def test_the_chart_labels_its_axes_with_units_and_its_cells() -> None:
    fig, _ = charting.draw(results())
    ax = fig.axes[0]
    assert ax.get_xlabel() == "cost (USD)" and ax.get_ylabel() == "throughput (units/s)"
    assert ax.get_title() == "Sweep lr: cost vs throughput, 3 succeeded cells"
    # Costs from $0.31 to $0.79 span less than a decade: linear axes, ticks in dollars and cents.
    assert (ax.get_xscale(), ax.get_yscale()) == ("linear", "linear")
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.startswith("$") for t in ticks) and "$0.50" in ticks
    # The legend names each GPU once, then the best cells; each best cell is labelled with its index.
    assert legend_texts(fig) == ["H100:1", "A100:1", "best by cost: #2", "best by throughput: #0"]
    marks = {(t.get_text(), t.get_color()) for t in ax.texts}
    assert marks == {("#2", charting.RING), ("#0", charting.CROSS)}


def test_costs_over_more_than_a_decade_get_a_log_axis() -> None:
    status = SweepStatus(
        best=SweepBest(by_cost=1, by_throughput=0),
        cells=[
            _cell(0, "H100:1", "0.1", "Succeeded", wall_seconds=60, units_per_second="900", cost_usd="4.20"),
            _cell(1, "A100:1", "0.1", "Succeeded", wall_seconds=60, units_per_second="300", cost_usd="0.05"),
            _cell(2, "A100:1", "0.01", "Succeeded", wall_seconds=60, units_per_second="310", cost_usd="0.30"),
        ],
    )
    status = msgspec.structs.replace(
        status, cells=[msgspec.structs.replace(c, region="eu-west") for c in status.cells]
    )
    res = results(status)
    chart = charting.layout(res)
    assert chart.x_axis is not None and chart.x_axis.scale == "log"  # $0.05 to $4.20: 84×
    assert chart.y_axis is not None and chart.y_axis.scale == "linear"  # 300 to 900: 3×
    fig, data = charting.draw(res)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "linear")
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert {"$0.10", "$1.00"} <= set(ticks) and all(t.startswith("$") for t in ticks)
    # Distance is ratio: $0.05 -> $0.30 (6×) takes over half the room of $0.30 -> $4.20 (14×), where a
    # linear axis would give it a fifteenth.
    x0, x1, x2 = (at(fig, chart.point(i))[0] for i in (1, 2, 0))
    assert x0 < x1 < x2 and (x1 - x0) > (x2 - x1) / 2
    assert legend_texts(fig)[:2] == ["H100:1 × eu-west", "A100:1 × eu-west"]
    assert decode_png(data).size == (charting.WIDTH, charting.HEIGHT)


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        (["0.31", "0.79"], "linear"),
        (["1", "10"], "linear"),  # exactly a decade
        (["1", "10.01"], "log"),
        (["0", "50"], "linear"),  # a log axis has no zero
        (["7"], "linear"),
    ],
)
def test_the_scale_rule(values: list[str], scale: str) -> None:
    assert charting.scale_of([Decimal(v) for v in values]) == scale


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.3, "$0.30"),
        (0.30000000000000004, "$0.30"),
        (1.0, "$1.00"),
        (0.0025, "$0.0025"),
        (20.0, "$20"),
        (1500.0, "$1,500"),
        (2.5, "$2.50"),
    ],
)
def test_cost_ticks_read_as_money(value: float, text: str) -> None:
    assert charting.usd_tick(value) == text


def test_the_chart_is_the_same_bytes_for_the_same_results() -> None:
    first, second = charting.render(results()), charting.render(results())
    assert first == second
    # Different results, a different chart.
    other = msgspec.structs.replace(STATUS, best=SweepBest(by_cost=3, by_throughput=0))
    assert charting.render(results(other)) != first


def test_one_cell_best_both_ways_gets_both_marks() -> None:
    status = SweepStatus(
        best=SweepBest(by_cost=0, by_throughput=0),
        cells=[
            _cell(0, "H100:1", "0.1", "Succeeded", wall_seconds=10, units_per_second="5", cost_usd="0.01")
        ],
    )
    res = results(status)
    fig, data = charting.draw(res)
    png = decode_png(data)
    point = at(fig, charting.layout(res).point(0))
    # A single value is drawn in the middle of each axis.
    box = fig.axes[0].get_window_extent()
    assert abs(point[0] - (box.x0 + box.x1) / 2) <= 1
    assert count_near(png, point, 14, charting.CROSS) > 30 and count_near(png, point, 14, charting.RING) > 30
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["#0", "#0"]


def test_a_chart_without_any_measured_cell_still_renders() -> None:
    res = results(SweepStatus(cells=[_cell(0, "H100:1", "0.1", "Running")]))
    fig, data = charting.draw(res)
    png = decode_png(data)
    assert png.size == (charting.WIDTH, charting.HEIGHT)
    assert charting.layout(res).points == ()
    centre = (charting.WIDTH // 2, charting.HEIGHT // 2)
    radius = max(charting.WIDTH, charting.HEIGHT)
    assert (
        count_near(png, centre, radius, charting.RING) == count_near(png, centre, radius, charting.CROSS) == 0
    )
    # The message is written in the middle of the plot; the axes still say what they would show.
    assert [t.get_text() for t in fig.axes[0].texts] == [charting.NO_POINTS]
    assert fig.axes[0].get_xlabel() == "cost (USD)" and fig.legends == []


def test_the_cli_imports_matplotlib_only_to_draw() -> None:
    """``nodus --help`` and every command without ``--chart`` skip matplotlib's import (a second or more)."""
    code = "import sys, nodus_cli.cli, nodus_cli.sweepresults; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_table_marks_the_best_cells() -> None:
    text = results_view(results())
    lines = text.splitlines()
    assert lines[0] == "Results of Sweep lr  Failed (CellsFailed)  3/4 cells succeeded  spent $1.55"
    header = lines[2].split()
    assert header == [
        "INDEX",
        "GPU",
        "REGION",
        "LR",
        "REP",
        "PHASE",
        "WALL",
        "UNITS/S",
        "COST",
        "$/M",
        "UNITS",
        "BEST",
    ]
    rows = {line.split()[0]: line for line in lines[3:7]}
    assert rows["0"].split()[-1] == "throughput" and "$8.615385" in rows["0"]
    assert rows["2"].split()[-1] == "cost" and "$8.611111" in rows["2"]
    assert rows["1"].split()[-1] == "-"  # the $/M UNITS of a failed cell without throughput: undefined
    assert lines[-2] == "best by cost: #2 (lr-2) $0.31, 300 units/s, $8.611111 per million units"
    assert lines[-1] == "best by throughput: #0 (lr-0) $0.42, 812.5 units/s, $8.615385 per million units"


# ---------------------------------------------------------------------------------------------------------
# The command, against a real gateway
# ---------------------------------------------------------------------------------------------------------


class Cli:
    """Runs ``nodus`` in a thread against the test gateway, in one namespace; collects what it printed."""

    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", self.url, "--token", TOKEN, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def nodus(gateway_url: str, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway_url, unique, capsys)


async def api_get(url: str, path: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        return await api.get(path, params=params)


async def finished_sweep(url: str, nc: NATS, namespace: str) -> None:
    """Create the Sweep through the gateway, then write its status as the sweep controller would."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        resp = await api.post(f"{V1}/namespaces/{namespace}/sweeps", json=SWEEP)
        assert resp.status_code == 201, resp.text
    store: ObjectStore[Sweep] = ObjectStore(nc, "sweeps", Sweep)
    await store.mutate(namespace, "lr", lambda s: msgspec.structs.replace(s, status=STATUS))


def results_path(namespace: str) -> str:
    return f"{V1}/namespaces/{namespace}/sweeps/lr/results"


async def test_results_prints_the_table(nodus: Cli, gateway_url: str, nc: NATS, unique: str) -> None:
    await finished_sweep(gateway_url, nc, unique)
    code, out, err = await nodus("sweep", "results", "lr")
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("Results of Sweep lr  Failed (CellsFailed)  3/4 cells succeeded")
    assert lines[2].split()[:4] == ["INDEX", "GPU", "REGION", "LR"]
    assert [line.split()[0] for line in lines[3:7]] == ["0", "1", "2", "3"]
    assert "best by cost: #2 (lr-2) $0.31" in out and "best by throughput: #0 (lr-0)" in out


async def test_results_as_json_and_csv(nodus: Cli, gateway_url: str, nc: NATS, unique: str) -> None:
    await finished_sweep(gateway_url, nc, unique)
    code, out, err = await nodus("sweep", "results", "lr", "-o", "json")
    assert code == 0, err
    api_json = (await api_get(gateway_url, results_path(unique))).json()
    assert json.loads(out) == api_json and api_json["kind"] == "SweepResults"
    code, out, err = await nodus("sweep", "results", "lr", "-o", "csv")
    assert code == 0, err
    api_csv = (await api_get(gateway_url, results_path(unique), format="csv")).text
    # The CLI writes the CSV with the function the gateway uses: the same text, CRLF line ends included.
    assert out == api_csv and out.startswith("index,repetition,object,gpu,region,LR,phase,")


async def test_results_writes_the_csv_and_the_chart(
    nodus: Cli, gateway_url: str, nc: NATS, unique: str, tmp_path: Path
) -> None:
    await finished_sweep(gateway_url, nc, unique)
    csv_file, png_file = tmp_path / "lr.csv", tmp_path / "lr.png"
    code, out, err = await nodus("sweep", "results", "lr", "--csv", str(csv_file), "--chart", str(png_file))
    assert code == 0, err
    assert out.startswith("Results of Sweep lr")  # the table is still printed
    assert f"wrote the results of 4 cell(s) as CSV to {csv_file}" in err
    assert f"wrote the chart of 3 succeeded cell(s) to {png_file}" in err
    assert "best by cost #2 ringed" in err and "best by throughput #0 crossed" in err
    api_csv = (await api_get(gateway_url, results_path(unique), format="csv")).content
    assert csv_file.read_bytes() == api_csv
    res = msgspec.convert((await api_get(gateway_url, results_path(unique))).json(), SweepResults)
    assert results_csv(res).encode() == api_csv
    png = decode_png(png_file.read_bytes())
    assert png.size == (charting.WIDTH, charting.HEIGHT)
    fig, _ = charting.draw(res)
    chart = charting.layout(res)
    assert chart.by_cost is not None and chart.by_throughput is not None
    assert count_near(png, at(fig, chart.by_cost), 14, charting.RING) > 30
    assert count_near(png, at(fig, chart.by_throughput), 14, charting.CROSS) > 30
    assert png_file.read_bytes() == charting.render(res)


async def test_a_missing_sweep_exits_1_with_the_status(nodus: Cli, unique: str, tmp_path: Path) -> None:
    chart = tmp_path / "never.png"
    code, out, err = await nodus("sweep", "results", "nope", "--chart", str(chart))
    assert code == 1 and out == ""
    assert 'error: sweeps.nodus.dev "nope" not found' in err
    assert f"fix: Check the name and the project: `nodus get sweeps -n {unique}`" in err
    assert "docs: https://docs.nodus.dev/errors/NotFound" in err
    assert not chart.exists()


async def test_a_file_that_cannot_be_written_exits_1(
    nodus: Cli, gateway_url: str, nc: NATS, unique: str, tmp_path: Path
) -> None:
    await finished_sweep(gateway_url, nc, unique)
    missing_dir = tmp_path / "no" / "such" / "dir"
    code, out, err = await nodus("sweep", "results", "lr", "-o", "csv", "--chart", str(missing_dir / "x.png"))
    assert code == 1
    assert out.startswith("index,")  # what could be printed was
    assert f"error: cannot write {missing_dir / 'x.png'}" in err and "fix: " in err


async def test_usage_errors_exit_2(nodus: Cli) -> None:
    code, _, err = await nodus("sweep", "results")
    assert code == 2 and "NAME" in err
    code, _, err = await nodus("sweep", "results", "lr", "-o", "yaml")
    assert code == 2 and "invalid choice" in err
