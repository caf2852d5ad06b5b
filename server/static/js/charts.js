// Metric charts on uPlot (vendored: /static/vendor/uPlot.esm.js, MIT licence beside it): one
// chart per metric key, grouped by the key's prefix, drag to zoom, double-click to reset,
// hover for values. A chart keeps its element and is given new data as the run goes on.

import uPlot from "/static/vendor/uPlot.esm.js";
import { h } from "/static/js/dom.js";

const COLORS = ["#2857c5", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c"];

export function metricKeys(rows) {
  const keys = new Set();
  for (const row of rows) for (const key of Object.keys(row)) if (key !== "step") keys.add(key);
  return [...keys].sort();
}

export function groupOf(key) {
  const cut = key.indexOf("/");
  return cut > 0 ? key.slice(0, cut) : "summary";
}

// [steps, values of series 1, ...] aligned on the union of steps; gaps are null.
export function align(seriesRows, key) {
  const steps = new Set();
  const byStep = seriesRows.map((rows) => {
    const map = new Map();
    for (const row of rows) {
      if (row[key] === undefined || row[key] === null) continue;
      map.set(row.step, row[key]);
      steps.add(row.step);
    }
    return map;
  });
  const xs = [...steps].sort((a, b) => a - b);
  return [xs, ...byStep.map((map) => xs.map((x) => (map.has(x) ? map.get(x) : null)))];
}

// A set of charts in `container`, one per key, kept up to date by `update`.
export class ChartBoard {
  constructor(container, seriesNames) {
    this.container = container;
    this.seriesNames = seriesNames;
    this.charts = new Map();
    this.groups = new Map();
  }

  update(seriesRows) {
    const keys = new Set(seriesRows.flatMap((rows) => metricKeys(rows)));
    for (const key of [...keys].sort()) {
      const data = align(seriesRows, key);
      const points = data.slice(1).reduce((n, ys) => n + ys.filter((y) => y !== null).length, 0);
      let chart = this.charts.get(key);
      if (!chart) chart = this.add(key, data);
      else chart.plot.setData(data);
      chart.el.dataset.points = String(points);
    }
  }

  add(key, data) {
    const group = this.group(groupOf(key));
    const target = h("div");
    const el = h(
      "div",
      { class: "chart", dataset: { metric: key, points: "0", series: String(this.seriesNames.length) } },
      h("div", { class: "chart-title" }, key),
      target,
    );
    group.append(el);
    const width = Math.max(300, (el.clientWidth || 420) - 10);
    const opts = {
      width,
      height: 180,
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false } },
      axes: [{ label: "step", size: 36 }, { size: 58, values: (u, ticks) => ticks.map(tick) }],
      series: [
        { label: "step" },
        ...this.seriesNames.map((name, i) => ({
          label: name,
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: true,
          points: { show: data[0].length < 60 },
        })),
      ],
    };
    const plot = new uPlot(opts, data, target);
    const chart = { el, plot };
    this.charts.set(key, chart);
    return chart;
  }

  group(name) {
    let group = this.groups.get(name);
    if (!group) {
      const grid = h("div", { class: "charts" });
      const section = h("div", { dataset: { group: name } }, h("h3", {}, name), grid);
      const after = [...this.groups.keys()].sort(byOrder).find((other) => byOrder(other, name) > 0);
      if (after) this.container.insertBefore(section, this.groups.get(after).parentElement);
      else this.container.append(section);
      this.groups.set(name, grid);
      group = grid;
    }
    return group;
  }

  resize() {
    for (const { el, plot } of this.charts.values()) {
      plot.setSize({ width: Math.max(300, el.clientWidth - 10), height: 180 });
    }
  }

  destroy() {
    for (const { plot } of this.charts.values()) plot.destroy();
    this.charts.clear();
  }
}

// An axis label that tells 0.012 from 0.014 (uPlot's default rounds small ranges to "0").
function tick(value) {
  if (value === 0) return "0";
  const size = Math.abs(value);
  if (size >= 1000 || size < 0.001) return value.toExponential(1);
  return String(Number(value.toPrecision(3)));
}

// Groups in name order, but "summary" first and "cost" (what the run spent so far) last.
function byOrder(a, b) {
  const [x, y] = [a, b].map((name) => (name === "summary" ? "" : name === "cost" ? "\uffff" : name));
  return x < y ? -1 : x > y ? 1 : 0;
}
