// The pieces every page is made of: an object's title, a phase badge, a list of facts, a table, the spend
// against a cap, a Status as an error box.

import { h, safeHref, setLive, show } from "./dom.js";
import { NONE, micros, percent, usd } from "./format.js";

// The title and the line under it of an object's page: its kind, name, phase, project, reason, message.
export function heading(kind, metadata, status) {
  return [
    h("h1", { id: "title", "data-name": metadata.name }, `${kind} ${metadata.name} `, phaseBadge(status.phase)),
    h(
      "p",
      { class: "sub" },
      `project ${metadata.namespace}`,
      status.reason ? ` · ${status.reason}` : "",
      status.message ? ` · ${status.message}` : "",
    ),
  ];
}

export function phaseBadge(phase) {
  const name = phase || "Pending";
  return h("span", { class: `phase phase-${name.replace(/[^A-Za-z]/g, "")}`, "data-phase": name }, name);
}

export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.map(([label, value, id]) => h("div", {}, h("dt", {}, label), h("dd", { id }, value ?? NONE))),
  );
}

export function table(id, columns, rows, empty) {
  if (!rows.length) return h("p", { class: "empty", id }, empty);
  const head = h("tr", {}, columns.map(([title, cls]) => h("th", { class: cls }, title)));
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, rows));
}

// The spend against a cap (a Sweep's, a Pipeline's): a bar and a line of text.
export function capBar(total, cap) {
  // The spend as a share of the cap, exact: both amounts in micro-dollars, the share in tenths of a percent.
  const spent = micros(total) ?? 0n;
  const limit = micros(cap);
  const fill = h("div", { class: "cap-fill", id: "cap-fill" });
  let text;
  let cls = "cap";
  let permille = null;
  if (limit === null || limit === 0n) {
    text = `spent ${usd(total || "0")}; no cap (spec.maxCostUSD is not set)`;
  } else {
    permille = (spent * 1000n) / limit;
    text = `spent ${usd(total || "0")} of the ${usd(cap)} cap (${percent(permille)})`;
    if (permille >= 1000n) cls += " over";
    else if (permille >= 800n) cls += " high";
    fill.style.width = `${Number(permille > 1000n ? 1000n : permille) / 10}%`;
  }
  return h(
    "div",
    { class: cls, id: "cap", "data-permille": permille === null ? "" : String(permille) },
    h("div", { class: "cap-track", role: "progressbar", "aria-label": "spend against the cap" }, fill),
    h("div", { class: "cap-text", id: "cap-text" }, text),
  );
}

export function errorBox(status) {
  return h(
    "div",
    { class: "error", id: "error", role: "alert", "data-reason": status.reason || "" },
    h("div", { class: "message" }, status.message || "the request failed"),
    status.fix ? h("div", { class: "fix" }, status.fix) : null,
    safeHref(status.docs)
      ? h("div", { class: "docs" }, h("a", { href: safeHref(status.docs), rel: "noreferrer" }, status.docs))
      : null,
    status.requestId ? h("div", { class: "hint" }, `request ${status.requestId}`) : null,
  );
}

export function showGone(kind, namespace, name) {
  setLive(null);
  show(
    h("h1", {}, `${kind} ${name}`),
    errorBox({ message: `${kind} ${name} in project ${namespace} was deleted.`, reason: "Deleted" }),
  );
}
