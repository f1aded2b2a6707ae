// A Sweep's cost-versus-throughput chart, as inline SVG (no canvas, no library).

import { append, s } from "./dom.js";
import { NONE, usd } from "./format.js";

// The chart, laid out as the CLI's PNG (nodus_cli/charting.py): x is a cell's cost, y its units per
// second, so the cells worth having sit top left; the best by cost is ringed, the best by throughput
// crossed, each labelled with its index; the axes carry their lowest and highest values.
const CHART = { width: 800, height: 500, left: 150, right: 760, top: 90, bottom: 430, inset: 20 };

function plotted(cells) {
  return cells
    .filter((c) => c.phase === "Succeeded" && c.costUSD != null && c.unitsPerSecond != null)
    .map((c) => ({ cell: c, cost: Number(c.costUSD), rate: Number(c.unitsPerSecond) }))
    .filter((p) => Number.isFinite(p.cost) && Number.isFinite(p.rate));
}

function offset(value, low, high, span) {
  return high === low ? span / 2 : ((value - low) * span) / (high - low);
}

function extremes(points, key) {
  const sorted = [...points].sort((a, b) => a[key] - b[key] || a.cell.index - b.cell.index);
  return [sorted[0], sorted[sorted.length - 1]];
}

export function chart(sweep) {
  const { width, height, left, right, top, bottom, inset } = CHART;
  const cells = (sweep.status && sweep.status.cells) || [];
  const best = (sweep.status && sweep.status.best) || {};
  const points = plotted(cells);
  const svg = s("svg", {
    class: "chart",
    id: "chart",
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": "cost versus throughput of the succeeded cells",
    "data-points": points.length,
  });
  const n = points.length;
  append(svg, [
    s("text", { x: 16, y: 28, class: "title" }, `Sweep ${sweep.metadata.name}: cost vs throughput, ${n} succeeded cell${n === 1 ? "" : "s"}`),
    s("rect", { x: left, y: top, width: right - left, height: bottom - top, class: "frame" }),
    s("line", { x1: left, y1: bottom, x2: right, y2: bottom, class: "axis" }),
    s("line", { x1: left, y1: top, x2: left, y2: bottom, class: "axis" }),
    s("text", { x: (left + right) / 2, y: height - 18, "text-anchor": "middle" }, "cost (USD)"),
    s("text", { x: left - 10, y: top - 14, "text-anchor": "end" }, "units/s"),
  ]);
  const byIndex = new Map(points.map((p) => [p.cell.index, p]));
  const ringed = byIndex.get(best.byCost);
  const crossed = byIndex.get(best.byThroughput);
  legend(svg, ringed, crossed);
  if (!n) {
    append(svg, s("text", { x: (left + right) / 2, y: (top + bottom) / 2, "text-anchor": "middle" }, "No succeeded cell with a cost and a throughput yet"));
    return svg;
  }
  const [costLo, costHi] = extremes(points, "cost");
  const [rateLo, rateHi] = extremes(points, "rate");
  for (const p of points) {
    p.x = left + inset + offset(p.cost, costLo.cost, costHi.cost, right - left - 2 * inset);
    p.y = bottom - inset - offset(p.rate, rateLo.rate, rateHi.rate, bottom - top - 2 * inset);
  }
  ticks(svg, costLo, costHi, rateLo, rateHi);
  // Dots first, then the marks over them, then the labels: no mark is hidden by another cell's dot.
  for (const p of points) {
    append(svg, s("circle", { cx: p.x, cy: p.y, r: 4, class: "dot", "data-index": p.cell.index }, s("title", {}, `#${p.cell.index} ${usd(p.cell.costUSD)}, ${p.cell.unitsPerSecond} units/s`)));
  }
  if (ringed) append(svg, s("circle", { cx: ringed.x, cy: ringed.y, r: 9, class: "mark-cost", "data-index": ringed.cell.index }));
  if (crossed) {
    const { x, y } = crossed;
    const d = `M${x - 9} ${y - 9}L${x + 9} ${y + 9}M${x - 9} ${y + 9}L${x + 9} ${y - 9}`;
    append(svg, s("path", { d, class: "mark-throughput", "data-index": crossed.cell.index }));
  }
  if (ringed) label(svg, ringed, "ring", 0);
  if (crossed) label(svg, crossed, "cross", ringed && ringed === crossed ? 1 : 0);
  return svg;
}

function legend(svg, ringed, crossed) {
  const y = 56;
  const costText = `best by cost ${ringed ? `#${ringed.cell.index}` : NONE}`;
  const rateText = `best by throughput ${crossed ? `#${crossed.cell.index}` : NONE}`;
  append(svg, [
    s("circle", { cx: 26, cy: y - 4, r: 8, class: "mark-cost" }),
    s("text", { x: 42, y, class: "ring" }, costText),
    s("path", { d: `M${262} ${y - 11}L${276} ${y + 3}M${262} ${y + 3}L${276} ${y - 11}`, class: "mark-throughput" }),
    s("text", { x: 286, y, class: "cross" }, rateText),
  ]);
}

function ticks(svg, costLo, costHi, rateLo, rateHi) {
  const { left, bottom } = CHART;
  const xTicks = [[costLo.x, usd(costLo.cell.costUSD), 0]];
  if (costHi.x !== costLo.x) xTicks.push([costHi.x, usd(costHi.cell.costUSD), costHi.x - costLo.x < 90 ? 1 : 0]);
  for (const [x, text, row] of xTicks) {
    append(svg, [
      s("line", { x1: x, y1: bottom + 2, x2: x, y2: bottom + 7, class: "axis" }),
      s("text", { x, y: bottom + 22 + row * 16, "text-anchor": "middle", class: "tick-x" }, text),
    ]);
  }
  const yTicks = [[rateLo.y, rateLo.y, rateLo.cell.unitsPerSecond]];
  if (rateHi.y !== rateLo.y) yTicks.push([rateHi.y, Math.min(rateHi.y, rateLo.y - 16), rateHi.cell.unitsPerSecond]);
  for (const [y, textY, text] of yTicks) {
    append(svg, [
      s("line", { x1: left - 7, y1: y, x2: left - 2, y2: y, class: "axis" }),
      s("text", { x: left - 12, y: textY + 4, "text-anchor": "end", class: "tick-y" }, text),
    ]);
  }
}

function label(svg, point, kind, row) {
  const { width } = CHART;
  const text = `#${point.cell.index}`;
  const right = point.x + 14 + text.length * 8 > width - 2;
  append(svg, s("text", {
    x: right ? point.x - 14 : point.x + 14,
    y: point.y - 12 + row * 16,
    "text-anchor": right ? "end" : "start",
    class: kind,
  }, text));
}
