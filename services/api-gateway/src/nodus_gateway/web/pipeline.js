// A Pipeline's page: spend against its one cap, the estimate, and its stages as a DAG drawn in columns by
// depth (a stage stands right of everything it depends on), each linked to its child Job or Sweep; kept
// current by a watch of the Pipeline.

import { getJSON } from "./api.js";
import { enc, h, show } from "./dom.js";
import { NONE, age, usd, wall } from "./format.js";
import { bestText, stageViews } from "./stages.js";
import { capBar, facts, heading, phaseBadge, showGone } from "./widgets.js";
import { watch } from "./watch.js";

export async function pipelinePage(namespace, name, signal) {
  const collection = `/namespaces/${enc(namespace)}/pipelines`;
  const pipeline = await getJSON(`${collection}/${enc(name)}`, signal);
  showPipeline(pipeline);
  watch(collection, name, pipeline.metadata.resourceVersion, signal, (type, obj) => {
    if (signal.aborted) return;
    if (type === "DELETED") showGone("Pipeline", namespace, name);
    else showPipeline(obj);
  });
}

function band(b, money) {
  if (!b || (b.p50 == null && b.p90 == null)) return NONE;
  const v = (x) => (x == null ? "?" : money ? usd(x) : x);
  return `p50 ${v(b.p50)} · p90 ${v(b.p90)}`;
}

function showPipeline(pipeline) {
  const { metadata, spec = {}, status = {} } = pipeline;
  const stages = stageViews(pipeline);
  const count = (phase) => stages.filter((s) => s.phase === phase).length;
  const cost = status.cost || {};
  const estimate = status.estimate || {};
  show(
    ...heading("Pipeline", metadata, status),
    facts([
      ["Stages succeeded", `${count("Succeeded")}/${stages.length}`, "stages-done"],
      ["Running", count("Running")],
      ["Failed", count("Failed")],
      ["Estimated cost", band(estimate.costUSD, true), "estimate-cost"],
      ["Estimated duration", band(status.estimatedDuration, false), "estimate-duration"],
      ["Started", age(status.startTime) === NONE ? NONE : `${age(status.startTime)} ago`],
    ]),
    h("h2", {}, "Spend against the cap"),
    capBar(cost.totalUSD, spec.maxCostUSD ?? cost.limitUSD),
    h("h2", {}, "Stages"),
    dag(metadata.namespace, stages),
  );
}

function dag(namespace, stages) {
  if (!stages.length) return h("p", { class: "empty", id: "dag" }, "No stages.");
  const columns = [];
  for (const stage of stages) (columns[stage.depth] ||= []).push(stage);
  return h(
    "div",
    { class: "dag", id: "dag" },
    columns.map((col, depth) =>
      h(
        "div",
        { class: "dag-col", "data-depth": depth },
        h("div", { class: "dag-step" }, `step ${depth + 1}`),
        (col || []).map((s) => stageCard(namespace, s)),
      ),
    ),
  );
}

function stageCard(namespace, s) {
  const page = s.kind === "Sweep" ? "sweeps" : "jobs";
  const best = bestText(s);
  return h(
    "div",
    { class: "stage", "data-stage": s.name, "data-phase": s.phase || "", "data-depth": s.depth },
    h("div", { class: "stage-head" }, h("strong", { class: "stage-name" }, s.name), " ", h("span", { class: "stage-kind" }, s.kind || NONE)),
    phaseBadge(s.phase),
    h(
      "div",
      { class: "stage-numbers" },
      "cost ",
      h("span", { class: "stage-cost" }, usd(s.costUSD)),
      " · wall ",
      h("span", { class: "stage-wall" }, wall(s.wallSeconds)),
    ),
    h(
      "div",
      { class: "stage-object" },
      s.object ? h("a", { href: `#/${page}/${enc(namespace)}/${enc(s.object)}` }, s.object) : "not created yet",
    ),
    s.dependsOn.length ? h("div", { class: "stage-after hint" }, `after ${s.dependsOn.join(", ")}`) : null,
    best ? h("div", { class: "stage-best" }, best) : null,
    s.message ? h("div", { class: "stage-message hint" }, s.message) : null,
  );
}
