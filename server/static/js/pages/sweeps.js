// Sweeps: a live table (polled every 2 s), newest first, 100 to a page: each sweep's
// environment, metric and goal, how many of its runs have finished, and its runs by status.

import { api } from "/static/js/api.js";
import { h, statusBadge } from "/static/js/dom.js";

const PAGE = 100;

// "2 succeeded · 1 running", most advanced states last.
const ORDER = ["queued", "starting", "running", "stopping", "succeeded", "failed", "stopped"];
export function countsText(counts) {
  const states = Object.keys(counts || {}).sort((a, b) => ORDER.indexOf(a) - ORDER.indexOf(b));
  return states.map((s) => `${counts[s]} ${s}`).join(" · ") || "no runs";
}

export function mount(main) {
  let offset = 0;
  const error = h("div", { class: "error" });
  const prev = h("button", { "data-testid": "page-prev", onclick: () => { offset = Math.max(0, offset - PAGE); refresh(); } }, "‹ newer");
  const next = h("button", { "data-testid": "page-next", onclick: () => { offset += PAGE; refresh(); } }, "older ›");
  const pageInfo = h("span", { class: "muted", "data-testid": "page-info" });
  const body = h("tbody");
  const table = h(
    "table",
    { "data-testid": "sweeps-table" },
    h("thead", {}, h("tr", {}, ["sweep", "environment", "metric", "status", "runs finished", "runs by status", "created"].map((t) => h("th", {}, t)))),
    body,
  );
  main.append(
    h("section", {},
      h("div", { class: "toolbar" }, h("h2", { style: "margin:0" }, "Sweeps"), h("span", { class: "spacer" }), prev, pageInfo, next),
      h("p", { class: "muted" }, "A sweep is many runs from one config and a grid of overrides (POST /sweeps, or rlctl sweep)."),
      error, table),
  );

  function row(sweep) {
    const cell = (col, ...content) => h("td", { dataset: { col } }, ...content);
    return h(
      "tr",
      { dataset: { sweepId: sweep.sweep_id } },
      h("td", {}, h("a", { "data-testid": "sweep-link", href: `#/sweeps/${sweep.sweep_id}` }, sweep.sweep_id)),
      cell("environment", sweep.environment),
      cell("metric", `${sweep.metric} (${sweep.goal})`),
      cell("status", statusBadge(sweep.status)),
      cell("runs", `${sweep.runs_finished} / ${sweep.runs_total}`),
      cell("counts", countsText(sweep.counts)),
      h("td", { class: "muted" }, (sweep.created_at || "").replace("T", " ").slice(0, 19)),
    );
  }

  async function refresh() {
    try {
      const sweeps = await api(`/sweeps?limit=${PAGE}&offset=${offset}`);
      body.replaceChildren(...sweeps.map(row));
      if (!sweeps.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, offset ? "No sweeps here." : "No sweeps yet.")));
      error.textContent = "";
      prev.disabled = offset === 0;
      next.disabled = sweeps.length < PAGE;
      pageInfo.textContent = sweeps.length ? `${offset + 1}–${offset + sweeps.length}` : "";
    } catch (e) {
      error.textContent = e.detail;
    }
  }

  refresh();
  const timer = setInterval(refresh, 2000);
  return () => clearInterval(timer);
}
