// The Nodus web view: Sweeps and Jobs, read from the same /apis/nodus.dev/v1 API the CLI calls.
//
// Plain JavaScript, no framework and no build step: the gateway serves this file as it is (webview.py).
// Views are hash routes, so the gateway serves one page and the browser's back button works:
//
//   #/sweeps[/<project>]          Sweeps, in every project the token sees or in one
//   #/sweeps/<project>/<name>     a Sweep: spend against its cap, the cost-versus-throughput chart, its cells
//   #/jobs[/<project>]            Jobs
//   #/jobs/<project>/<name>       a Job: cost by segment, attempts, checkpoints, its log
//
// The token (ADR-0033): pasted once, kept in this tab's sessionStorage, sent as `Authorization: Bearer`
// on every API call and never as a cookie, so no other site can make the browser call the API for the
// user. Everything the API returns is written as text nodes (never innerHTML): an object name or a log
// line that looks like HTML stays text, and the page's Content-Security-Policy forbids inline script.
//
// Money is the API's decimal strings, shown as they are. Where an amount must be compared (the spend
// against the cap) it is read into BigInt micro-dollars; only the chart's pixel positions use Number.
"use strict";

(() => {
  const API = "/apis/nodus.dev/v1";
  const TOKEN_KEY = "nodus.token";
  const NONE = "-";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);
  const LIST_LIMIT = 500;
  const LOG_TAIL_LINES = 2000;
  const RETRY_MS = 1000;
  const RETRY_MAX_MS = 15000;

  // ---------------------------------------------------------------------------------------------------
  // DOM: elements and text nodes only
  // ---------------------------------------------------------------------------------------------------

  function setAttrs(el, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function append(el, children) {
    for (const child of [children].flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    return append(el, children);
  }

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    return append(el, children);
  }

  function show(...nodes) {
    const main = document.getElementById("main");
    main.replaceChildren();
    append(main, nodes);
  }

  function safeHref(url) {
    return typeof url === "string" && /^https?:\/\//.test(url) ? url : null;
  }

  const enc = encodeURIComponent;

  // ---------------------------------------------------------------------------------------------------
  // Values as the CLI prints them
  // ---------------------------------------------------------------------------------------------------

  function usd(amount) {
    // The API's decimal string as it is: a float could print 0.30000000000000004.
    return amount ? `$${amount}` : NONE;
  }

  function wall(seconds) {
    if (seconds === null || seconds === undefined) return NONE;
    const hours = Math.floor(seconds / 3600);
    const minutes = Math.floor((seconds % 3600) / 60);
    const secs = seconds % 60;
    const two = (n) => String(n).padStart(2, "0");
    if (hours) return `${hours}h${two(minutes)}m${two(secs)}s`;
    if (minutes) return `${minutes}m${two(secs)}s`;
    return `${secs}s`;
  }

  function age(timestamp) {
    const then = Date.parse(timestamp || "");
    if (Number.isNaN(then)) return NONE;
    const seconds = Math.max(0, Math.floor((Date.now() - then) / 1000));
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (seconds >= size) return `${Math.floor(seconds / size)}${unit}`;
    }
    return `${seconds}s`;
  }

  function bytes(n) {
    if (n === null || n === undefined) return NONE;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let whole = n;
    while (whole >= 1024 && i < units.length - 1) {
      whole /= 1024;
      i += 1;
    }
    return i === 0 ? `${n} B` : `${whole.toFixed(1)} ${units[i]}`;
  }

  function micros(amount) {
    // "1.55" -> 1550000n: exact, for comparing amounts; null for anything that is not a decimal string.
    const m = /^(\d+)(?:\.(\d{1,6}))?$/.exec(String(amount ?? "").trim());
    if (!m) return null;
    return BigInt(m[1]) * 1000000n + BigInt((m[2] || "").padEnd(6, "0"));
  }

  function percent(permille) {
    return `${permille / 10n}.${permille % 10n}%`;
  }

  function gpuOf(spec) {
    const gpu = spec && spec.resources && spec.resources.gpu;
    if (!gpu) return NONE;
    if (typeof gpu === "string") return gpu;
    const types = Array.isArray(gpu.type) ? gpu.type.join("|") : gpu.type;
    return `${types || "?"}:${gpu.count ?? 1}`;
  }

  // The title and the line under it of an object's page: its kind, name, phase, project, reason, message.
function heading(kind, metadata, status) {
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

function phaseBadge(phase) {
    const name = phase || "Pending";
    return h("span", { class: `phase phase-${name.replace(/[^A-Za-z]/g, "")}`, "data-phase": name }, name);
  }

  function facts(pairs) {
    return h(
      "dl",
      { class: "facts" },
      pairs.map(([label, value, id]) => h("div", {}, h("dt", {}, label), h("dd", { id }, value ?? NONE))),
    );
  }

  function table(id, columns, rows, empty) {
    if (!rows.length) return h("p", { class: "empty", id }, empty);
    const head = h("tr", {}, columns.map(([title, cls]) => h("th", { class: cls }, title)));
    return h("table", { id }, h("thead", {}, head), h("tbody", {}, rows));
  }

  // ---------------------------------------------------------------------------------------------------
  // The API, with the token
  // ---------------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(code, status) {
      super(status.message || `HTTP ${code}`);
      this.code = code;
      this.status = status;
    }
  }

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  async function errorOf(resp) {
    let body = null;
    try {
      body = await resp.json();
    } catch (_) {
      body = null;
    }
    if (!body || typeof body !== "object") body = { message: `${resp.status} ${resp.statusText}` };
    return new ApiError(resp.status, body);
  }

  function call(path, signal, accept) {
    return fetch(API + path, {
      headers: { Authorization: `Bearer ${token()}`, Accept: accept || "application/json" },
      credentials: "omit", // no cookie goes with the request: the header alone authenticates it
      cache: "no-store",
      signal,
    });
  }

  async function getJSON(path, signal) {
    const resp = await call(path, signal);
    if (!resp.ok) throw await errorOf(resp);
    return resp.json();
  }

  async function getText(path, signal) {
    const resp = await call(path, signal, "text/plain");
    if (!resp.ok) throw await errorOf(resp);
    return resp.text();
  }

  function pause(ms, signal) {
    // A reconnect's backoff: the page waits before it asks the gateway again.
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  async function* ndjson(body) {
    // A watch: newline-delimited JSON WatchEvents, as they arrive.
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (line) yield JSON.parse(line);
      }
    }
  }

  async function watch(collection, name, resourceVersion, signal, onEvent) {
    // Kubernetes' watch of one object: from the version the page shows, reconnecting from the last one
    // seen; after an ERROR (410 Expired: history compacted) from scratch, which starts with the object.
    let rv = resourceVersion;
    let wait = RETRY_MS;
    while (!signal.aborted) {
      const query = new URLSearchParams({
        watch: "true",
        fieldSelector: `metadata.name=${name}`,
        allowWatchBookmarks: "true",
      });
      if (rv) query.set("resourceVersion", rv);
      try {
        const resp = await call(`${collection}?${query}`, signal);
        if (!resp.ok) throw await errorOf(resp);
        setLive(true);
        wait = RETRY_MS;
        for await (const event of ndjson(resp.body)) {
          if (event.type === "ERROR") {
            rv = null;
            break;
          }
          const version = event.object && event.object.metadata && event.object.metadata.resourceVersion;
          if (version) rv = version;
          if (event.type !== "BOOKMARK") onEvent(event.type, event.object);
        }
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError && (e.code === 401 || e.code === 403)) {
          failed(e);
          return;
        }
      }
      if (signal.aborted) return;
      setLive(false);
      await pause(wait, signal);
      wait = Math.min(wait * 2, RETRY_MAX_MS);
    }
  }

  function setLive(state) {
    const el = document.getElementById("live");
    el.hidden = state === null;
    el.classList.toggle("on", state === true);
    el.textContent = state ? "live" : "reconnecting";
    el.dataset.state = state === null ? "" : state ? "live" : "reconnecting";
  }

  // ---------------------------------------------------------------------------------------------------
  // Signing in, errors
  // ---------------------------------------------------------------------------------------------------

  function errorBox(status) {
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

  function showLogin(status) {
    document.getElementById("sign-out").hidden = true;
    setLive(null);
    const input = h("input", {
      id: "token-input",
      type: "password",
      autocomplete: "off",
      placeholder: "bearer token",
      "aria-label": "Bearer token",
    });
    const form = h(
      "form",
      { id: "login-form" },
      input,
      h("button", { type: "submit", id: "sign-in" }, "Sign in"),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const given = input.value.trim();
      if (!given) return;
      sessionStorage.setItem(TOKEN_KEY, given);
      route();
    });
    show(
      h(
        "section",
        { class: "login panel", id: "login" },
        h("h1", {}, "Sign in to Nodus"),
        h(
          "p",
          {},
          "Paste a bearer token. It is kept in this browser tab only and sent to the gateway's API in the ",
          h("code", {}, "Authorization"),
          " header, never as a cookie; closing the tab forgets it.",
        ),
        h(
          "p",
          { class: "hint" },
          "The local stack's admin token is NODUS_TOKEN in .nodus/local.env (written by make up); ",
          "an admin mints others with POST /apis/nodus.dev/v1/tokens.",
        ),
        status ? errorBox(status) : null,
        form,
      ),
    );
    input.focus();
  }

  function failed(error) {
    if (error instanceof ApiError && error.code === 401) {
      // The token is wrong or revoked: forget it and ask again, with the gateway's reason and fix.
      sessionStorage.removeItem(TOKEN_KEY);
      if (page) page.abort();
      showLogin(error.status);
      return;
    }
    setLive(null);
    const status = error instanceof ApiError ? error.status : { message: String(error) };
    show(h("section", {}, h("h1", {}, "Something went wrong"), errorBox(status)));
  }

  // ---------------------------------------------------------------------------------------------------
  // Lists
  // ---------------------------------------------------------------------------------------------------

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

  async function listPage(plural, namespace, signal) {
    const path = namespace ? `/namespaces/${enc(namespace)}/${plural}` : `/${plural}`;
    const list = await getJSON(`${path}?limit=${LIST_LIMIT}`, signal);
    const items = list.items || [];
    for (const item of items) seenNamespaces.add(item.metadata.namespace);
    if (namespace) seenNamespaces.add(namespace);
    const rows = items.map((item) => (plural === "sweeps" ? sweepRow(item) : jobRow(item)));
    const columns = plural === "sweeps" ? SWEEP_COLUMNS : JOB_COLUMNS;
    const title = plural === "sweeps" ? "Sweeps" : "Jobs";
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

  // ---------------------------------------------------------------------------------------------------
  // A Sweep
  // ---------------------------------------------------------------------------------------------------

  async function sweepPage(namespace, name, signal) {
    const collection = `/namespaces/${enc(namespace)}/sweeps`;
    const sweep = await getJSON(`${collection}/${enc(name)}`, signal);
    showSweep(sweep);
    watch(collection, name, sweep.metadata.resourceVersion, signal, (type, obj) => {
      if (signal.aborted) return;
      if (type === "DELETED") showGone("Sweep", namespace, name);
      else showSweep(obj);
    });
  }

  function showGone(kind, namespace, name) {
    setLive(null);
    show(
      h("h1", {}, `${kind} ${name}`),
      errorBox({ message: `${kind} ${name} in project ${namespace} was deleted.`, reason: "Deleted" }),
    );
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

  function capBar(total, cap) {
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

  function chart(sweep) {
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

  // ---------------------------------------------------------------------------------------------------
  // A Job
  // ---------------------------------------------------------------------------------------------------

  async function jobPage(namespace, name, signal) {
    const collection = `/namespaces/${enc(namespace)}/jobs`;
    const state = { job: await getJSON(`${collection}/${enc(name)}`, signal), attempts: [], log: null, logError: null, index: 0 };
    const load = async () => {
      const [attempts, log] = await Promise.allSettled([
        getJSON(`/namespaces/${enc(namespace)}/attempts?labelSelector=${enc(`nodus.dev/job=${name}`)}`, signal),
        getText(`${collection}/${enc(name)}/log?index=${state.index}&tailLines=${LOG_TAIL_LINES}`, signal),
      ]);
      for (const r of [attempts, log]) {
        if (r.status === "rejected" && r.reason instanceof ApiError && r.reason.code === 401) throw r.reason;
      }
      if (attempts.status === "fulfilled") {
        const uid = state.job.metadata.uid;
        state.attempts = (attempts.value.items || []).filter((a) => {
          const labels = a.metadata.labels || {};
          return !labels["nodus.dev/job-uid"] || labels["nodus.dev/job-uid"] === uid;
        });
      }
      state.log = log.status === "fulfilled" ? log.value : null;
      state.logError = log.status === "rejected" ? log.reason : null;
    };
    const redraw = () => {
      if (!signal.aborted) {
        showJob(state, async (index) => {
          state.index = index;
          try {
            await load();
            redraw();
          } catch (e) {
            if (!signal.aborted) failed(e);
          }
        });
      }
    };
    await load();
    redraw();
    // A change of the Job (a new attempt, a checkpoint, a charge) reloads its attempts and log, one load at
    // a time: changes that arrive during a load are folded into the next one.
    let loading = null;
    let again = false;
    const reload = async () => {
      if (loading) {
        again = true;
        return;
      }
      loading = (async () => {
        do {
          again = false;
          await load();
          redraw();
        } while (again && !signal.aborted);
      })();
      try {
        await loading;
      } catch (e) {
        if (!signal.aborted) failed(e);
      } finally {
        loading = null;
      }
    };
    watch(collection, name, state.job.metadata.resourceVersion, signal, (type, obj) => {
      if (signal.aborted) return;
      if (type === "DELETED") {
        showGone("Job", namespace, name);
        return;
      }
      state.job = obj;
      reload();
    });
  }

  function showJob(state, pickIndex) {
    const { metadata, spec = {}, status = {} } = state.job;
    const cost = status.cost || {};
    const attempts = [...state.attempts].sort(
      (a, b) => a.spec.index - b.spec.index || a.spec.attempt - b.spec.attempt || (a.spec.rank ?? 0) - (b.spec.rank ?? 0),
    );
    show(
      ...heading("Job", metadata, status),
      facts([
        ["GPU", gpuOf(spec)],
        ["Indexes done", `${status.succeeded ?? 0}/${spec.completions ?? 1}`],
        ["Attempts", status.attempts ?? attempts.length, "attempt-count"],
        ["Wall", wall(status.wallSeconds)],
        ["Units/s", status.unitsPerSecond ?? NONE],
        ["Spent", usd(cost.totalUSD), "job-cost"],
        ["Cap", usd(spec.maxCostUSD ?? cost.limitUSD)],
        ["Rate", cost.rateUSDPerHour ? `${usd(cost.rateUSDPerHour)}/h` : NONE],
      ]),
      h("h2", {}, "Cost by segment"),
      segments(cost),
      h("h2", {}, "Attempts"),
      table("attempts", ATTEMPT_COLUMNS, attempts.map(attemptRow), "No attempts yet."),
      h("h2", {}, "Checkpoints"),
      checkpoints(attempts),
      h("h2", {}, "Log"),
      logSection(state, spec.completions ?? 1, pickIndex),
    );
  }

  function segments(cost) {
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

  const ATTEMPT_COLUMNS = [
    ["Attempt"], ["Index", "num"], ["Try", "num"], ["Node"], ["Offering"], ["Phase"], ["Exit", "num"],
    ["Wall", "num"], ["Units/s", "num"], ["Restored from"], ["Ended by"],
  ];

  function attemptRow(attempt) {
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
      h("td", {}, restored ? `checkpoint ${restored.sequence ?? 0}` : NONE),
      h("td", {}, status.endedBy || status.reason || NONE),
    );
  }

  function checkpoints(attempts) {
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

  function logSection(state, completions, pickIndex) {
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

  // ---------------------------------------------------------------------------------------------------
  // Routing
  // ---------------------------------------------------------------------------------------------------

  let page = null; // the AbortController of the view shown: leaving it ends its requests and watches

  function markNav(section) {
    for (const id of ["sweeps", "jobs"]) {
      document.getElementById(`nav-${id}`).classList.toggle("active", section === id);
    }
  }

  async function route() {
    if (page) page.abort();
    page = new AbortController();
    const { signal } = page;
    setLive(null);
    const raw = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
    let parts;
    try {
      parts = raw.map(decodeURIComponent);
    } catch (_) {
      parts = raw; // a hand-typed %-sequence that is not UTF-8: taken as written, and not found
    }
    const [section = "sweeps", namespace, name] = parts;
    markNav(section);
    if (!token()) {
      showLogin(null);
      return;
    }
    document.getElementById("sign-out").hidden = false;
    try {
      if (section === "sweeps" && name) await sweepPage(namespace, name, signal);
      else if (section === "sweeps") await listPage("sweeps", namespace, signal);
      else if (section === "jobs" && name) await jobPage(namespace, name, signal);
      else if (section === "jobs") await listPage("jobs", namespace, signal);
      else throw new ApiError(404, { message: `there is no page #/${parts.join("/")}`, fix: "The pages are #/sweeps and #/jobs." });
    } catch (e) {
      if (!signal.aborted) failed(e);
    }
  }

  function start() {
    document.getElementById("sign-out").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      route();
    });
    window.addEventListener("hashchange", route);
    if (!location.hash) history.replaceState(null, "", "#/sweeps");
    route();
  }

  start();
})();
