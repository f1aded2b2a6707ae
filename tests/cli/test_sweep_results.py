"""``nodus sweep results`` against a real gateway, and its chart (a PNG made without a plotting library).

The Sweep is created through the gateway; its status is written straight into the ``sweeps`` bucket, as
the sweep controller writes it. The CLI then prints the table (best cells marked), JSON and CSV, and
writes the CSV (the same bytes as the API's ``?format=csv``) and the chart. The chart is checked by
decoding the PNG here: signature, chunk CRCs, IHDR size, and the colours at the best cells' positions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_cli import charting, main
from nodus_cli.sweepresults import results_view
from nodus_kit.storing import ObjectStore
from nodus_schema import Sweep, decode
from nodus_schema.costs import Cost
from nodus_schema.results import SweepResults, results_csv, results_of
from nodus_schema.sweeps import SweepBest, SweepCell, SweepStatus

TOKEN = "cli-test-token-0123456789"  # the gateway_url fixture's admin token (tests/cli/conftest.py)
V1 = "/apis/nodus.dev/v1"
GOLDEN_PIXELS_SHA256 = "7a5d5d6210a4bfc341a41d8e243e327d5e7914e01627800be63825a349b60f97"

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
# A PNG decoder of what the encoder writes (8-bit RGB, filter 0), to check the chart's pixels
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Png:
    width: int
    height: int
    rgb: bytes

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        at = (y * self.width + x) * 3
        r, g, b = self.rgb[at : at + 3]
        return r, g, b


def decode_png(data: bytes) -> Png:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    at, chunks = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        tag, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, f"bad CRC on {tag!r}"
        chunks.append((tag, body))
        at += 12 + length
    tags = [t for t, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND" and b"IDAT" in tags
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    stride = width * 3 + 1
    assert len(raw) == stride * height
    rows = [raw[y * stride : (y + 1) * stride] for y in range(height)]
    assert all(row[0] == 0 for row in rows), "every row is written with filter 0"
    return Png(width, height, b"".join(row[1:] for row in rows))


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


def test_the_chart_marks_the_best_cells_with_a_ring_and_a_cross() -> None:
    res = results()
    png = decode_png(charting.render(res))
    assert (png.width, png.height) == (charting.WIDTH, charting.HEIGHT)
    chart = charting.layout(res)
    # One dot per succeeded cell with a cost and a throughput: the failed cell 1 is not on it.
    assert sorted(p.cell.index for p in chart.points) == [0, 2, 3]
    cheapest, fastest, other = chart.point(2), chart.point(0), chart.point(3)
    assert cheapest is not None and fastest is not None and other is not None
    # x grows with cost and y (downwards in pixels) shrinks with throughput: cheap is left, fast is up.
    assert cheapest.x < fastest.x < other.x and fastest.y < other.y < cheapest.y
    # The cheapest cell: a ring around its dot.
    assert png.pixel(cheapest.x, cheapest.y) == charting.DOT
    for dx, dy in ((9, 0), (-9, 0), (0, 9), (0, -9)):
        assert png.pixel(cheapest.x + dx, cheapest.y + dy) == charting.RING
    # The fastest cell: a cross through it (its centre and its diagonals), no ring.
    for k in (0, 3, -3, 6):
        assert png.pixel(fastest.x + k, fastest.y + k) == charting.CROSS
        assert png.pixel(fastest.x + k, fastest.y - k) == charting.CROSS
    assert png.pixel(fastest.x + 9, fastest.y) != charting.RING
    # Any other cell: a plain dot.
    assert png.pixel(other.x, other.y) == charting.DOT
    assert png.pixel(other.x + 9, other.y) == charting.BACKGROUND
    # Extremes sit inside the axes, not on them.
    assert cheapest.x > charting.PLOT_LEFT and fastest.y > charting.PLOT_TOP
    assert chart.x_axis is not None and (chart.x_axis.low_label, chart.x_axis.high_label) == (
        "$0.31",
        "$0.79",
    )
    assert chart.y_axis is not None and (chart.y_axis.low_label, chart.y_axis.high_label) == ("300", "812.5")


def _ink_in(png: Png, box: tuple[int, int, int, int], color: tuple[int, int, int]) -> int:
    x0, y0, x1, y1 = box
    return sum(1 for y in range(y0, y1) for x in range(x0, x1) if png.pixel(x, y) == color)


def test_the_chart_labels_the_best_cells_with_their_index() -> None:
    res = results()
    png = decode_png(charting.render(res))
    chart = charting.layout(res)
    assert chart.by_cost is not None and chart.by_throughput is not None
    # "#2" in the ring's colour just above right of the cheapest cell, "#0" in the cross's by the fastest.
    for point, color in ((chart.by_cost, charting.RING), (chart.by_throughput, charting.CROSS)):
        x = point.x + charting.RING_OUTER + 4
        y = point.y - charting.RING_OUTER - charting.TEXT_H
        box = (x, y, x + charting.text_width("#0"), y + charting.TEXT_H)
        assert _ink_in(png, box, color) > 20


def test_the_chart_is_the_same_bytes_for_the_same_results() -> None:
    first, second = charting.render(results()), charting.render(results())
    assert first == second
    # The pixels are pinned too: a golden hash of the raster (not of the PNG, whose compressed bytes may
    # differ between zlib builds). A change to the drawing changes it: look at the new chart, then update.
    canvas, _ = charting.draw(results())
    assert decode_png(first).rgb == bytes(canvas.pixels)
    assert hashlib.sha256(bytes(canvas.pixels)).hexdigest() == GOLDEN_PIXELS_SHA256
    # Different results, different pixels.
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
    png = decode_png(charting.render(res))
    point = charting.layout(res).point(0)
    assert point is not None
    # A single value is drawn in the middle of each axis.
    width = charting.PLOT_RIGHT - charting.PLOT_LEFT - 2 * charting.INSET
    assert point.x == charting.PLOT_LEFT + charting.INSET + width // 2
    assert png.pixel(point.x, point.y) == charting.CROSS
    assert png.pixel(point.x + 9, point.y) == charting.RING


def test_a_chart_without_any_measured_cell_still_renders() -> None:
    res = results(SweepStatus(cells=[_cell(0, "H100:1", "0.1", "Running")]))
    png = decode_png(charting.render(res))
    assert (png.width, png.height) == (charting.WIDTH, charting.HEIGHT)
    assert charting.layout(res).points == ()
    assert not any(png.pixel(x, y) in (charting.DOT, charting.RING, charting.CROSS) for x, y in _grid(png))
    # The message is written in the middle of the plot.
    mid = (charting.PLOT_TOP + charting.PLOT_BOTTOM) // 2
    assert _ink_in(png, (charting.PLOT_LEFT, mid - 8, charting.PLOT_RIGHT, mid + 8), charting.INK) > 100


def _grid(png: Png) -> list[tuple[int, int]]:
    """Every pixel of the plot area (the legend above it shows the marks, in their colours, always)."""
    return [
        (x, y)
        for y in range(charting.PLOT_TOP, charting.PLOT_BOTTOM + 1)
        for x in range(charting.PLOT_LEFT, charting.PLOT_RIGHT + 1)
    ]


def test_the_font_has_a_glyph_for_what_the_chart_writes() -> None:
    for text in ("$0123456789.", "SWEEP LR-1: COST VS THROUGHPUT", "UNITS/S (USD) #"):
        assert all(ch in charting.FONT for ch in text)
    with pytest.raises(ValueError, match="7 rows of 5 pixels"):
        charting._bitmap("#### #")


def test_encode_png_refuses_a_raster_of_the_wrong_size() -> None:
    assert decode_png(charting.encode_png(2, 1, bytes([1, 2, 3, 4, 5, 6]))).pixel(1, 0) == (4, 5, 6)
    with pytest.raises(ValueError, match="needs 6 bytes"):
        charting.encode_png(2, 1, b"\x00" * 5)


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
    assert (png.width, png.height) == (charting.WIDTH, charting.HEIGHT)
    chart = charting.layout(res)
    assert chart.by_cost is not None and chart.by_throughput is not None
    assert png.pixel(chart.by_cost.x + charting.RING_OUTER - 1, chart.by_cost.y) == charting.RING
    assert png.pixel(chart.by_throughput.x, chart.by_throughput.y) == charting.CROSS
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
