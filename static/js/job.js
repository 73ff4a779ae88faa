/*
 * pgdash: one job (templates/job.html, which carries data-job-id).
 *
 * Data in:
 *   on load  GET /api/jobs/<id>, /collectives, /findings, /incidents (no progress over REST)
 *   live     after emitting watch {"job": <id>}, Socket.IO event "job": a snapshot
 *            {job_id, v, sections: {job, ranks, groups, progress (a row per group, a
 *            column per field: expandProgress), rank_stats, findings, incidents,
 *            ops, timeline_grid, rendezvous, errors, gpus}, server_time}; then "job_delta"
 *            {job_id, v, base, sections: {name: whole value}, rows: {name: [[i, row]]},
 *            server_time} at most twice a second (dashboard/live.py). A delta whose base
 *            is not the version held means one was missed: watch again for a snapshot.
 * State:     `state` below; handlers replace parts of it and call render().
 * Render:    one function per section, each rebuilding only its own container. Small
 *            sections rebuild only when their inputs changed (PG.changed), so text
 *            selections and open <details> survive; the big ones (topology, progress,
 *            heat map, ranks) update in place and stay cheap at 1,024 ranks.
 * Selection: clicking a finding (or a rank in the topology) highlights its ranks in every
 *            section: topology cells, progress, heat map, rendezvous, the ranks table.
 * Derived:   rankStates() turns ranks, progress and findings into one state per rank:
 *            failed, lost, hung, straggling, exited, waiting, initializing, running.
 */
(function () {
  "use strict";
  const { el, clear, DASH } = PG;

  const page = document.getElementById("job-page");
  const JOB_ID = Number(page.dataset.jobId);
  const $ = (id) => document.getElementById(id);

  // An in-flight collective older than this is flagged (and the ranks its
  // group is waiting for turn from "behind" to "stuck").
  const INFLIGHT_WARN_S = 10;
  // Ranks of a moving job are routinely a few collectives apart (heartbeats are snapshots
  // taken at different moments): "behind" is only worth a colour once the others have
  // waited in a collective this long.
  const STALL_S = 2;
  const RANK_ROWS = 200; // ranks table rows drawn at once (the filter finds the others)
  const PROGRESS_DETAIL_ROWS = 256; // above this many (group, rank) rows: one strip per family
  const ERRORS_SHOWN = 50;
  const RATE_SECONDS = 5; // the collectives table's bytes/s: mean of the last full seconds

  const state = {
    job: null, // GET /api/jobs/<id> object (with ranks, groups)
    collectives: null, // rows per group, op, rank (REST only: large at 1,024 ranks)
    rankStats: null, // per rank: count and the (group, op) it runs most (live)
    progress: null, // rows; only arrives over the socket
    findings: null, // rows
    incidents: null, // rows: findings grouped by root cause (dashboard/incidents.py)
    ops: null, // rows per group family and op (socket)
    grid: null, // timeline_grid (socket)
    rendezvous: null,
    errors: null,
    gpus: null,
    serverTime: null,
    live: false, // a socket snapshot arrived: later REST answers are stale
    collSort: { key: "family", dir: "asc" },
    selection: null, // {kind: "finding", id} | {kind: "rank", rank}
    view: "hosts",
    heatFamily: null,
    openEvidence: new Set(),
    ranksFilter: "",
    replay: null, // {at} while the page shows a past moment (GET /api/jobs/<id>/state?at=)
  };

  // ----------------------------------------------------------- derived --

  /** Look-up of process groups by the name used in collectives/progress rows. */
  function indexGroups(groups) {
    const byName = new Map();
    const byId = new Map();
    for (const g of groups || []) {
      byName.set(String(g.name), g);
      byId.set(String(g.id), g);
    }
    return (key) => byName.get(String(key)) || byId.get(String(key)) || null;
  }

  /** Per rank: total collective count, and the (group, op) row it runs most. */
  function rankStats(rankRows, collectives) {
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
  function inflightByRank(progress) {
    const out = new Map();
    for (const row of progress || []) {
      if (row.inflight_op == null) continue;
      if (!out.has(row.rank)) out.set(row.rank, []);
      out.get(row.rank).push({ group: row.group, op: row.inflight_op, since: row.inflight_since });
    }
    return out;
  }

  const STATES = ["failed", "lost", "hung", "mismatch", "stuck", "straggling", "waiting", "running", "initializing", "exited", "unknown"];
  const STATE_TEXT = {
    failed: "failed",
    lost: "lost",
    hung: "hung (at fault)",
    stuck: "waiting on a hang",
    mismatch: "called another collective",
    straggling: "straggling",
    waiting: "in a collective",
    running: "running",
    initializing: "initializing",
    exited: "exited",
    unknown: "not reported",
  };

  /** One display state per rank, most serious first (see STATES). */
  function rankStates(ranks, progress, findings) {
    const hung = new Set(); // blamed by a hang finding
    const stuck = new Set(); // waiting in the collective that hangs
    const straggling = new Set();
    const mismatch = new Set(); // blamed by a desync finding
    const blamedBy = new Map();
    for (const f of findings || []) {
      if (!f.active) continue;
      for (const r of f.ranks || []) {
        if (!blamedBy.has(r)) blamedBy.set(r, []);
        blamedBy.get(r).push(f.kind);
      }
      if (f.kind === "hang") {
        for (const r of f.ranks || []) hung.add(r);
        const ev = f.evidence || {};
        for (const r of Array.isArray(ev.waiting) ? ev.waiting : []) stuck.add(r);
      } else if (f.kind === "straggler") {
        for (const r of f.ranks || []) straggling.add(r);
      } else if (f.kind === "desync") {
        for (const r of f.ranks || []) mismatch.add(r);
      }
    }
    const waiting = new Set();
    for (const row of progress || []) if (row.inflight_op != null) waiting.add(row.rank);
    const out = new Map();
    for (const r of ranks || []) {
      let s;
      if (r.status === "failed" || r.status === "lost") s = r.status;
      else if (hung.has(r.rank)) s = "hung";
      else if (mismatch.has(r.rank)) s = "mismatch";
      else if (stuck.has(r.rank)) s = "stuck";
      else if (straggling.has(r.rank)) s = "straggling";
      else if (r.status === "exited") s = "exited";
      else if (waiting.has(r.rank)) s = "waiting";
      else if (r.status === "initializing") s = "initializing";
      else if (r.status === "running") s = "running";
      else s = "unknown";
      out.set(r.rank, s);
    }
    return { states: out, blamedBy: blamedBy };
  }

  /** The ranks the current selection highlights. */
  function highlighted() {
    const sel = state.selection;
    if (!sel) return new Set();
    if (sel.kind === "rank") return new Set([sel.rank]);
    const f = ((sel.kind === "incident" ? state.incidents : state.findings) || []).find((x) => x.id === sel.id);
    return new Set(f && Array.isArray(f.ranks) ? f.ranks : []);
  }

  /**
   * One group's progress: the member ranks (group.ranks plus any rank that
   * reported), each with its progress row or null, and which ranks are furthest
   * behind. "Behind" compares entered first (a rank that never entered the
   * collective the others are waiting in is the classic hang), then completed.
   */
  function groupProgress(group, rows) {
    const byRank = new Map();
    for (const row of rows) byRank.set(row.rank, row);
    const members = new Set(group && Array.isArray(group.ranks) ? group.ranks : []);
    for (const r of byRank.keys()) members.add(r);
    const ranks = Array.from(members).sort((a, b) => a - b);

    let maxE = -Infinity;
    let maxC = -Infinity;
    let minE = Infinity;
    let n = 0;
    for (const r of rows) {
      if (!PG.isNum(r.entered) || !PG.isNum(r.completed)) continue;
      n += 1;
      if (r.entered > maxE) maxE = r.entered;
      if (r.completed > maxC) maxC = r.completed;
      if (r.entered < minE) minE = r.entered;
    }
    let minCAtMinE = Infinity;
    for (const r of rows) if (r.entered === minE && PG.isNum(r.completed)) minCAtMinE = Math.min(minCAtMinE, r.completed);
    const behind = new Map(); // rank -> how far behind (in collectives)
    if (n > 1 && (minE < maxE || minCAtMinE < maxC)) {
      for (const r of rows) {
        if (r.entered === minE && r.completed === minCAtMinE) {
          behind.set(r.rank, minE < maxE ? maxE - minE : maxC - minCAtMinE);
        }
      }
    }
    // The oldest collective other members are stuck in: once it is older than
    // INFLIGHT_WARN_S, the ranks behind are what they are waiting for.
    let oldestWait = null;
    for (const r of rows) {
      if (r.inflight_op != null && PG.isNum(r.inflight_since) && !behind.has(r.rank)) {
        oldestWait = oldestWait === null ? r.inflight_since : Math.min(oldestWait, r.inflight_since);
      }
    }
    return { ranks, byRank, behind, oldestWait, maxE: n ? maxE : null };
  }

  function sortGroups(groups) {
    return PG.sortBy(groups || [], "name", "asc");
  }

  // ------------------------------------------------------------ pieces --

  /** "tp · 1": the group's description (what people know it by), then its name. */
  function groupLabel(findGroup, key) {
    const g = findGroup(key);
    if (!g) return el("span", { class: "group", text: key == null ? DASH : String(key) });
    const name = String(g.name);
    if (g.desc == null || g.desc === "") return el("span", { class: "group", text: name });
    return el("span", { class: "group", title: "process group " + name }, String(g.desc), el("span", { class: "group-name", text: name }));
  }

  function inflightNode(findGroup, item, showGroup) {
    const node = el(
      "span",
      { class: "inflight" },
      el("span", { class: "op", text: String(item.op) }),
      showGroup ? [" on ", groupLabel(findGroup, item.group)] : null,
      PG.isNum(item.since) ? [" \u00b7 ", PG.since(item.since)] : null
    );
    return PG.overdueAt(node, PG.isNum(item.since) ? item.since + INFLIGHT_WARN_S : null);
  }

  function text(value) {
    return value === null || value === undefined || value === "" ? DASH : String(value);
  }

  function rankDescriber(ranks, derived, progress) {
    const info = new Map((ranks || []).map((r) => [r.rank, r]));
    const flights = inflightByRank(progress);
    return (rank) => {
      const r = info.get(rank);
      const parts = ["rank " + rank];
      if (r) {
        if (r.host) parts.push(String(r.host));
        if (r.device) parts.push(String(r.device));
      }
      const st = derived.states.get(rank) || "unknown";
      parts.push(STATE_TEXT[st] + (r && r.status && r.status !== st ? " (" + r.status + ")" : ""));
      let out = parts.join(" \u00b7 ");
      for (const f of flights.get(rank) || []) {
        out += "\nin " + f.op + " on group " + f.group + (PG.isNum(f.since) ? " for " + PG.fmtDuration(PG.now() - f.since) : "");
      }
      const blamed = derived.blamedBy.get(rank);
      if (blamed) out += "\nblamed by: " + blamed.join(", ");
      return out;
    };
  }

  // ---------------------------------------------------------- sections --

  /** Events the agents had to drop (their buffers were full, e.g. while the server was
   *  down), by kind, as they reported them: counted, never silent. */
  function agentDrops(ranks) {
    const drops = {};
    for (const r of ranks || []) {
      for (const [kind, n] of Object.entries(r.dropped || {})) if (PG.isNum(n)) drops[kind] = (drops[kind] || 0) + n;
    }
    return drops;
  }

  function renderHeader(job) {
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
    const drops = agentDrops(ranks);
    const dropped = Object.values(drops).reduce((a, b) => a + b, 0);
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
        ? item("Dropped by agents", el("span", { id: "job-dropped", title: Object.entries(drops).map(([k, n]) => k + ": " + n).join(", "), text: PG.fmtNum(dropped) + " events" }))
        : null
    );
  }

  /** How many attempts the job has had (torchrun restarts it after a failure). */
  function attemptCount() {
    const list = state.job && Array.isArray(state.job.attempts) ? state.job.attempts : [];
    return list.length;
  }

  /** One line per attempt of a restarted job: how it ended, when, and which ranks failed. */
  function renderAttempts(attempts) {
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

  function renderVerdict(incidents) {
    const findings = incidents;
    const active = (incidents || []).filter((f) => f.active);
    const box = $("job-verdict");
    const crit = active.filter((f) => severityOf(f)[1] === 0).length;
    const warn = active.filter((f) => severityOf(f)[1] === 1).length;
    box.className = "verdict " + (crit ? "v-crit" : warn ? "v-warn" : "v-ok");
    // Who the most severe incidents blame, in one phrase.
    const worst = active.filter((f) => severityOf(f)[1] === (crit ? 0 : 1));
    const blamed = Array.from(new Set(worst.flatMap((f) => (Array.isArray(f.ranks) ? f.ranks : []))));
    const who = blamed.length ? " \u00b7 at fault: " + (blamed.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(blamed) : "";
    box.textContent = crit
      ? crit + (crit === 1 ? " critical incident" : " critical incidents") + (warn ? ", " + warn + " warning" + (warn === 1 ? "" : "s") : "") + who
      : warn
      ? warn + (warn === 1 ? " warning" : " warnings") + who
      : findings === null
      ? ""
      : "no active incidents";
  }

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
  const severityOf = (f) => SEVERITY[String(f.severity).toLowerCase()] || ["sev-other", 3];

  function selectFinding(id) {
    const same = state.selection && state.selection.kind === "finding" && state.selection.id === id;
    state.selection = same ? null : { kind: "finding", id: id };
    render();
  }

  function selectIncident(id) {
    const same = state.selection && state.selection.kind === "incident" && state.selection.id === id;
    state.selection = same ? null : { kind: "incident", id: id };
    render();
  }

  function selectRank(rank) {
    const same = state.selection && state.selection.kind === "rank" && state.selection.rank === rank;
    state.selection = same ? null : { kind: "rank", rank: rank };
    render();
  }

  /** Evidence as readable blocks: stacks and error texts preformatted, the rest as fields. */
  function evidenceNode(f, findGroup) {
    const ev = f.evidence;
    if (ev === null || ev === undefined) return null;
    if (typeof ev !== "object") return el("pre", { class: "ev-text", text: String(ev) });
    const keys = Object.keys(ev);
    if (!keys.length) return null;
    const fields = [];
    const blocks = [];
    const rankList = (v) => (Array.isArray(v) ? PG.fmtRanks(v) : text(v));
    for (const key of keys) {
      const v = ev[key];
      if (v === null || v === undefined || (typeof v === "object" && !Array.isArray(v) && !Object.keys(v).length) || (Array.isArray(v) && !v.length)) continue;
      if (key === "stacks" && typeof v === "object") {
        for (const [rank, stack] of Object.entries(v)) {
          blocks.push(el("div", { class: "ev-block" }, el("div", { class: "ev-label", text: "Python stack of rank " + rank }), el("pre", { class: "ev-text", text: String(stack) })));
        }
      } else if ((key === "error" || key === "stack") && typeof v === "string") {
        blocks.push(el("div", { class: "ev-block" }, el("div", { class: "ev-label", text: key === "error" ? "Error text (verbatim)" : "Stack" }), el("pre", { class: "ev-text", text: v })));
      } else if (key === "chain" && Array.isArray(v)) {
        fields.push([
          "chain",
          v.map((c) => "rank " + c.rank + " waits in " + c.op + " #" + c.seq + " on group " + c.waits_in + (Array.isArray(c.for) && c.for.length ? " for " + PG.fmtRanks(c.for) : "")).join("; "),
        ]);
      } else if (key === "signatures" && typeof v === "object") {
        blocks.push(
          el(
            "div",
            { class: "ev-block" },
            el("div", { class: "ev-label", text: "What each rank called" }),
            el(
              "table",
              { class: "data ev-table" },
              el("thead", null, el("tr", null, ["rank", "op", "dtype", "bytes"].map((h) => el("th", { scope: "col", text: h })))),
              el(
                "tbody",
                null,
                Object.entries(v).map(([rank, sig]) =>
                  el(
                    "tr",
                    { class: (f.ranks || []).includes(Number(rank)) ? "row-bad" : null },
                    el("td", { class: "num", text: rank }),
                    el("td", { class: "mono", text: text(sig && sig.op) }),
                    el("td", { class: "mono", text: text(sig && sig.dtype) }),
                    el("td", { class: "num", text: sig && PG.isNum(sig.bytes) ? PG.fmtNum(sig.bytes) : DASH })
                  )
                )
              )
            )
          )
        );
      } else if (key === "waiting" || key === "missing" || key === "arrived" || key === "ranks") {
        fields.push([key, rankList(v)]);
      } else if (key === "victims" && typeof v === "object") {
        for (const [rank, err] of Object.entries(v)) {
          blocks.push(el("div", { class: "ev-block" }, el("div", { class: "ev-label", text: "Rank " + rank + " (a consequence)" }), el("pre", { class: "ev-text", text: err == null ? "(no error text)" : String(err) })));
        }
      } else if (/(_at|since|last_seen)$/.test(key) && PG.isNum(v)) {
        fields.push([key, PG.fmtTime(v) + " (" + PG.fmtAgo(v) + ")"]);
      } else if (key === "group" || key === "waits_in") {
        fields.push([key, groupLabel(findGroup, v)]);
      } else if (typeof v === "object") {
        fields.push([key, el("code", { class: "ev-json", text: JSON.stringify(v) })]);
      } else {
        fields.push([key, String(v)]);
      }
    }
    return el(
      "div",
      { class: "ev" },
      fields.length ? el("dl", { class: "ev-fields" }, fields.map(([k, v]) => el("div", null, el("dt", { text: k.replace(/_/g, " ") }), el("dd", null, v)))) : null,
      blocks
    );
  }

  /**
   * The head both lists share (incidents, findings): the count of active and resolved ones,
   * the all-clear when there are none (then null), else the items in their order: active
   * first, then the most severe, then the newest.
   */
  function listHead(items, box, countId, noun) {
    const list = Array.isArray(items) ? items.slice() : [];
    const active = list.filter((i) => i.active).length;
    $(countId).textContent = list.length ? active + " active, " + (list.length - active) + " resolved" : "";
    if (list.length === 0) {
      const n = state.job && Array.isArray(state.job.ranks) ? state.job.ranks.length : 0;
      clear(box, el("p", { class: "empty all-clear", text: n ? "No " + noun + ": nothing wrong seen on " + n + (n === 1 ? " rank." : " ranks.") : "No " + noun }));
      return null;
    }
    return list.sort(
      (a, b) =>
        (b.active ? 1 : 0) - (a.active ? 1 : 0) ||
        severityOf(a)[1] - severityOf(b)[1] ||
        (b.first_seen || 0) - (a.first_seen || 0)
    );
  }

  /** The clickable head of an incident or a finding: severity, summary, blamed ranks, state. */
  function itemHead(item, ranks, isSel, onClick) {
    return el(
      "button",
      {
        type: "button",
        class: "finding-head",
        "aria-pressed": isSel ? "true" : "false",
        title: isSel ? "Click to clear the highlight" : "Click to highlight these ranks everywhere on the page",
        on: { click: onClick },
      },
      el("span", { class: "sev", text: text(item.severity) }),
      el("span", { class: "finding-summary", text: text(item.summary) }),
      ranks.length ? el("span", { class: "blamed", text: (ranks.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(ranks) }) : null,
      el("span", { class: "finding-state", text: item.active ? "active" : "resolved" })
    );
  }

  function renderIncidents(incidents) {
    const box = $("incidents");
    const list = listHead(incidents, box, "incidents-count", "incidents");
    if (list === null) return;
    const selected = state.selection && state.selection.kind === "incident" ? state.selection.id : null;
    clear(
      box,
      el(
        "ul",
        { class: "findings incidents" },
        list.map((inc) => {
          const ranks = Array.isArray(inc.ranks) ? inc.ranks : [];
          const isSel = selected !== null && inc.id === selected;
          const chain = Array.isArray(inc.chain) ? inc.chain : [];
          const key = "incident:" + inc.id;
          return el(
            "li",
            {
              class: "finding incident " + severityOf(inc)[0] + (inc.active ? "" : " resolved") + (isSel ? " selected" : ""),
              dataset: { incident: String(inc.id), kind: String(inc.kind) },
            },
            itemHead(inc, ranks, isSel, () => selectIncident(inc.id)),
            inc.hint ? el("p", { class: "finding-hint" }, el("span", { class: "hint-label", text: "Next step" }), el("span", { class: "hint-text", text: String(inc.hint) })) : null,
            el(
              "div",
              { class: "finding-meta" },
              el("span", { class: "mono", text: String(inc.kind) }),
              el("span", null, "first seen ", PG.ago(inc.first_seen)),
              inc.active ? null : el("span", null, "last seen ", PG.ago(inc.last_seen))
            ),
            el(
              "details",
              {
                class: "evidence incident-findings",
                open: state.openEvidence.has(key),
                on: {
                  toggle: (ev) => {
                    if (ev.target.open) state.openEvidence.add(key);
                    else state.openEvidence.delete(key);
                  },
                },
              },
              el("summary", { text: (Array.isArray(inc.findings) ? inc.findings.length : 0) + (inc.findings && inc.findings.length === 1 ? " finding" : " findings") }),
              el(
                "ol",
                { class: "chain" },
                chain.map((c) =>
                  el(
                    "li",
                    { class: c.active ? "" : "resolved", dataset: { linkedFinding: String(c.finding) } },
                    el("span", { class: "mono", text: String(c.kind) }),
                    " ",
                    el("span", { text: text(c.link) }),
                    c.active ? null : el("span", { class: "muted", text: " (resolved)" })
                  )
                )
              )
            )
          );
        })
      )
    );
  }

  function renderFindings(findings, findGroup) {
    const box = $("findings");
    const list = listHead(findings, box, "findings-count", "findings");
    if (list === null) return;
    const selected = state.selection && state.selection.kind === "finding" ? state.selection.id : null;
    const hintsShown = new Set(); // a hint already shown above is not repeated in full
    clear(
      box,
      el(
        "ul",
        { class: "findings" },
        list.map((f) => {
          const ranks = Array.isArray(f.ranks) ? f.ranks : f.ranks == null ? [] : [f.ranks];
          const isSel = selected !== null && f.id === selected;
          const repeated = Boolean(f.hint) && hintsShown.has(String(f.hint));
          if (f.hint) hintsShown.add(String(f.hint));
          const evidence = evidenceNode(f, findGroup);
          const details = evidence
            ? el(
                "details",
                {
                  class: "evidence",
                  open: state.openEvidence.has(f.id),
                  on: {
                    toggle: (ev) => {
                      if (ev.target.open) state.openEvidence.add(f.id);
                      else state.openEvidence.delete(f.id);
                    },
                  },
                },
                el("summary", { text: "Evidence" }),
                evidence
              )
            : null;
          return el(
            "li",
            {
              class: "finding " + severityOf(f)[0] + (f.active ? "" : " resolved") + (isSel ? " selected" : "") + (repeated ? " compact" : ""),
              dataset: { finding: String(f.id), kind: String(f.kind) },
            },
            itemHead(f, ranks, isSel, () => selectFinding(f.id)),
            f.hint && !repeated ? el("p", { class: "finding-hint" }, el("span", { class: "hint-label", text: "Next step" }), el("span", { class: "hint-text", text: String(f.hint) })) : null,
            el(
              "div",
              { class: "finding-meta" },
              repeated ? el("span", { class: "same-hint", title: String(f.hint), text: "same next step as above" }) : null,
              f.kind != null ? el("span", { class: "mono", text: String(f.kind) }) : null,
              PG.isNum(f.attempt) && attemptCount() > 1 ? el("span", { class: "finding-attempt", text: "attempt " + f.attempt }) : null,
              f.group != null ? el("span", null, "group ", groupLabel(findGroup, f.group)) : null,
              el("span", null, "first seen ", PG.ago(f.first_seen)),
              f.active ? null : el("span", null, "last seen ", PG.ago(f.last_seen))
            ),
            details
          );
        })
      )
    );
  }

  function renderTopology(job, derived, hl, describe) {
    const ranks = Array.isArray(job.ranks) ? job.ranks : [];
    const groups = Array.isArray(job.groups) ? job.groups : [];
    const select = $("topology-view");
    const views = PGTopology.views(groups, ranks);
    if (!views.some((v) => v.value === state.view)) state.view = "hosts";
    if (PG.changed("topology-views", views)) {
      const plain = [];
      const byOpt = new Map();
      for (const v of views) {
        const opt = el("option", { value: v.value, text: v.label });
        if (v.optgroup) {
          if (!byOpt.has(v.optgroup)) byOpt.set(v.optgroup, el("optgroup", { label: v.optgroup }));
          byOpt.get(v.optgroup).appendChild(opt);
        } else plain.push(opt);
      }
      clear(select, plain, Array.from(byOpt.values()));
    }
    select.value = state.view;
    const counts = new Map();
    for (const s of derived.states.values()) counts.set(s, (counts.get(s) || 0) + 1);
    if (PG.changed("topology-legend", Array.from(counts.entries()))) {
      clear(
        $("topology-legend"),
        STATES.filter((s) => counts.get(s)).map((s) =>
          el("span", { class: "legend-item", dataset: { state: s } }, el("span", { class: "swatch", dataset: { state: s } }), STATE_TEXT[s] + " ", el("b", { text: PG.fmtNum(counts.get(s)) }))
        )
      );
    }
    const hosts = new Set(ranks.map((r) => r.host)).size;
    $("topology-summary").textContent = ranks.length ? ranks.length + (ranks.length === 1 ? " rank on " : " ranks on ") + hosts + (hosts === 1 ? " host, " : " hosts, ") + groups.length + (groups.length === 1 ? " group" : " groups") : "";
    PGTopology.render($("topology"), {
      ranks: ranks,
      groups: groups,
      view: state.view,
      highlight: hl,
      stateOf: (r) => derived.states.get(r) || "unknown",
      blamed: (r) => derived.blamedBy.has(r),
      describe: describe,
      onSelectRank: selectRank,
    });
  }

  function renderRanks(ranks, progress, findGroup, derived, hl) {
    const body = $("ranks-body");
    const list = PG.sortBy(Array.isArray(ranks) ? ranks : [], "rank", "asc");
    if (list.length === 0) {
      clear(body, PG.emptyRow(10, "No ranks have reported yet."));
      $("ranks-summary").textContent = "";
      $("ranks-shown").textContent = "";
      return;
    }
    const stats = rankStats(state.rankStats, state.collectives);
    const inflight = inflightByRank(progress);

    const hosts = new Set(list.map((r) => r.host));
    const byStatus = {};
    for (const r of list) byStatus[r.status] = (byStatus[r.status] || 0) + 1;
    $("ranks-summary").textContent =
      list.length + (list.length === 1 ? " rank on " : " ranks on ") + hosts.size + (hosts.size === 1 ? " host \u00b7 " : " hosts \u00b7 ") +
      Object.entries(byStatus).map(([s, n]) => n + " " + s).join(", ");

    // Filter ("517", "node003", "hung"); highlighted and troubled ranks come first when
    // there are more ranks than rows.
    const needle = state.ranksFilter.trim().toLowerCase();
    let shown = list;
    if (needle) {
      shown = list.filter((r) => String(r.rank) === needle || String(r.host || "").toLowerCase().includes(needle) || (derived.states.get(r.rank) || "").startsWith(needle) || String(r.status || "").startsWith(needle));
    }
    if (shown.length > RANK_ROWS) {
      const first = shown.filter((r) => hl.has(r.rank) || !["running", "waiting", "exited"].includes(derived.states.get(r.rank)));
      const firstSet = new Set(first.map((r) => r.rank));
      shown = first.concat(shown.filter((r) => !firstSet.has(r.rank))).slice(0, RANK_ROWS);
    }
    $("ranks-shown").textContent = shown.length < list.length ? "showing " + shown.length + " of " + list.length : "";

    clear(
      body,
      shown.length
        ? shown.map((r) => {
            const s = stats.get(r.rank);
            const top = s && s.top;
            const flights = inflight.get(r.rank) || [];
            const bad = r.status === "failed" || r.status === "lost";
            return el(
              "tr",
              { class: (bad ? "row-bad" : "") + (hl.has(r.rank) ? " hl" : "") || null, dataset: { rank: String(r.rank), state: derived.states.get(r.rank) || "unknown" } },
              el("td", { class: "num strong", text: text(r.rank) }),
              el("td", { class: "mono", text: text(r.host) }),
              el("td", { class: "num", text: text(r.local_rank) }),
              el("td", { class: "num mono", text: text(r.pid) }),
              el("td", { class: "mono", text: text(r.device) }),
              el("td", null, PG.badge(r.status)),
              el("td", null, PG.ago(r.last_seen)),
              el("td", { class: "num", text: s ? PG.fmtNum(s.total) : DASH }),
              el(
                "td",
                { class: "num" },
                top
                  ? [el("span", { text: PG.fmtUs(top.p50_us) }), el("span", { class: "sub" }, " ", String(top.op), " ", groupLabel(findGroup, top.group))]
                  : DASH
              ),
              el(
                "td",
                null,
                flights.length
                  ? flights.map((f) => el("div", null, inflightNode(findGroup, f, true)))
                  : el("span", { class: "muted", text: progress !== null && (r.status === "running" || r.status === "initializing") ? "idle" : DASH })
              )
            );
          })
        : PG.emptyRow(10, "No rank matches \u201c" + state.ranksFilter.trim() + "\u201d")
    );
  }

  function renderGroups(groups) {
    const body = $("groups-body");
    const list = sortGroups(groups);
    $("groups-count").textContent = list.length ? list.length + (list.length === 1 ? " group" : " groups") : "";
    if (list.length === 0) {
      clear(body, PG.emptyRow(4, "No process groups reported yet."));
      return;
    }
    const LIMIT = 64;
    clear(
      body,
      list.slice(0, LIMIT).map((g) => {
        const ranks = Array.isArray(g.ranks) ? g.ranks : [];
        return el(
          "tr",
          null,
          el("td", { class: "mono strong", text: text(g.name) }),
          el("td", { text: text(g.desc) }),
          el("td", { text: text(g.backend) }),
          el(
            "td",
            { title: ranks.length <= 256 ? ranks.join(", ") : null },
            PG.fmtRanks(ranks),
            el("span", { class: "sub", text: " (" + ranks.length + ")" })
          )
        );
      }),
      list.length > LIMIT ? PG.emptyRow(4, (list.length - LIMIT) + " more groups; the Topology view lists every one.") : null
    );
  }

  function renderProgress(groups, progress, findGroup, hl, describe) {
    const box = $("progress");
    if (progress === null) {
      clear(box, PG.empty("Waiting for live data\u2026"));
      return;
    }
    // Group the rows; keep groups that only appear in progress, too.
    const rowsByGroup = new Map();
    for (const row of progress) {
      const g = findGroup(row.group);
      const key = g ? String(g.name) : String(row.group);
      if (!rowsByGroup.has(key)) rowsByGroup.set(key, []);
      rowsByGroup.get(key).push(row);
    }
    const keys = sortGroups(groups).map((g) => String(g.name));
    const known = new Set(keys);
    for (const key of PG.sortBy(Array.from(rowsByGroup.keys()).map((k) => ({ k })), "k", "asc").map((x) => x.k)) {
      if (!known.has(key)) keys.push(key);
    }
    if (keys.length === 0) {
      clear(box, PG.empty("No progress reported yet."));
      return;
    }
    if (progress.length > PROGRESS_DETAIL_ROWS) {
      renderProgressStrips(box, keys, rowsByGroup, findGroup, hl, describe);
      return;
    }
    box.__strips = null;
    clear(
      box,
      keys.map((key) => {
        const g = findGroup(key);
        const gp = groupProgress(g, rowsByGroup.get(key) || []);
        const stalled = gp.oldestWait !== null && PG.now() - gp.oldestWait >= STALL_S;
        return el(
          "div",
          { class: "pg-group" },
          el(
            "div",
            { class: "pg-label" },
            groupLabel(findGroup, key),
            g && g.backend ? el("span", { class: "sub", text: String(g.backend) }) : null,
            (rowsByGroup.get(key) || []).some((r) => r.source === "flight_recorder") ? el("span", { class: "sub", title: "Python never saw this group's collectives (DDP runs them in C++): sequence numbers from PyTorch's Flight Recorder", text: "C++ collectives" }) : null,
            gp.maxE !== null ? el("span", { class: "sub pg-max", dataset: { maxSeq: String(gp.maxE) }, text: "seq " + PG.fmtNum(gp.maxE) }) : null
          ),
          el(
            "div",
            { class: "pg-ranks" },
            gp.ranks.map((rank) => {
              const row = gp.byRank.get(rank);
              const hlc = hl.has(rank) ? " hl" : "";
              if (!row) {
                return el("div", { class: "pg-cell nodata" + hlc, dataset: { rank: String(rank) }, title: "rank " + rank + ": no progress reported" }, el("span", { class: "pg-rank", text: "r" + rank }), el("span", { class: "pg-seq", text: DASH }));
              }
              const lag = stalled ? gp.behind.get(rank) : undefined;
              const cell = el(
                "div",
                {
                  class: "pg-cell" + (lag !== undefined ? " behind" : "") + (row.inflight_op != null ? " busy" : "") + hlc,
                  dataset: { rank: String(rank) },
                  title: "rank " + rank + ": entered " + text(row.entered) + ", completed " + text(row.completed) + (lag !== undefined ? " \u2014 furthest behind" : ""),
                },
                el("span", { class: "pg-rank", text: "r" + rank }),
                el("span", { class: "pg-seq" }, text(row.entered), el("span", { class: "pg-slash", text: " / " }), text(row.completed)),
                lag !== undefined ? el("span", { class: "pg-lag", text: lag + " behind" }) : null,
                row.inflight_op != null ? inflightNode(findGroup, { op: row.inflight_op, since: row.inflight_since }, false) : null
              );
              // Furthest-behind ranks turn from amber to red once the others have waited too long.
              if (lag !== undefined && gp.oldestWait !== null) PG.overdueAt(cell, gp.oldestWait + INFLIGHT_WARN_S);
              return cell;
            })
          )
        );
      })
    );
  }

  /**
   * Many ranks: one row per group family, a canvas strip with a column per rank coloured
   * by how far it is behind its own group (grey: in step, amber: behind, red: behind while
   * the others have waited more than INFLIGHT_WARN_S), and the ranks behind named in text.
   */
  function renderProgressStrips(box, keys, rowsByGroup, findGroup, hl, describe) {
    const fams = new Map();
    for (const key of keys) {
      const g = findGroup(key);
      const fam = g ? PGTopology.familyOf(g) : String(key);
      if (!fams.has(fam)) fams.set(fam, []);
      fams.get(fam).push(key);
    }
    const now = PG.now();
    const model = [];
    for (const [fam, gkeys] of fams) {
      const cells = []; // [rank, lag, overdue, entered]
      let maxSeq = null;
      const behind = [];
      for (const key of gkeys) {
        const gp = groupProgress(findGroup(key), rowsByGroup.get(key) || []);
        if (gp.maxE !== null && (maxSeq === null || gp.maxE > maxSeq)) maxSeq = gp.maxE;
        const overdue = gp.oldestWait !== null && now - gp.oldestWait > INFLIGHT_WARN_S;
        const stalled = gp.oldestWait !== null && now - gp.oldestWait >= STALL_S;
        for (const rank of gp.ranks) {
          const row = gp.byRank.get(rank);
          const lag = gp.behind.get(rank);
          const notable = lag !== undefined && stalled; // see STALL_S
          cells.push([rank, row ? (notable ? lag : 0) : -1, overdue && lag !== undefined, row ? row.entered : null, key]);
          if (notable) behind.push({ rank, lag, overdue, group: key });
        }
      }
      cells.sort((a, b) => a[0] - b[0]);
      model.push({ fam, gkeys, cells, maxSeq, behind });
    }
    const sig = model.map((m) => m.fam + ":" + m.cells.length).join("|");
    if (!box.__strips || box.__strips.sig !== sig) {
      const rows = model.map((m) => {
        const canvas = el("canvas", { class: "pg-strip", height: "14" });
        const head = el("div", { class: "pg-strip-head" });
        const row = el("div", { class: "pg-family" }, head, el("div", { class: "pg-strip-box" }, canvas, el("div", { class: "chart-tip", hidden: true })));
        canvas.addEventListener("mousemove", (ev) => {
          const cur = row.__model;
          if (!cur) return;
          const rect = canvas.getBoundingClientRect();
          const i = Math.floor(((ev.clientX - rect.left) / rect.width) * cur.cells.length);
          const c = cur.cells[i];
          const tipNode = row.querySelector(".chart-tip");
          if (!c) {
            tipNode.hidden = true;
            return;
          }
          clear(tipNode, el("div", { class: "strong", text: describe(c[0]).split("\n")[0] }), el("div", { text: "group " + c[4] + ": entered " + text(c[3]) + (c[1] > 0 ? ", " + c[1] + " behind" : c[1] === 0 ? ", in step" : "") }));
          tipNode.hidden = false;
          tipNode.style.left = Math.min(ev.clientX - rect.left + 12, rect.width - 240) + "px";
          tipNode.style.top = "18px";
        });
        canvas.addEventListener("mouseleave", () => (row.querySelector(".chart-tip").hidden = true));
        return row;
      });
      clear(box, el("p", { class: "muted small", text: "One strip per group family, one column per rank: grey while the group moves, amber behind while the others have waited " + STALL_S + " s, red after " + INFLIGHT_WARN_S + " s." }), rows);
      box.__strips = { sig, rows };
    }
    model.forEach((m, idx) => {
      const row = box.__strips.rows[idx];
      row.__model = m;
      const head = row.querySelector(".pg-strip-head");
      const label = m.gkeys.length > 1 ? m.fam + " \u00b7 " + m.gkeys.length + " groups" : null;
      m.behind.sort((a, b) => b.lag - a.lag || a.rank - b.rank);
      const named = m.behind.slice(0, 6).map((b) => "r" + b.rank + " (" + b.lag + ")");
      clear(
        head,
        label ? el("span", { class: "group strong", text: label }) : groupLabel(findGroup, m.gkeys[0]),
        el("span", { class: "sub pg-max", dataset: { maxSeq: m.maxSeq === null ? "" : String(m.maxSeq) }, text: m.maxSeq === null ? "" : "seq " + PG.fmtNum(m.maxSeq) }),
        el(
          "span",
          { class: "pg-behind" + (m.behind.some((b) => b.overdue) ? " overdue" : m.behind.length ? " some" : "") },
          m.behind.length ? m.behind.length + " behind: " + named.join(", ") + (m.behind.length > named.length ? ", \u2026" : "") : "moving: nobody waits for a rank"
        )
      );
      const canvas = row.querySelector("canvas");
      const width = Math.max(200, canvas.parentNode.clientWidth || 600);
      const dpr = window.devicePixelRatio || 1;
      if (canvas.width !== Math.round(width * dpr)) {
        canvas.width = Math.round(width * dpr);
        canvas.height = Math.round(14 * dpr);
        canvas.style.width = width + "px";
        canvas.style.height = "14px";
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      const n = m.cells.length;
      const w = width / Math.max(1, n);
      ctx.clearRect(0, 0, width, 14);
      for (let i = 0; i < n; i++) {
        const c = m.cells[i];
        ctx.fillStyle = c[1] < 0 ? "#ffffff" : c[2] ? "#c4231e" : c[1] > 0 ? "#d4a72c" : "#d0d7de";
        ctx.fillRect(i * w, 2, Math.max(w - (w > 3 ? 1 : 0), 0.6), 10);
        if (hl.has(c[0])) {
          ctx.fillStyle = "#1f2328";
          ctx.fillRect(i * w + w / 2 - 1, 0, 2, 14);
        }
      }
    });
  }

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
  function opRows(ops, collectives, findGroup) {
    if (Array.isArray(ops)) return ops;
    const out = new Map();
    for (const r of collectives || []) {
      const g = findGroup(r.group);
      const fam = g ? PGTopology.familyOf(g) : String(r.group);
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

  function renderCollectives(rows, findGroup) {
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
            render();
          }, c.num)
        )
      )
    );
    const rates = bytesRates();
    const list = (rows || []).map((r) => Object.assign({}, r, { rate: rates.get(String(r.family)) == null ? null : rates.get(String(r.family)).get(opLabel(r)) }));
    const total = list.reduce((n, r) => n + (r.count || 0), 0);
    $("coll-count").textContent = list.length ? PG.fmtNum(total) + " collectives in " + list.length + (list.length === 1 ? " kind" : " kinds") : "";
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

  function renderCharts(grid, hl, describe) {
    const fams = grid && Array.isArray(grid.families) ? grid.families : [];
    const ops = grid && Array.isArray(grid.ops) ? grid.ops : [];
    const x = grid && grid.end != null ? Array.from({ length: grid.bins }, (_, i) => grid.end - grid.bins + 1 + i + 0.5) : [];
    const waiting = grid ? "No collectives yet." : "Waiting for live data\u2026";

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
    if (!grid) clear(heat, PG.empty("Waiting for live data\u2026"));
    else if (!fam) clear(heat, PG.empty("No collectives in the last " + grid.bins + " s."));
    else PGCharts.heatmap(heat, { ranks: fam.ranks, busy: fam.busy, end: grid.end, bins: grid.bins, highlight: hl, describe: (r) => describe(r).split("\n")[0] });
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

  function renderRendezvous(rows, job, hl) {
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
    PGCharts.rendezvous(box, { rows: list, highlight: hl, now: state.serverTime || PG.now() });
  }

  function renderErrors(errors) {
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

  function renderGpus(gpus, hl) {
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
    const derived = rankStates(job ? job.ranks : [], state.progress, state.findings);
    const describe = rankDescriber(job ? job.ranks : [], derived, state.progress);
    const selKey = [state.selection, Array.from(hl)];

    const openIncidents = (state.incidents || []).filter((i) => i.active).length;
    if (job && PG.changed("header", [jobHead, state.replay && state.replay.at, openIncidents])) renderHeader(job);
    if (job && PG.changed("attempts", job.attempts)) renderAttempts(job.attempts);
    if (job) showReplayBar();
    if (state.incidents !== null) {
      renderVerdict(state.incidents);
      const stableInc = state.incidents.map((i) => Object.assign({}, i, { last_seen: i.active ? null : i.last_seen }));
      if (PG.changed("incidents", [stableInc, selKey])) renderIncidents(state.incidents);
    }
    if (state.findings !== null) {
      const stable = state.findings.map((f) => Object.assign({}, f, { last_seen: f.active ? null : f.last_seen }));
      if (PG.changed("findings", [stable, groups.length, selKey, job ? job.ranks.length : 0])) renderFindings(state.findings, findGroup);
    }
    if (job) renderTopology(job, derived, hl, describe);
    if (job) renderRanks(job.ranks, state.progress, findGroup, derived, hl);
    if (job && PG.changed("groups", groups)) renderGroups(groups);
    if (job) renderProgress(groups, state.progress, findGroup, hl, describe);
    const rows = state.ops !== null || state.collectives !== null ? opRows(state.ops, state.collectives, findGroup) : null;
    renderCollectives(rows, findGroup);
    if (state.live) renderCharts(state.grid, hl, describe);
    if (PG.changed("rendezvous", [state.rendezvous, job && job.world_size, selKey])) renderRendezvous(state.rendezvous, job, hl);
    if (PG.changed("errors", state.errors)) renderErrors(state.errors);
    if (PG.changed("gpus", [state.gpus, selKey])) renderGpus(state.gpus, hl);

    if (state.live && job && !firstCompleteRender) {
      firstCompleteRender = true;
      performance.mark("pgdash:first-render"); // bench/page.py reads this
      page.dataset.rendered = "1";
    }
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

  // -------------------------------------------------------------- data --

  // What the live feed sent, by section, and its version (null until a snapshot came).
  let live = null;
  let liveVersion = null;
  let rewatching = false;

  function onSnapshot(message) {
    if (!message || !message.sections || Number(message.job_id) !== JOB_ID) return;
    if (!state.live) performance.mark("pgdash:first-payload");
    live = Object.assign({}, message.sections);
    liveVersion = message.v;
    rewatching = false;
    showLive(message.server_time, message.server_behind_s);
  }

  function onDelta(message) {
    if (!message || Number(message.job_id) !== JOB_ID) return;
    if (liveVersion === null || message.base !== liveVersion) {
      // Missed one (or the snapshot is yet to come): only a new snapshot can catch up.
      if (liveVersion !== null && !rewatching && liveHandle.rewatch) {
        rewatching = true;
        liveHandle.rewatch();
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
    showLive(message.server_time, message.server_behind_s);
  }

  let liveGridIn = null; // the timeline_grid last expanded into state.grid
  let liveProgressIn = null; // likewise the progress columns

  /** Live progress comes as a row per group with a column per field: back to a row per rank. */
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

  /** The live grid's busy rows come as strings, a character per second (dashboard/live.py). */
  function expandGrid(grid) {
    const digits = typeof grid.busy_digits === "string" ? grid.busy_digits : "";
    const value = new Map(Array.from(digits, (c, i) => [c, Math.min(100, i * 2)]));
    const expand = (row) => (typeof row === "string" ? Array.from(row, (c) => (value.has(c) ? value.get(c) : null)) : row);
    return Object.assign({}, grid, {
      families: (Array.isArray(grid.families) ? grid.families : []).map((f) => Object.assign({}, f, { busy: (f.busy || []).map(expand) })),
    });
  }

  function showLive(serverTime, behindS) {
    showLag(behindS);
    if (!live.job || state.replay) return; // a replayed moment stays on screen
    const list = (name) => (Array.isArray(live[name]) ? live[name] : []);
    state.live = true;
    state.job = Object.assign({}, live.job, { ranks: list("ranks"), groups: list("groups"), attempts: list("attempts") });
    state.rankStats = list("rank_stats");
    if (live.progress !== liveProgressIn) {
      liveProgressIn = live.progress;
      state.progress = expandProgress(list("progress"));
    }
    state.findings = list("findings");
    state.incidents = list("incidents");
    state.ops = Array.isArray(live.ops) ? live.ops : null;
    if (live.timeline_grid !== liveGridIn) {
      liveGridIn = live.timeline_grid;
      state.grid = liveGridIn && typeof liveGridIn === "object" ? expandGrid(liveGridIn) : null;
    }
    state.rendezvous = list("rendezvous");
    state.errors = list("errors");
    state.gpus = list("gpus");
    state.serverTime = PG.isNum(serverTime) ? serverTime : null;
    setNotFound(false);
    showError("");
    render();
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

  // ------------------------------------------------------------ replay --
  // The slider maps 0..1000 onto the job's start..end (or now). Findings, ranks, progress
  // and the header show the server's state at that moment; the charts stay live.

  const REPLAY_STEPS = 1000;
  let replayRequest = 0; // answers to older requests are dropped
  let replayTimer = null;

  function replayBounds() {
    const job = state.job;
    if (!job || !PG.isNum(job.started_at)) return null;
    const end = PG.isNum(job.ended_at) ? job.ended_at : state.serverTime || PG.now();
    return [job.started_at, Math.max(end, job.started_at + 1)];
  }

  function showReplayBar() {
    const bar = $("replay");
    if (bar.hidden && replayBounds()) bar.hidden = false;
  }

  $("replay-at").addEventListener("input", (ev) => {
    const bounds = replayBounds();
    if (!bounds) return;
    const at = bounds[0] + ((bounds[1] - bounds[0]) * Number(ev.target.value)) / REPLAY_STEPS;
    $("replay-when").textContent = PG.fmtTime(at) + " (+" + PG.fmtDuration(at - bounds[0]) + ")";
    $("replay-when").classList.add("replaying");
    clearTimeout(replayTimer);
    replayTimer = setTimeout(() => loadReplay(at), 120);
  });

  async function loadReplay(at) {
    const ticket = ++replayRequest;
    let data;
    try {
      data = await PG.fetchJSON("/api/jobs/" + JOB_ID + "/state?at=" + at);
    } catch (err) {
      if (ticket === replayRequest) showError("Could not load the job at that moment: " + err.message);
      return;
    }
    if (ticket !== replayRequest) return;
    state.replay = { at: at };
    state.job = Object.assign({}, state.job, data.job, { ranks: data.ranks || [], groups: data.groups || [] });
    state.progress = data.progress || [];
    state.findings = data.findings || [];
    state.incidents = data.incidents || [];
    page.classList.add("replaying");
    $("replay-live").hidden = false;
    showError("");
    render();
  }

  $("replay-live").addEventListener("click", () => {
    replayRequest++;
    clearTimeout(replayTimer);
    state.replay = null;
    page.classList.remove("replaying");
    $("replay-live").hidden = true;
    $("replay-at").value = String(REPLAY_STEPS);
    $("replay-when").textContent = "drag to see findings, ranks and progress as they were";
    $("replay-when").classList.remove("replaying");
    liveProgressIn = null; // the replay replaced state.progress: expand the live one again
    if (live) showLive(state.serverTime);
    else refresh(true).catch((err) => showError("Could not load job: " + err.message));
  });

  // ------------------------------------------------------------ wiring --

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

  // For tests and tools: what the page derived (read-only copies).
  window.pgdashJob = Object.freeze({
    highlighted: () => Array.from(highlighted()).sort((a, b) => a - b),
    renderTimes: () => renderTimes.slice(),
    received: () => (liveHandle.received || []).slice(),
    rankState: (rank) => rankStates(state.job ? state.job.ranks : [], state.progress, state.findings).states.get(rank) || null,
  });

  refresh(false).catch((err) => showError("Could not load job: " + err.message));
  const liveHandle = PG.connectLive({
    watch: { job: JOB_ID },
    events: { job: onSnapshot, job_delta: onDelta },
    refresh: () => {
      state.live = false; // polling fallback while the socket is down
      state.rankStats = null;
      return refresh(true);
    },
  });
})();
