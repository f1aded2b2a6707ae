// The API, with the token: every call sends it as `Authorization: Bearer` and never a cookie.

import { token } from "./session.js";

const API = "/apis/nodus.dev/v1";

export class ApiError extends Error {
  constructor(code, status) {
    super(status.message || `HTTP ${code}`);
    this.code = code;
    this.status = status;
  }
}

export async function errorOf(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch (_) {
    body = null;
  }
  if (!body || typeof body !== "object") body = { message: `${resp.status} ${resp.statusText}` };
  return new ApiError(resp.status, body);
}

export function call(path, signal, accept) {
  return fetch(API + path, {
    headers: { Authorization: `Bearer ${token()}`, Accept: accept || "application/json" },
    credentials: "omit", // no cookie goes with the request: the header alone authenticates it
    cache: "no-store",
    signal,
  });
}

export async function getJSON(path, signal) {
  const resp = await call(path, signal);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export async function getText(path, signal) {
  const resp = await call(path, signal, "text/plain");
  if (!resp.ok) throw await errorOf(resp);
  return resp.text();
}
