/*
 * pgdash job page: the live feed (dashboard/web/live.py) and the one way sections reach the page.
 *
 * The server sends a snapshot ("job": {job_id, v, at, sections, server_time}), then deltas
 * ("job_delta": {job_id, v, base, at, sections, rows, server_time}). A delta whose base is
 * not the version held means one was missed: watch again for a snapshot. Replay
 * (GET /api/jobs/<id>/state?at=) returns the same sections: both go through showSections().
 */
import { PG } from "../common.js";
import { $, JOB_ID, state } from "./ctx.js";

// What the live feed sent, by section, and its version (null until a snapshot came).
let live = null;
let liveVersion = null;
let rewatching = false;
let lastMessage = null; // {at, server_time, server_behind_s} of the last live message
let gridIn = null; // the timeline_grid last expanded into state.grid
let progressIn = null; // likewise the progress columns

/** What main.js provides: render(), showError(), setNotFound(), rewatch(). */
export const liveHooks = { render: () => {}, showError: () => {}, setNotFound: () => {}, rewatch: null };

/** Progress comes as a row per group with a column per field: back to a row per rank. */
function expandProgress(groups) {
  const rows = [];
  for (const g of groups) {
    const inflight = new Map((g.inflight || []).map((x) => [x[0], x]));
    (g.ranks || []).forEach((rank, i) => {
      const f = inflight.get(rank);
      rows.push({ group: g.group, rank: rank, entered: g.entered[i], completed: g.completed[i], inflight_op: f ? f[1] : null, inflight_since: f ? f[2] : null, source: g.source });
    });
  }
  return rows;
}

/** The grid's busy rows come as strings, a character per second (dashboard/web/live.py). */
function expandGrid(grid) {
  const digits = typeof grid.busy_digits === "string" ? grid.busy_digits : "";
  const value = new Map(Array.from(digits, (c, i) => [c, Math.min(100, i * 2)]));
  const expand = (row) => (typeof row === "string" ? Array.from(row, (c) => (value.has(c) ? value.get(c) : null)) : row);
  return Object.assign({}, grid, {
    families: (Array.isArray(grid.families) ? grid.families : []).map((f) => Object.assign({}, f, { busy: (f.busy || []).map(expand) })),
  });
}

/** Put the sections of one moment (live or replayed) into the page's state. */
export function showSections(secs) {
  const list = (name) => (Array.isArray(secs[name]) ? secs[name] : []);
  state.job = Object.assign({}, secs.job, { ranks: list("ranks"), groups: list("groups"), attempts: list("attempts") });
  state.rankStats = list("rank_stats");
  if (secs.progress !== progressIn) {
    progressIn = secs.progress;
    state.progress = expandProgress(list("progress"));
  }
  state.findings = list("findings");
  state.incidents = list("incidents");
  state.rankStates = list("rank_states");
  state.groupStates = list("group_states");
  state.ops = Array.isArray(secs.ops) ? secs.ops : null;
  if (secs.timeline_grid !== gridIn) {
    gridIn = secs.timeline_grid;
    state.grid = gridIn && typeof gridIn === "object" ? expandGrid(gridIn) : null;
  }
  state.rendezvous = list("rendezvous");
  state.errors = list("errors");
  state.gpus = list("gpus");
}

export function onSnapshot(message) {
  if (!message || !message.sections || Number(message.job_id) !== JOB_ID) return;
  if (!state.live) performance.mark("pgdash:first-payload");
  live = Object.assign({}, message.sections);
  liveVersion = message.v;
  rewatching = false;
  showLive(message);
}

export function onDelta(message) {
  if (!message || Number(message.job_id) !== JOB_ID) return;
  if (liveVersion === null || message.base !== liveVersion) {
    // Missed one (or the snapshot is yet to come): only a new snapshot can catch up.
    if (liveVersion !== null && !rewatching && liveHooks.rewatch) {
      rewatching = true;
      liveHooks.rewatch();
    }
    return;
  }
  for (const [name, value] of Object.entries(message.sections || {})) {
    if (value === null) delete live[name];
    else live[name] = value;
  }
  for (const [name, patch] of Object.entries(message.rows || {})) {
    const rows = Array.isArray(live[name]) ? live[name].slice() : [];
    for (const [i, row] of patch) rows[i] = row;
    live[name] = rows;
  }
  liveVersion = message.v;
  showLive(message);
}

/** Show what the live feed holds (unless a replayed moment is on screen). */
export function showLive(message) {
  if (message) lastMessage = message;
  const m = lastMessage || {};
  showLag(m.server_behind_s);
  if (!live || !live.job || state.replay) return; // a replayed moment stays on screen
  state.live = true;
  showSections(live);
  state.at = PG.isNum(m.at) ? m.at : null;
  state.serverTime = PG.isNum(m.server_time) ? m.server_time : null;
  liveHooks.setNotFound(false);
  liveHooks.showError("");
  liveHooks.render();
}

/** Whether a live snapshot is held (Back to live can show it at once). */
export function haveLive() {
  return live !== null;
}

/** Replay replaced the progress and grid: expand the live ones again on the way back. */
export function forgetExpanded() {
  progressIn = null;
  gridIn = null;
}

/** The server says when its ingest is behind the agents: verdicts wait for it. */
function showLag(seconds) {
  const box = $("job-lag");
  const behind = PG.isNum(seconds);
  box.hidden = !behind;
  box.textContent = behind
    ? `The server is ${Math.round(seconds)} s behind the agents: it holds verdicts that ` +
      "this lag could explain until it catches up (no rank is blamed for it)."
    : "";
}
