"""A Sweep's cost-versus-throughput chart as a PNG, drawn with matplotlib (ADR-0029).

One point per succeeded cell with a cost and a throughput: x is the cell's cost (USD), y its units per
second, so the cells worth having sit top left. The points are coloured by GPU × region, which the legend
names; the best cell by cost is ringed and the best cell by throughput crossed (the same cell may get
both), each labelled with its index. An axis whose values span more than a decade is logarithmic (a
sweep over GPU types easily spans 50×, and on a linear axis its cheap cells would sit in one corner),
otherwise linear.

:func:`layout` is pure and cheap (which cells, which marks, which scales): the CLI's note on stderr and
the tests read it. :func:`draw` imports matplotlib inside the function: the import takes a second or
more, which ``nodus --help`` and every other command must not pay.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Final, Literal

from nodus_schema.quantities import parse_decimal, parse_usd
from nodus_schema.results import SUCCEEDED, ResultCell, SweepResults, best_cells

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Scale = Literal["linear", "log"]

WIDTH: Final = 800
HEIGHT: Final = 500
DPI: Final = 100
"""The PNG is WIDTH × HEIGHT pixels: a figure of WIDTH/DPI × HEIGHT/DPI inches saved at DPI."""
DECADE: Final = Decimal(10)
"""An axis is logarithmic when its largest value is more than DECADE times its smallest."""

RING: Final = "#008c46"
"""The best cell by cost: a ring around its point."""
CROSS: Final = "#cc0000"
"""The best cell by throughput: a cross over its point."""
GROUP_COLORS: Final = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Matplotlib's tab10 without its green and red, so that no GPU × region looks like a best-cell mark."""

COST_LABEL: Final = "cost (USD)"
THROUGHPUT_LABEL: Final = "throughput (units/s)"
"""The API's throughput is unitsPerSecond: units of whatever the program counts, per second."""
NO_POINTS: Final = "no succeeded cell with a cost and a throughput yet"
TITLE_CHARS: Final = 90
"""A longer title is cut (with "..."): matplotlib does not wrap, and a fixed-size PNG would crop it."""


@dataclass(frozen=True, slots=True)
class Point:
    """A cell on the chart and its values."""

    cell: ResultCell
    cost: Decimal
    units_per_second: Decimal

    @property
    def group(self) -> str:
        return group_of(self.cell)


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis: the smallest and largest value on it, and its scale."""

    low: Decimal
    high: Decimal
    scale: Scale


@dataclass(frozen=True, slots=True)
class Layout:
    """What the chart shows: its points, axes and best cells; :func:`draw` draws it."""

    points: tuple[Point, ...]
    x_axis: Axis | None
    y_axis: Axis | None
    by_cost: Point | None
    by_throughput: Point | None

    def point(self, index: int) -> Point | None:
        return next((p for p in self.points if p.cell.index == index), None)

    @property
    def groups(self) -> tuple[str, ...]:
        """The GPU × region groups in the order of their first cell: a legend in a stable order."""
        return tuple(dict.fromkeys(p.group for p in self.points))


def group_of(cell: ResultCell) -> str:
    """What a cell ran on, as the legend names it: ``H100:1 × eu-west``, or the GPU alone."""
    gpu = cell.gpu or "no GPU"
    return f"{gpu} × {cell.region}" if cell.region else gpu


def _values(cell: ResultCell) -> tuple[Decimal, Decimal] | None:
    """(cost, units per second) of a succeeded cell that has both; None for any other cell."""
    if cell.phase != SUCCEEDED or cell.cost_usd is None or cell.units_per_second is None:
        return None
    try:
        return parse_usd(cell.cost_usd), parse_decimal(cell.units_per_second, what="unitsPerSecond")
    except ValueError:
        return None


def scale_of(values: Sequence[Decimal]) -> Scale:
    """Log when the values span more than a decade (and are all positive: a log axis has no zero)."""
    low, high = min(values), max(values)
    return "log" if low > 0 and high > low * DECADE else "linear"


def _axis(values: Sequence[Decimal]) -> Axis:
    return Axis(min(values), max(values), scale_of(values))


def layout(results: SweepResults) -> Layout:
    """The chart's points (succeeded cells with a cost and a throughput), its axes and its best cells."""
    points = tuple(Point(c, *v) for c in results.cells if (v := _values(c)) is not None)
    if not points:
        return Layout((), None, None, None, None)
    by_cost, by_throughput = best_cells(results)
    on_chart = {p.cell.index: p for p in points}
    return Layout(
        points,
        _axis([p.cost for p in points]),
        _axis([p.units_per_second for p in points]),
        on_chart.get(by_cost.index) if by_cost else None,
        on_chart.get(by_throughput.index) if by_throughput else None,
    )


# ---------------------------------------------------------------------------------------------------------
# Tick labels
# ---------------------------------------------------------------------------------------------------------


def _plain(value: float) -> str:
    """A tick value with thousands separators and at most six decimals, trailing zeros dropped (ticks are
    floats: 0.30000000000000004 prints as 0.3)."""
    text = f"{value:,.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


# Floats here are pixel positions on the chart, never money: matplotlib places marks and asks for tick
# labels in floats. Costs are summed and compared as Decimal strings elsewhere (layout()); only drawing
# converts them, and a tick label is a rounded position, not an amount anyone is charged.
def usd_tick(value: float, _position: int | None = None) -> str:
    """A cost tick as money: ``$0.05``, ``$1.50``, ``$12``, ``$1,000``; sub-cent amounts keep their
    digits (``$0.0025``)."""
    whole, _, cents = _plain(value).partition(".")
    if not cents and abs(value) >= 10:
        return f"${whole}"
    return f"${whole}.{cents.ljust(2, '0')}"


def number_tick(value: float, _position: int | None = None) -> str:
    """A throughput tick: ``812.5``, ``12,000``; never in exponent form."""
    return _plain(value)


# ---------------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------------


def _title(results: SweepResults, plotted: int) -> str:
    name = results.metadata.name or "?"
    text = f"Sweep {name}: cost vs throughput, {plotted} succeeded cell{'s' if plotted != 1 else ''}"
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 3] + "..."


def _scale(ax: Axes, which: Literal["x", "y"], axis: Axis, label: Literal["usd", "number"]) -> None:
    from matplotlib import ticker

    target = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)(axis.scale)
    if axis.scale == "log":
        # 1, 2 and 5 of each decade: a log axis over one or two decades still gets several labels, and
        # the unlabelled minor ticks keep the spacing readable.
        target.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_minor_formatter(ticker.NullFormatter())
    target.set_major_formatter(ticker.FuncFormatter(usd_tick if label == "usd" else number_tick))


def _draw_groups(ax: Axes, chart: Layout) -> None:
    for n, group in enumerate(chart.groups):
        points = [p for p in chart.points if p.group == group]
        ax.scatter(
            [float(p.cost) for p in points],
            [float(p.units_per_second) for p in points],
            s=36,
            color=GROUP_COLORS[n % len(GROUP_COLORS)],
            label=group,
            zorder=2,
        )


def _mark(ax: Axes, point: Point, color: str, row: int) -> None:
    """The ``#index`` label beside a marked cell; the second label of a cell marked twice goes lower."""
    ax.annotate(
        f"#{point.cell.index}",
        (float(point.cost), float(point.units_per_second)),
        xytext=(10, 8 - 14 * row),
        textcoords="offset points",
        color=color,
        fontweight="bold",
        zorder=5,
    )


def _draw_best(ax: Axes, chart: Layout) -> None:
    # The marks go over every cell's point (zorder), so another cell never hides them.
    if (cheap := chart.by_cost) is not None:
        xy = ([float(cheap.cost)], [float(cheap.units_per_second)])
        label = f"best by cost: #{cheap.cell.index}"
        ax.scatter(*xy, s=300, facecolors="none", edgecolors=RING, linewidths=2, label=label, zorder=3)
        _mark(ax, cheap, RING, 0)
    if (fast := chart.by_throughput) is not None:
        xy = ([float(fast.cost)], [float(fast.units_per_second)])
        label = f"best by throughput: #{fast.cell.index}"
        ax.scatter(*xy, s=220, marker="x", color=CROSS, linewidths=2.5, label=label, zorder=4)
        _mark(ax, fast, CROSS, 1 if fast is cheap else 0)


def _draw_empty(ax: Axes) -> None:
    ax.text(0.5, 0.5, NO_POINTS, transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


def _figure(results: SweepResults) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chart = layout(results)
    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="constrained")
    # The figure draws on Agg, in memory, chosen here for this figure: no pyplot, no display, and nothing
    # from MPLBACKEND or the process-wide backend.
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(_title(results, len(chart.points)))
    ax.set_xlabel(COST_LABEL)
    ax.set_ylabel(THROUGHPUT_LABEL)
    if chart.x_axis is None or chart.y_axis is None:
        _draw_empty(ax)
        return fig
    _scale(ax, "x", chart.x_axis, "usd")
    _scale(ax, "y", chart.y_axis, "number")
    ax.grid(True, alpha=0.3)
    _draw_groups(ax, chart)
    _draw_best(ax, chart)
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


def draw(results: SweepResults) -> tuple[Figure, bytes]:
    """The chart: its figure (drawn, so its transforms place the cells) and its PNG bytes."""
    import matplotlib.style

    # Matplotlib's own defaults, whatever a matplotlibrc of the user says: the same chart everywhere.
    with matplotlib.style.context("default"):
        fig = _figure(results)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=DPI)  # no bbox_inches="tight": the size stays WIDTH × HEIGHT
    return fig, out.getvalue()


def render(results: SweepResults) -> bytes:
    """The chart as PNG bytes: the same results give the same bytes (on the same matplotlib)."""
    return draw(results)[1]
