// The dashboard: a hash router over the pages, the connection badge (a /health poll every
// 2 s, which also brings the page back by itself after the server returns) and the token
// dialog a 401 opens.

import { onConnection, ping, setToken, token, whenTokenNeeded } from "/static/js/api.js";
import * as compare from "/static/js/pages/compare.js";
import * as engine from "/static/js/pages/engine.js";
import * as newRun from "/static/js/pages/new_run.js";
import * as run from "/static/js/pages/run.js";
import * as runs from "/static/js/pages/runs.js";
import * as sweep from "/static/js/pages/sweep.js";
import * as sweeps from "/static/js/pages/sweeps.js";
import * as tryModel from "/static/js/pages/try.js";

const PAGES = { runs, run, sweeps, sweep, compare, new: newRun, try: tryModel, engine };
// A page's nav link: a run's page is under Runs, a sweep's under Sweeps.
const NAV = { run: "runs", sweep: "sweeps" };
const main = document.getElementById("page");
let cleanup = null;

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  let page = "runs";
  let arg = null;
  if (parts[0] === "runs" && parts[1]) [page, arg] = ["run", parts[1]];
  else if (parts[0] === "sweeps") [page, arg] = parts[1] ? ["sweep", parts[1]] : ["sweeps", null];
  else if (parts[0] === "compare") [page, arg] = ["compare", parts[1] || ""];
  else if (parts[0] === "new") [page, arg] = ["new", parts[1] || null];
  else if (parts[0] === "try") page = "try";
  else if (parts[0] === "engine") page = "engine";
  return { page, arg: arg && decodeURIComponent(arg) };
}

function show() {
  if (cleanup) cleanup();
  const { page, arg } = route();
  main.replaceChildren();
  main.dataset.page = page;
  for (const link of document.querySelectorAll("header nav a")) {
    const target = link.getAttribute("href");
    link.classList.toggle("active", target === `#/${NAV[page] || page}`);
  }
  cleanup = PAGES[page].mount(main, arg) || null;
}

const badge = document.getElementById("conn-status");
onConnection((up) => {
  badge.textContent = up ? "connected" : "disconnected";
  badge.className = `conn ${up ? "conn-ok" : "conn-down"}`;
});

const launcher = document.getElementById("launcher");
async function poll() {
  const health = await ping();
  if (health) {
    const where = health.launcher?.kind === "ray" ? ` · Ray ${health.launcher.reachable ? "" : "unreachable"}` : "";
    launcher.textContent = `${health.backend} backend · ${health.active_runs} active${where}`;
  }
}
poll();
setInterval(poll, 2000);

const dialog = document.getElementById("token-dialog");
const input = document.getElementById("token-input");
function askToken() {
  if (dialog.open) return;
  input.value = token();
  dialog.showModal();
}
dialog.addEventListener("close", () => {
  if (dialog.returnValue === "save") {
    setToken(input.value.trim());
    show();
  }
});
document.getElementById("token-button").addEventListener("click", askToken);
whenTokenNeeded(askToken);

window.addEventListener("hashchange", show);
show();
