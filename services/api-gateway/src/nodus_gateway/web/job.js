// A Job's page: its facts, then its cost by segment, attempts, checkpoints and log (jobsections.js); kept
// current by a watch of the Job, each change reloading the attempts and the log.

import { ApiError, getJSON, getText } from "./api.js";
import { enc, h, show } from "./dom.js";
import { NONE, gpuOf, usd, wall } from "./format.js";
import { ATTEMPT_COLUMNS, LOG_TAIL_LINES, attemptRow, checkpoints, logSection, segments } from "./jobsections.js";
import { failed } from "./login.js";
import { facts, heading, showGone, table } from "./widgets.js";
import { watch } from "./watch.js";

export async function jobPage(namespace, name, signal) {
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
