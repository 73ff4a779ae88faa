import { PG } from "../common.js";
/* pgdash job page: what every section shares (the page's state, look-ups, small widgets). */
const { el, DASH } = PG;

export const page = document.getElementById("job-page");
export const JOB_ID = Number(page.dataset.jobId);
export const $ = (id) => document.getElementById(id);

export const RANK_ROWS = 200; // ranks table rows drawn at once (the filter finds the others)
export const PROGRESS_DETAIL_ROWS = 256; // above this many (group, rank) rows: one strip per family
export const ERRORS_SHOWN = 50;
export const RATE_SECONDS = 5; // the collectives table's bytes/s: mean of the last full seconds

export const state = {
  job: null, // GET /api/jobs/<id> object (with ranks, groups)
  collectives: null, // rows per group, op, rank (REST only: large at 1,024 ranks)
  rankStats: null, // per rank: count and the (group, op) it runs most (live)
  progress: null, // rows; only arrives over the socket
  findings: null, // rows
  incidents: null, // rows: findings grouped by root cause (dashboard/incidents.py)
  jobIncidents: null, // replay: every incident of the job, as GET /incidents says now
  ops: null, // rows per group family and op (socket)
  grid: null, // timeline_grid (socket)
  rendezvous: null,
  errors: null,
  gpus: null,
  serverTime: null,
  at: null, // the event time the server judged what is shown at (live: its judged time)
  rankStates: null, // rows per rank: {rank, state, findings, overdue, waiting?} (server)
  groupStates: null, // rows per group: {group, family, ranks, max_seq, behind, state} (server)
  live: false, // a socket snapshot arrived: later REST answers are stale
  collSort: { key: "family", dir: "asc" },
  selection: null, // {kind: "finding", id} | {kind: "rank", rank}
  view: "hosts",
  heatFamily: null,
  openEvidence: new Set(),
  ranksFilter: "",
  replay: null, // {at} while the page shows a past moment (GET /api/jobs/<id>/state?at=)
};

/** render() of main.js, set there (sections call it after a click). */
export const hooks = { render: () => {} };

/** The moment on screen: the replayed one, else the server's judged time, else null. */
export function viewAt() {
  return state.replay ? state.replay.at : state.at;
}

/** Look-up of process groups by the name used in collectives/progress rows. */
export function indexGroups(groups) {
  const byName = new Map();
  const byId = new Map();
  for (const g of groups || []) {
    byName.set(String(g.name), g);
    byId.set(String(g.id), g);
  }
  return (key) => byName.get(String(key)) || byId.get(String(key)) || null;
}

/** Per rank: total collective count, and the (group, op) row it runs most. */
export function rankStats(rankRows, collectives) {
  const stats = new Map();
  if (Array.isArray(rankRows)) {
    for (const row of rankRows) stats.set(row.rank, { total: PG.isNum(row.count) ? row.count : 0, top: row });
    return stats;
  }
  for (const row of collectives || []) {
    let s = stats.get(row.rank);
    if (!s) stats.set(row.rank, (s = { total: 0, top: null }));
    const n = PG.isNum(row.count) ? row.count : 0;
    s.total += n;
    if (!s.top || n > (s.top.count || 0)) s.top = row;
  }
  return stats;
}


/** Per rank: list of {group, op, since} for collectives it has in flight. */
export function inflightByRank(progress) {
  const out = new Map();
  for (const row of progress || []) {
    if (row.inflight_op == null) continue;
    if (!out.has(row.rank)) out.set(row.rank, []);
    out.get(row.rank).push({ group: row.group, op: row.inflight_op, since: row.inflight_since });
  }
  return out;
}


/** The ranks the current selection highlights. */
export function highlighted() {
  const sel = state.selection;
  if (!sel) return new Set();
  if (sel.kind === "rank") return new Set([sel.rank]);
  const f = ((sel.kind === "incident" ? state.incidents : state.findings) || []).find((x) => x.id === sel.id);
  return new Set(f && Array.isArray(f.ranks) ? f.ranks : []);
}


export function sortGroups(groups) {
  return PG.sortBy(groups || [], "name", "asc");
}

/** "tp · 1": the group's description (what people know it by), then its name. */
export function groupLabel(findGroup, key) {
  const g = findGroup(key);
  if (!g) return el("span", { class: "group", text: key == null ? DASH : String(key) });
  const name = String(g.name);
  if (g.desc == null || g.desc === "") return el("span", { class: "group", text: name });
  return el("span", { class: "group", title: "process group " + name }, String(g.desc), el("span", { class: "group-name", text: name }));
}

/** An in-flight collective: op, group, how long (item.overdue: the server's verdict). */
export function inflightNode(findGroup, item, showGroup) {
  const node = el(
    "span",
    { class: "inflight" },
    el("span", { class: "op", text: String(item.op) }),
    showGroup ? [" on ", groupLabel(findGroup, item.group)] : null,
    PG.isNum(item.since) ? [" \u00b7 ", PG.since(item.since)] : null
  );
  // Overdue as the server judged it (dashboard/web/views.py), never by this browser's clock.
  if (item.overdue) node.classList.add("overdue");
  return node;
}

export function text(value) {
  return value === null || value === undefined || value === "" ? DASH : String(value);
}

/** A finding's severity as [CSS class, sort order]: critical first. */
const SEVERITY = {
  critical: ["sev-error", 0],
  error: ["sev-error", 0],
  high: ["sev-error", 0],
  warning: ["sev-warn", 1],
  warn: ["sev-warn", 1],
  medium: ["sev-warn", 1],
  info: ["sev-info", 2],
  low: ["sev-info", 2],
};
export const severityOf = (f) => SEVERITY[String(f.severity).toLowerCase()] || ["sev-other", 3];

/** How many attempts the job has had (a torchrun restart is the next attempt). */
export function attemptCount() {
  const list = state.job && Array.isArray(state.job.attempts) ? state.job.attempts : [];
  return list.length;
}
