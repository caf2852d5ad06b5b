// A run's Rollouts view: a step slider over its recorded steps, a reward filter, the step's
// episodes (the best and the worst first), a group's episodes side by side with their rewards
// and advantages, one prompt's completions across steps, and in every episode the model's
// tokens told apart from the environment's text. Episode text is untrusted: it only ever goes
// into the page as text (h() appends strings as text nodes), never as HTML.

import { api } from "/static/js/api.js";
import { fmt, h } from "/static/js/dom.js";

const PAGE = 1000; // episodes per request (the API's most)
const MAX_PAGES = 5; // a step's episodes shown at most: PAGE * MAX_PAGES
const PREVIEW = 160; // characters of a completion in the table
const COLUMNS = [
  ["group", "click: this group's episodes side by side"],
  ["#", "click: this episode in full"],
  ["reward", "the episode's return"],
  ["advantage", "what its tokens were trained with (– : not trained on)"],
  ["finish", "stop: the model ended its turn; length: cut at max tokens"],
  ["tokens", "the model's tokens"],
  ["completion", "the model's text (its start)"],
];

export class RolloutsView {
  constructor(runId) {
    this.runId = runId;
    this.steps = [];
    this.items = [];
    this.loading = 0;
    this.slider = h("input", { type: "range", min: "0", max: "0", value: "0", "data-testid": "rollouts-step", disabled: true, oninput: () => this.showStepLabel(), onchange: () => this.loadStep() });
    this.stepLabel = h("span", { "data-testid": "rollouts-step-label", class: "muted" }, "no steps recorded yet");
    this.minReward = h("input", { type: "number", step: "any", placeholder: "min", "data-testid": "rollouts-min-reward", style: "width:80px", onchange: () => this.loadStep() });
    this.maxReward = h("input", { type: "number", step: "any", placeholder: "max", "data-testid": "rollouts-max-reward", style: "width:80px", onchange: () => this.loadStep() });
    this.summary = h("div", { "data-testid": "rollouts-summary", class: "muted" });
    this.error = h("div", { class: "error", "data-testid": "rollouts-error" });
    this.ends = h("div", { class: "rollout-ends", "data-testid": "rollouts-ends" });
    // One listener for the table's rows (a step may have thousands): a group or an index.
    this.table = h("div", { "data-testid": "rollouts-table", class: "rollouts-list", onclick: (e) => this.onTableClick(e) });
    this.detail = h("div", { "data-testid": "rollouts-detail" });
    this.el = h("section", { "data-testid": "rollouts" },
      h("h2", {}, "Rollouts"),
      h("div", { class: "toolbar" }, "step", this.slider, this.stepLabel, h("span", { class: "spacer" }), "reward from", this.minReward, "to", this.maxReward),
      this.summary, this.error, this.ends, this.detail,
      h("div", { class: "rollouts-scroll" }, this.table));
  }

  // The run's recorded steps, again (a running run adds some); the slider follows the newest
  // step while it is on it. One refresh at a time: calls meanwhile share it.
  refresh() {
    if (!this.refreshing) this.refreshing = this.reload().finally(() => { this.refreshing = null; });
    return this.refreshing;
  }

  async reload() {
    let record;
    try {
      record = await api(`/runs/${this.runId}/rollouts/steps`);
    } catch (e) {
      this.error.textContent = e.detail;
      return;
    }
    const atNewest = !this.steps.length || Number(this.slider.value) === this.steps.length - 1;
    const before = this.steps.length;
    this.steps = record.steps;
    if (!this.steps.length) {
      this.stepLabel.textContent = record.rollouts_per_step ? "no steps recorded yet" : "this run records no rollouts (rollouts_per_step is 0)";
      return;
    }
    this.slider.disabled = false;
    this.slider.max = String(this.steps.length - 1);
    if (atNewest) this.slider.value = String(this.steps.length - 1);
    this.showStepLabel();
    if (atNewest && this.steps.length !== before) await this.loadStep();
  }

  current() {
    return this.steps[Number(this.slider.value)];
  }

  showStepLabel() {
    const step = this.current();
    if (!step) return;
    this.stepLabel.textContent = `step ${step.step} (${this.steps[0].step}–${this.steps[this.steps.length - 1].step})`;
  }

  async fetchAll(params) {
    const items = [];
    let cursor = null;
    for (let page = 0; page < MAX_PAGES; page++) {
      const query = new URLSearchParams({ ...params, limit: String(PAGE) });
      if (cursor) query.set("cursor", cursor);
      const answer = await api(`/runs/${this.runId}/rollouts?${query}`);
      items.push(...answer.items);
      cursor = answer.next_cursor;
      if (!cursor) break;
    }
    return items;
  }

  async loadStep() {
    const step = this.current();
    if (!step) return;
    const ticket = ++this.loading;
    const params = { step: String(step.step) };
    if (this.minReward.value !== "") params.min_reward = this.minReward.value;
    if (this.maxReward.value !== "") params.max_reward = this.maxReward.value;
    let items;
    try {
      items = await this.fetchAll(params);
    } catch (e) {
      this.error.textContent = e.detail;
      return;
    }
    if (ticket !== this.loading) return; // a later choice of step or filter won
    this.error.textContent = "";
    this.items = items;
    const rewards = `reward mean ${fmt(step.reward_mean)} (min ${fmt(step.reward_min)}, max ${fmt(step.reward_max)})`;
    const shown = items.length === step.kept ? "" : `, ${items.length} shown`;
    this.summary.textContent = `step ${step.step}: ${step.sampled} episodes sampled, ${step.kept} kept${shown} · ${rewards}${step.note ? ` · ${step.note}` : ""}`;
    this.renderEnds(items);
    this.renderTable(items);
    this.detail.replaceChildren();
  }

  renderEnds(items) {
    const rewarded = items.filter((i) => i.reward !== null);
    if (!rewarded.length) {
      this.ends.replaceChildren();
      return;
    }
    let best = rewarded[0];
    let worst = rewarded[0];
    for (const item of rewarded) {
      if (item.reward > best.reward) best = item;
      if (item.reward < worst.reward) worst = item;
    }
    this.ends.replaceChildren(
      h("div", { "data-testid": "rollouts-best" }, h("h3", {}, "Best"), this.card(best)),
      h("div", { "data-testid": "rollouts-worst" }, h("h3", {}, "Worst"), this.card(worst)),
    );
  }

  // Rows as a grid of divs, not a table: a row the scroll box does not show is not laid out
  // (content-visibility), so a step of thousands opens as fast as one of tens.
  renderTable(items) {
    const head = h("div", { class: "rollout-row head" }, COLUMNS.map(([name, title]) => h("span", { title }, name)));
    const rows = items.map((item, at) => h("div", { class: item.trained ? "rollout-row" : "rollout-row untrained", dataset: { at: String(at) } },
      h("span", { class: "link", "data-testid": "rollout-group" }, String(item.group)),
      h("span", { class: "link", "data-testid": "rollout-open" }, String(item.index)),
      h("span", { dataset: { col: "reward" } }, fmt(item.reward)),
      h("span", { dataset: { col: "advantage" } }, fmt(item.advantage)),
      h("span", {}, item.finish_reason || "–"),
      h("span", {}, String(item.completion_tokens)),
      h("span", { class: "completion", dataset: { col: "completion" } }, item.completion.slice(0, PREVIEW))));
    this.table.replaceChildren(head, ...rows);
    if (!items.length) this.table.append(h("div", { class: "muted" }, "no episodes match"));
  }

  onTableClick(event) {
    const cell = event.target.closest(".link");
    const row = cell && cell.closest(".rollout-row[data-at]");
    if (!row) return;
    const item = this.items[Number(row.dataset.at)];
    if (cell.dataset.testid === "rollout-group") this.showGroup(item.group);
    else this.showEpisode(item);
  }

  // One episode in order: the environment's text and the model's tokens, told apart.
  card(item) {
    const head = `#${item.index} · group ${item.group ?? "–"} · reward ${fmt(item.reward)} · advantage ${fmt(item.advantage)} · ${item.finish_reason || "–"}`;
    return h("div", { class: "rollout-card", dataset: { index: String(item.index), step: String(item.step) } },
      h("div", { class: "rollout-head" }, head),
      item.segments.map((s) => h("div", { class: `seg seg-${s.role}`, dataset: { role: s.role }, title: s.role === "model" ? "the model's tokens" : "the environment's text" }, s.text)),
      h("button", { class: "link", "data-testid": "rollout-prompt", onclick: () => this.showPrompt(item) }, "this prompt across steps"));
  }

  showEpisode(item) {
    this.detail.replaceChildren(h("div", { "data-testid": "rollouts-episode" }, h("h3", {}, `Step ${item.step}, episode ${item.index}`), this.card(item)));
  }

  async showGroup(group) {
    const step = this.current();
    try {
      const items = await this.fetchAll({ step: String(step.step), group: String(group) });
      this.detail.replaceChildren(h("div", { "data-testid": "rollouts-group-view" },
        h("h3", {}, `Step ${step.step}, group ${group}: ${items.length} episodes side by side`),
        h("div", { class: "rollout-columns" }, items.map((item) => this.card(item)))));
    } catch (e) {
      this.error.textContent = e.detail;
    }
  }

  async showPrompt(item) {
    try {
      const items = await this.fetchAll({ prompt_key: item.prompt_key });
      const byStep = new Map();
      for (const other of items) {
        if (!byStep.has(other.step)) byStep.set(other.step, []);
        byStep.get(other.step).push(other);
      }
      this.detail.replaceChildren(h("div", { "data-testid": "rollouts-prompt-view" },
        h("h3", {}, `One prompt across ${byStep.size} step${byStep.size === 1 ? "" : "s"}`),
        h("div", { class: "seg seg-env" }, item.prompt),
        [...byStep.entries()].map(([step, group]) => h("div", { class: "prompt-step", dataset: { step: String(step) } },
          h("div", { class: "rollout-head" }, `step ${step}: mean reward ${fmt(group.reduce((s, i) => s + (i.reward ?? 0), 0) / group.length)}`),
          group.map((i) => h("div", { class: "prompt-completion" },
            h("span", { class: "muted" }, `reward ${fmt(i.reward)} · advantage ${fmt(i.advantage)}: `),
            h("span", { class: "seg-model-text" }, i.completion)))))));
    } catch (e) {
      this.error.textContent = e.detail;
    }
  }
}
