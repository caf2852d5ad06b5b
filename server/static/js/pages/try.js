// Try the model: prompts (or tasks drawn from the environment) against the base model or a
// run's trained weights, two side by side, each answer with the environment's score.

import { api } from "/static/js/api.js";
import { fmt, h } from "/static/js/dom.js";

export function mount(main) {
  const env = h("select", { "data-testid": "try-env" });
  const sourceA = h("select", { "data-testid": "try-source-a" }, h("option", { value: "base" }, "base model"));
  const sourceB = h("select", { "data-testid": "try-source-b" }, h("option", { value: "none" }, "none"), h("option", { value: "base" }, "base model"));
  const prompts = h("textarea", { "data-testid": "try-prompts", rows: 4, style: "width:100%", placeholder: "One prompt per line; leave empty to draw tasks from the environment" });
  const numItems = h("input", { "data-testid": "try-num-items", type: "number", min: 1, max: 64, value: "3", style: "width:70px" });
  const maxTokens = h("input", { "data-testid": "try-max-tokens", type: "number", min: 1, max: 4096, value: "128", style: "width:80px" });
  const go = h("button", { class: "primary", "data-testid": "try-go", onclick: run }, "Generate");
  const error = h("div", { class: "error", "data-testid": "try-error" });
  const results = h("div", { class: "try-columns", "data-testid": "try-results" });
  main.append(
    h("section", {},
      h("h2", {}, "Try the model"),
      h("div", { class: "toolbar" }, "environment", env, "A", sourceA, "B", sourceB),
      prompts,
      h("div", { class: "toolbar", style: "margin-top:8px" }, "tasks to draw", numItems, "max tokens", maxTokens, go),
      error),
    h("section", {}, results),
  );

  (async () => {
    try {
      const [envs, runs] = await Promise.all([api("/environments"), api("/runs?limit=100")]);
      for (const e of envs) env.append(h("option", { value: e.name }, e.name));
      for (const run of runs.filter((r) => r.step > 0)) {
        const label = `${run.run_id} (${run.environment}, step ${run.step}, ${run.status})`;
        sourceA.append(h("option", { value: `run:${run.run_id}` }, label));
        sourceB.append(h("option", { value: `run:${run.run_id}` }, label));
      }
    } catch (e) {
      error.textContent = e.detail || String(e);
    }
  })();

  async function ask(source, seed) {
    const lines = prompts.value.split("\n").map((s) => s.trim()).filter(Boolean);
    const body = { environment: env.value, max_tokens: Number(maxTokens.value), seed };
    if (lines.length) body.prompts = lines;
    else body.num_items = Number(numItems.value);
    if (source.startsWith("run:")) body.run_id = source.slice(4);
    return api("/test/inference", { method: "POST", body });
  }

  function column(source, answer) {
    return h("div", { class: "try-column", dataset: { source } },
      h("h3", {}, `${source === "base" ? "base model" : source.slice(4)}: ${answer.model}${answer.adapter ? " + adapter" : ""}`),
      h("div", { class: "muted" }, Object.entries(answer.summary || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ")),
      answer.results.map((r) => h("div", { class: "try-item", dataset: { score: r.score === null ? "" : String(r.score) } },
        h("div", { class: "prompt" }, r.prompt ?? ""),
        h("div", { class: "response" }, r.response),
        h("div", { class: "muted" }, `score ${fmt(r.score)}${r.correct === null ? "" : r.correct ? " · correct" : " · wrong"}${r.truncated ? ` · cut short: ${r.reason}` : ""}`))));
  }

  async function run() {
    error.textContent = "";
    go.disabled = true;
    results.replaceChildren(h("div", { class: "muted" }, "generating…"));
    const sources = [sourceA.value, sourceB.value].filter((s) => s !== "none");
    const seed = Math.floor(Math.random() * 1e9); // both sources get the same drawn tasks
    try {
      const answers = await Promise.all(sources.map((s) => ask(s, seed)));
      results.replaceChildren(...answers.map((answer, i) => column(sources[i], answer)));
    } catch (e) {
      results.replaceChildren();
      error.textContent = e.detail || String(e);
    } finally {
      go.disabled = false;
    }
  }
  return null;
}
