// The engine host: the one process that holds every local model (GET /engine, polled every
// 2 s): its pid and uptime, the base models it holds with their size, the adapters in its
// samplers' slots, its decode queue, and its clients (the server, each run) with what each holds.

import { api } from "/static/js/api.js";
import { duration, h } from "/static/js/dom.js";

function mib(bytes) {
  return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}

export function mount(main) {
  const error = h("div", { class: "error" });
  const summary = h("p", { "data-testid": "engine-summary" });
  const bases = h("tbody");
  const clients = h("tbody");
  const table = (testid, heads, body) =>
    h("table", { "data-testid": testid }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), body);
  main.append(
    h("section", {},
      h("h2", {}, "Engine"),
      h("p", { class: "muted" }, "One process per machine holds the models of every run, Tinker session and /v1 request, each base model once (rlctl engine)."),
      error, summary,
      h("h3", {}, "Base models"), table("engine-bases", ["model", "size", "users"], bases),
      h("h3", {}, "Clients"), table("engine-clients", ["client", "role", "pid", "models", "samplers", "jobs", "connected"], clients)),
  );

  async function refresh() {
    try {
      const engine = await api("/engine");
      error.textContent = "";
      if (!engine.running) {
        summary.textContent = "No engine host is running: it starts when a run, a Tinker session or a /v1 request needs a model.";
        bases.replaceChildren();
        clients.replaceChildren();
        return;
      }
      const up = Date.now() / 1000 - engine.started_at;
      summary.textContent = `pid ${engine.pid}, up ${duration(up)} · ${engine.adapters_resident} adapter(s) in its slots · ${engine.decode_queue} sample request(s) waiting` +
        (engine.memory_budget_bytes ? ` · memory budget ${mib(engine.memory_budget_bytes)}` : "");
      bases.replaceChildren(...engine.bases.map((b) => h("tr", { dataset: { base: b.name } }, h("td", {}, b.name), h("td", {}, mib(b.bytes)), h("td", {}, String(b.users)))));
      if (!engine.bases.length) bases.append(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "No model loaded.")));
      clients.replaceChildren(...engine.clients.map((c) => {
        const run = c.client.startsWith("run ") ? c.client.slice(4) : null;
        return h("tr", { dataset: { client: c.client } },
          h("td", {}, run ? h("a", { href: `#/runs/${run}` }, c.client) : c.client),
          h("td", {}, c.role), h("td", {}, String(c.pid)), h("td", {}, String(c.models)),
          h("td", {}, String(c.samplers)), h("td", {}, String(c.jobs)),
          h("td", { class: "muted" }, duration(Date.now() / 1000 - c.connected_at)));
      }));
    } catch (e) {
      error.textContent = e.detail;
    }
  }

  refresh();
  const timer = setInterval(refresh, 2000);
  return () => clearInterval(timer);
}
