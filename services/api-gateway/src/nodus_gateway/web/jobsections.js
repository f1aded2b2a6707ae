// The sections of a Job's page, each drawn from the Job, its attempts and its log as job.js last loaded them.

import { ApiError } from "./api.js";
import { h } from "./dom.js";
import { NONE, bytes, usd, wall } from "./format.js";
import { errorBox, phaseBadge, table } from "./widgets.js";

export const LOG_TAIL_LINES = 2000;

export function segments(cost) {
  const by = cost.bySegment || {};
  const covered = new Set(by.coveredByNodus || []);
  const rows = [
    ["Boot", by.bootUSD],
    ["Running", by.runningUSD],
    ["Restore", by.restoreUSD],
    ["Teardown", by.teardownUSD],
  ].map(([segment, amount]) =>
    h(
      "tr",
      { "data-segment": segment },
      h("td", {}, segment),
      h("td", { class: "num" }, usd(amount)),
      h("td", {}, covered.has(segment) ? "covered by Nodus" : ""),
    ),
  );
  rows.push(
    h(
      "tr",
      { "data-segment": "Total" },
      h("td", {}, h("strong", {}, "Total")),
      h("td", { class: "num" }, h("strong", {}, usd(cost.totalUSD))),
      h("td", {}, cost.final ? "final" : cost.heldUSD ? `${usd(cost.heldUSD)} held` : ""),
    ),
  );
  return table("segments", [["Segment"], ["USD", "num"], [""]], rows, "");
}

export const ATTEMPT_COLUMNS = [
  ["Attempt"], ["Index", "num"], ["Try", "num"], ["Node"], ["Offering"], ["Phase"], ["Exit", "num"],
  ["Wall", "num"], ["Units/s", "num"], ["Code"], ["Data"], ["Restored from"], ["Ended by"],
];

// The code an attempt ran (ADR-0036): the commit of spec.source.git, or the uploaded blob.
function codeOf(source) {
  if (!source) return NONE;
  if (source.blob) return `blob ${source.blob.slice(7, 19)}…`;
  return source.commit ? `${source.commit.slice(0, 12)}${source.ref ? ` (${source.ref})` : ""}` : "not checked out";
}

// What it mounted: each Volume revision (with whether the node's cache had it) and Workspace.
function dataOf(mounts) {
  if (!mounts || mounts.length === 0) return NONE;
  return mounts
    .map((m) => {
      const what = m.kind === "Workspace" ? `workspace ${m.name}` : `${m.name}@${m.revision ?? "?"}`;
      const cache = m.cacheHit == null ? "" : m.cacheHit ? ", cached" : ", downloaded";
      const made = m.committedRevision == null ? "" : `, made @${m.committedRevision}`;
      return `${what} at ${m.mountPath}${cache}${made}`;
    })
    .join("; ");
}

export function attemptRow(attempt) {
  const { metadata, spec, status = {} } = attempt;
  const restored = status.restoredFrom;
  return h(
    "tr",
    { "data-name": metadata.name, "data-phase": status.phase || "" },
    h("td", {}, metadata.name),
    h("td", { class: "num" }, spec.index),
    h("td", { class: "num" }, spec.attempt),
    h("td", {}, spec.node || NONE),
    h("td", {}, spec.offering || NONE),
    h("td", {}, phaseBadge(status.phase)),
    h("td", { class: "num" }, status.exitCode ?? NONE),
    h("td", { class: "num" }, status.wallMillis == null ? NONE : wall(Math.round(status.wallMillis / 1000))),
    h("td", { class: "num" }, status.unitsPerSecond ?? NONE),
    h("td", { "data-field": "code" }, codeOf(status.source)),
    h("td", { "data-field": "data" }, dataOf(status.mounts)),
    h("td", {}, restored ? `checkpoint ${restored.sequence ?? 0}` : NONE),
    h("td", {}, status.endedBy || status.reason || NONE),
  );
}

export function checkpoints(attempts) {
  const rows = [];
  for (const a of attempts) {
    const cp = a.status && a.status.checkpoint;
    if (!cp) continue;
    rows.push(
      h(
        "tr",
        { "data-attempt": a.metadata.name, "data-sequence": cp.sequence ?? 0 },
        h("td", {}, a.metadata.name),
        h("td", { class: "num" }, cp.sequence ?? 0),
        h("td", {}, cp.time || NONE),
        h("td", { class: "num" }, bytes(cp.sizeBytes)),
        h("td", {}, cp.reason || NONE),
        h("td", {}, cp.consistent === false ? "no" : "yes"),
        h("td", {}, cp.uri || NONE),
      ),
    );
  }
  return table(
    "checkpoints",
    [["Attempt"], ["Sequence", "num"], ["Taken"], ["Size", "num"], ["Reason"], ["Consistent"], ["Where"]],
    rows,
    "No checkpoints: this Job's attempts have not written one.",
  );
}

export function logSection(state, completions, pickIndex) {
  const parts = [];
  if (completions > 1) {
    const select = h(
      "select",
      { id: "log-index", "aria-label": "Index" },
      Array.from({ length: Math.min(completions, 1000) }, (_, i) => h("option", { value: i, selected: i === state.index }, `index ${i}`)),
    );
    select.addEventListener("change", () => pickIndex(Number(select.value)));
    parts.push(h("div", { class: "toolbar" }, h("label", { for: "log-index" }, "Index"), select));
  }
  if (state.logError) {
    parts.push(errorBox(state.logError instanceof ApiError ? state.logError.status : { message: String(state.logError) }));
  } else {
    const text = state.log || "";
    parts.push(h("pre", { class: "log", id: "log" }, text || "(no log lines yet)"));
  }
  parts.push(h("p", { class: "hint" }, `The last ${LOG_TAIL_LINES} lines of every attempt of the index, oldest first; nodus logs ${state.job.metadata.name} -f follows them.`));
  return parts;
}
