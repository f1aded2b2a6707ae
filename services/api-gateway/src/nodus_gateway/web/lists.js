// The lists: Sweeps, Jobs or Pipelines, in every project the token can read or in one (the project selector).

import { getJSON } from "./api.js";
import { enc, h, show } from "./dom.js";
import { NONE, TERMINAL, age, gpuOf, usd, wall } from "./format.js";
import { stagesDone } from "./stages.js";
import { phaseBadge, table } from "./widgets.js";

const LIST_LIMIT = 500;

const seenNamespaces = new Set();

function namespaceSelector(plural, current) {
  const select = h(
    "select",
    { id: "namespace", "aria-label": "Project" },
    h("option", { value: "" }, "All projects"),
    [...seenNamespaces].sort().map((ns) => h("option", { value: ns, selected: ns === current }, ns)),
  );
  select.addEventListener("change", () => {
    location.hash = select.value ? `#/${plural}/${enc(select.value)}` : `#/${plural}`;
  });
  return h("div", { class: "toolbar" }, h("label", { for: "namespace" }, "Project"), select);
}

export async function listPage(plural, namespace, signal) {
  const path = namespace ? `/namespaces/${enc(namespace)}/${plural}` : `/${plural}`;
  const list = await getJSON(`${path}?limit=${LIST_LIMIT}`, signal);
  const items = list.items || [];
  for (const item of items) seenNamespaces.add(item.metadata.namespace);
  if (namespace) seenNamespaces.add(namespace);
  const { title, columns, row } = LISTS[plural];
  const rows = items.map(row);
  const more = list.metadata && list.metadata.continue;
  show(
    h("h1", {}, title),
    h("p", { class: "sub" }, namespace ? `in project ${namespace}` : "in every project this token can read"),
    namespaceSelector(plural, namespace),
    table(`${plural}-table`, columns, rows, `No ${plural} ${namespace ? "in this project" : "yet"}.`),
    more ? h("p", { class: "hint" }, `The first ${LIST_LIMIT} are shown.`) : null,
  );
}

const SWEEP_COLUMNS = [
  ["Project"], ["Name"], ["Phase"], ["Cells", "num"], ["Spent", "num"], ["Cap", "num"],
  ["Best by cost"], ["Best by throughput"], ["Age"],
];

function sweepRow(sweep) {
  const { metadata, spec = {}, status = {} } = sweep;
  const cells = status.cells || [];
  const done = cells.filter((c) => TERMINAL.has(c.phase)).length;
  const best = status.best || {};
  const mark = (index) => (index === null || index === undefined ? NONE : `#${index}`);
  return h(
    "tr",
    { "data-name": metadata.name, "data-namespace": metadata.namespace },
    h("td", {}, metadata.namespace),
    h("td", {}, h("a", { href: `#/sweeps/${enc(metadata.namespace)}/${enc(metadata.name)}` }, metadata.name)),
    h("td", {}, phaseBadge(status.phase)),
    h("td", { class: "num" }, `${done}/${cells.length}`),
    h("td", { class: "num" }, usd(status.cost && status.cost.totalUSD)),
    h("td", { class: "num" }, usd(spec.maxCostUSD)),
    h("td", {}, mark(best.byCost)),
    h("td", {}, mark(best.byThroughput)),
    h("td", {}, age(metadata.creationTimestamp)),
  );
}

const JOB_COLUMNS = [
  ["Project"], ["Name"], ["Phase"], ["GPU"], ["Done", "num"], ["Attempts", "num"], ["Wall", "num"],
  ["Units/s", "num"], ["Cost", "num"], ["Age"],
];

function jobRow(job) {
  const { metadata, spec = {}, status = {} } = job;
  return h(
    "tr",
    { "data-name": metadata.name, "data-namespace": metadata.namespace },
    h("td", {}, metadata.namespace),
    h("td", {}, h("a", { href: `#/jobs/${enc(metadata.namespace)}/${enc(metadata.name)}` }, metadata.name)),
    h("td", {}, phaseBadge(status.phase)),
    h("td", {}, gpuOf(spec)),
    h("td", { class: "num" }, `${status.succeeded ?? 0}/${spec.completions ?? 1}`),
    h("td", { class: "num" }, status.attempts ?? 0),
    h("td", { class: "num" }, wall(status.wallSeconds)),
    h("td", { class: "num" }, status.unitsPerSecond ?? NONE),
    h("td", { class: "num" }, usd(status.cost && status.cost.totalUSD)),
    h("td", {}, age(metadata.creationTimestamp)),
  );
}

const PIPELINE_COLUMNS = [
  ["Project"], ["Name"], ["Phase"], ["Stages", "num"], ["Spent", "num"], ["Cap", "num"], ["Age"],
];

function pipelineRow(pipeline) {
  const { metadata, spec = {}, status = {} } = pipeline;
  const { succeeded, total } = stagesDone(pipeline);
  return h(
    "tr",
    { "data-name": metadata.name, "data-namespace": metadata.namespace },
    h("td", {}, metadata.namespace),
    h("td", {}, h("a", { href: `#/pipelines/${enc(metadata.namespace)}/${enc(metadata.name)}` }, metadata.name)),
    h("td", {}, phaseBadge(status.phase)),
    h("td", { class: "num" }, `${succeeded}/${total}`),
    h("td", { class: "num" }, usd(status.cost && status.cost.totalUSD)),
    h("td", { class: "num" }, usd(spec.maxCostUSD)),
    h("td", {}, age(metadata.creationTimestamp)),
  );
}

const LISTS = {
  sweeps: { title: "Sweeps", columns: SWEEP_COLUMNS, row: sweepRow },
  jobs: { title: "Jobs", columns: JOB_COLUMNS, row: jobRow },
  pipelines: { title: "Pipelines", columns: PIPELINE_COLUMNS, row: pipelineRow },
};
