// Compare runs: their curves overlaid per metric, and the config fields that differ.

import { api, history } from "/static/js/api.js";
import { ChartBoard } from "/static/js/charts.js";
import { h, statusBadge } from "/static/js/dom.js";

export function mount(main, arg) {
  const ids = (arg || "").split(",").map((s) => s.trim()).filter(Boolean);
  const error = h("div", { class: "error" });
  const charts = h("div", { "data-testid": "compare-charts" });
  const diff = h("table", { "data-testid": "config-diff" });
  const runsLine = h("div", { class: "toolbar" });
  main.append(
    h("section", {}, h("h2", {}, `Compare ${ids.length} runs`), runsLine, error),
    h("section", {}, h("h2", {}, "Config fields that differ"), diff),
    h("section", {}, h("h2", {}, "Metrics"), charts),
  );
  if (ids.length < 2) {
    error.textContent = "Pick two or more runs in the runs table, then Compare selected.";
    return null;
  }
  const board = new ChartBoard(charts, ids);
  let cancelled = false;

  (async () => {
    try {
      const runs = await Promise.all(ids.map((id) => api(`/runs/${id}`)));
      const histories = await Promise.all(ids.map(history));
      if (cancelled) return;
      runsLine.replaceChildren(
        ...runs.map((run) => h("span", {}, h("a", { href: `#/runs/${run.run_id}` }, run.run_id), " ", statusBadge(run.status), ` ${run.environment}`)),
      );
      renderDiff(runs);
      board.update(histories.map((found) => found.rows));
    } catch (e) {
      error.textContent = e.detail || String(e);
    }
  })();

  function renderDiff(runs) {
    const fields = new Set(runs.flatMap((run) => Object.keys(run.config || {})));
    const rows = [];
    for (const field of [...fields].sort()) {
      const values = runs.map((run) => JSON.stringify(run.config?.[field] ?? null));
      if (new Set(values).size > 1) {
        rows.push(h("tr", { dataset: { field } }, h("td", {}, field), values.map((v) => h("td", {}, v))));
      }
    }
    diff.replaceChildren(
      h("thead", {}, h("tr", {}, h("th", {}, "field"), runs.map((run) => h("th", {}, run.run_id)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { class: "muted", colspan: runs.length + 1 }, "The configs are the same."))),
    );
  }

  return () => {
    cancelled = true;
    board.destroy();
  };
}
