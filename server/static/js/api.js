// Talking to the server: the token (kept in this browser), JSON in and out, errors with the
// server's `detail`, the connection state, and server-sent events read through fetch (so the
// token header goes with them, which EventSource cannot send).

const TOKEN_KEY = "rlcs-token";
const connectionListeners = new Set();
let connected = null;

export class ApiError extends Error {
  constructor(status, detail, body) {
    super(detail);
    this.status = status;
    this.detail = detail;
    this.body = body;
  }
}

export function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) localStorage.setItem(TOKEN_KEY, value);
  else localStorage.removeItem(TOKEN_KEY);
}

export function onConnection(listener) {
  connectionListeners.add(listener);
  if (connected !== null) listener(connected);
}

function setConnected(value) {
  if (value === connected) return;
  connected = value;
  for (const listener of connectionListeners) listener(value);
}

let askToken = () => {};
export function whenTokenNeeded(handler) {
  askToken = handler;
}

function headers(json) {
  const out = {};
  if (token()) out.Authorization = `Bearer ${token()}`;
  if (json) out["Content-Type"] = "application/json";
  return out;
}

function detailOf(status, body) {
  if (body && typeof body === "object" && body.detail) {
    return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  }
  return `the server answered ${status}`;
}

export async function api(path, { method = "GET", body } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    setConnected(false);
    throw new ApiError(0, "disconnected: the server does not answer");
  }
  setConnected(true);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (response.status === 401) askToken();
  if (!response.ok) throw new ApiError(response.status, detailOf(response.status, data), data);
  return data;
}

// /health answers without a token: polled to show whether the server is there.
export async function ping() {
  try {
    const response = await fetch("/health", { cache: "no-store" });
    setConnected(response.ok);
    return response.ok ? await response.json() : null;
  } catch {
    setConnected(false);
    return null;
  }
}

// Server-sent events from `path`, as (event, data) calls, until the stream ends or `signal`
// aborts it.
export async function streamEvents(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers(false), signal });
  if (response.status === 401) askToken();
  if (!response.ok) {
    const text = await response.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
    throw new ApiError(response.status, detailOf(response.status, body), body);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      onEvent(event, data.join("\n"));
    }
  }
}

// A run's metric history for charts: every row, each metric thinned on the server to at most
// CHART_POINTS points.
const CHART_POINTS = 600;
export function history(runId) {
  return api(`/runs/${runId}/history?limit=100000&max_points=${CHART_POINTS}`);
}

// The field a 422 names ("field 'lora_rank': ..."), or null.
export function fieldOf(detail) {
  const match = /field '([^']+)'/.exec(detail || "");
  return match ? match[1] : null;
}
