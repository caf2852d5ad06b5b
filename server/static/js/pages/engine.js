// The engine hosts: one per device of this machine (GET /engine, polled every 2 s), each hosting
// the local models of the runs, Tinker sessions and /v1 requests placed on it. A section per
// host: its device, pid and uptime, memory against its budget, the base models it holds (or is
// loading), its training lanes' queues, its samplers' slots and decode queue, and its clients.

import { api } from "/static/js/api.js";
import { duration, h } from "/static/js/dom.js";

// Bytes for people: KiB under a MiB (tiny-random's weights), MiB under a GiB, else GiB.
export function size(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  if (bytes < 2 ** 20) return `${(bytes / 2 ** 10).toFixed(0)} KiB`;
  if (bytes < 2 ** 30) return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}

function table(testid, heads, rows, empty) {
  const body = h("tbody", {}, rows);
  if (!rows.length) body.append(h("tr", {}, h("td", { colspan: heads.length, class: "muted" }, empty)));
  return h("table", { "data-testid": testid },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), body);
}

const cell = (col, ...content) => h("td", { dataset: { col } }, ...content);

function memory(host) {
  const parts = [`${size(host.rss_bytes)} resident`];
  if (host.device_bytes !== null && host.device_bytes !== undefined) {
    parts.push(`GPU ${size(host.device_bytes)}, ${size(host.device_free_bytes)} free`);
  }
  parts.push(`budget ${size(host.memory_budget_bytes)}`);
  return parts.join(" · ");
}

function basesTable(host) {
  const rows = host.bases.map((b) => h("tr", { dataset: { base: b.name, loaded: String(b.loaded) } },
    cell("name", b.name), cell("size", size(b.bytes)), cell("users", String(b.users)),
    cell("state", b.loaded ? "loaded" : "loading")));
  return table("engine-bases", ["model", "size", "users", "state"], rows, "No model loaded.");
}

function lanesTable(host) {
  const rows = host.lanes.map((l) => h("tr", { dataset: { base: l.base, lane: String(l.lane) } },
    cell("base", l.base), cell("lane", String(l.lane)),
    cell("training", l.training ? "yes" : "no"), cell("waiting", String(l.waiting))));
  return table("engine-lanes", ["base", "lane", "training now", "waiting"], rows, "No training lane.");
}

function clientsTable(host, now) {
  const rows = host.clients.map((c) => {
    const run = c.client.startsWith("run ") ? c.client.slice(4) : null;
    return h("tr", { dataset: { client: c.client } },
      cell("client", run ? h("a", { href: `#/runs/${run}` }, c.client) : c.client),
      cell("role", c.role), cell("pid", String(c.pid)), cell("models", String(c.models)),
      cell("samplers", String(c.samplers)), cell("jobs", String(c.jobs)),
      cell("bases", (c.bases || []).join(", ")),
      h("td", { class: "muted", dataset: { col: "connected" } }, duration(now - c.connected_at)));
  });
  return table("engine-clients", ["client", "role", "pid", "models", "samplers", "jobs", "bases", "connected"], rows, "No client.");
}

function hostSection(host, now) {
  // As named (h2 shouts in capitals): "cuda:0", not "CUDA:0".
  const heading = h("h2", { style: "text-transform:none" }, `Host ${host.name} · `, h("span", { "data-testid": "engine-device" }, host.device));
  const attrs = { "data-testid": "engine-host", "data-host": host.name, "data-running": String(host.running) };
  if (!host.running) {
    return h("section", attrs, heading,
      h("p", { "data-testid": "engine-summary" }, "Not running: it starts when a run, a Tinker session or a /v1 request placed here needs a model."),
      h("p", { class: "muted", "data-testid": "engine-log" }, `Its log: ${host.log}`));
  }
  return h("section", attrs, heading,
    h("p", { "data-testid": "engine-summary" },
      `pid ${host.pid}, up ${duration(now - host.started_at)} · ${host.adapters_resident} adapter(s) in its samplers' slots · ${host.decode_queue} sample request(s) waiting`),
    h("p", { "data-testid": "engine-memory" }, `Memory: ${memory(host)}`),
    h("p", { class: "muted", "data-testid": "engine-log" }, `Its log: ${host.log}`),
    h("h3", {}, "Base models"), basesTable(host),
    h("h3", {}, "Training lanes"), lanesTable(host),
    h("h3", {}, "Clients"), clientsTable(host, now));
}

export function mount(main) {
  const error = h("div", { class: "error" });
  const node = h("p", { "data-testid": "engine-node" });
  const hosts = h("div", { "data-testid": "engine-hosts" });
  main.append(
    h("section", {},
      h("h2", {}, "Engine"),
      h("p", { class: "muted" }, "One engine host per device (each GPU; the CPU on a machine without one) holds the models of the runs, Tinker sessions and /v1 requests placed on it, each base model once (rlctl engine)."),
      error, node),
    hosts,
  );

  async function refresh() {
    try {
      const engine = await api("/engine");
      error.textContent = "";
      const running = engine.hosts.filter((host) => host.running).length;
      node.textContent = `Machine ${engine.node}: ${engine.hosts.length} host(s), ${running} running.`;
      const now = Date.now() / 1000;
      hosts.replaceChildren(...engine.hosts.map((host) => hostSection(host, now)));
    } catch (e) {
      error.textContent = e.detail || e.message;
    }
  }

  refresh();
  const timer = setInterval(refresh, 2000);
  return () => clearInterval(timer);
}
