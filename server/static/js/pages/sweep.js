// One sweep: its runs side by side (a row per run: the overridden fields, status, step, the
// sweep's metric and the other summary metrics), the best run marked, live while runs go on;
// compare the runs picked, or stop the sweep.

import { api } from "/static/js/api.js";
import { fmt, h, statusBadge } from "/static/js/dom.js";
import { countsText } from "/static/js/pages/sweeps.js";

const SUMMARY = ["reward_mean", "percent_correct", "eval_percent_correct", "loss"];

function shown(value) {
  if (value === undefined) return "–"; // not overridden in this run: the base config's value
  return typeof value === "string" ? value : JSON.stringify(value);
}

export function mount(main, sweepId) {
  const picked = new Set();
  let timer = null;
  let cancelled = false;
  const status = h("span", { "data-testid": "sweep-status", class: "status" }, "…");
  const facts = h("dl", { class: "facts" });
  const error = h("div", { class: "error" });
  const result = h("div", { "data-testid": "action-result", class: "ok" });
  const compareButton = h("button", {
    "data-testid": "compare-selected",
    disabled: true,
    onclick: () => { location.hash = `#/compare/${[...picked].join(",")}`; },
  }, "Compare selected");
  const stopButton = h("button", { "data-testid": "stop-sweep", onclick: stop }, "Stop sweep");
  const table = h("table", { "data-testid": "sweep-runs" });
  main.append(
    h("section", {},
      h("div", { class: "toolbar" },
        h("h2", { style: "margin:0" }, "Sweep ", h("span", { "data-testid": "sweep-id" }, sweepId)),
        status, h("span", { class: "spacer" }), result, compareButton, stopButton),
      facts, error),
    h("section", {}, h("h2", {}, "Runs"), table),
  );

  function fact(name, value) {
    return [h("dt", {}, name), h("dd", {}, value)];
  }

  function pickBox(runId) {
    const box = h("input", {
      type: "checkbox",
      "data-testid": "pick",
      checked: picked.has(runId),
      onchange: () => {
        if (box.checked) picked.add(runId);
        else picked.delete(runId);
        compareButton.disabled = picked.size < 2;
      },
    });
    return box;
  }

  function render(sweep) {
    status.className = `status s-${sweep.status}`;
    status.textContent = sweep.status;
    stopButton.disabled = sweep.status === "finished";
    const best = sweep.best;
    const bestFact = best
      ? h("span", { "data-testid": "best-run" },
        h("a", { href: `#/runs/${best.run_id}` }, best.run_id), ` ${sweep.metric} ${fmt(best.value)}`,
        best.final ? "" : h("span", { class: "muted" }, " (so far: runs are still going)"))
      : h("span", { class: "muted", "data-testid": "best-run" }, `none yet: no run has recorded ${sweep.metric}`);
    facts.replaceChildren(
      ...fact("environment", sweep.environment),
      ...fact("metric", `${sweep.metric} (${sweep.goal === "min" ? "lowest" : "highest"} is best)`),
      ...fact("best run", bestFact),
      ...fact("runs", `${sweep.runs_finished} of ${sweep.runs_total} finished: ${countsText(sweep.counts)}`),
      ...fact("shared overrides", Object.entries(sweep.base || {}).map(([k, v]) => `${k} ${shown(v)}`).join(" · ") || "none"),
      ...fact("created", (sweep.created_at || "–").replace("T", " ").slice(0, 19)),
    );

    // Columns: every field some run overrides (in the order the sweep gave them), then the
    // sweep's metric, then the other summary metrics that some run has.
    const fields = [...new Set(sweep.runs.flatMap((run) => Object.keys(run.overrides)))];
    const others = SUMMARY.filter((m) => m !== sweep.metric && sweep.runs.some((run) => run.metrics?.[m] !== null && run.metrics?.[m] !== undefined));
    const all = h("input", {
      type: "checkbox",
      "data-testid": "pick-all",
      title: "Pick every run",
      checked: sweep.runs.length > 0 && sweep.runs.every((run) => picked.has(run.run_id)),
      onchange: () => {
        for (const run of sweep.runs) {
          if (all.checked) picked.add(run.run_id);
          else picked.delete(run.run_id);
        }
        render(sweep);
      },
    });
    const head = h("tr", {}, h("th", {}, all), h("th", {}, "run"),
      fields.map((f) => h("th", { dataset: { field: f } }, f)),
      h("th", {}, "status"), h("th", {}, "step"), h("th", { class: "metric" }, sweep.metric),
      others.map((m) => h("th", {}, m)), h("th", {}, "failure"));
    const rows = sweep.runs.map((run) => {
      const isBest = best?.run_id === run.run_id;
      const cell = (col, ...content) => h("td", { dataset: { col } }, ...content);
      return h("tr", { class: isBest ? "best" : "", dataset: { runId: run.run_id, best: String(isBest) } },
        h("td", {}, pickBox(run.run_id)),
        h("td", {},
          h("a", { "data-testid": "run-link", href: `#/runs/${run.run_id}` }, run.run_id),
          isBest ? h("span", { class: "best-mark", "data-testid": "best-mark", title: best.final ? "The best run" : "The best run so far" }, best.final ? "★ best" : "★ best so far") : null),
        fields.map((f) => h("td", { dataset: { col: "override", field: f } }, shown(run.overrides[f]))),
        cell("status", statusBadge(run.status)),
        cell("step", `${run.step} / ${run.total_steps}`),
        cell("value", fmt(run.value)),
        others.map((m) => h("td", { dataset: { col: m } }, fmt(run.metrics?.[m]))),
        cell("failure", run.failure_kind || ""));
    });
    table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows));
    compareButton.disabled = picked.size < 2;
  }

  async function refresh() {
    let sweep;
    try {
      sweep = await api(`/sweeps/${encodeURIComponent(sweepId)}`);
    } catch (e) {
      error.textContent = e.detail;
      return;
    }
    if (cancelled) return;
    error.textContent = "";
    render(sweep);
    if (sweep.status === "finished" && timer) {
      clearInterval(timer);
      timer = null;
    }
  }

  async function stop() {
    stopButton.disabled = true;
    try {
      const answer = await api(`/sweeps/${encodeURIComponent(sweepId)}/stop`, { method: "POST" });
      result.className = "ok";
      result.textContent = answer.runs.length ? `stop requested for ${answer.runs.length} run${answer.runs.length > 1 ? "s" : ""}` : "every run had already finished";
    } catch (e) {
      result.className = "error";
      result.textContent = e.detail;
    }
    refresh();
  }

  refresh();
  timer = setInterval(refresh, 2000);
  return () => {
    cancelled = true;
    if (timer) clearInterval(timer);
  };
}
