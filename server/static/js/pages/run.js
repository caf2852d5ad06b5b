// One run: its status and progress, where it came from (source, fork parent, sweep) and its
// forks, what it spent, a chart of every metric (live while it runs), what its model said
// (rollouts), the frozen config, checkpoints, the W&B link, the live log with its end event,
// stop and resume.

import { api, history, streamEvents } from "/static/js/api.js";
import { ChartBoard } from "/static/js/charts.js";
import { costFacts } from "/static/js/cost.js";
import { FINISHED, duration, fmt, h, stepOf } from "/static/js/dom.js";
import { RolloutsView } from "/static/js/rollouts.js";
import { forkOf, frameworks, sourceLabel, sweepOf } from "/static/js/run_origin.js";

// A parent's forks are found among the newest runs (GET /runs has each run's parent id).
const FORK_SCAN = 1000;

export function mount(main, runId) {
  const aborter = new AbortController();
  let timer = null;
  let lastStep = -1;
  let lastStatus = null;
  let envFrameworks = new Map();
  let forks = [];
  const name = h("span", { "data-testid": "run-name", class: "muted" });
  const title = h("h2", { style: "margin:0" }, "Run ", h("span", { "data-testid": "run-id" }, runId), " ", name);
  const status = h("span", { "data-testid": "run-status", class: "status" }, "…");
  const step = h("span", { "data-testid": "run-step" }, "");
  const facts = h("dl", { class: "facts" });
  const details = h("div", { "data-testid": "run-details", class: "muted" });
  const result = h("div", { "data-testid": "action-result", class: "ok" });
  const stopButton = h("button", { "data-testid": "stop-run", onclick: stop }, "Stop");
  const resumeButton = h("button", { "data-testid": "resume-run", onclick: resume }, "Resume");
  const tryLink = h("a", { href: `#/try` }, "Try its weights");
  const charts = h("div", { "data-testid": "charts" });
  const noCharts = h("div", { class: "muted" }, "No metrics yet: they appear after the first step.");
  const config = h("pre", { "data-testid": "run-config", class: "light" });
  const checkpoints = h("table", { "data-testid": "checkpoints" });
  const log = h("pre", { "data-testid": "run-log" });
  const logEnd = h("div");
  const board = new ChartBoard(charts, [runId]);
  const rollouts = new RolloutsView(runId);

  main.append(
    h("section", {},
      h("div", { class: "toolbar" }, title, status, step, h("span", { class: "spacer" }), result, stopButton, resumeButton, tryLink),
      facts, details),
    h("section", {}, h("h2", {}, "Metrics"), noCharts, charts),
    rollouts.el,
    h("div", { class: "grid2" },
      h("section", {}, h("h2", {}, "Log"), log, logEnd),
      h("section", {}, h("h2", {}, "Checkpoints"), checkpoints, h("h2", { style: "margin-top:14px" }, "Frozen config"), config)),
  );

  function fact(name, value) {
    return [h("dt", {}, name), h("dd", {}, value)];
  }

  async function refresh() {
    let run;
    try {
      run = await api(`/runs/${runId}`);
    } catch (e) {
      details.textContent = e.detail;
      details.className = "error";
      return;
    }
    status.className = `status s-${run.status}`;
    status.textContent = run.status;
    step.textContent = stepOf(run);
    name.textContent = run.display_name || "";
    const wandb = run.wandb_url ? h("a", { "data-testid": "wandb-link", href: run.wandb_url, target: "_blank", rel: "noopener" }, "W&B run") : "–";
    const forkLinks = forks.map((child) => h("a", { "data-testid": "fork-link", href: `#/runs/${child.run_id}` }, child.run_id));
    facts.replaceChildren(
      ...fact("source", sourceLabel(run, envFrameworks)),
      ...(run.parent_run_id ? fact("parent", forkOf(run)) : []),
      ...(run.sweep_id ? fact("sweep", sweepOf(run)) : []),
      ...(forks.length ? fact("forks", h("span", { "data-testid": "forks" }, forkLinks.flatMap((a, i) => (i ? [", ", a] : [a])))) : []),
      ...fact("environment", run.environment),
      ...fact("model", run.model_name || "–"),
      ...fact("reward (latest)", fmt(run.metrics?.reward_mean)),
      ...fact("correct (latest)", fmt(run.metrics?.percent_correct)),
      ...fact("time per step", duration(run.progress?.time_per_step_s)),
      ...fact("ETA", run.status === "running" ? duration(run.progress?.eta_s) : "–"),
      ...fact("attempt", String(run.attempt)),
      ...costFacts(run.cost).flatMap(([name, value]) => fact(name, value)),
      ...fact("metrics from", run.metrics_source + (run.metrics_note ? ` (${run.metrics_note})` : "")),
      ...fact("W&B", wandb),
      ...fact("weights", run.weights_path || "–"),
    );
    const why = run.error || (run.stalled ? run.stall_details : run.details);
    details.textContent = why || "";
    details.className = run.error ? "error" : "muted";
    stopButton.disabled = FINISHED.has(run.status) || run.status === "stopping";
    resumeButton.disabled = !FINISHED.has(run.status);
    // A Tinker SDK session is continued by its script (from a saved state), not by the server.
    resumeButton.hidden = run.source === "tinker-api";
    if (!config.textContent) config.textContent = JSON.stringify(run.config, null, 2);
    const changed = run.step !== lastStep || run.status !== lastStatus;
    if (changed) {
      await Promise.all([loadHistory(), loadCheckpoints(), rollouts.refresh()]);
      lastStep = run.step;
      lastStatus = run.status;
    }
    if (FINISHED.has(run.status) && timer) {
      clearInterval(timer);
      timer = null;
    }
  }

  async function loadHistory() {
    const { rows } = await history(runId);
    if (rows.length) {
      noCharts.remove();
      board.update([rows]);
    }
  }

  async function loadCheckpoints() {
    const rows = await api(`/runs/${runId}/checkpoints`);
    checkpoints.replaceChildren(
      h("thead", {}, h("tr", {}, ["step", "kind", "name"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((c) => h("tr", { dataset: { step: String(c.step) }, title: c.path }, h("td", {}, String(c.step)), h("td", {}, c.kind), h("td", {}, c.name)))),
    );
    if (!rows.length) checkpoints.append(h("tbody", {}, h("tr", {}, h("td", { class: "muted" }, "none yet"))));
  }

  async function stop() {
    stopButton.disabled = true;
    try {
      const answer = await api(`/runs/${runId}/stop`, { method: "POST" });
      result.className = "ok";
      result.textContent = `stop requested: ${answer.status}`;
    } catch (e) {
      result.className = "error";
      result.textContent = e.detail;
    }
    refresh();
  }

  async function resume() {
    resumeButton.disabled = true;
    try {
      const answer = await api(`/runs/${runId}/resume`, { method: "POST", body: {} });
      result.className = "ok";
      result.textContent = `resumed from step ${answer.resume_step} (attempt ${answer.attempt}): ${answer.status}`;
      log.textContent = "";
      logEnd.replaceChildren();
      followLog();
      if (!timer) timer = setInterval(refresh, 2000);
    } catch (e) {
      result.className = "error";
      result.textContent = e.detail;
    }
    refresh();
  }

  async function followLog() {
    try {
      await streamEvents(
        `/runs/${runId}/logs?follow=true&tail=200`,
        (event, data) => {
          if (event === "line") {
            const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
            log.append(`${data}\n`);
            if (stick) log.scrollTop = log.scrollHeight;
          } else if (event === "end") {
            const end = JSON.parse(data);
            logEnd.replaceChildren(h("div", { "data-testid": "log-end", class: "muted" }, `log ended: ${end.status}`));
            refresh();
          }
        },
        aborter.signal,
      );
    } catch (e) {
      if (!aborter.signal.aborted) logEnd.replaceChildren(h("div", { class: "error" }, `log: ${e.detail || e.message}`));
    }
  }

  // What the facts need from elsewhere, once: environment frameworks and this run's forks.
  Promise.all([
    api("/environments").then((envs) => { envFrameworks = frameworks(envs); }),
    api(`/runs?limit=${FORK_SCAN}`).then((runs) => { forks = runs.filter((r) => r.parent_run_id === runId).reverse(); }),
  ]).catch(() => {}).then(() => { if (!aborter.signal.aborted) refresh(); });
  refresh();
  rollouts.refresh(); // not waiting for the run's own answer: a step's episodes take longest
  followLog();
  timer = setInterval(refresh, 2000);
  const onResize = () => board.resize();
  window.addEventListener("resize", onResize);
  return () => {
    aborter.abort();
    if (timer) clearInterval(timer);
    window.removeEventListener("resize", onResize);
    board.destroy();
  };
}
