// What a run spent (its `cost`): the money where a price applies, else its device time and
// tokens; the run page's lines with the counts, the prices used and why money is missing.

import { duration, h } from "/static/js/dom.js";

export function money(amount, currency) {
  const shown = amount >= 1 ? amount.toFixed(2) : amount.toPrecision(4).replace(/\.?0+$/, "");
  return `${shown} ${currency || ""}`.trim();
}

export function tokens(count) {
  if (count === null || count === undefined) return "–";
  for (const [size, unit] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (count >= size) return `${Number((count / size).toPrecision(3))}${unit}`;
  }
  return String(count);
}

// A list's cell: "0.0012 USD", or "42 s · 12.3k tok" when nothing is priced.
export function costCell(cost) {
  if (!cost) return "–";
  if (cost.money !== null && cost.money !== undefined) return money(cost.money, cost.currency);
  if (cost.device_s == null && cost.tokens == null) return "–";
  return `${duration(cost.device_s)} · ${tokens(cost.tokens)} tok`;
}

// The run page's facts: [name, value] pairs.
export function costFacts(cost) {
  if (!cost) return [];
  const held = cost.device_s == null ? "–" : `${duration(cost.device_s)}${cost.device ? ` on ${cost.device}` : ""}`;
  const counts = ["prefill", "sampled", "trained"].map((kind) => `${tokens(cost[`tokens_${kind}`])} ${kind}`).join(", ");
  const priced = cost.money !== null && cost.money !== undefined;
  const spent = h("span", { "data-testid": "run-cost", title: cost.basis || "" }, priced ? money(cost.money, cost.currency) : "–");
  const facts = [["device time", held], ["tokens", counts], ["cost", spent]];
  if (cost.note) facts.push(["cost note", h("span", { class: "muted", "data-testid": "run-cost-note" }, cost.note)]);
  if (cost.basis) facts.push(["priced by", h("span", { class: "muted" }, cost.basis)]);
  return facts;
}
