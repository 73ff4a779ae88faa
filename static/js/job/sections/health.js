/* pgdash job page: rendezvous timeline, error texts (verbatim) and GPU health. */
import { PG } from "../../common.js";
import { PGCharts } from "../../charts.js";
import { $, ERRORS_SHOWN, JOB_ID, RANK_ROWS, state, text } from "../ctx.js";

const { el, clear, DASH } = PG;

export function renderRendezvous(rows, job, hl) {
  const box = $("rendezvous");
  const summary = $("rdzv-summary");
  if (rows === null) {
    summary.textContent = "";
    clear(box, PG.empty("Waiting for live data\u2026"));
    return;
  }
  const list = PG.sortBy(rows, "rank", "asc");
  const world = job && PG.isNum(job.world_size) ? job.world_size : null;
  const arrived = list.filter((r) => PG.isNum(r.arrived_at));
  const done = list.filter((r) => PG.isNum(r.done_at));
  const failed = list.filter((r) => r.error);
  if (arrived.length) {
    const t0 = Math.min(...arrived.map((r) => r.arrived_at));
    const last = arrived.reduce((a, b) => (b.arrived_at > a.arrived_at ? b : a));
    const parts = [arrived.length + (world ? " of " + world : "") + " arrived"];
    if (done.length) parts.push(done.length + " done, the last +" + PGCharts.fmtSeconds(Math.max(...done.map((r) => r.done_at)) - t0));
    if (arrived.length > 1) parts.push("last to arrive: rank " + last.rank + " (+" + PGCharts.fmtSeconds(last.arrived_at - t0) + ")");
    if (failed.length) parts.push(failed.length + " failed");
    if (world && arrived.length < world) {
      const have = new Set(arrived.map((r) => r.rank));
      const missing = [];
      for (let r = 0; r < world; r++) if (!have.has(r)) missing.push(r);
      parts.push("never arrived: " + (missing.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(missing));
    }
    summary.textContent = parts.join(" \u00b7 ");
  } else summary.textContent = "";
  PGCharts.rendezvous(box, { rows: list, highlight: hl, now: state.replay ? PG.now() : state.serverTime || PG.now() });
}

export function renderErrors(errors) {
  const box = $("errors");
  const count = $("errors-count");
  if (errors === null) {
    count.textContent = "";
    clear(box, PG.empty("Waiting for live data\u2026"));
    return;
  }
  count.textContent = errors.length ? errors.length + (errors.length === 1 ? " error" : " errors") : "";
  if (!errors.length) {
    clear(box, PG.empty("No errors reported by any rank."));
    return;
  }
  clear(
    box,
    el(
      "ul",
      { class: "errors" },
      errors.slice(0, ERRORS_SHOWN).map((e) =>
        el(
          "li",
          { class: "error-item", dataset: { rank: e.rank == null ? "" : String(e.rank) } },
          el(
            "div",
            { class: "error-head" },
            el("span", { class: "strong", text: e.rank == null ? "rank ?" : "rank " + e.rank }),
            el("span", { class: "mono", text: text(e.error_type) }),
            e.where ? el("span", { class: "muted", text: String(e.where) }) : null,
            e.op ? el("span", { class: "muted" }, "in ", el("span", { class: "op", text: String(e.op) }), e.seq != null ? " #" + e.seq : "") : null,
            el("span", { class: "error-time" }, PG.timeCell(e.t))
          ),
          el("pre", { class: "error-text", text: e.error == null ? "" : String(e.error) })
        )
      ),
      errors.length > ERRORS_SHOWN ? el("li", { class: "muted", text: errors.length - ERRORS_SHOWN + " older errors not shown (GET /api/jobs/" + JOB_ID + "/export has them all)." }) : null
    )
  );
}

const pct = (v) => (PG.isNum(v) ? Math.round(v) + "%" : DASH);
const GPU_FIELDS = [
  ["GPU", (g) => text(g.name)],
  ["Util", (g) => pct(g.util_gpu)],
  ["Memory", (g) => (PG.isNum(g.mem_used) ? PG.fmtBytes(g.mem_used) + (PG.isNum(g.mem_total) ? " / " + PG.fmtBytes(g.mem_total) : "") : DASH)],
  ["Temp", (g) => (PG.isNum(g.temp_c) ? Math.round(g.temp_c) + " \u00b0C" : DASH)],
  ["Power", (g) => (PG.isNum(g.power_w) ? Math.round(g.power_w) + (PG.isNum(g.power_limit_w) ? " / " + Math.round(g.power_limit_w) : "") + " W" : DASH)],
  ["SM clock", (g) => (PG.isNum(g.sm_clock_mhz) ? Math.round(g.sm_clock_mhz) + (PG.isNum(g.sm_clock_max_mhz) ? " / " + Math.round(g.sm_clock_max_mhz) : "") + " MHz" : DASH)],
  ["Clock events", (g) => (Array.isArray(g.reasons) ? (g.reasons.length ? g.reasons.join(", ") : "none") : DASH)],
  ["Errors", (g) => gpuErrors(g)],
];

/** Faults and error counters of one GPU reading, "none" when clean. */
function gpuErrors(g) {
  const out = [];
  if (g.lost) out.push("fell off the bus");
  for (const key of Object.keys(g.faults || {})) if (!(key === "lost" && g.lost)) out.push(key);
  for (const [key, label] of [["ecc_uncorrected", "ECC uncorrected"], ["ecc_corrected", "ECC corrected"], ["remap_pending", "remap pending"], ["remap_failure", "remap failure"], ["pcie_replay", "PCIe replays"]]) {
    if (PG.isNum(g[key]) && g[key] > 0) out.push(label + " " + PG.fmtNum(g[key]));
  }
  return out.length ? out.join(", ") : "none";
}

export function renderGpus(gpus, hl) {
  const box = $("gpus");
  $("gpus-count").textContent = gpus && gpus.length ? gpus.length + (gpus.length === 1 ? " GPU" : " GPUs") : "";
  if (gpus === null) {
    clear(box, PG.empty("Waiting for live data\u2026"));
    return;
  }
  if (!gpus.length) {
    clear(box, el("p", { class: "empty gpu-empty", text: "No GPU data: this job runs on CPU, or the agent has no NVML" }));
    return;
  }
  clear(
    box,
    el(
      "div",
      { class: "table-wrap scroll-box" },
      el(
        "table",
        { class: "data gpu-table" },
        el("thead", null, el("tr", null, el("th", { scope: "col", class: "num", text: "Rank" }), GPU_FIELDS.map(([label]) => el("th", { scope: "col", text: label })))),
        el(
          "tbody",
          null,
          PG.sortBy(gpus, "rank", "asc").slice(0, RANK_ROWS).map((g) => {
            const errs = gpuErrors(g);
            const throttled = Array.isArray(g.reasons) && g.reasons.some((r) => /slowdown|brake/.test(String(r)));
            return el(
              "tr",
              { class: (errs !== "none" ? "row-bad" : "") + (hl.has(g.rank) ? " hl" : "") || null, dataset: { rank: String(g.rank) } },
              el("td", { class: "num strong", text: text(g.rank) }),
              GPU_FIELDS.map(([label, fmt]) => el("td", { class: (label === "Clock events" && throttled) || (label === "Errors" && errs !== "none") ? "bad" : null, text: fmt(g) }))
            );
          })
        )
      )
    )
  );
}
