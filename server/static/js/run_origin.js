// Where a run came from: its source (our API, or a Tinker SDK session served by this server;
// an API run on an Atropos environment says so), the run it was forked from, and its sweep.
// Servers without a `source` field (older ones) only have API runs.

import { h } from "/static/js/dom.js";

export const SOURCES = { api: "API", "tinker-api": "Tinker SDK session" };

export function sourceOf(run) {
  return run.source || "api";
}

// name -> framework ("rlcs" or "atropos") from GET /environments; empty where the server
// does not say.
export function frameworks(envs) {
  return new Map(envs.filter((e) => e.framework).map((e) => [e.name, e.framework]));
}

export function sourceLabel(run, envFrameworks = new Map()) {
  const source = sourceOf(run);
  const atropos = source === "api" && envFrameworks.get(run.environment) === "atropos";
  const text = atropos ? "API · Atropos env" : SOURCES[source] || source;
  const title = {
    api: "Started through this server's API (POST /runs, a sweep or a fork)",
    "tinker-api": "The session of a Tinker SDK script served by this server at /api/v1",
  }[source];
  return h("span", { class: `source src-${source}`, "data-testid": "source-label", dataset: { source }, title }, text);
}

// "fork of r-xxxx at step N" with a link to the parent, or null for a run that is no fork.
export function forkOf(run) {
  if (!run.parent_run_id) return null;
  const step = run.parent_step === null || run.parent_step === undefined ? "" : ` at step ${run.parent_step}`;
  return h("span", { class: "lineage", "data-testid": "fork-of" },
    "fork of ", h("a", { "data-testid": "parent-link", href: `#/runs/${run.parent_run_id}` }, run.parent_run_id), step);
}

export function sweepOf(run) {
  if (!run.sweep_id) return null;
  return h("span", { class: "lineage", "data-testid": "in-sweep" },
    "sweep ", h("a", { "data-testid": "sweep-link", href: `#/sweeps/${run.sweep_id}` }, run.sweep_id));
}
