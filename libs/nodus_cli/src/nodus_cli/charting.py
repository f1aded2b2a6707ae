"""A Sweep's cost-versus-throughput chart as a PNG, in pure Python: no plotting library, no new dependency.

One dot per succeeded cell with a cost and a throughput: x is the cell's cost (USD), y its units per
second, so the cells worth having sit top left. The best cell by cost gets a ring and the best cell by
throughput a cross (the same cell may get both), each labelled with its index; the axes carry their
minimum and maximum values as tick labels, and a title line and a legend sit above the plot.

Three small parts do it:

* :class:`Canvas`, an RGB raster with the few shapes a scatter plot needs;
* a 5×7 bitmap font (:data:`FONT`): digits, capital letters and the punctuation money and names use,
  drawn twice the size; lower case prints as capitals;
* :func:`encode_png`, a PNG encoder (signature, IHDR, one zlib IDAT, IEND; 8-bit RGB, filter 0 on every
  row) with ``zlib`` and ``struct`` from the standard library.

Positions are computed with :class:`~fractions.Fraction` from the API's decimal strings and rounded half
up to whole pixels: no float anywhere, so the same results give the same bytes on every machine with the
same zlib (the chunks carry no time and no text).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Final

from nodus_schema.quantities import format_usd, parse_decimal, parse_usd
from nodus_schema.results import SUCCEEDED, ResultCell, SweepResults, best_cells

Color = tuple[int, int, int]

WIDTH: Final = 800
HEIGHT: Final = 500
BACKGROUND: Final[Color] = (255, 255, 255)
INK: Final[Color] = (33, 37, 41)
"""Axes, tick labels and the title."""
FRAME: Final[Color] = (206, 212, 218)
DOT: Final[Color] = (52, 101, 164)
"""A succeeded cell."""
RING: Final[Color] = (0, 140, 70)
"""The best cell by cost."""
CROSS: Final[Color] = (204, 0, 0)
"""The best cell by throughput."""

DOT_RADIUS: Final = 4
RING_INNER: Final = 8
RING_OUTER: Final = 10
"""The ring covers the pixels from RING_INNER to RING_OUTER away from the cell's centre."""
CROSS_ARM: Final = 9
"""A diagonal cross through the cell's centre, this many pixels each way, three pixels thick."""

SCALE: Final = 2
"""Each font pixel is SCALE × SCALE pixels."""
GLYPH_W: Final = 5
GLYPH_H: Final = 7
ADVANCE: Final = (GLYPH_W + 1) * SCALE
TEXT_H: Final = GLYPH_H * SCALE

# The plot area (the axes' box) and the margin inside it, so that the extreme cells are not on an axis.
PLOT_LEFT: Final = 150
PLOT_RIGHT: Final = WIDTH - 40
PLOT_TOP: Final = 90
PLOT_BOTTOM: Final = HEIGHT - 70
INSET: Final = 20

PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"

# ---------------------------------------------------------------------------------------------------------
# The font: 7 rows of 5 pixels per glyph, '#' on, '.' off
# ---------------------------------------------------------------------------------------------------------

_GLYPHS: Final[dict[str, str]] = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "D": "###.. #..#. #...# #...# #...# #..#. ###..",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.",
    "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.",
    "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    " ": "..... ..... ..... ..... ..... ..... .....",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... .##.. ..#.. .#...",
    "-": "..... ..... ..... ##### ..... ..... .....",
    "_": "..... ..... ..... ..... ..... ..... #####",
    "$": "..#.. .#### #.#.. .###. ..#.# ####. ..#..",
    "#": ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#.",
    "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "=": "..... ..... ##### ..... ##### ..... .....",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##",
    "<": "...#. ..#.. .#... #.... .#... ..#.. ...#.",
    ">": ".#... ..#.. ...#. ....# ...#. ..#.. .#...",
    "'": "..#.. ..#.. .#... ..... ..... ..... .....",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}


def _bitmap(rows: str) -> tuple[tuple[int, int], ...]:
    """The lit (column, row) pixels of a glyph."""
    lines = rows.split()
    if len(lines) != GLYPH_H or any(len(line) != GLYPH_W for line in lines):
        raise ValueError(f"a glyph is {GLYPH_H} rows of {GLYPH_W} pixels: {rows!r}")
    return tuple((x, y) for y, line in enumerate(lines) for x, c in enumerate(line) if c == "#")


FONT: Final = {ch: _bitmap(rows) for ch, rows in _GLYPHS.items()}
"""Each glyph's lit pixels; a character without a glyph prints as '?'."""


def text_width(text: str) -> int:
    return max(0, len(text) * ADVANCE - SCALE)


# ---------------------------------------------------------------------------------------------------------
# The raster
# ---------------------------------------------------------------------------------------------------------


class Canvas:
    """An RGB raster, row by row from the top left; drawing outside it is clipped, never an error."""

    def __init__(self, width: int, height: int, background: Color = BACKGROUND) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = (y * self.width + x) * 3
            self.pixels[at : at + 3] = bytes(color)

    def get(self, x: int, y: int) -> Color:
        at = (y * self.width + x) * 3
        r, g, b = self.pixels[at : at + 3]
        return r, g, b

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the pixels from (x0, y0) to (x1, y1), both included."""
        for y in range(y0, y1 + 1):
            for x in range(x0, x1 + 1):
                self.set(x, y, color)

    def disc(self, cx: int, cy: int, radius: int, color: Color) -> None:
        self._annulus(cx, cy, 0, radius, color)

    def ring(self, cx: int, cy: int, inner: int, outer: int, color: Color) -> None:
        self._annulus(cx, cy, inner, outer, color)

    def _annulus(self, cx: int, cy: int, inner: int, outer: int, color: Color) -> None:
        # Whole numbers only: a pixel is in when inner² <= dx² + dy² <= outer².
        for dy in range(-outer, outer + 1):
            for dx in range(-outer, outer + 1):
                if inner * inner <= dx * dx + dy * dy <= outer * outer:
                    self.set(cx + dx, cy + dy, color)

    def cross(self, cx: int, cy: int, arm: int, color: Color) -> None:
        """A diagonal cross (×) through (cx, cy), three pixels thick."""
        for k in range(-arm, arm + 1):
            for t in (-1, 0, 1):
                self.set(cx + k + t, cy + k, color)
                self.set(cx + k + t, cy - k, color)

    def text(self, x: int, y: int, text: str, color: Color) -> None:
        """``text`` with its top left at (x, y), in capitals."""
        for i, ch in enumerate(text.upper()):
            left = x + i * ADVANCE
            for gx, gy in FONT.get(ch, FONT["?"]):
                self.rect(
                    left + gx * SCALE,
                    y + gy * SCALE,
                    left + gx * SCALE + SCALE - 1,
                    y + gy * SCALE + SCALE - 1,
                    color,
                )


# ---------------------------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------------------------


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (``width × height × 3`` bytes, rows from the top)."""
    stride = width * 3
    if len(rgb) != stride * height:
        raise ValueError(f"{width}x{height} RGB needs {stride * height} bytes, not {len(rgb)}")
    # Filter type 0 (none) before every row: the simplest valid stream; zlib does the compressing.
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, truecolour, no interlace
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------------------
# The chart
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """A cell on the chart: its values, and its centre in pixels."""

    cell: ResultCell
    cost: Decimal
    units_per_second: Decimal
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis: the smallest and largest value on it, and their labels."""

    low: Decimal
    high: Decimal
    low_label: str
    high_label: str


@dataclass(frozen=True, slots=True)
class Layout:
    """Where everything goes; :func:`render` draws it. Tests read it to know which pixels to look at."""

    points: tuple[Point, ...]
    x_axis: Axis | None
    y_axis: Axis | None
    by_cost: Point | None
    by_throughput: Point | None

    def point(self, index: int) -> Point | None:
        return next((p for p in self.points if p.cell.index == index), None)


def _values(cell: ResultCell) -> tuple[Decimal, Decimal] | None:
    """(cost, units per second) of a succeeded cell that has both; None for any other cell."""
    if cell.phase != SUCCEEDED or cell.cost_usd is None or cell.units_per_second is None:
        return None
    try:
        return parse_usd(cell.cost_usd), parse_decimal(cell.units_per_second, what="unitsPerSecond")
    except ValueError:
        return None


def _to_pixel(value: Decimal, low: Decimal, high: Decimal, span: int) -> int:
    """``value``'s offset along an axis ``span`` pixels long, rounded half up; the middle when the axis
    has a single value."""
    if high == low:
        return span // 2
    share = (Fraction(value) - Fraction(low)) * span / (Fraction(high) - Fraction(low))
    return (2 * share.numerator + share.denominator) // (2 * share.denominator)


def _axis(values: Sequence[Decimal], label: Callable[[Decimal], str]) -> Axis:
    low, high = min(values), max(values)
    return Axis(low, high, label(low), label(high))


def _plain(value: Decimal) -> str:
    """A decimal as digits without trailing zeros (``812.50`` → ``812.5``), never in exponent form."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _usd_label(amount: Decimal) -> str:
    return "$" + format_usd(amount)  # as the API spells money: "$0.90", not "$0.9"


def layout(results: SweepResults) -> Layout:
    """The chart's points (succeeded cells with a cost and a throughput) in pixels, and its axes."""
    measured = [(c, v) for c in results.cells if (v := _values(c)) is not None]
    if not measured:
        return Layout((), None, None, None, None)
    x_axis = _axis([cost for _, (cost, _) in measured], _usd_label)
    y_axis = _axis([ups for _, (_, ups) in measured], _plain)
    width = PLOT_RIGHT - PLOT_LEFT - 2 * INSET
    height = PLOT_BOTTOM - PLOT_TOP - 2 * INSET
    points = tuple(
        Point(
            cell,
            cost,
            ups,
            PLOT_LEFT + INSET + _to_pixel(cost, x_axis.low, x_axis.high, width),
            PLOT_BOTTOM - INSET - _to_pixel(ups, y_axis.low, y_axis.high, height),
        )
        for cell, (cost, ups) in measured
    )
    by_cost, by_throughput = best_cells(results)
    on_chart = {p.cell.index: p for p in points}
    return Layout(
        points,
        x_axis,
        y_axis,
        on_chart.get(by_cost.index) if by_cost else None,
        on_chart.get(by_throughput.index) if by_throughput else None,
    )


def _title(results: SweepResults, plotted: int) -> str:
    name = results.metadata.name or "?"
    text = f"SWEEP {name}: COST VS THROUGHPUT, {plotted} SUCCEEDED CELL{'S' if plotted != 1 else ''}"
    limit = (WIDTH - 20) // ADVANCE
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _draw_axes(canvas: Canvas, chart: Layout) -> None:
    canvas.rect(PLOT_LEFT, PLOT_TOP, PLOT_RIGHT, PLOT_TOP, FRAME)
    canvas.rect(PLOT_RIGHT, PLOT_TOP, PLOT_RIGHT, PLOT_BOTTOM, FRAME)
    canvas.rect(PLOT_LEFT, PLOT_BOTTOM, PLOT_RIGHT, PLOT_BOTTOM + 1, INK)
    canvas.rect(PLOT_LEFT - 1, PLOT_TOP, PLOT_LEFT, PLOT_BOTTOM + 1, INK)
    title = "COST (USD)"
    canvas.text((PLOT_LEFT + PLOT_RIGHT - text_width(title)) // 2, HEIGHT - 24, title, INK)
    canvas.text(PLOT_LEFT - 40, PLOT_TOP - 26, "UNITS/S", INK)
    _x_ticks(canvas, chart)
    _y_ticks(canvas, chart)


def _x_ticks(canvas: Canvas, chart: Layout) -> None:
    if chart.x_axis is None or not chart.points:
        return
    lo = min(chart.points, key=lambda p: (p.cost, p.cell.index))
    hi = max(chart.points, key=lambda p: (p.cost, -p.cell.index))
    ticks = [(lo.x, chart.x_axis.low_label, 0)]
    if hi.x != lo.x:
        room = (text_width(chart.x_axis.low_label) + text_width(chart.x_axis.high_label)) // 2 + ADVANCE
        ticks.append((hi.x, chart.x_axis.high_label, 0 if hi.x - lo.x >= room else 1))
    for x, label, row in ticks:
        canvas.rect(x, PLOT_BOTTOM + 2, x, PLOT_BOTTOM + 7, INK)
        left = min(max(x - text_width(label) // 2, 2), WIDTH - 2 - text_width(label))
        # Two labels too close to sit side by side: the high one goes a line lower.
        canvas.text(left, PLOT_BOTTOM + 12 + row * (TEXT_H + 4), label, INK)


def _y_ticks(canvas: Canvas, chart: Layout) -> None:
    if chart.y_axis is None or not chart.points:
        return
    lo = min(chart.points, key=lambda p: (p.units_per_second, p.cell.index))
    hi = max(chart.points, key=lambda p: (p.units_per_second, -p.cell.index))
    ticks = [(lo.y, lo.y, chart.y_axis.low_label)]
    if hi.y != lo.y:
        # Two labels closer than a line: the high one moves up until they no longer touch.
        ticks.append((hi.y, min(hi.y, lo.y - TEXT_H - 4), chart.y_axis.high_label))
    for y, text_y, label in ticks:
        canvas.rect(PLOT_LEFT - 7, y, PLOT_LEFT - 2, y, INK)
        # Right-aligned against the tick; a label too long for the margin is cut on the left edge.
        canvas.text(PLOT_LEFT - 12 - text_width(label), text_y - TEXT_H // 2, label, INK)


def _label(canvas: Canvas, point: Point, color: Color, row: int) -> None:
    """``#<index>`` beside a marked cell: above right, or above left near the right edge; the second
    label of a cell marked twice goes one line lower."""
    text = f"#{point.cell.index}"
    x = point.x + RING_OUTER + 4
    if x + text_width(text) > WIDTH - 2:
        x = point.x - RING_OUTER - 4 - text_width(text)
    y = point.y - RING_OUTER - TEXT_H + row * (TEXT_H + 4)
    canvas.text(x, y, text, color)


def _legend(canvas: Canvas, chart: Layout) -> None:
    x, y = 16, 44
    entries: list[tuple[str, Color, Point | None]] = [
        ("BEST BY COST", RING, chart.by_cost),
        ("BEST BY THROUGHPUT", CROSS, chart.by_throughput),
    ]
    for name, color, point in entries:
        text = f"{name} {'#' + str(point.cell.index) if point else '-'}"
        cx, cy = x + RING_OUTER, y + TEXT_H // 2
        if color == RING:
            canvas.ring(cx, cy, RING_INNER, RING_OUTER, color)
        else:
            canvas.cross(cx, cy, CROSS_ARM - 2, color)
        canvas.text(x + 2 * RING_OUTER + 8, y, text, color)
        x += 2 * RING_OUTER + 8 + text_width(text) + 32


def _draw_points(canvas: Canvas, chart: Layout) -> None:
    # Dots first, then the marks over them, then the labels: a mark is never hidden by another cell's dot.
    for p in chart.points:
        canvas.disc(p.x, p.y, DOT_RADIUS, DOT)
    if chart.by_cost is not None:
        canvas.ring(chart.by_cost.x, chart.by_cost.y, RING_INNER, RING_OUTER, RING)
    if chart.by_throughput is not None:
        canvas.cross(chart.by_throughput.x, chart.by_throughput.y, CROSS_ARM, CROSS)
    if chart.by_cost is not None:
        _label(canvas, chart.by_cost, RING, 0)
    if chart.by_throughput is not None:
        same = chart.by_cost is not None and chart.by_cost.cell.index == chart.by_throughput.cell.index
        _label(canvas, chart.by_throughput, CROSS, 1 if same else 0)


def draw(results: SweepResults) -> tuple[Canvas, Layout]:
    """The chart on a canvas, and the layout it was drawn from."""
    chart = layout(results)
    canvas = Canvas(WIDTH, HEIGHT)
    canvas.text(16, 16, _title(results, len(chart.points)), INK)
    _legend(canvas, chart)
    _draw_axes(canvas, chart)
    if chart.points:
        _draw_points(canvas, chart)
    else:
        message = "NO SUCCEEDED CELL WITH A COST AND A THROUGHPUT YET"
        mid_x, mid_y = (PLOT_LEFT + PLOT_RIGHT) // 2, (PLOT_TOP + PLOT_BOTTOM) // 2
        canvas.text(mid_x - text_width(message) // 2, mid_y - TEXT_H // 2, message, INK)
    return canvas, chart


def render(results: SweepResults) -> bytes:
    """The chart as PNG bytes: the same results give the same bytes."""
    canvas, _ = draw(results)
    return encode_png(canvas.width, canvas.height, bytes(canvas.pixels))


def plotted(results: SweepResults) -> int:
    """How many cells the chart shows."""
    return len(layout(results).points)
