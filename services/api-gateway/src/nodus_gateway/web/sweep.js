// A Sweep's page: spend against its cap, its cells with the best marked, the cost-versus-throughput chart
// (chart.js); kept current by a watch of the Sweep.

import { getJSON } from "./api.js";
import { chart } from "./chart.js";
import { enc, h, show } from "./dom.js";
import { NONE, TERMINAL, age, usd, wall } from "./format.js";
import { capBar, facts, heading, phaseBadge, showGone, table } from "./widgets.js";
import { watch } from "./watch.js";

export async function sweepPage(namespace, name, signal) {
  const collection = `/namespaces/${enc(namespace)}/sweeps`;
  const sweep = await getJSON(`${collection}/${enc(name)}`, signal);
  showSweep(sweep);
  watch(collection, name, sweep.metadata.resourceVersion, signal, (type, obj) => {
    if (signal.aborted) return;
    if (type === "DELETED") showGone("Sweep", namespace, name);
    else showSweep(obj);
  });
}

function showSweep(sweep) {
  const { metadata, spec = {}, status = {} } = sweep;
  const cells = status.cells || [];
  const count = (phase) => cells.filter((c) => c.phase === phase).length;
  const done = cells.filter((c) => TERMINAL.has(c.phase)).length;
  const cost = status.cost || {};
  show(
    ...heading("Sweep", metadata, status),
    facts([
      ["Cells done", `${done}/${cells.length}`, "cells-done"],
      ["Succeeded", count("Succeeded")],
      ["Failed", count("Failed")],
      ["Running", count("Running")],
      ["Max parallel", spec.maxParallel ?? NONE],
      ["Started", age(status.startTime) === NONE ? NONE : `${age(status.startTime)} ago`],
    ]),
    h("h2", {}, "Spend against the cap"),
    capBar(cost.totalUSD, spec.maxCostUSD ?? cost.limitUSD),
    h("h2", {}, "Cells"),
    table("cells", CELL_COLUMNS, cells.map((c) => cellRow(metadata.namespace, c, status.best || {})), "No cells yet."),
    h("h2", {}, "Cost versus throughput"),
    h("div", { class: "chart-row" }, chart(sweep), bestLines(cells, status.best || {})),
  );
}

function bestLines(cells, best) {
  const byIndex = new Map(cells.map((c) => [c.index, c]));
  const line = (id, what, index, value) => {
    const cell = index === null || index === undefined ? null : byIndex.get(index);
    return h(
      "p",
      { id, "data-index": cell ? String(cell.index) : "" },
      h("strong", {}, `best by ${what}: `),
      cell ? `#${cell.index} (${cell.object || NONE}) ${value(cell)}` : `${NONE} (no succeeded cell has reported it yet)`,
    );
  };
  return h(
    "div",
    { class: "best-lines" },
    line("best-cost", "cost", best.byCost, (c) => usd(c.costUSD)),
    line("best-throughput", "throughput", best.byThroughput, (c) => `${c.unitsPerSecond ?? NONE} units/s`),
  );
}

const CELL_COLUMNS = [
  ["#", "num"], ["Job"], ["GPU"], ["Region"], ["Params"], ["Rep", "num"], ["Phase"], ["Wall", "num"],
  ["Units/s", "num"], ["Cost", "num"], ["Best"],
];

function cellRow(namespace, cell, best) {
  const params = Object.keys(cell.params || {})
    .sort()
    .map((k) => `${k}=${cell.params[k]}`)
    .join(", ");
  const marks = [];
  if (best.byCost === cell.index) marks.push(h("span", { class: "mark best-cost", title: "best by cost" }, "cost"));
  if (best.byThroughput === cell.index) {
    marks.push(h("span", { class: "mark best-throughput", title: "best by throughput" }, "throughput"));
  }
  return h(
    "tr",
    { "data-index": cell.index, "data-phase": cell.phase || "", class: marks.length ? "best" : null },
    h("td", { class: "num" }, cell.index),
    h("td", {}, cell.object ? h("a", { href: `#/jobs/${enc(namespace)}/${enc(cell.object)}` }, cell.object) : NONE),
    h("td", {}, cell.gpu || NONE),
    h("td", {}, cell.region || NONE),
    h("td", {}, params || NONE),
    h("td", { class: "num" }, cell.repetition ?? 0),
    h("td", {}, phaseBadge(cell.phase)),
    h("td", { class: "num cell-wall" }, wall(cell.wallSeconds)),
    h("td", { class: "num cell-throughput" }, cell.unitsPerSecond ?? NONE),
    h("td", { class: "num cell-cost" }, usd(cell.costUSD)),
    h("td", { class: "cell-best" }, marks.length ? marks : NONE),
  );
}
