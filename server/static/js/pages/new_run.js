// Start a run: the selected environment's config as a form; start a run with the values
// shown, or store them as the environment's config. The server's validation errors appear
// next to the field they name.

import { api, fieldOf } from "/static/js/api.js";
import { ConfigForm } from "/static/js/config_form.js";
import { h } from "/static/js/dom.js";

export function mount(main, envName) {
  const select = h("select", { "data-testid": "env-select", onchange: () => { location.hash = `#/new/${select.value}`; } });
  const holder = h("div");
  const formError = h("div", { class: "error", "data-testid": "form-error" });
  const formResult = h("div", { class: "ok", "data-testid": "form-result" });
  const start = h("button", { class: "primary", type: "button", "data-testid": "start-run", onclick: startRun }, "Start run");
  const save = h("button", { type: "button", "data-testid": "save-config", onclick: saveConfig }, "Save as the environment's config");
  const description = h("div", { class: "muted" });
  main.append(
    h("section", {},
      h("div", { class: "toolbar" }, h("h2", { style: "margin:0" }, "New run"), select, description),
      h("p", { class: "muted" }, "The form shows the environment's stored config. Start a run with the values shown (changes apply to this run only), or save them as the environment's config for later runs."),
      holder,
      h("div", { class: "toolbar", style: "margin-top:12px" }, start, save, formResult),
      formError),
  );
  let form = null;

  (async () => {
    try {
      const envs = await api("/environments");
      const name = envName || envs[0]?.name;
      for (const env of envs) {
        const label = env.framework === "atropos" ? `${env.name} (Atropos)` : env.name;
        select.append(h("option", { value: env.name, selected: env.name === name }, label));
      }
      const env = envs.find((e) => e.name === name);
      // Servers that predate `framework` only list our own environments.
      const framework = env?.framework === "atropos" ? "Atropos environment" : "";
      description.textContent = env ? [framework, env.description].filter(Boolean).join(": ") : "";
      if (!name) return;
      const view = await api(`/environments/${encodeURIComponent(name)}/config`);
      form = new ConfigForm(view);
      holder.replaceChildren(form.el);
    } catch (e) {
      formError.textContent = e.detail || String(e);
    }
  })();

  function failed(e) {
    if (!form.showError(fieldOf(e.detail), e.detail)) formError.textContent = e.detail;
  }

  function begin() {
    form.clearErrors();
    formError.textContent = "";
    formResult.textContent = "";
  }

  async function startRun() {
    if (!form) return;
    begin();
    start.disabled = true;
    try {
      const created = await api("/runs", { method: "POST", body: { environment: form.view.environment, ...form.changes() } });
      location.hash = `#/runs/${created.run_id}`;
    } catch (e) {
      failed(e);
    } finally {
      start.disabled = false;
    }
  }

  async function saveConfig() {
    if (!form) return;
    begin();
    const changes = form.changes();
    if (!Object.keys(changes).length) {
      formResult.textContent = "Nothing changed.";
      return;
    }
    try {
      const view = await api(`/environments/${encodeURIComponent(form.view.environment)}/config`, { method: "PUT", body: { values: changes } });
      form.view = view;
      formResult.textContent = `Saved ${Object.keys(changes).join(", ")} (version ${view.version}).`;
    } catch (e) {
      failed(e);
    }
  }
  return null;
}
