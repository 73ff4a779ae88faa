/*
 * pgdash: one job (templates/job.html, which carries data-job-id).
 *
 * Data in:
 *   on load  GET /api/jobs/<id>, /collectives, /findings (no progress over REST)
 *   live     Socket.IO event "job" after emitting watch {"job": <id>}:
 *            {job, collectives, progress, findings}, a full snapshot each time.
 * State:     `state` below; handlers replace parts of it and call render().
 * Render:    one function per section, each rebuilding only its own container,
 *            and only when its inputs changed (PG.changed) so that text
 *            selections survive no-op updates.
 * Derived:   small pure helpers (indexGroups, rankStats, inflightByRank,
 *            groupProgress) turn API rows into what the sections show.
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

  const state = {
    job: null, // GET /api/jobs/<id> object (with ranks, groups)
    collectives: null, // rows
    progress: null, // rows; only arrives over the socket
    findings: null, // rows
    live: false, // a socket snapshot arrived: later REST answers are stale
    collSort: { key: "group", dir: "asc" },
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
  function rankStats(collectives) {
    const stats = new Map();
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

    const seen = rows.filter((r) => PG.isNum(r.entered) && PG.isNum(r.completed));
    const maxE = Math.max(...seen.map((r) => r.entered));
    const maxC = Math.max(...seen.map((r) => r.completed));
    const minE = Math.min(...seen.map((r) => r.entered));
    const minCAtMinE = Math.min(...seen.filter((r) => r.entered === minE).map((r) => r.completed));
    const behind = new Map(); // rank -> how far behind (in collectives)
    if (seen.length > 1 && (minE < maxE || minCAtMinE < maxC)) {
      for (const r of seen) {
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
    return { ranks, byRank, behind, oldestWait };
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

  // ---------------------------------------------------------- sections --

  function renderHeader(job) {
    const name = job.name == null || job.name === "" ? "Job " + JOB_ID : String(job.name);
    document.title = name + " \u00b7 pgdash";
    $("job-name").textContent = name;
    $("crumb-job").textContent = name;
    clear($("job-status"), PG.badge(job.status));

    const started = job.started_at;
    const ended = job.ended_at;
    let duration;
    if (PG.isNum(started) && PG.isNum(ended)) duration = PG.fmtDuration(ended - started);
    else if (PG.isNum(started) && (job.status === "running" || job.status === "initializing")) duration = PG.since(started);
    else duration = DASH;

    const item = (label, value) => el("div", null, el("dt", { text: label }), el("dd", null, value));
    clear(
      $("job-meta"),
      item("Job ID", String(job.id == null ? JOB_ID : job.id)),
      item("World size", PG.fmtNum(job.world_size)),
      item("Backend", text(job.backend)),
      item("Started", PG.timeCell(started)),
      PG.isNum(ended) ? item("Ended", PG.timeCell(ended)) : null,
      item("Duration", duration)
    );
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

  function renderFindings(findings, findGroup) {
    const box = $("findings");
    const list = Array.isArray(findings) ? findings.slice() : [];
    const active = list.filter((f) => f.active).length;
    $("findings-count").textContent = list.length ? active + " active, " + (list.length - active) + " resolved" : "";
    if (list.length === 0) {
      clear(box, PG.empty("No findings"));
      return;
    }
    list.sort(
      (a, b) =>
        (b.active ? 1 : 0) - (a.active ? 1 : 0) ||
        severityOf(a)[1] - severityOf(b)[1] ||
        (b.last_seen || 0) - (a.last_seen || 0)
    );
    clear(
      box,
      el(
        "ul",
        { class: "findings" },
        list.map((f) => {
          const ranks = Array.isArray(f.ranks) ? f.ranks : f.ranks == null ? [] : [f.ranks];
          const hasEvidence = f.evidence !== null && f.evidence !== undefined && !(typeof f.evidence === "object" && Object.keys(f.evidence).length === 0);
          return el(
            "li",
            { class: "finding " + severityOf(f)[0] + (f.active ? "" : " resolved") },
            el(
              "div",
              { class: "finding-head" },
              el("span", { class: "sev", text: text(f.severity) }),
              el("span", { class: "finding-summary", text: text(f.summary) }),
              el("span", { class: "finding-state", text: f.active ? "active" : "resolved" })
            ),
            el(
              "div",
              { class: "finding-meta" },
              f.kind != null ? el("span", { class: "mono", text: String(f.kind) }) : null,
              ranks.length ? el("span", null, (ranks.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(ranks)) : null,
              f.group != null ? el("span", null, "group ", groupLabel(findGroup, f.group)) : null,
              el("span", null, "first seen ", PG.ago(f.first_seen)),
              el("span", null, "last seen ", PG.ago(f.last_seen))
            ),
            f.hint ? el("p", { class: "finding-hint", text: String(f.hint) }) : null,
            hasEvidence
              ? el(
                  "details",
                  { class: "evidence" },
                  el("summary", { text: "Evidence" }),
                  el("pre", { text: typeof f.evidence === "string" ? f.evidence : JSON.stringify(f.evidence, null, 2) })
                )
              : null
          );
        })
      )
    );
  }

  function renderRanks(ranks, collectives, progress, findGroup) {
    const body = $("ranks-body");
    const list = PG.sortBy(Array.isArray(ranks) ? ranks : [], "rank", "asc");
    if (list.length === 0) {
      clear(body, PG.emptyRow(10, "No ranks have reported yet."));
      $("ranks-summary").textContent = "";
      return;
    }
    const stats = rankStats(collectives);
    const inflight = inflightByRank(progress);

    const hosts = new Set(list.map((r) => r.host));
    const byStatus = {};
    for (const r of list) byStatus[r.status] = (byStatus[r.status] || 0) + 1;
    $("ranks-summary").textContent =
      list.length + (list.length === 1 ? " rank on " : " ranks on ") + hosts.size + (hosts.size === 1 ? " host \u00b7 " : " hosts \u00b7 ") +
      Object.entries(byStatus).map(([s, n]) => n + " " + s).join(", ");

    clear(
      body,
      list.map((r) => {
        const s = stats.get(r.rank);
        const top = s && s.top;
        const flights = inflight.get(r.rank) || [];
        const bad = r.status === "failed" || r.status === "lost";
        return el(
          "tr",
          { class: bad ? "row-bad" : null },
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
    );
  }

  function renderGroups(groups) {
    const body = $("groups-body");
    const list = sortGroups(groups);
    if (list.length === 0) {
      clear(body, PG.emptyRow(4, "No process groups reported yet."));
      return;
    }
    clear(
      body,
      list.map((g) => {
        const ranks = Array.isArray(g.ranks) ? g.ranks : [];
        return el(
          "tr",
          null,
          el("td", { class: "mono strong", text: text(g.name) }),
          el("td", { text: text(g.desc) }),
          el("td", { text: text(g.backend) }),
          el(
            "td",
            { title: ranks.join(", ") },
            PG.fmtRanks(ranks),
            el("span", { class: "sub", text: " (" + ranks.length + ")" })
          )
        );
      })
    );
  }

  function renderProgress(groups, progress, findGroup) {
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
    for (const key of PG.sortBy(Array.from(rowsByGroup.keys()).map((k) => ({ k })), "k", "asc").map((x) => x.k)) {
      if (!keys.includes(key)) keys.push(key);
    }
    if (keys.length === 0) {
      clear(box, PG.empty("No progress reported yet."));
      return;
    }

    clear(
      box,
      keys.map((key) => {
        const g = findGroup(key);
        const gp = groupProgress(g, rowsByGroup.get(key) || []);
        return el(
          "div",
          { class: "pg-group" },
          el("div", { class: "pg-label" }, groupLabel(findGroup, key), g && g.backend ? el("span", { class: "sub", text: String(g.backend) }) : null),
          el(
            "div",
            { class: "pg-ranks" },
            gp.ranks.map((rank) => {
              const row = gp.byRank.get(rank);
              if (!row) {
                return el("div", { class: "pg-cell nodata", title: "rank " + rank + ": no progress reported" }, el("span", { class: "pg-rank", text: "r" + rank }), el("span", { class: "pg-seq", text: DASH }));
              }
              const lag = gp.behind.get(rank);
              const cell = el(
                "div",
                {
                  class: "pg-cell" + (lag !== undefined ? " behind" : "") + (row.inflight_op != null ? " busy" : ""),
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

  const COLL_COLUMNS = [
    { key: "group", label: "Group" },
    { key: "op", label: "Op" },
    { key: "rank", label: "Rank", num: true },
    { key: "count", label: "Count", num: true },
    { key: "p50_us", label: "p50", num: true },
    { key: "p99_us", label: "p99", num: true },
    { key: "max_us", label: "max", num: true },
    { key: "bytes", label: "Bytes", num: true },
  ];

  function renderCollectives(collectives, findGroup) {
    const sort = state.collSort;
    clear(
      $("coll-head"),
      el(
        "tr",
        null,
        COLL_COLUMNS.map((c) =>
          PG.sortHeader(c.label, c.key, sort, (next) => {
            state.collSort = next;
            renderCollectives(state.collectives, findGroup);
          }, c.num)
        )
      )
    );
    const rows = Array.isArray(collectives) ? collectives : [];
    $("coll-count").textContent = rows.length ? rows.length + (rows.length === 1 ? " row" : " rows") : "";
    const body = $("coll-body");
    if (rows.length === 0) {
      clear(body, PG.emptyRow(COLL_COLUMNS.length, collectives === null ? "Loading\u2026" : "No collectives recorded yet."));
      return;
    }
    // Stable sorts: the clicked column first, ties by group, op, rank.
    let sorted = PG.sortBy(PG.sortBy(PG.sortBy(rows, "rank", "asc"), "op", "asc"), "group", "asc");
    sorted = PG.sortBy(sorted, sort.key, sort.dir);
    clear(
      body,
      sorted.map((r) =>
        el(
          "tr",
          null,
          el("td", null, groupLabel(findGroup, r.group)),
          el("td", { class: "mono", text: text(r.op) }),
          el("td", { class: "num", text: text(r.rank) }),
          el("td", { class: "num", text: PG.fmtNum(r.count) }),
          el("td", { class: "num", text: PG.fmtUs(r.p50_us) }),
          el("td", { class: "num", text: PG.fmtUs(r.p99_us) }),
          el("td", { class: "num", text: PG.fmtUs(r.max_us) }),
          el("td", { class: "num", title: PG.isNum(r.bytes) ? PG.fmtNum(r.bytes) + " bytes" : null, text: PG.fmtBytes(r.bytes) })
        )
      )
    );
  }

  // ------------------------------------------------------------ render --

  function render() {
    const job = state.job;
    const groups = job && Array.isArray(job.groups) ? job.groups : [];
    const findGroup = indexGroups(groups);
    const jobHead = job ? Object.assign({}, job, { ranks: undefined, groups: undefined }) : null;

    if (job && PG.changed("header", jobHead)) renderHeader(job);
    if (state.findings !== null && PG.changed("findings", [state.findings, groups])) renderFindings(state.findings, findGroup);
    if (job && PG.changed("ranks", [job.ranks, state.collectives, state.progress, groups])) {
      renderRanks(job.ranks, state.collectives, state.progress, findGroup);
    }
    if (job && PG.changed("groups", groups)) renderGroups(groups);
    if (job && PG.changed("progress", [state.progress, groups])) renderProgress(groups, state.progress, findGroup);
    if (state.collectives !== null && PG.changed("collectives", [state.collectives, groups])) {
      renderCollectives(state.collectives, findGroup);
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

  function onLive(payload) {
    if (!payload || !payload.job) return;
    if (payload.job.id != null && Number(payload.job.id) !== JOB_ID) return;
    state.live = true;
    state.job = payload.job;
    state.collectives = Array.isArray(payload.collectives) ? payload.collectives : [];
    state.progress = Array.isArray(payload.progress) ? payload.progress : [];
    state.findings = Array.isArray(payload.findings) ? payload.findings : [];
    setNotFound(false);
    showError("");
    render();
  }

  async function refresh() {
    const [job, coll, findings] = await Promise.allSettled([
      PG.fetchJSON("/api/jobs/" + JOB_ID),
      PG.fetchJSON("/api/jobs/" + JOB_ID + "/collectives"),
      PG.fetchJSON("/api/jobs/" + JOB_ID + "/findings"),
    ]);
    if (state.live) return; // a live snapshot got here first and is newer
    if (job.status === "rejected") {
      if (job.reason.status === 404) setNotFound(true);
      else showError("Could not load job: " + job.reason.message);
      return;
    }
    setNotFound(false);
    const errors = [];
    state.job = job.value;
    if (coll.status === "fulfilled") state.collectives = coll.value.collectives || [];
    else errors.push("collectives: " + coll.reason.message);
    if (findings.status === "fulfilled") state.findings = findings.value.findings || [];
    else errors.push("findings: " + findings.reason.message);
    showError(errors.length ? "Could not load " + errors.join("; ") : "");
    render();
  }

  refresh().catch((err) => showError("Could not load job: " + err.message));
  PG.connectLive({
    watch: { job: JOB_ID },
    events: { job: onLive },
    refresh: () => {
      state.live = false; // polling fallback while the socket is down
      return refresh();
    },
  });
})();
