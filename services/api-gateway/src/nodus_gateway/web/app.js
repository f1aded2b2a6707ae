// The Nodus web view: Sweeps, Jobs and Pipelines, read from the same /apis/nodus.dev/v1 API the CLI calls.
//
// Plain JavaScript, no framework and no build step: the gateway serves the files as they are (webview.py).
// Views are hash routes, so the gateway serves one page and the browser's back button works:
//
//   #/sweeps[/<project>]          Sweeps, in every project the token sees or in one
//   #/sweeps/<project>/<name>     a Sweep: spend against its cap, the cost-versus-throughput chart, its cells
//   #/jobs[/<project>]            Jobs
//   #/jobs/<project>/<name>       a Job: cost by segment, attempts, checkpoints, its log
//   #/pipelines[/<project>]       Pipelines
//   #/pipelines/<project>/<name>  a Pipeline: spend against its cap, the estimate, its stages by depth
//
// The token (ADR-0033): pasted once, kept in this tab's sessionStorage, sent as `Authorization: Bearer`
// on every API call and never as a cookie, so no other site can make the browser call the API for the
// user. Everything the API returns is written as text nodes (never innerHTML): an object name or a log
// line that looks like HTML stays text, and the page's Content-Security-Policy forbids inline script.
//
// Money is the API's decimal strings, shown as they are. Where an amount must be compared (the spend
// against the cap) it is read into BigInt micro-dollars; only the chart's pixel positions use Number.
//
// This is the entry point, loaded by index.html as an ES module (deferred and strict, as modules are; its
// imports come from this origin only, as the Content-Security-Policy's script-src 'self' allows). It routes;
// each view, and what they share, is a module of its own:
//
//   lists.js                      the lists of Sweeps, Jobs and Pipelines
//   sweep.js, chart.js            a Sweep's page and its chart
//   job.js, jobsections.js        a Job's page and its sections
//   pipeline.js, stages.js        a Pipeline's page and how its stages are read
//   api.js, watch.js              calls to the gateway, and the watch that keeps a page current
//   session.js, login.js          the token and the view on screen; signing in, and errors
//   widgets.js, format.js, dom.js the pieces of every page, values as the CLI prints them, elements and text

import { ApiError } from "./api.js";
import { setLive } from "./dom.js";
import { jobPage } from "./job.js";
import { listPage } from "./lists.js";
import { failed, showLogin } from "./login.js";
import { pipelinePage } from "./pipeline.js";
import { newView, onSessionChange, signOut, token } from "./session.js";
import { sweepPage } from "./sweep.js";

function markNav(section) {
  for (const id of ["sweeps", "jobs", "pipelines"]) {
    document.getElementById(`nav-${id}`).classList.toggle("active", section === id);
  }
}

async function route() {
  const signal = newView();
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
    else if (section === "pipelines" && name) await pipelinePage(namespace, name, signal);
    else if (section === "pipelines") await listPage("pipelines", namespace, signal);
    else {
      const fix = "The pages are #/sweeps, #/jobs and #/pipelines.";
      throw new ApiError(404, { message: `there is no page #/${parts.join("/")}`, fix });
    }
  } catch (e) {
    if (!signal.aborted) failed(e);
  }
}

function start() {
  // Signing in or out redraws the page from its route (session.js calls back; login.js need not know us).
  onSessionChange(route);
  document.getElementById("sign-out").addEventListener("click", signOut);
  window.addEventListener("hashchange", route);
  if (!location.hash) history.replaceState(null, "", "#/sweeps");
  route();
}

start();
