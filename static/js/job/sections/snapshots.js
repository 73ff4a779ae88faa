/*
 * pgdash job page: snapshots. Ask ranks what they are doing (one rank, some, the blamed
 * ones, all: POST /api/jobs/<id>/snapshots) and show the answers as they arrive (GET
 * /api/jobs/<id>/snapshots/<sid>): identical training-thread stacks grouped with their ranks,
 * the odd ones out first; where each rank stands in each of its groups (the wavefront); the
 * ranks that did not answer and why; and the last collectives of the ranks shown in detail,
 * one row per rank on a shared time axis, with the collective still in flight.
 * Every grouping and status comes from the server (dashboard/web/snapshots.py).
 */
import { PG } from "../../common.js";
import { $, JOB_ID, state, text } from "../ctx.js";

const { el, clear } = PG;

const POLL_MS = 500; // while a request's answers arrive
const POLL_FOR_MS = 20000; // then it is complete (the server says so after 5 s) or given up
const DETAIL_RANKS = 8; // ranks whose whole answer (threads, groups, collectives) is shown
const TIMELINE_S = 30; // seconds of collectives before the snapshot on the timeline
const MAX_RANKS_TEXT = 20000; // the ranks box accepts at most this many characters

let shown = null; // the request id on screen
let pollTimer = null;
let pollUntil = 0;
const listed = new Set(); // request ids the picker holds
let listing = false; // a listing is on its way

/** "3", "0-7,12" -> [0..7, 12]; throws with what is wrong. */
export function parseRanks(textIn) {
  const text = String(textIn || "").replace(/\s+/g, "");
  if (!text) throw new Error("name the ranks to snapshot, e.g. 3 or 0-7,12");
  if (text.length > MAX_RANKS_TEXT) throw new Error("too many ranks: ask for all instead");
  const out = new Set();
  for (const part of text.split(",")) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!m) throw new Error("'" + part + "' is not a rank or a range like 0-7");
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo) throw new Error("'" + part + "' runs backwards");
    if (hi - lo > 4096) throw new Error("'" + part + "' is more than 4,096 ranks: ask for all instead");
    for (let r = lo; r <= hi; r++) out.add(r);
  }
  return Array.from(out).sort((a, b) => a - b);
}

function say(msg, isError) {
  const box = $("snapshot-status");
  box.textContent = msg;
  box.classList.toggle("error", Boolean(isError));
}

/** Ask (which: a list of ranks, "blamed" or "all"), then show the request as it fills. */
async function ask(which) {
  say("asking\u2026");
  try {
    const res = await fetch(PG.url("/api/jobs/" + JOB_ID + "/snapshots"), {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ ranks: which, native: $("snapshot-native").checked }),
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {
      say(String(body.error || "the server answered " + res.status), true);
      return;
    }
    say("asked " + countRanks(body.asked) + (body.not_connected.length ? "; not connected here: " + PG.fmtRanks(body.not_connected) : ""));
    await listRequests(body.id);
  } catch (err) {
    say("could not ask: " + err.message, true);
  }
}

function countRanks(ranks) {
  return ranks.length === 1 ? "rank " + ranks[0] : ranks.length + " ranks";
}

/** Fill the request picker (newest first) and show ``select`` (or the newest). */
async function listRequests(select) {
  let body;
  try {
    body = await PG.fetchJSON("/api/jobs/" + JOB_ID + "/snapshots");
  } catch (err) {
    say("could not list the snapshots: " + err.message, true);
    return;
  }
  const list = Array.isArray(body.snapshots) ? body.snapshots : [];
  listed.clear();
  for (const r of list) listed.add(r.id);
  const picker = $("snapshot-list");
  clear(
    picker,
    list.map((r) =>
      el("option", { value: r.id, text: requestLabel(r.asked_at, r.reason, r.answered, r.asked.length + r.not_connected.length) })
    )
  );
  picker.hidden = !list.length;
  const id = select || (list.length ? list[0].id : null);
  if (id) {
    picker.value = id;
    show(id);
  }
}

function requestLabel(at, reason, answered, asked) {
  return PG.fmtTime(at) + " \u00b7 " + (reason || "asked") + " \u00b7 " + answered + "/" + asked + " answered";
}

/** Show request ``id`` in the card and bring the card into view (an incident's snapshot:
 *  every asked rank's answer and last collectives around it). */
export async function openRequest(id) {
  await listRequests(id);
  $("snapshots-card").scrollIntoView({ behavior: "smooth", block: "start" });
}

/** Show one request, polling while its answers come. */
function show(id) {
  shown = id;
  pollUntil = Date.now() + POLL_FOR_MS;
  poll(id, null);
}

async function poll(id, detail) {
  clearTimeout(pollTimer);
  let view;
  try {
    const q = detail && detail.length ? "?detail=" + detail.join(",") : "";
    view = await PG.fetchJSON("/api/jobs/" + JOB_ID + "/snapshots/" + id + q);
  } catch (err) {
    if (id === shown) say("could not read the snapshot: " + err.message, true);
    return;
  }
  if (id !== shown) return; // another request was picked meanwhile
  const want = detailRanks(view);
  const have = Object.entries(view.ranks).filter(([, row]) => row.threads).map(([r]) => Number(r));
  renderView(view);
  const missingDetail = want.some((r) => !have.includes(r) && view.ranks[r] && view.ranks[r].status === "answered");
  // A silent rank another rank's agent is still reading from outside (py-spy) comes later.
  const reading = Object.values(view.ranks).some((row) => row.read_from_outside && !row.read_from_outside.dump && !row.read_from_outside.error);
  if ((!view.complete || missingDetail || reading) && Date.now() < pollUntil) {
    pollTimer = setTimeout(() => poll(id, want), missingDetail && view.complete ? 0 : POLL_MS);
  }
}

/** The ranks shown in detail: one of each stack group, the odd ones out first, then the
 *  ranks the page has selected. */
function detailRanks(view) {
  const out = [];
  const sel = state.selection && state.selection.kind === "rank" ? [state.selection.rank] : [];
  for (const r of sel) if (view.ranks[r]) out.push(r);
  for (const g of view.groups || []) {
    for (const r of g.ranks.slice(0, g.ranks.length <= 2 ? 2 : 1)) if (!out.includes(r)) out.push(r);
    if (out.length >= DETAIL_RANKS) break;
  }
  return out.slice(0, DETAIL_RANKS);
}

function renderView(view) {
  const rows = Object.entries(view.ranks);
  const count = (status) => rows.filter(([, r]) => r.status === status).length;
  const parts = [count("answered") + " answered"];
  for (const status of ["waiting", "no answer", "not connected"]) if (count(status)) parts.push(count(status) + " " + status);
  say("asked " + countRanks(rows.map(([r]) => Number(r))) + " at " + PG.fmtTime(view.asked_at) + (view.reason ? " (" + view.reason + ")" : "") + ": " + parts.join(", "));
  clear(
    $("snapshot-view"),
    stackGroups(view.groups || []),
    missingNode(view),
    wavefrontNode(view.wavefront || {}),
    timelineNode(view),
    detailNodes(view)
  );
  const option = Array.from($("snapshot-list").options).find((o) => o.value === view.id);
  if (option) option.textContent = requestLabel(view.asked_at, view.reason, count("answered"), rows.length);
  $("snapshot-view").dataset.request = view.id;
  $("snapshot-view").dataset.complete = view.complete ? "1" : "0";
}

function whereText(w) {
  return w ? String(w.file).split("/").pop() + ":" + w.line + " in " + w.function + (w.code ? ": " + w.code : "") : "";
}

function stackGroups(groups) {
  if (!groups.length) return el("p", { class: "empty", text: "No rank has answered yet." });
  return el(
    "ol",
    { class: "stack-groups" },
    groups.map((g) =>
      el(
        "li",
        { class: "stack-group" + (g.ranks.length === 1 && groups.length > 1 ? " odd-one" : ""), dataset: { ranks: g.ranks.join(",") } },
        el("div", { class: "stack-group-head" }, el("span", { class: "blamed", text: (g.ranks.length === 1 ? "rank " : g.ranks.length + " ranks: ") + PG.fmtRanks(g.ranks) }), g.thread ? el("span", { class: "muted", text: " \u00b7 " + g.thread }) : null),
        g.where ? el("div", { class: "mono snapshot-where", text: whereText(g.where) }) : null,
        el("pre", { class: "ev-text", text: String(g.stack || "(no Python frames)") })
      )
    )
  );
}

const GONE = {
  exited: "it exited",
  finished: "it exited",
  failed: "it failed",
  lost: "it was lost (its process vanished)",
};

/** How a rank that has ended ended, and when ("it failed at 12:00:01"); null while it runs. */
function gone(row) {
  return GONE[row.rank_status] ? GONE[row.rank_status] + (PG.isNum(row.exit_at) ? " at " + PG.fmtTime(row.exit_at) : "") : null;
}

// Why a rank did not answer. Where a rank of its host read it from outside (or is reading it),
// that reading says where it is: the py-spy command to run by hand is left out unless the
// reading failed. A rank that has ended since (asked as it went down) is not "blocked".
const WHY = {
  "no answer": (proc, row) =>
    row.read_from_outside && !row.read_from_outside.error
      ? "asked, silent"
      : gone(row)
        ? "asked, silent: " + gone(row) + ", before it answered"
        : "asked, silent: its interpreter may be blocked in C with the GIL held, or frozen; `py-spy dump --native --pid " + (proc ? proc.pid + "` on " + proc.host : "<pid>` on its host") + " shows where",
  "not connected": (proc, row) =>
    row.read_from_outside && row.read_from_outside.dump
      ? "its agent's connection is gone, but its process is still there"
      : gone(row)
        ? gone(row) + ": nobody is left to ask"
        : "its agent holds no connection here: exited, lost, or connected to another server process",
};

function processOf(rank) {
  const ranks = state.job && Array.isArray(state.job.ranks) ? state.job.ranks : [];
  const r = ranks.find((x) => x.rank === rank);
  return r && PG.isNum(r.pid) && r.host ? r : null;
}

const DUMP_THREAD = /^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$/; // as pgdash_agent/native.py reads it

/**
 * py-spy's dump without the agent's own threads (named pgdash-…), which only wait: the
 * text, and how many were left out. The API keeps the whole dump.
 */
function userThreads(dump) {
  const kept = [];
  let skipping = false;
  let left = 0;
  for (const line of String(dump).split("\n")) {
    const head = DUMP_THREAD.exec(line);
    if (head) {
      skipping = (head[3] || "").startsWith("pgdash-");
      left += skipping ? 1 : 0;
    } else if (skipping && !/^\s/.test(line)) skipping = false;
    if (!skipping) kept.push(line);
  }
  return { text: kept.join("\n"), left };
}

/** A silent rank as another rank's agent on its host, or the host's reader process, read it
 * with py-spy (or why it could not). */
function outsideNode(outside) {
  if (!outside) return null;
  if (!PG.isNum(outside.by) && !outside.host_reader) return el("div", { class: "snapshot-outside", text: "Not read from outside: " + (outside.error || "nobody was asked") });
  const by = outside.host_reader
    ? "the host reader" + (PG.isNum(outside.reader_pid) ? " (pid " + outside.reader_pid + ")" : "") +
      (PG.isNum(outside.by) ? " that rank " + outside.by + " started" : "")
    : "rank " + outside.by + "'s agent (same host)";
  if (!outside.dump && outside.error) return el("div", { class: "snapshot-outside", text: by + " could not read it from outside: " + outside.error });
  if (!outside.dump) return el("div", { class: "snapshot-outside", text: by + " is reading it from outside with py-spy\u2026" });
  const what = outside.gil_held_by
    ? "blocked with the GIL held (thread " + outside.gil_held_by + "), so its agent cannot answer"
    : "read from outside";
  const shown = userThreads(outside.dump);
  return el(
    "details",
    { class: "snapshot-outside", open: true },
    el("summary", { text: what + ": py-spy dump by " + by + " at " + PG.fmtTime(outside.t) }),
    el("pre", { class: "ev-text", text: shown.text }),
    shown.left ? el("div", { class: "muted", text: shown.left + " thread" + (shown.left === 1 ? "" : "s") + " of pgdash's agent left out (GET the snapshot for the whole dump)" }) : null
  );
}

function missingNode(view) {
  const missing = Object.entries(view.ranks).filter(([, r]) => WHY[r.status]);
  if (!missing.length) return null;
  return el(
    "div",
    { class: "ev-block snapshot-missing" },
    el("div", { class: "ev-label", text: "Did not answer" }),
    el(
      "ul",
      null,
      missing.map(([rank, row]) =>
        el(
          "li",
          { dataset: { rank } },
          el("span", { class: "blamed", text: "rank " + rank }),
          " " + row.status + ": " + WHY[row.status](processOf(Number(rank)), row),
          outsideNode(row.read_from_outside),
          row.last_stack ? el("details", null, el("summary", { text: "its last stack, sent from a collective " + PG.fmtTime(row.last_stack.t) }), el("pre", { class: "ev-text", text: String(row.last_stack.stack || "") })) : null
        )
      )
    )
  );
}

function wavefrontNode(wave) {
  const groups = Object.keys(wave);
  if (!groups.length) return null;
  return el(
    "table",
    { class: "wavefront" },
    el("caption", { class: "ev-label", text: "Where each group's ranks stand (fewest ranks first)" }),
    el("thead", null, el("tr", null, ["group", "ranks", "entered", "completed", "in flight"].map((h) => el("th", { text: h })))),
    el(
      "tbody",
      null,
      groups.flatMap((g) =>
        wave[g].map((p, i) =>
          el(
            "tr",
            { class: i === 0 && wave[g].length > 1 ? "odd-one" : "" },
            el("td", { class: "mono", text: i === 0 ? g : "" }),
            el("td", { text: PG.fmtRanks(p.ranks) }),
            el("td", { class: "num", text: p.entered == null ? PG.DASH : String(p.entered) }),
            el("td", { class: "num", text: p.completed == null ? PG.DASH : String(p.completed) }),
            el("td", { class: "mono", text: p.inflight_op || "" })
          )
        )
      )
    )
  );
}

/** The last collectives of the ranks shown in detail, one row each on one time axis. */
function timelineNode(view) {
  const ranks = Object.entries(view.ranks).filter(([, r]) => Array.isArray(r.recent));
  if (!ranks.length) return null;
  const end = Math.max(...ranks.map(([, r]) => r.t));
  const start = end - TIMELINE_S;
  const x = (t) => Math.max(0, Math.min(100, ((t - start) / TIMELINE_S) * 100));
  const ops = new Map();
  const hue = (op) => {
    if (!ops.has(op)) ops.set(op, (200 + ops.size * 67) % 300); // never the in-flight red
    return ops.get(op);
  };
  const rows = ranks.map(([rank, r]) => {
    const bars = r.recent
      .filter((c) => c.end >= start)
      .map((c) =>
        el("span", {
          class: "tl-bar" + (c.source === "flight_recorder" ? " tl-cpp" : ""),
          style: "left:" + x(c.start).toFixed(2) + "%;width:" + Math.max(0.3, x(c.end) - x(c.start)).toFixed(2) + "%;background:hsl(" + hue(c.op) + ",55%,55%)",
          title: c.op + (c.seq != null ? " #" + c.seq : "") + " on group " + c.group + ", " + PG.fmtUs((c.end - c.start) * 1e6) + ", " + PG.fmtBytes(c.bytes) + ", ended " + PG.fmtTime(c.end) + (c.source === "flight_recorder" ? " (issued from C++, timed by the Flight Recorder)" : ""),
        })
      );
    for (const g of r.groups || []) {
      if (!g.inflight_op || !PG.isNum(g.inflight_since)) continue;
      bars.push(el("span", { class: "tl-bar tl-inflight", style: "left:" + x(g.inflight_since).toFixed(2) + "%;width:" + Math.max(0.3, x(r.t) - x(g.inflight_since)).toFixed(2) + "%", title: g.inflight_op + " on group " + g.group + ", in flight since " + PG.fmtTime(g.inflight_since) }));
    }
    return el("div", { class: "tl-row", dataset: { rank } }, el("span", { class: "tl-rank", text: "rank " + rank }), el("span", { class: "tl-track" }, bars));
  });
  return el(
    "div",
    { class: "ev-block snapshot-timeline" },
    el("div", { class: "ev-label", text: "Last collectives, the " + TIMELINE_S + " s before each answer (red: in flight when asked; outlined: issued from C++, timed by the Flight Recorder)" }),
    rows,
    el("div", { class: "tl-legend small muted" }, Array.from(ops.keys()).map((op) => el("span", { class: "tl-key" }, el("span", { class: "tl-swatch", style: "background:hsl(" + hue(op) + ",55%,55%)" }), op)))
  );
}

function detailNodes(view) {
  const ranks = Object.entries(view.ranks).filter(([, r]) => Array.isArray(r.threads));
  if (!ranks.length) return null;
  return ranks.map(([rank, r]) =>
    el(
      "details",
      { class: "evidence snapshot-rank", dataset: { rank } },
      el("summary", { text: "rank " + rank + ": " + r.threads.length + (r.threads.length === 1 ? " thread" : " threads") + (PG.isNum(r.took_ms) ? ", answered in " + r.took_ms + " ms" : "") }),
      r.gpu ? el("p", { class: "small", text: "Last GPU reading (" + PG.fmtTime(r.gpu.t) + "): " + [PG.isNum(r.gpu.util_gpu) ? r.gpu.util_gpu + "% busy" : null, PG.isNum(r.gpu.temp_c) ? r.gpu.temp_c + " °C" : null, PG.isNum(r.gpu.power_w) ? r.gpu.power_w + " W" : null, r.gpu.lost ? "GPU lost" : null].filter(Boolean).join(", ") }) : null,
      r.error ? el("div", { class: "ev-block" }, el("div", { class: "ev-label", text: "Last error (" + PG.fmtTime(r.error.t) + ", " + text(r.error.where) + "): " + text(r.error.error_type) }), el("pre", { class: "ev-text", text: String(r.error.error) })) : null,
      r.native_error ? el("p", { class: "small muted", text: "No native frames: " + r.native_error }) : null,
      r.threads.map((t) =>
        el(
          "div",
          { class: "ev-block" },
          el("div", { class: "ev-label", text: String(t.name) + (t.training ? " (training thread)" : "") }),
          el("pre", { class: "ev-text", text: String(t.stack || "") }),
          t.native ? [el("div", { class: "ev-label", text: "native frames, innermost first (py-spy)" }), el("pre", { class: "ev-text native", text: String(t.native) })] : null
        )
      )
    )
  );
}

/** Wire the card's controls (once); replay hides the asking, not what was stored. */
export function setupSnapshots() {
  $("snapshot-these").addEventListener("click", () => {
    let ranks;
    try {
      ranks = parseRanks($("snapshot-ranks").value);
    } catch (err) {
      say(err.message, true);
      return;
    }
    const world = state.job && PG.isNum(state.job.world_size) ? state.job.world_size : null;
    const beyond = world === null ? [] : ranks.filter((r) => r >= world);
    if (beyond.length) {
      say("this job has no rank " + beyond[0] + ": its ranks are 0-" + (world - 1), true);
      return;
    }
    ask(ranks);
  });
  $("snapshot-ranks").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") $("snapshot-these").click();
  });
  $("snapshot-blamed").addEventListener("click", () => ask("blamed"));
  $("snapshot-all").addEventListener("click", () => ask("all"));
  $("snapshot-list").addEventListener("change", (ev) => show(ev.target.value));
  listRequests(null);
}

/** On every render: the rank selected elsewhere fills the box; replay hides the asking; an
 *  incident's snapshot the picker does not hold yet is listed (shown, if none was). */
export function renderSnapshotControls() {
  const asked = (state.incidents || []).map((i) => i.snapshot && i.snapshot.ask).filter(Boolean);
  if (!listing && asked.some((id) => !listed.has(id))) {
    listing = true;
    listRequests(shown).finally(() => (listing = false));
  }
  const asking = $("snapshot-ask");
  asking.hidden = Boolean(state.replay);
  const sel = state.selection && state.selection.kind === "rank" ? String(state.selection.rank) : null;
  const box = $("snapshot-ranks");
  if (sel !== null && document.activeElement !== box && box.dataset.fromSelection !== sel) {
    box.value = sel;
    box.dataset.fromSelection = sel;
  }
}
