/*
 * pgdash: jobs list page (templates/jobs.html).
 *
 * Data in:  GET /api/jobs once on load, then Socket.IO event "jobs" after
 *           emitting watch {"jobs": true}. Both carry {"jobs": [...]}, newest first.
 * State:    the last job list and the filter text (mirrored in ?q= of the URL).
 * Render:   render() rebuilds the table body from state; nothing else touches it.
 */
import { PG } from "./common.js";

const { el, clear } = PG;

const body = document.getElementById("jobs-body");
const search = document.getElementById("jobs-search");
const count = document.getElementById("jobs-count");
const errorBox = document.getElementById("jobs-error");

const state = {
  jobs: null, // null until the first data arrives
  filter: new URLSearchParams(location.search).get("q") || "",
  live: false, // true once a socket snapshot arrived; stale REST answers are then ignored
};

// ------------------------------------------------------------ render --

function matches(job, needle) {
  return !needle || String(job.name == null ? "" : job.name).toLowerCase().includes(needle);
}

/** Active incidents (null: not diagnosed since the server started). */
function incidentsCell(n) {
  if (!PG.isNum(n)) return el("td", { class: "num muted", text: PG.DASH });
  return el("td", { class: "num incidents" + (n > 0 ? " has-incidents" : ""), text: String(n) });
}

/** The name, with what tells it apart: "run 2" when a launch reused the name, "imported"
 *  (from which file) for a job `pgdash import` made, and the program's command line. */
function nameCell(job) {
  const name = job.name == null || job.name === "" ? "job " + job.id : job.name;
  const tags = [];
  if (PG.isNum(job.run) && job.run > 1) {
    tags.push(el("span", { class: "tag tag-run", title: "Launch " + job.run + " under this name", text: "run " + job.run }));
  }
  if (job.imported) {
    const from = job.imported_from ? "Imported from " + job.imported_from : "Imported";
    const when = PG.isNum(job.exported_at) ? ", exported " + PG.fmtTime(job.exported_at) : "";
    tags.push(el("span", { class: "tag tag-imported", title: from + when, text: "imported" }));
  }
  return el(
    "td",
    { class: "name" },
    el("a", { href: PG.url("/jobs/" + encodeURIComponent(job.id)), text: name }),
    tags,
    job.command ? el("div", { class: "launch-cmd", title: job.command, text: job.command }) : null
  );
}

function launcherCell(job) {
  if (!job.launcher) return el("td", { class: "muted", text: PG.DASH });
  return el(
    "td",
    { class: "launcher" },
    el("span", { text: job.launcher }),
    job.launcher_id ? el("span", { class: "muted", text: " \u00b7 " + job.launcher_id }) : null
  );
}

function jobRow(job) {
  const started = job.started_at;
  const ended = job.ended_at;
  let duration;
  if (PG.isNum(started) && PG.isNum(ended)) duration = el("span", { text: PG.fmtDuration(ended - started) });
  else if (PG.isNum(started) && (job.status === "running" || job.status === "initializing")) duration = PG.since(started);
  else duration = el("span", { class: "muted", text: PG.DASH });

  return el(
    "tr",
    { dataset: { job: String(job.id) } },
    nameCell(job),
    el("td", null, PG.badge(job.status)),
    launcherCell(job),
    el("td", { class: "num", text: PG.fmtNum(job.world_size) }),
    el("td", { class: "num" + (job.attempt > 0 ? "" : " muted"), text: PG.isNum(job.attempt) ? String(job.attempt) : PG.DASH }),
    el("td", { text: job.backend == null ? PG.DASH : job.backend }),
    el("td", null, PG.timeCell(started)),
    el("td", null, PG.timeCell(ended)),
    el("td", { class: "num" }, duration),
    incidentsCell(job.incidents)
  );
}

function render() {
  if (state.jobs === null) return;
  const needle = state.filter.trim().toLowerCase();
  const shown = state.jobs.filter((job) => matches(job, needle));
  if (state.jobs.length === 0) {
    clear(body, PG.emptyRow(10, "No jobs yet. Jobs appear here as soon as an agent reports in."));
  } else if (shown.length === 0) {
    clear(body, PG.emptyRow(10, "No jobs match \u201c" + state.filter.trim() + "\u201d"));
  } else {
    clear(body, shown.map(jobRow));
  }
  count.textContent = needle
    ? shown.length + " of " + state.jobs.length + " jobs"
    : state.jobs.length + (state.jobs.length === 1 ? " job" : " jobs");
}

// -------------------------------------------------------------- data --

function setJobs(payload, fromLive) {
  if (!payload || !Array.isArray(payload.jobs)) return;
  if (fromLive) state.live = true;
  else if (state.live) return; // a live snapshot is newer than this REST answer
  errorBox.hidden = true;
  if (!PG.changed("jobs", payload.jobs) && state.jobs !== null) return;
  state.jobs = payload.jobs;
  render();
}

function showError(msg) {
  errorBox.textContent = msg;
  errorBox.hidden = false;
  if (state.jobs === null) clear(body, PG.emptyRow(10, "Could not load jobs."));
}

async function refresh() {
  try {
    setJobs(await PG.fetchJSON("/api/jobs"), false);
  } catch (err) {
    showError("Could not load jobs: " + err.message);
  }
}

// ------------------------------------------------------------- wiring --

search.value = state.filter;
search.addEventListener("input", () => {
  state.filter = search.value;
  const u = new URL(location.href);
  if (state.filter) u.searchParams.set("q", state.filter);
  else u.searchParams.delete("q");
  history.replaceState(null, "", u.pathname + u.search + u.hash);
  render();
});
document.addEventListener("keydown", (ev) => {
  if (ev.key === "/" && document.activeElement !== search && !ev.ctrlKey && !ev.metaKey) {
    ev.preventDefault();
    search.focus();
  } else if (ev.key === "Escape" && document.activeElement === search) {
    search.value = "";
    search.dispatchEvent(new Event("input"));
  }
});

refresh();
PG.connectLive({
  watch: { jobs: true },
  events: { jobs: (payload) => setJobs(payload, true) },
  refresh: () => {
    state.live = false; // polling fallback: REST answers are the freshest we have
    return refresh();
  },
});
