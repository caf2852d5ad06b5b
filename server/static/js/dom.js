// Building elements: h("td", {dataset: {col: "status"}}, "running").

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "class") el.className = value;
    else if (key === "value") el.value = value; // a textarea has no value attribute
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1000 ? value.toFixed(0) : value.toPrecision(digits);
  }
  return String(value);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function statusBadge(status, testid) {
  return h("span", { class: `status s-${status}`, "data-testid": testid }, status);
}

export const FINISHED = new Set(["succeeded", "failed", "stopped"]);

// A run's step of its total; a Tinker SDK session has no total (its script decides when to end).
export function stepOf(run) {
  return run.total_steps ? `${run.step} / ${run.total_steps}` : String(run.step);
}
