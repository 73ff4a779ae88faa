/*
 * pgdash: one job (templates/job.html, which carries data-job-id). Native ES modules, no
 * build step: this module wires the page; live.js holds the live feed, replay.js the
 * replay bar, sections/*.js draw one section each, ctx.js what they share.
 *
 * Data in:
 *   on load  GET /api/jobs/<id>, /collectives, /findings, /incidents (no progress over REST)
 *   live     Socket.IO "job" snapshot then "job_delta" deltas of the sections of
 *            dashboard/web/live.py, judged by the server at its event time ``at``
 *   replay   GET /api/jobs/<id>/state?at=T: the same sections, judged at T
 * The page only renders: every display state (rank_states, group_states) and every verdict
 * comes from the server (dashboard/web/views.py); no threshold and no clock decides here. A
 * clock only formats "5 s ago" labels, measured from the moment on screen in replay.
 * Selection: clicking a finding (or a rank in the topology) highlights its ranks in every
 *            section: topology cells, progress, heat map, rendezvous, the ranks table.
 */
import { PG } from "../common.js";
import { $, JOB_ID, page, hooks, state, highlighted, indexGroups, viewAt } from "./ctx.js";
import { liveHooks, onDelta, onSnapshot } from "./live.js";
import { replayHooks, setupReplay, showIndicator, showReplayBar } from "./replay.js";
import { opRows, renderCharts, renderCollectives } from "./sections/collectives.js";
import { renderFindings, renderIncidents } from "./sections/findings.js";
import { agentDrops, renderAttempts, renderHeader, renderVerdict } from "./sections/header.js";
import { renderErrors, renderGpus, renderRendezvous } from "./sections/health.js";
import { renderProgress } from "./sections/progress.js";
import { renderSnapshotControls, setupSnapshots } from "./sections/snapshots.js";
import { derivedStates, rankDescriber, renderGroups, renderRanks, renderTopology } from "./sections/ranks.js";

// ------------------------------------------------------------ render --

let firstCompleteRender = false;
const renderTimes = []; // ms per render of a live payload (the last 200), for bench/page.py

function render() {
  const t0 = performance.now();
  renderSections();
  if (state.live) {
    renderTimes.push(performance.now() - t0);
    if (renderTimes.length > 200) renderTimes.shift();
  }
}

function renderSections() {
  const job = state.job;
  const groups = job && Array.isArray(job.groups) ? job.groups : [];
  const findGroup = indexGroups(groups);
  const jobHead = job ? Object.assign({}, job, { ranks: undefined, groups: undefined, attempts: undefined, hosts: job.ranks ? new Set(job.ranks.map((r) => r.host)).size : 0, drops: agentDrops(job.ranks) }) : null;
  const hl = highlighted();
  const derived = derivedStates();
  const describe = rankDescriber(job ? job.ranks : [], derived, state.progress);
  const selKey = [state.selection, Array.from(hl)];

  const openIncidents = (state.incidents || []).filter((i) => i.active).length;
  if (job && PG.changed("header", [jobHead, state.replay && state.replay.at, openIncidents])) renderHeader(job);
  if (job && PG.changed("attempts", job.attempts)) renderAttempts(job.attempts);
  if (job) showReplayBar();
  showIndicator(); // "Replay" or "Ended" instead of "Live" when that is what the page shows
  if (state.incidents !== null) {
    renderVerdict(state.incidents, state.replay ? forming(state.replay.at) : []);
    const stableInc = state.incidents.map((i) => Object.assign({}, i, { last_seen: i.active ? null : i.last_seen }));
    if (PG.changed("incidents", [stableInc, selKey])) renderIncidents(state.incidents);
  }
  if (state.findings !== null) {
    const stable = state.findings.map((f) => Object.assign({}, f, { last_seen: f.active ? null : f.last_seen }));
    if (PG.changed("findings", [stable, groups.length, selKey, job ? job.ranks.length : 0])) renderFindings(state.findings, findGroup);
  }
  renderSnapshotControls();
  if (job) renderTopology(job, derived, hl, describe);
  if (job) renderRanks(job.ranks, state.progress, findGroup, derived, hl);
  if (job && PG.changed("groups", groups)) renderGroups(groups);
  if (job) renderProgress(groups, state.progress, findGroup, hl, describe);
  const rows = state.ops !== null || state.collectives !== null ? opRows(state.ops, state.collectives, findGroup) : null;
  renderCollectives(rows, findGroup);
  if (state.live || state.replay) renderCharts(state.grid, hl, describe, rows);
  if (PG.changed("rendezvous", [state.rendezvous, job && job.world_size, selKey])) renderRendezvous(state.rendezvous, job, hl);
  if (PG.changed("errors", state.errors)) renderErrors(state.errors);
  if (PG.changed("gpus", [state.gpus, selKey])) renderGpus(state.gpus, hl);

  if (state.live && job && !firstCompleteRender) {
    firstCompleteRender = true;
    performance.mark("pgdash:first-render"); // bench/page.py reads this
    page.dataset.rendered = "1";
  }
}

/**
 * Replay: the job's incidents under way at `at` that the findings judged then do not name
 * yet. An incident begins where its evidence does (a hang where the wait crossed its
 * threshold), the moment Shift+→ stops at; the server names it at its next judgement, a
 * moment later: the page says so instead of "no active incidents".
 */
function forming(at) {
  const named = new Set((state.findings || []).filter((f) => f.active).map((f) => f.id));
  return (state.jobIncidents || []).filter(
    (inc) => PG.isNum(inc.first_seen) && inc.first_seen <= at && (inc.active || at <= inc.last_seen) &&
      !(inc.findings || []).some((id) => named.has(id))
  );
}

function showError(msg) {
  const box = $("job-error");
  box.textContent = msg;
  box.hidden = !msg;
}

function setNotFound(notFound) {
  page.classList.toggle("not-found", notFound);
  if (notFound) showError("Job " + JOB_ID + " was not found. It may not have reported yet; this page will update if it appears.");
}


/**
 * REST snapshot: on load (the live payload usually follows within a second) and while the
 * socket is down. The per-rank collectives rows are large at 1,024 ranks and the live
 * payload carries them, so the first load leaves them to it.
 */
async function refresh(withCollectives) {
  const [job, coll, findings, incidents] = await Promise.allSettled([
    PG.fetchJSON("/api/jobs/" + JOB_ID),
    withCollectives ? PG.fetchJSON("/api/jobs/" + JOB_ID + "/collectives") : Promise.resolve({ collectives: state.collectives }),
    PG.fetchJSON("/api/jobs/" + JOB_ID + "/findings"),
    PG.fetchJSON("/api/jobs/" + JOB_ID + "/incidents"),
  ]);
  if (state.live || state.replay) return; // a live snapshot got here first and is newer
  if (job.status === "rejected") {
    if (job.reason.status === 404) setNotFound(true);
    else showError("Could not load job: " + job.reason.message);
    return;
  }
  setNotFound(false);
  const errors = [];
  state.job = job.value;
  if (coll.status === "fulfilled") state.collectives = coll.value.collectives || (withCollectives ? [] : null);
  else errors.push("collectives: " + coll.reason.message);
  if (findings.status === "fulfilled") state.findings = findings.value.findings || [];
  else errors.push("findings: " + findings.reason.message);
  if (incidents.status === "fulfilled") state.incidents = incidents.value.incidents || [];
  else errors.push("incidents: " + incidents.reason.message);
  showError(errors.length ? "Could not load " + errors.join("; ") : "");
  render();
}

// ------------------------------------------------------------ wiring --

hooks.render = render;
Object.assign(liveHooks, { render, showError, setNotFound, rewatch: () => liveHandle.rewatch && liveHandle.rewatch() });
Object.assign(replayHooks, { render, showError, refresh });

$("topology-view").addEventListener("change", (ev) => {
  state.view = ev.target.value;
  render();
});
$("heat-family").addEventListener("change", (ev) => {
  state.heatFamily = ev.target.value;
  render();
});
$("ranks-filter").addEventListener("input", (ev) => {
  state.ranksFilter = ev.target.value;
  render();
});
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && state.selection && document.activeElement !== $("ranks-filter")) {
    state.selection = null;
    render();
  }
});
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    for (const id of ["heatmap", "rendezvous"]) PG.changed(id, null);
    PG.changed("rendezvous", null);
    if (state.job) render();
  }, 150);
});

// For tests and tools: what the page shows (read-only copies; the server derived it).
window.pgdashJob = Object.freeze({
  highlighted: () => Array.from(highlighted()).sort((a, b) => a - b),
  renderTimes: () => renderTimes.slice(),
  received: () => (liveHandle.received || []).slice(),
  rankState: (rank) => derivedStates().states.get(rank) || null,
  at: viewAt,
});

setupSnapshots();
const replaying = setupReplay();
if (!replaying) refresh(false).catch((err) => showError("Could not load job: " + err.message));
const liveHandle = PG.connectLive({
  watch: { job: JOB_ID },
  events: { job: onSnapshot, job_delta: onDelta },
  refresh: () => {
    state.live = false; // polling fallback while the socket is down
    state.rankStats = null;
    return state.replay ? Promise.resolve() : refresh(true);
  },
});
