// Runs: a live table (polled every 2 s), newest first, filtered by status, environment and
// source, 100 to a page; each run's source, fork parent, sweep and cost; pick runs to compare
// them.

import { api } from "/static/js/api.js";
import { costCell } from "/static/js/cost.js";
import { duration, fmt, h, statusBadge, stepOf } from "/static/js/dom.js";
import { SOURCES, forkOf, frameworks, sourceLabel, sourceOf, sweepOf } from "/static/js/run_origin.js";

const PAGE = 100;
const STATUSES = ["queued", "starting", "running", "stopping", "succeeded", "failed", "stopped"];

export function mount(main) {
  const state = { offset: 0, status: "", environment: "", source: "", picked: new Set(), timer: null, frameworks: new Map() };
  const error = h("div", { class: "error" });
  const statusFilter = h(
    "select",
    { "data-testid": "filter-status", onchange: () => { state.status = statusFilter.value; state.offset = 0; refresh(); } },
    h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s }, s)),
  );
  const envFilter = h(
    "select",
    { "data-testid": "filter-env", onchange: () => { state.environment = envFilter.value; state.offset = 0; refresh(); } },
    h("option", { value: "" }, "any environment"),
  );
  const sourceFilter = h(
    "select",
    { "data-testid": "filter-source", onchange: () => { state.source = sourceFilter.value; state.offset = 0; refresh(); } },
    h("option", { value: "" }, "any source"),
    Object.entries(SOURCES).map(([value, label]) => h("option", { value }, label)),
  );
  const compareButton = h(
    "button",
    {
      "data-testid": "compare-selected",
      disabled: true,
      onclick: () => { location.hash = `#/compare/${[...state.picked].join(",")}`; },
    },
    "Compare selected",
  );
  const prev = h("button", { "data-testid": "page-prev", onclick: () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); } }, "‹ newer");
  const next = h("button", { "data-testid": "page-next", onclick: () => { state.offset += PAGE; refresh(); } }, "older ›");
  const pageInfo = h("span", { class: "muted", "data-testid": "page-info" });
  const body = h("tbody");
  const table = h(
    "table",
    { "data-testid": "runs-table" },
    h("thead", {}, h("tr", {}, ["", "run", "source", "environment", "model", "status", "step", "reward", "cost", "ETA", "stalled", "failure", "created"].map((t) => h("th", {}, t)))),
    body,
  );
  main.append(
    h("section", {},
      h("div", { class: "toolbar" }, h("h2", { style: "margin:0" }, "Runs"), statusFilter, envFilter, sourceFilter, compareButton,
        h("span", { class: "spacer" }), prev, pageInfo, next,
        h("a", { href: "#/new" }, h("button", { class: "primary", type: "button" }, "New run"))),
      error, table),
  );

  api("/environments").then((envs) => {
    for (const env of envs) {
      envFilter.append(h("option", { value: env.name }, env.framework === "atropos" ? `${env.name} (Atropos)` : env.name));
    }
    state.frameworks = frameworks(envs);
  }).catch(() => {});

  function row(run) {
    const pick = h("input", {
      type: "checkbox",
      "data-testid": "pick",
      checked: state.picked.has(run.run_id),
      onchange: () => {
        if (pick.checked) state.picked.add(run.run_id);
        else state.picked.delete(run.run_id);
        compareButton.disabled = state.picked.size < 2;
      },
    });
    const cell = (col, ...content) => h("td", { dataset: { col } }, ...content);
    return h(
      "tr",
      { dataset: { runId: run.run_id } },
      h("td", {}, pick),
      h("td", {},
        h("a", { "data-testid": "run-link", href: `#/runs/${run.run_id}` }, run.run_id),
        run.display_name ? h("div", { class: "muted", "data-testid": "run-name" }, run.display_name) : null),
      cell("source", sourceLabel(run, state.frameworks), forkOf(run), sweepOf(run)),
      cell("environment", run.environment),
      cell("model", run.model_name || "–"),
      cell("status", statusBadge(run.status)),
      cell("step", stepOf(run)),
      cell("reward", fmt(run.reward_mean)),
      cell("cost", costCell(run.cost)),
      cell("eta", run.status === "running" ? duration(run.eta_s) : "–"),
      cell("stalled", run.stalled ? "stalled" : ""),
      cell("failure", run.failure_kind || ""),
      h("td", { class: "muted" }, (run.created_at || "").replace("T", " ").slice(0, 19)),
    );
  }

  async function refresh() {
    const params = new URLSearchParams({ limit: String(PAGE), offset: String(state.offset) });
    if (state.status) params.set("status", state.status);
    if (state.environment) params.set("environment", state.environment);
    // Sent for a server that filters by source; the page filters too, for one that does not.
    if (state.source) params.set("source", state.source);
    try {
      const runs = await api(`/runs?${params}`);
      const shown = state.source ? runs.filter((run) => sourceOf(run) === state.source) : runs;
      body.replaceChildren(...shown.map(row));
      if (!shown.length) {
        const filtered = state.status || state.environment || state.source || state.offset;
        const why = filtered ? "No runs here match the filters." : "No runs yet: start one with New run.";
        body.append(h("tr", {}, h("td", { colspan: 13, class: "muted" }, why)));
      }
      error.textContent = "";
      prev.disabled = state.offset === 0;
      next.disabled = runs.length < PAGE;
      pageInfo.textContent = runs.length ? `${state.offset + 1}–${state.offset + runs.length}` : "";
    } catch (e) {
      error.textContent = e.detail;
    }
  }

  refresh();
  state.timer = setInterval(refresh, 2000);
  return () => clearInterval(state.timer);
}
