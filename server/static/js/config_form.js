// A form built from an environment's config JSON schema: a control per field with its type
// and bounds (numbers, booleans, choices, text, JSON for objects), locked fields read-only, and
// a place beside each field for the server's `detail` about it.

import { h } from "/static/js/dom.js";

function plain(prop, defs = {}) {
  // A `$ref` (an enum class of an Atropos environment's config) points into the schema's $defs.
  const deref = (p) => (p.$ref ? { ...defs[p.$ref.split("/").pop()], ...p } : p);
  // `X | None` comes as anyOf [X, null]: the control is X's, and empty means null.
  if (prop.anyOf) {
    const other = deref(prop.anyOf.find((p) => p.type !== "null") || {});
    return { ...prop, ...other, nullable: prop.anyOf.some((p) => p.type === "null") };
  }
  return deref(prop);
}

function control(name, prop, value, locked, defs) {
  const p = plain(prop, defs);
  const common = { name, id: `f-${name}`, disabled: locked, title: p.description || "" };
  if (p.enum) {
    return h("select", common, p.enum.map((v) => h("option", { value: v, selected: v === value }, v)));
  }
  if (p.type === "boolean") return h("input", { ...common, type: "checkbox", checked: Boolean(value) });
  if (p.type === "integer" || p.type === "number") {
    return h("input", {
      ...common,
      type: "number",
      step: p.type === "integer" ? "1" : "any",
      min: p.minimum ?? p.exclusiveMinimum,
      max: p.maximum ?? p.exclusiveMaximum,
      placeholder: p.nullable ? "automatic" : "",
      value: value === null || value === undefined ? "" : String(value),
    });
  }
  // A locked value without a schema (what an Atropos environment's servers are) shows as JSON.
  if (p.type === "object" || p.type === "array" || (value !== null && typeof value === "object")) {
    return h("textarea", { ...common, rows: 2, value: JSON.stringify(value ?? (p.type === "array" ? [] : {})) });
  }
  return h("input", { ...common, type: "text", placeholder: p.nullable ? "none" : "", value: value ?? "" });
}

export class ConfigForm {
  constructor(view) {
    this.view = view; // GET /environments/{name}/config
    this.props = view.schema.properties || {};
    this.defs = view.schema.$defs || {};
    this.el = h("form", { class: "config", "data-testid": "config-form", onsubmit: (e) => e.preventDefault() });
    const fields = { ...view.configurable_fields, ...view.locked_fields };
    for (const name of Object.keys(fields)) {
      const locked = name in view.locked_fields;
      const prop = this.props[name] || {};
      const hint = (prop.description || "") + (locked ? " (decided by the server)" : "");
      this.el.append(
        h("label", { for: `f-${name}` }, name),
        control(name, prop, fields[name], locked, this.defs),
        h("div", { class: "hint" }, hint),
        h("div", { dataset: { errorFor: name } }),
      );
    }
  }

  value(name) {
    const el = this.el.elements.namedItem(name);
    const p = plain(this.props[name] || {}, this.defs);
    if (el.type === "checkbox") return el.checked;
    const raw = el.value;
    if (p.type === "integer" || p.type === "number") {
      if (raw.trim() === "") return p.nullable ? null : raw;
      return Number(raw);
    }
    if (p.type === "object" || p.type === "array") {
      try {
        return JSON.parse(raw);
      } catch {
        return raw; // sent as typed: the server says what is wrong with it
      }
    }
    if (p.nullable && raw === "") return null;
    return raw;
  }

  // The editable fields whose value differs from the stored config.
  changes() {
    const out = {};
    for (const [name, stored] of Object.entries(this.view.configurable_fields)) {
      const value = this.value(name);
      if (JSON.stringify(value) !== JSON.stringify(stored)) out[name] = value;
    }
    return out;
  }

  clearErrors() {
    for (const el of this.el.querySelectorAll("[data-error-for]")) el.textContent = "";
  }

  // Put the server's detail next to the field it names; false when it names none here.
  showError(field, detail) {
    const el = field && this.el.querySelector(`[data-error-for="${CSS.escape(field)}"]`);
    if (!el) return false;
    el.textContent = detail;
    this.el.elements.namedItem(field)?.focus();
    return true;
  }
}
