// What keeps an object's page current: a watch of the object, read as it streams, reconnecting with a
// backoff (the header's mark says "live" or "reconnecting") until the view that opened it is left.

import { ApiError, call, errorOf } from "./api.js";
import { setLive } from "./dom.js";
import { failed } from "./login.js";

const RETRY_MS = 1000;
const RETRY_MAX_MS = 15000;

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

export async function watch(collection, name, resourceVersion, signal, onEvent) {
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
