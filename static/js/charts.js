/*
 * pgdash: the job page's charts, drawn on <canvas> (heat map, rendezvous) or with the
 * vendored uPlot (latency and bytes over time). Plain ES2018, no build step.
 *
 *   PGCharts.lines(box, {x, series: [{label, values, color, dash}], yFormat, empty})
 *            (no series, or fewer than two x values: the text `empty` instead)
 *   PGCharts.heatmap(box, {ranks, busy, end, bins, highlight, describe})
 *   PGCharts.rendezvous(box, {rows, highlight, now})
 *
 * Each keeps its canvas or plot on the box between calls and redraws in place; none of them
 * parses data as HTML (canvas text is drawn, tooltips are textContent).
 */
import { PG } from "./common.js";

const { el, clear } = PG;

const PALETTE = ["#0b63ce", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7a83", "#c4231e", "#57606a"];

function color(i) {
  return PALETTE[i % PALETTE.length];
}

/** A canvas sized to the box at the device's pixel ratio; returns its 2D context. */
function canvasIn(box, cssHeight) {
  let canvas = box.querySelector("canvas.pg-canvas");
  if (!canvas) {
    clear(box);
    canvas = el("canvas", { class: "pg-canvas" });
    box.appendChild(canvas);
    box.appendChild(el("div", { class: "chart-tip", hidden: true }));
  }
  const width = Math.max(200, box.clientWidth || 600);
  const dpr = window.devicePixelRatio || 1;
  canvas.style.width = width + "px";
  canvas.style.height = cssHeight + "px";
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(cssHeight * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(cssHeight * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, cssHeight);
  return { canvas, ctx, width, height: cssHeight };
}

/** Show `lines` (strings) in the box's tooltip next to the pointer; null hides it. */
function tip(box, ev, lines) {
  const node = box.querySelector(".chart-tip");
  if (!node) return;
  if (!lines) {
    node.hidden = true;
    return;
  }
  clear(node, lines.map((line, i) => el("div", { class: i === 0 ? "strong" : null, text: line })));
  node.hidden = false;
  const rect = box.getBoundingClientRect();
  let x = ev.clientX - rect.left + 14;
  if (x + 240 > rect.width) x = ev.clientX - rect.left - 250;
  node.style.left = Math.max(0, x) + "px";
  node.style.top = ev.clientY - rect.top + 12 + "px";
}

function clockLabel(t) {
  const d = new Date(t * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

// ------------------------------------------------------------- lines --

function lines(box, spec) {
  if (spec.x.length < 2 || !spec.series.length) {
    if (box.__plot) box.__plot.destroy();
    box.__plot = null;
    clear(box, PG.empty(spec.empty || "Collecting\u2026"));
    return;
  }
  if (typeof window.uPlot !== "function") {
    clear(box, PG.empty("Chart library missing (static/vendor/uPlot)."));
    return;
  }
  const width = Math.max(240, box.clientWidth || 500);
  const key = JSON.stringify(spec.series.map((s) => [s.label, s.color, s.dash]));
  const data = [spec.x].concat(spec.series.map((s) => s.values));
  let plot = box.__plot;
  if (plot && box.__plotKey === key) {
    if (Math.abs(plot.width - width) > 2) plot.setSize({ width: width, height: spec.height || 190 });
    plot.setData(data);
    return;
  }
  if (plot) plot.destroy();
  clear(box);
  const fmt = spec.yFormat || String;
  plot = new window.uPlot(
    {
      width: width,
      height: spec.height || 190,
      legend: { show: true, live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      axes: [
        { stroke: "#656d76", grid: { stroke: "#eef0f2" }, ticks: { stroke: "#e2e5e9" } },
        { stroke: "#656d76", grid: { stroke: "#eef0f2" }, ticks: { stroke: "#e2e5e9" }, size: 80, values: (u, vals) => vals.map(fmt) },
      ],
      series: [{ value: (u, v) => (v == null ? "\u2014" : clockLabel(v)) }].concat(
        spec.series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: s.dash ? 1.25 : 1.75,
          dash: s.dash ? [5, 4] : undefined,
          spanGaps: true,
          points: { show: false },
          value: (u, v) => (v == null ? "\u2014" : fmt(v)),
        }))
      ),
    },
    data,
    box
  );
  box.__plot = plot;
  box.__plotKey = key;
}

// ----------------------------------------------------------- heatmap --

/** Busy percent -> colour: near-white at 0, deep blue at 100. */
function heatColor(p) {
  // Square root: a few percent (a healthy job) is visible, 100% (a hang) is darkest.
  const t = Math.sqrt(Math.max(0, Math.min(1, p / 100)));
  const r = Math.round(243 + (11 - 243) * t);
  const g = Math.round(246 + (61 - 246) * t);
  const b = Math.round(250 + (145 - 250) * t);
  return "rgb(" + r + "," + g + "," + b + ")";
}

function heatmap(box, spec) {
  const n = spec.ranks.length;
  if (!n) {
    box.__heat = null;
    clear(box, PG.empty("No collectives in the last " + spec.bins + " s."));
    return;
  }
  const rowH = n <= 24 ? 14 : n <= 64 ? 6 : Math.max(0.25, 320 / n);
  const plotH = Math.max(24, Math.round(rowH * n));
  const labels = rowH >= 10;
  const left = 52;
  const bottom = 18;
  const { canvas, ctx, width, height } = canvasIn(box, plotH + bottom);
  const cols = spec.bins;
  const cw = (width - left - 4) / cols;
  for (let i = 0; i < n; i++) {
    const row = spec.busy[i] || [];
    const y = i * rowH;
    for (let b = 0; b < cols; b++) {
      const v = row[b];
      ctx.fillStyle = v == null ? "#ffffff" : heatColor(v);
      ctx.fillRect(left + b * cw, y, Math.ceil(cw), Math.max(rowH, 0.5) + (rowH < 1 ? 0 : 0.5));
    }
  }
  // Highlighted ranks: a red mark in the gutter and an outline.
  const hl = spec.highlight || new Set();
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  for (let i = 0; i < n; i++) {
    const rank = spec.ranks[i];
    const y = i * rowH;
    if (hl.has(rank)) {
      ctx.fillStyle = "#c4231e";
      ctx.fillRect(left - 6, y, 4, Math.max(rowH, 2));
      if (rowH >= 3) {
        ctx.strokeStyle = "#c4231e";
        ctx.lineWidth = 1;
        ctx.strokeRect(left + 0.5, y + 0.5, width - left - 5, rowH - 1);
      }
    }
    if (labels) {
      ctx.fillStyle = hl.has(rank) ? "#c4231e" : "#656d76";
      ctx.fillText("r" + rank, left - 9, y + rowH / 2);
    }
  }
  if (!labels) {
    ctx.fillStyle = "#656d76";
    ctx.fillText("r" + spec.ranks[0], left - 9, 6);
    ctx.fillText("r" + spec.ranks[n - 1], left - 9, plotH - 6);
  }
  // Time axis: seconds before the newest bin, which is "now" live and the moment shown in
  // replay (spec.endLabel).
  const endLabel = spec.endLabel || "now";
  const endWidth = ctx.measureText(endLabel).width;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.fillStyle = "#656d76";
  for (let b = 0; b < cols; b += Math.max(1, Math.round(cols / 6))) {
    const x = left + (b + 0.5) * cw;
    if (x < width - 4 - endWidth - 24) ctx.fillText(String(b - cols + 1) + " s", x, plotH + 4);
  }
  ctx.textAlign = "right";
  ctx.fillText(endLabel, width - 4, plotH + 4);
  box.__heat = { spec: spec, rowH: rowH, left: left, cw: cw, plotH: plotH };
  box.dataset.ranks = String(n);
  if (!box.__heatWired) {
    box.__heatWired = true;
    canvas.addEventListener("mousemove", (ev) => {
      const h = box.__heat;
      if (!h) return;
      const rect = canvas.getBoundingClientRect();
      const x = ev.clientX - rect.left;
      const y = ev.clientY - rect.top;
      const i = Math.floor(y / h.rowH);
      const b = Math.floor((x - h.left) / h.cw);
      if (i < 0 || i >= h.spec.ranks.length || b < 0 || b >= h.spec.bins || y > h.plotH) return tip(box, ev, null);
      const v = (h.spec.busy[i] || [])[b];
      const t = h.spec.end - h.spec.bins + 1 + b;
      tip(box, ev, [h.spec.describe(h.spec.ranks[i]), clockLabel(t) + ": " + (v == null ? "no report" : v + "% of the second inside collectives")]);
    });
    canvas.addEventListener("mouseleave", (ev) => tip(box, ev, null));
  }
}

// -------------------------------------------------------- rendezvous --

function rendezvous(box, spec) {
  const rows = spec.rows;
  const n = rows.length;
  const arrivals = rows.map((r) => r.arrived_at).filter(PG.isNum);
  if (!n || !arrivals.length) {
    box.__rdzv = null;
    clear(box, PG.empty("No rendezvous recorded: the agent was attached after init_process_group."));
    return;
  }
  const t0 = Math.min(...arrivals);
  let t1 = t0;
  for (const r of rows) {
    if (PG.isNum(r.done_at)) t1 = Math.max(t1, r.done_at);
    else if (PG.isNum(r.arrived_at)) t1 = Math.max(t1, r.error ? r.arrived_at : spec.now);
  }
  const span = Math.max(0.05, t1 - t0) * 1.05;
  const rowH = n <= 16 ? 16 : Math.max(0.2, 180 / n);
  const plotH = Math.round(rowH * n);
  const labels = rowH >= 12;
  const left = labels ? 44 : 12;
  const bottom = 18;
  const { canvas, ctx, width } = canvasIn(box, plotH + bottom);
  const sx = (t) => left + ((t - t0) / span) * (width - left - 8);
  const hl = spec.highlight || new Set();
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  for (let i = 0; i < n; i++) {
    const r = rows[i];
    const y = i * rowH;
    const h = Math.max(rowH - (rowH >= 4 ? 3 : 0), 0.5);
    if (PG.isNum(r.arrived_at)) {
      const end = PG.isNum(r.done_at) ? r.done_at : r.error ? r.arrived_at : spec.now;
      ctx.fillStyle = r.error ? "#c4231e" : PG.isNum(r.done_at) ? "#8cc5a0" : "#e9c46a";
      ctx.fillRect(sx(r.arrived_at), y + (rowH - h) / 2, Math.max(2, sx(end) - sx(r.arrived_at)), h);
      if (rowH >= 8) {
        ctx.fillStyle = "#1f2328";
        ctx.fillRect(sx(r.arrived_at) - 1, y + (rowH - h) / 2, 2, h);
      }
    }
    if (hl.has(r.rank)) {
      ctx.fillStyle = "#c4231e";
      ctx.fillRect(2, y, 4, Math.max(rowH, 2));
    }
    if (labels) {
      ctx.textAlign = "right";
      ctx.fillStyle = hl.has(r.rank) ? "#c4231e" : "#656d76";
      ctx.fillText(r.rank == null ? "?" : "r" + r.rank, left - 6, y + rowH / 2);
    }
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.fillStyle = "#656d76";
  const step = niceStep(span / 5);
  for (let s = 0; s <= span && sx(t0 + s) < width - 24; s += step) ctx.fillText("+" + fmtSeconds(s), sx(t0 + s), plotH + 4);
  box.__rdzv = { rows: rows, rowH: rowH, plotH: plotH, t0: t0 };
  if (!box.__rdzvWired) {
    box.__rdzvWired = true;
    canvas.addEventListener("mousemove", (ev) => {
      const d = box.__rdzv;
      if (!d) return;
      const rect = canvas.getBoundingClientRect();
      const i = Math.floor((ev.clientY - rect.top) / d.rowH);
      const r = d.rows[i];
      if (!r || ev.clientY - rect.top > d.plotH) return tip(box, ev, null);
      const lines = ["rank " + (r.rank == null ? "?" : r.rank) + (r.host ? " on " + r.host : "")];
      if (PG.isNum(r.arrived_at)) lines.push("arrived +" + fmtSeconds(r.arrived_at - d.t0) + " (" + clockLabel(r.arrived_at) + ")");
      if (PG.isNum(r.done_at)) lines.push("done +" + fmtSeconds(r.done_at - d.t0) + ", after " + fmtSeconds(r.done_at - r.arrived_at));
      else if (r.error) lines.push("failed: " + String(r.error).split("\n")[0].slice(0, 160));
      else lines.push("still waiting");
      tip(box, ev, lines);
    });
    canvas.addEventListener("mouseleave", (ev) => tip(box, ev, null));
  }
}

function niceStep(x) {
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1e-3))));
  for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function fmtSeconds(s) {
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 60) return (Math.round(s * 10) / 10).toFixed(1) + " s";
  return PG.fmtDuration(s);
}

export const PGCharts = Object.freeze({ lines, heatmap, heatColor, rendezvous, color, fmtSeconds });
