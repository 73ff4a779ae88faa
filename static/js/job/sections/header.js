/* pgdash job page: the header (name, status, figures), attempts and the one-line verdict. */
import { PG } from "../../common.js";
import { $, JOB_ID, state, text, severityOf } from "../ctx.js";

const { el, clear, DASH } = PG;

/** Events the agents had to drop (their buffers were full, e.g. while the server was
 *  down), by kind, as they reported them: counted, never silent. */
export function agentDrops(ranks) {
  const drops = {};
  for (const r of ranks || []) {
    for (const [kind, n] of Object.entries(r.dropped || {})) if (PG.isNum(n)) drops[kind] = (drops[kind] || 0) + n;
  }
  return drops;
}

export function renderHeader(job) {
  const name = job.name == null || job.name === "" ? "Job " + JOB_ID : String(job.name);
  const open = (state.incidents || []).filter((i) => i.active).length;
  document.title = (open ? "(" + open + ") " : "") + name + " \u00b7 pgdash";
  $("job-name").textContent = name;
  $("crumb-job").textContent = name;
  clear($("job-status"), PG.badge(job.status));

  const started = job.started_at;
  const ended = job.ended_at;
  let duration;
  if (PG.isNum(started) && PG.isNum(ended)) duration = PG.fmtDuration(ended - started);
  else if (PG.isNum(started) && state.replay) duration = PG.fmtDuration(state.replay.at - started);
  else if (PG.isNum(started) && (job.status === "running" || job.status === "initializing")) duration = PG.since(started);
  else duration = DASH;

  const ranks = Array.isArray(job.ranks) ? job.ranks : [];
  const hosts = new Set(ranks.map((r) => r.host)).size;
  // Events an agent's buffer dropped, apart from collectives it could not time (its record
  // table was full, or the Flight Recorder's ring moved on before a read): those are
  // latency samples lost, not events, and a busy job misses many without harm.
  const drops = agentDrops(ranks);
  const untimedKinds = ["collectives", "flight_recorder"];
  const sum = (keep) => Object.entries(drops).filter(([k]) => keep(k)).reduce((a, [, n]) => a + n, 0);
  const dropped = sum((k) => !untimedKinds.includes(k));
  const untimed = sum((k) => untimedKinds.includes(k));
  const title = (keep) => Object.entries(drops).filter(([k]) => keep(k)).map(([k, n]) => k + ": " + n).join(", ");
  const item = (label, value) => el("div", null, el("dt", { text: label }), el("dd", null, value));
  clear(
    $("job-meta"),
    item("Job ID", String(job.id == null ? JOB_ID : job.id)),
    item("World size", PG.fmtNum(job.world_size)),
    item("Hosts", ranks.length ? PG.fmtNum(hosts) : DASH),
    item("Backend", text(job.backend)),
    item("Started", PG.timeCell(started)),
    PG.isNum(ended) ? item("Ended", PG.timeCell(ended)) : null,
    item("Duration", duration),
    dropped > 0
      ? item("Dropped by agents", el("span", { id: "job-dropped", title: title((k) => !untimedKinds.includes(k)), text: PG.fmtNum(dropped) + " events" }))
      : null,
    untimed > 0
      ? item("Not timed", el("span", { id: "job-untimed", title: title((k) => untimedKinds.includes(k)), text: PG.fmtNum(untimed) + " collectives" }))
      : null
  );
}

/** One line per attempt of a restarted job: how it ended, when, and which ranks failed. */
export function renderAttempts(attempts) {
  const box = $("job-attempts");
  const list = Array.isArray(attempts) ? attempts : [];
  box.hidden = list.length < 2;
  if (box.hidden) return clear(box);
  clear(
    box,
    el("span", { class: "muted small", text: "Attempts" }),
    el(
      "ol",
      { class: "attempt-list" },
      list.map((a) => {
        // the live feed sends a count and the failed ranks; /api/jobs/<id> every rank row
        const rows = Array.isArray(a.ranks) ? a.ranks : [];
        const count = PG.isNum(a.ranks) ? a.ranks : rows.length;
        const bad = Array.isArray(a.failed) ? a.failed : rows.filter((r) => r.status === "failed" || r.status === "lost").map((r) => r.rank);
        const span = PG.isNum(a.started_at) && PG.isNum(a.ended_at) ? PG.fmtDuration(a.ended_at - a.started_at) : null;
        return el(
          "li",
          { class: "attempt", dataset: { attempt: String(a.attempt) } },
          el("span", { class: "strong", text: "attempt " + a.attempt }),
          PG.badge(a.status),
          el("span", { class: "muted", text: count + (count === 1 ? " rank" : " ranks") }),
          bad.length ? el("span", { class: "blamed", text: "failed or lost: " + (bad.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(bad) }) : null,
          el("span", { class: "muted" }, "started ", PG.timeCell(a.started_at)),
          span ? el("span", { class: "muted", text: "ran " + span }) : null
        );
      })
    )
  );
}

/** The verdict pill: the active incidents' count and whom they blame; in replay, with none
 *  named yet, an incident `forming` at that moment (main.js) instead of "no active incidents". */
export function renderVerdict(incidents, forming) {
  const findings = incidents;
  const active = (incidents || []).filter((f) => f.active);
  const box = $("job-verdict");
  const crit = active.filter((f) => severityOf(f)[1] === 0).length;
  const warn = active.filter((f) => severityOf(f)[1] === 1).length;
  const soon = !crit && !warn && forming && forming.length ? forming[0] : null;
  box.className = "verdict " + (crit ? "v-crit" : warn ? "v-warn" : soon ? "v-forming" : "v-ok");
  box.dataset.forming = soon ? String(soon.id) : "";
  // Who the most severe incidents blame, in one phrase.
  const worst = active.filter((f) => severityOf(f)[1] === (crit ? 0 : 1));
  const blamed = Array.from(new Set(worst.flatMap((f) => (Array.isArray(f.ranks) ? f.ranks : []))));
  const who = (ranks) => (ranks.length ? " \u00b7 at fault: " + (ranks.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(ranks) : "");
  box.textContent = crit
    ? crit + (crit === 1 ? " critical incident" : " critical incidents") + (warn ? ", " + warn + " warning" + (warn === 1 ? "" : "s") : "") + who(blamed)
    : warn
    ? warn + (warn === 1 ? " warning" : " warnings") + who(blamed)
    : soon
    ? "an incident begins here (" + String(soon.kind).replace(/_/g, " ") + "), named at the next judgement" + who(Array.isArray(soon.ranks) ? soon.ranks : [])
    : findings === null
    ? ""
    : "no active incidents";
}
