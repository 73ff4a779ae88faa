/*
 * pgdash job page: replay. The slider maps 0..1000 onto the job's start..end (or now); the
 * page then shows the server's sections at that moment (GET /api/jobs/<id>/state?at=, the
 * same sections the live feed sends, judged at that moment's event time): ranks, findings,
 * progress, charts, heat map, GPUs, errors. Play advances the moment at 1x-60x. Moments
 * shown are kept (a few), and the second after the one shown is asked ahead. On a big job
 * (KEYFRAME_RANKS), whose moments take seconds to fold, dragging and fast Play show the
 * stored keyframes on the way (the newest at most KEYFRAME_WITHIN_S before the moment:
 * &within=, a read, not a fold) and the exact moment where the slider stops.
 * /jobs/<id>?at=<unix seconds> opens the page at that moment; the address follows the slider.
 */
import { PG } from "../common.js";
import { $, JOB_ID, page, state } from "./ctx.js";
import { compareTo, pin, setupCompare } from "./compare.js";
import { forgetExpanded, haveLive, showLive, showSections } from "./live.js";

const REPLAY_STEPS = 1000;
const PLAY_TICK_MS = 500; // how often playing asks for the next moment
// A moment slower than this to come says so: the sections below are still the last moment's
// (a big job's moment can take the server seconds to fold).
const PENDING_AFTER_MS = 300;
const IDLE_TEXT = "drag to see the whole page as it was at that moment";
// Moments already shown come back at once (a step back, a second look): the newest few are
// kept, 8 at most and fewer for a big job (a 1,024-rank moment is ~2 MB of JSON): about
// KEPT_RANKS rank-moments in all, never fewer than 2 moments.
const MAX_KEPT = 8;
const KEPT_RANKS = 4096;
// A moment this close to a running job's present may still gain events (a batch received
// and not yet stored, more than ten seconds of them when the server is behind): it is
// shown, never kept.
const SETTLED_S = 60;
const AHEAD_AFTER_MS = 400; // resting on a moment this long asks for the next second
const MARKS_AHEAD_RANKS = 256; // ... and, up to this many ranks, the incidents on either side
// While the slider moves or plays, a job of this many ranks (a moment costs the server up to
// seconds to fold) is shown by its keyframes: the server stores them every PGDASH_KEYFRAME_S
// (10 s by default) for jobs this big (dashboard/history/keyframes.py's MIN_RANKS).
const KEYFRAME_RANKS = 128;
const KEYFRAME_WITHIN_S = 30;
// Play shows keyframes when each tick moves this far (10x and faster): a slower one steps
// the exact moments forward, each a short fold on from the last (the server keeps its place).
const KEYFRAME_PLAY_STEP_S = 5;

/** What main.js provides: render(), showError(), refresh(). */
export const replayHooks = { render: () => {}, showError: () => {}, refresh: async () => {} };

let request = 0; // answers to older requests are dropped
let inFlight = false;
let wanted = null; // the newest moment asked (drag, keys) while another was loading
let wantedNear = false; // ... and whether a keyframe before it will do (the slider moving)
let marks = []; // moments of the job's incidents (Unix seconds, sorted): Shift+arrows go there
let playTimer = null;
let pendingTimer = null;
let aheadTimer = null;
let range = null; // [start, end] of the job (Unix seconds), from GET /api/jobs/<id>
const kept = new Map(); // moment (Unix seconds) -> its answer, the least recently used first
const asked = new Map(); // moment -> the answer on its way (shown or fetched ahead)

/** The job's span: its start to its end, or to now while it runs. */
function bounds() {
  let start;
  let end;
  if (range) {
    start = range.start;
    end = range.running ? Math.max(range.end, PG.clockNow()) : range.end;
  } else if (state.job && PG.isNum(state.job.started_at)) {
    start = state.job.started_at;
    end = PG.isNum(state.job.ended_at) ? state.job.ended_at : state.serverTime || PG.clockNow();
  } else return null;
  return [start, Math.max(end, start + 1)];
}

/** Learn the job's span once (a replayed moment's header says only what was known then). */
async function learnRange() {
  const job = await PG.fetchJSON("/api/jobs/" + JOB_ID);
  if (PG.isNum(job.started_at)) {
    const running = !PG.isNum(job.ended_at);
    range = { start: job.started_at, end: running ? PG.clockNow() : job.ended_at, running };
  }
}

/** Why a moment could not be shown (kept until the next moment is shown). */
function showReplayError(msg) {
  const box = $("replay-error");
  box.textContent = msg;
  box.hidden = !msg;
  if (msg) page.dataset.replayed = "error";
}

/** Whether the job has ended (its span is known and closed, or the live job says so). */
function jobEnded() {
  const job = state.replay ? null : state.job; // a replayed header says what was known then
  if (job) return job.status === "finished" || job.status === "failed";
  return Boolean(range && !range.running);
}

/**
 * The indicator at the top (base.html #live) says what the page shows: "Replay" and the
 * moment while a past one is on screen, "Ended" for a job that ended, else the connection
 * ("Live"). The way back says where it leads: the live job, or the end of an ended one.
 */
export function showIndicator() {
  const ended = jobEnded();
  if (ended && range && range.running && !state.replay && PG.isNum(state.job.ended_at)) {
    range = { start: range.start, end: state.job.ended_at, running: false }; // it ended while watched
  }
  $("replay-live").textContent = ended ? "Back to the end" : "Back to live";
  if (state.replay) {
    const at = state.replay.at;
    let rel = "";
    if (range && !range.running) {
      const before = range.end - at;
      rel = before < 1 ? "the end" : PG.fmtDuration(before) + " before the end";
    } else if (range) {
      rel = PG.fmtDuration(PG.clockNow() - at) + " ago"; // a label: the job runs on
    }
    PG.setMoment({
      state: "replay",
      text: "Replay \u00b7 " + PG.fmtTime(at).slice(11) + (rel ? " (" + rel + ")" : ""),
      title: "The page shows the job as it was at " + PG.fmtTime(at) + ", not live. " + (ended ? "\u201cBack to the end\u201d shows how it ended." : "\u201cBack to live\u201d follows it again."),
    });
    return;
  }
  const job = state.job;
  if (job && (job.status === "finished" || job.status === "failed")) {
    PG.setMoment({
      state: "ended",
      text: "Ended" + (PG.isNum(job.ended_at) ? " \u00b7 " + PG.fmtTime(job.ended_at).slice(11) : ""),
      title: "This job " + (job.status === "failed" ? "failed" : "finished") + (PG.isNum(job.ended_at) ? " at " + PG.fmtTime(job.ended_at) : "") + ": the page shows how it ended.",
    });
    return;
  }
  PG.setMoment(null);
}

export function showReplayBar() {
  const bar = $("replay");
  if (bar.hidden && bounds()) bar.hidden = false;
}

function describe(at, pending) {
  const b = bounds();
  let text = PG.fmtTime(at) + (b ? " (+" + PG.fmtDuration(at - b[0]) + ")" : "");
  if (pending) {
    text += " \u00b7 loading\u2026";
    if (state.replay && state.replay.shown) text += " (showing " + PG.fmtTime(state.replay.at) + ")";
  }
  $("replay-when").textContent = text;
  $("replay-when").classList.add("replaying");
}

/**
 * `at` is asked for: if it is slow to come, say that the page still shows another moment, and
 * dim it, unless it is the keyframe just before `at` (a moment as true as any, seconds off).
 */
function awaitMoment(at) {
  clearTimeout(pendingTimer);
  pendingTimer = setTimeout(() => {
    const shown = state.replay && state.replay.shown ? at - state.replay.at : Infinity;
    if (!(byKeyframes() && shown >= 0 && shown <= KEYFRAME_WITHIN_S)) page.classList.add("replay-pending");
    describe(at, true);
  }, PENDING_AFTER_MS);
}

function momentSettled() {
  clearTimeout(pendingTimer);
  pendingTimer = null;
  page.classList.remove("replay-pending");
}

function placeSlider(at) {
  const b = bounds();
  if (b) $("replay-at").value = String(Math.round(((at - b[0]) / (b[1] - b[0])) * REPLAY_STEPS));
}

/** Whether moving the slider shows keyframes (see KEYFRAME_RANKS) rather than exact moments. */
function byKeyframes() {
  const ranks = state.job && Array.isArray(state.job.ranks) ? state.job.ranks.length : 0;
  return ranks >= KEYFRAME_RANKS;
}

/**
 * The server's answer for moment `at`: kept from before (if settled: see SETTLED_S), on its
 * way already (fetched ahead), or asked now. With `near`, the newest stored keyframe up to
 * KEYFRAME_WITHIN_S before `at` will do (its `at` says which moment it is).
 */
function fetchMoment(at, near) {
  const have = kept.get(at);
  kept.delete(at); // now the most recently used, or asked again
  if (have && settled(at)) {
    kept.set(at, have);
    return Promise.resolve(have);
  }
  const key = near ? "near " + at : at;
  if (asked.has(key)) return asked.get(key);
  if (!near && asked.has("near " + at)) return asked.get("near " + at).then(() => fetchMoment(at));
  const within = near ? "&within=" + KEYFRAME_WITHIN_S : "";
  const answer = PG.fetchJSON("/api/jobs/" + JOB_ID + "/state?at=" + at + within)
    .then((data) => {
      kept.set(PG.isNum(data.at) ? data.at : at, data);
      while (kept.size > maxKept()) kept.delete(kept.keys().next().value);
      return data;
    })
    .finally(() => asked.delete(key));
  asked.set(key, answer);
  return answer;
}

/** Whether moment `at` can no longer change: the job ended, or it is long past. */
function settled(at) {
  return (range !== null && !range.running) || at < PG.clockNow() - SETTLED_S;
}

/** How many moments the page keeps for this job (see KEPT_RANKS). */
function maxKept() {
  const ranks = state.job && Array.isArray(state.job.ranks) ? state.job.ranks.length : 0;
  return Math.max(2, Math.min(MAX_KEPT, Math.floor(KEPT_RANKS / Math.max(1, ranks))));
}

/** Whether moment `at` is kept (and settled) or on its way: asking again would add nothing. */
function have(at) {
  return (kept.has(at) && settled(at)) || asked.has(at);
}

/**
 * While the page rests on `at`, ask for the second after it: → and Play then show it at
 * once. One second ahead only: the server keeps the moment it showed last, so the next
 * second is a short fold there, where a moment before it would be a rewind. For a job of up
 * to MARKS_AHEAD_RANKS ranks (its moments cost the server a fraction of a second), the
 * incident marks on either side follow, one after the other: Shift+←/→ then show them at once.
 */
function fetchAhead(at) {
  const b = bounds();
  if (!b || playTimer) return;
  const next = at + 1;
  const ahead = next <= b[1] && !have(next) ? fetchMoment(next) : Promise.resolve();
  if (next <= b[1]) page.dataset.ahead = String(next); // tests wait for this
  const ranks = state.job && Array.isArray(state.job.ranks) ? state.job.ranks.length : Infinity;
  if (ranks > MARKS_AHEAD_RANKS) return;
  const around = [marks.find((t) => t > at + 0.5), marks.filter((t) => t < at - 0.5).pop()].filter((t) => t !== undefined);
  let chain = ahead.catch(() => {});
  for (const t of around) {
    // Each only while the page still rests on `at` (a drag or a key press moved on: no more).
    const resting = () => state.replay && state.replay.at === at && !inFlight;
    chain = chain.then(() => (resting() && !have(t) ? fetchMoment(t).catch(() => {}) : null));
  }
  chain.then(() => {
    if (state.replay && state.replay.at === at) page.dataset.aheadMarks = around.join(" "); // tests wait for this
  });
}

/**
 * Show the job at `at` (Unix seconds), or with `near` at the keyframe before it the server
 * has (see fetchMoment); a failure is said on the page, nothing else moves.
 */
export async function loadReplay(at, near) {
  const ticket = ++request;
  clearTimeout(aheadTimer);
  inFlight = true;
  awaitMoment(at);
  let data;
  try {
    data = await fetchMoment(at, near);
  } catch (err) {
    if (ticket === request) {
      inFlight = false;
      momentSettled();
      pause();
      showReplayError("Could not show the job at that moment: " + err.message);
      if (!state.replay || !state.replay.shown) leaveReplay(); // nothing replayed yet: live
      else describe(state.replay.at); // the label says the moment the page still shows
    }
    return false;
  } finally {
    if (ticket === request) inFlight = false;
  }
  if (ticket !== request) return false;
  momentSettled();
  if (PG.isNum(data.at)) at = data.at; // a keyframe: the moment it is
  state.replay = { at: at, shown: true };
  showReplayError("");
  PG.setViewAt(at); // "5 s ago" is measured from the moment shown, never from now
  showSections(data.sections || {});
  page.classList.add("replaying");
  $("replay-live").hidden = false;
  describe(at);
  history.replaceState(null, "", location.pathname + "?at=" + at);
  replayHooks.showError("");
  replayHooks.render();
  page.dataset.replayed = String(at); // tests wait for this
  compareTo(at);
  // Once the page rests there (not while a drag or Play moves on): the second after.
  aheadTimer = setTimeout(() => {
    if (!inFlight && wanted === null && state.replay && state.replay.at === at) fetchAhead(at);
  }, AHEAD_AFTER_MS);
  return true;
}

/**
 * Show `at` as soon as the server can: one moment is asked at a time, and while it loads
 * the newest moment asked waits (dragging shows the moments in between as they come,
 * coarse while the server is slow, the exact one where the slider stops).
 */
function seek(at, near) {
  wanted = at;
  wantedNear = Boolean(near);
  if (inFlight) return;
  const next = wanted;
  wanted = null;
  loadReplay(next, wantedNear).finally(() => {
    if (wanted !== null && !inFlight) seek(wanted, wantedNear);
  });
}

/** The moment a key press starts from: the one asked last, else the one shown. */
function currentMoment() {
  const b = bounds();
  if (wanted !== null) return wanted;
  if (state.replay) return state.replay.at;
  return b ? b[1] : null;
}

/** ←/→ a second, Shift+←/→ the previous/next incident, Home/End the job's ends. */
function stepKey(ev) {
  const b = bounds();
  const at = currentMoment();
  if (!b || at === null || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  let next = null;
  if (ev.key === "ArrowLeft" || ev.key === "ArrowRight") {
    const dir = ev.key === "ArrowLeft" ? -1 : 1;
    if (ev.shiftKey) {
      const found = dir < 0 ? marks.filter((t) => t < at - 0.5).pop() : marks.find((t) => t > at + 0.5);
      next = found === undefined ? (dir < 0 ? b[0] : b[1]) : found;
    } else next = at + dir;
  } else if (ev.key === "Home") next = b[0];
  else if (ev.key === "End") next = b[1];
  if (next === null) return;
  ev.preventDefault();
  pause();
  next = Math.min(b[1], Math.max(b[0], next));
  placeSlider(next);
  describe(next);
  seek(next);
}

/** Learn the moments of the job's incidents (they open and resolve): Shift+arrows' stops,
 *  and the slider's tick marks. */
async function learnMarks() {
  const body = await PG.fetchJSON("/api/jobs/" + JOB_ID + "/incidents");
  const found = new Set();
  state.jobIncidents = body.incidents || [];
  for (const inc of state.jobIncidents) {
    if (PG.isNum(inc.first_seen)) found.add(inc.first_seen);
    if (!inc.active && PG.isNum(inc.last_seen)) found.add(inc.last_seen);
  }
  marks = Array.from(found).sort((x, y) => x - y);
  const b = bounds();
  const list = $("replay-marks");
  while (list.firstChild) list.removeChild(list.firstChild);
  for (const t of b ? marks : []) {
    const option = document.createElement("option");
    option.value = String(Math.round(((t - b[0]) / (b[1] - b[0])) * REPLAY_STEPS));
    list.appendChild(option);
  }
  // A moment shown before they came (the page opened at ?at=, where an incident begins)
  // says now whether one is forming there.
  if (state.replay && state.job) replayHooks.render();
}

function pause() {
  clearInterval(playTimer);
  playTimer = null;
  $("replay-play").textContent = "Play";
  $("replay-play").setAttribute("aria-pressed", "false");
}

function play() {
  const b = bounds();
  if (!b) return;
  let at = state.replay ? state.replay.at : b[0];
  if (at >= b[1]) at = b[0]; // played to the end: start over
  $("replay-play").textContent = "Pause";
  $("replay-play").setAttribute("aria-pressed", "true");
  let last = performance.now();
  const step = () => {
    const t = performance.now();
    const speed = Number($("replay-speed").value) || 1;
    if (inFlight) return; // a slow answer holds the moment back, it never piles requests
    at = Math.min(bounds()[1], at + (speed * (t - last)) / 1000);
    last = t;
    placeSlider(at);
    loadReplay(at, byKeyframes() && (speed * PLAY_TICK_MS) / 1000 >= KEYFRAME_PLAY_STEP_S);
    if (at >= bounds()[1]) pause();
  };
  step();
  playTimer = setInterval(step, PLAY_TICK_MS);
}

function backToLive() {
  showReplayError("");
  leaveReplay();
}

function leaveReplay() {
  request++;
  clearTimeout(aheadTimer);
  momentSettled();
  pause();
  wanted = null;
  pin(null);
  state.replay = null;
  PG.setViewAt(null);
  page.classList.remove("replaying");
  $("replay-live").hidden = true;
  $("replay-at").value = String(REPLAY_STEPS);
  $("replay-when").textContent = IDLE_TEXT;
  $("replay-when").classList.remove("replaying");
  history.replaceState(null, "", location.pathname);
  forgetExpanded();
  if (haveLive()) showLive(null);
  else replayHooks.refresh(true).catch((err) => replayHooks.showError("Could not load job: " + err.message));
}

/**
 * Wire the replay bar; open the moment the address asks for (?at=). Returns true when the
 * page opens in replay (then the live feed waits behind it).
 */
export function setupReplay() {
  $("replay-at").addEventListener("input", (ev) => {
    const b = bounds();
    if (!b) return;
    pause();
    const at = b[0] + ((b[1] - b[0]) * Number(ev.target.value)) / REPLAY_STEPS;
    describe(at);
    seek(at, byKeyframes());
  });
  // Let go: the exact moment where it stopped (keyframes were shown on the way).
  $("replay-at").addEventListener("change", (ev) => {
    const b = bounds();
    if (!b || !byKeyframes()) return;
    const at = b[0] + ((b[1] - b[0]) * Number(ev.target.value)) / REPLAY_STEPS;
    if (!state.replay || state.replay.at !== at) seek(at, false);
  });
  $("replay-at").addEventListener("keydown", stepKey); // a second a press, not a slider step
  document.addEventListener("keydown", (ev) => {
    const t = ev.target;
    if ($("replay").hidden || ev.target === $("replay-at")) return;
    if (!state.replay || (t && (t.isContentEditable || ["INPUT", "SELECT", "TEXTAREA"].includes(t.tagName)))) return;
    stepKey(ev);
  });
  $("replay-play").addEventListener("click", () => (playTimer ? pause() : play()));
  $("replay-live").addEventListener("click", backToLive);
  setupCompare(currentMoment);
  learnRange().catch(() => {}).then(() => {
    showIndicator();
    return learnMarks();
  }).catch(() => {}); // without it the slider spans what the page knows
  PG.tick(() => state.replay && range && range.running && showIndicator()); // "(2 m ago)" moves on

  const raw = new URLSearchParams(location.search).get("at");
  if (raw === null) return false;
  const at = raw.trim() === "" ? NaN : Number(raw);
  if (!Number.isFinite(at)) {
    showReplayError("The address asks for the moment at=" + JSON.stringify(raw.slice(0, 40)) + ", which is not a time: give Unix seconds, e.g. ?at=1764000000.5. Showing the job live instead.");
    return false;
  }
  state.replay = { at: at }; // the live feed and the REST load wait behind it
  PG.setViewAt(at);
  showIndicator();
  page.classList.add("replaying");
  $("replay-live").hidden = false;
  describe(at);
  learnRange()
    .catch(() => {})
    .then(() => {
      showReplayBar();
      placeSlider(at);
    });
  loadReplay(at);
  return true;
}
