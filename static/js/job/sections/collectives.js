/* pgdash job page: the collectives table, latency and bytes charts, the heat map. */
import { PG } from "../../common.js";
import { PGCharts } from "../../charts.js";
import { $, RATE_SECONDS, hooks, state, text, groupLabel } from "../ctx.js";

const { el, clear, DASH } = PG;

const COLL_COLUMNS = [
  { key: "family", label: "Group" },
  { key: "op", label: "Op" },
  { key: "ranks", label: "Ranks", num: true },
  { key: "count", label: "Count", num: true },
  { key: "p50_us", label: "p50", num: true },
  { key: "p99_us", label: "p99", num: true },
  { key: "max_us", label: "max", num: true },
  { key: "bytes", label: "Bytes", num: true },
  { key: "rate", label: "Bytes/s", num: true },
];

/** Rows per family and op: from `ops` when live, else summed from the per-rank rows. */
export function opRows(ops, collectives, findGroup) {
  if (Array.isArray(ops)) return ops;
  const out = new Map();
  for (const r of collectives || []) {
    const g = findGroup(r.group);
    const fam = g ? String(g.family != null ? g.family : g.name) : String(r.group); // the server sends the family
    const k = fam + "\u0000" + opLabel(r);
    let row = out.get(k);
    if (!row) out.set(k, (row = { family: fam, groups: [String(r.group)], op: r.op, source: r.source, timing: r.timing, resolution_us: r.resolution_us, ranks: 0, count: 0, bytes: 0, p50_us: null, p99_us: null, max_us: 0 }));
    row.ranks += 1;
    row.count += r.count || 0;
    row.bytes += r.bytes || 0;
    row.max_us = Math.max(row.max_us, r.max_us || 0);
  }
  return Array.from(out.values());
}

function familyLabel(findGroup, row) {
  const groups = Array.isArray(row.groups) ? row.groups : [];
  if (groups.length === 1) return groupLabel(findGroup, groups[0]);
  return el("span", { class: "group", text: String(row.family) }, el("span", { class: "group-name", text: groups.length + " groups" }));
}

export function renderCollectives(rows, findGroup) {
  const sort = state.collSort;
  clear(
    $("coll-head"),
    el(
      "tr",
      null,
      COLL_COLUMNS.map((c) =>
        PG.sortHeader(c.label, c.key, sort, (next) => {
          state.collSort = next;
          PG.changed("collectives", null);
          hooks.render();
        }, c.num)
      )
    )
  );
  const rates = bytesRates();
  const list = (rows || []).map((r) => Object.assign({}, r, { rate: rates.get(String(r.family)) == null ? null : rates.get(String(r.family)).get(opLabel(r)) }));
  const total = list.reduce((n, r) => n + (r.count || 0), 0);
  // Each rank's call counts: a collective of 8 ranks is 8 calls (progress counts it once).
  $("coll-count").textContent = list.length ? PG.fmtNum(total) + " calls over all ranks, " + list.length + (list.length === 1 ? " kind" : " kinds") : "";
  const body = $("coll-body");
  if (list.length === 0) {
    clear(body, PG.emptyRow(COLL_COLUMNS.length, rows === null ? "Loading\u2026" : "No collectives recorded yet."));
    return;
  }
  let sorted = PG.sortBy(PG.sortBy(list, "op", "asc"), "family", "asc");
  sorted = PG.sortBy(sorted, sort.key, sort.dir);
  clear(
    body,
    sorted.map((r) =>
      el(
        "tr",
        null,
        el("td", null, familyLabel(findGroup, r)),
        el("td", { class: "mono", title: sourceNote(r), text: opLabel(r) }),
        el("td", { class: "num", text: PG.fmtNum(r.ranks) }),
        el("td", { class: "num", text: PG.fmtNum(r.count) }),
        el("td", { class: "num", text: PG.fmtUs(r.p50_us) }),
        el("td", { class: "num", text: PG.fmtUs(r.p99_us) }),
        el("td", { class: "num", text: PG.fmtUs(r.max_us) }),
        el("td", { class: "num", title: PG.isNum(r.bytes) ? PG.fmtNum(r.bytes) + " bytes" : null, text: PG.fmtBytes(r.bytes) }),
        el("td", { class: "num", text: PG.isNum(r.rate) ? PG.fmtBytes(r.rate) + "/s" : DASH })
      )
    )
  );
}

/** Remember cumulative bytes per family and op, to chart bytes per second. */
/** family -> op -> bytes per second over the last full seconds of the live grid. */
/** An op's name, marked when its figures come from the Flight Recorder (issued from C++). */
function opLabel(r) {
  return text(r.op) + (r.source === "flight_recorder" ? " (C++)" : "");
}

/** How a row's latency was measured, for its tooltip. */
function sourceNote(r) {
  if (r.source !== "flight_recorder") return "Timed by pgdash's wrapper around the Python call";
  if (r.timing === "host_poll") return "Issued from C++ (DDP, functional collectives): seen in PyTorch's Flight Recorder; latency exact to " + PG.fmtUs(r.resolution_us) + " (the agent's poll gap)";
  return "Issued from C++: seen in PyTorch's Flight Recorder; latency measured on the device (TORCH_NCCL_ENABLE_TIMING)";
}

function bytesRates() {
  const out = new Map();
  const grid = state.grid;
  for (const o of grid && Array.isArray(grid.ops) ? grid.ops : []) {
    const full = (o.bytes || []).slice(0, -1).slice(-RATE_SECONDS); // the last is still filling
    if (!full.length) continue;
    const fam = String(o.family);
    if (!out.has(fam)) out.set(fam, new Map());
    out.get(fam).set(opLabel(o), full.reduce((a, b) => a + b, 0) / full.length);
  }
  return out;
}

/** The heat map's right edge: the moment replayed, an ended job's last second on it, else now. */
function heatEnd(grid) {
  if (state.replay) return "at " + PG.fmtTime(state.replay.at).slice(11);
  const job = state.job;
  if (job && (job.status === "finished" || job.status === "failed")) return "at " + PG.fmtTime(grid.end + 1).slice(11);
  return "now";
}

/**
 * What an empty chart says: exactly what there is none of, in agreement with the table
 * below it (`rows`: the table's rows, over the whole job; the charts show the last seconds).
 */
export function noCollectivesText(grid, rows) {
  if (!grid) return "Waiting for live data\u2026";
  const total = (rows || []).reduce((n, r) => n + (PG.isNum(r.count) ? r.count : 0), 0);
  if (!total) return "No collectives recorded yet.";
  return "No collectives in the last " + grid.bins + " s; the table below counts all " + PG.fmtNum(total) + " calls since the job began.";
}

export function renderCharts(grid, hl, describe, rows) {
  const fams = grid && Array.isArray(grid.families) ? grid.families : [];
  const ops = grid && Array.isArray(grid.ops) ? grid.ops : [];
  const x = grid && grid.end != null ? Array.from({ length: grid.bins }, (_, i) => grid.end - grid.bins + 1 + i + 0.5) : [];
  const waiting = noCollectivesText(grid, rows);

  // Latency per family and op: p50 solid, p99 dashed, from every rank's merged histograms.
  const latSeries = [];
  ops.forEach((o, i) => {
    latSeries.push({ label: o.family + " " + opLabel(o) + " p50", values: o.p50_us, color: PGCharts.color(i) });
    latSeries.push({ label: o.family + " " + opLabel(o) + " p99", values: o.p99_us, color: PGCharts.color(i), dash: true });
  });
  PGCharts.lines($("latency-chart"), { x: x, series: latSeries, yFormat: (v) => PG.fmtUs(v), empty: waiting });

  // Bytes per second per family (every op), from the same grid.
  const perFamily = new Map();
  for (const o of ops) {
    const sum = perFamily.get(String(o.family)) || new Array(grid.bins).fill(null);
    (o.bytes || []).forEach((v, i) => {
      if (o.count && o.count[i]) sum[i] = (sum[i] || 0) + v;
    });
    perFamily.set(String(o.family), sum);
  }
  const bytesSeries = Array.from(perFamily, ([fam, values], i) => ({ label: fam, values: values, color: PGCharts.color(i) }));
  PGCharts.lines($("bytes-chart"), { x: x, series: bytesSeries, yFormat: (v) => PG.fmtBytes(v) + "/s", empty: waiting });

  // Heat map of the chosen family.
  const select = $("heat-family");
  const names = fams.map((f) => String(f.family));
  if (PG.changed("heat-families", names)) {
    clear(select, fams.map((f) => el("option", { value: String(f.family), text: f.family + (f.groups && f.groups.length > 1 ? " (" + f.groups.length + " groups)" : "") })));
  }
  if (!names.includes(state.heatFamily)) state.heatFamily = names.length ? names[0] : null;
  select.value = state.heatFamily || "";
  select.hidden = !names.length;
  const fam = fams.find((f) => String(f.family) === state.heatFamily);
  const heat = $("heatmap");
  // Collectives issued from C++ (DDP's) are timed to the agent's polls: their busy share is
  // sampled from the Flight Recorder, and the caption says so.
  $("heat-note").textContent = fam && fam.sampled ? "C++ collectives (DDP's): share of the agent's Flight Recorder samples inside one" : "";
  if (!grid || !fam) {
    // The charts above may still have some (point-to-point ops, or C++ ones without samples).
    const named = Array.from(new Set(ops.map((o) => opLabel(o))));
    clear(heat, PG.empty(grid && named.length ? "No time inside collectives measured in the last " + grid.bins + " s: it had only " + named.join(", ") + ", which this map does not draw." : waiting));
  }
  else PGCharts.heatmap(heat, { ranks: fam.ranks, busy: fam.busy, end: grid.end, bins: grid.bins, highlight: hl, endLabel: heatEnd(grid), describe: (r) => describe(r).split("\n")[0] });
  const legend = $("heat-legend");
  if (!legend.firstChild) {
    clear(
      legend,
      "0%",
      [0, 25, 50, 75, 100].map((p) => el("span", { class: "heat-swatch", style: "background:" + PGCharts.heatColor(p), title: p + "%" })),
      "100% of each second"
    );
  }
}
