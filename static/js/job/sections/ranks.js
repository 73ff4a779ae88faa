/* pgdash job page: the topology, the ranks table and the groups table, coloured by the
 * display states the server judged (dashboard/views.py). */
import { $, RANK_ROWS, state, text, groupLabel, inflightNode, inflightByRank, rankStats, sortGroups } from "../ctx.js";
import { selectRank } from "./findings.js";

const { el, clear, DASH } = PG;

// The server's vocabulary (dashboard/views.py RANK_STATES), in its order.
const STATES = ["failed", "lost", "hung", "stalled", "mismatch", "stuck", "straggling", "waiting", "running", "initializing", "exited", "unknown"];
const STATE_TEXT = {
  failed: "failed",
  lost: "lost",
  hung: "hung (at fault)",
  stalled: "stalled (others wait for it)",
  stuck: "waiting on a hang",
  mismatch: "called another collective",
  straggling: "straggling",
  waiting: "in a collective",
  running: "running",
  initializing: "initializing",
  exited: "exited",
  unknown: "not reported",
};

/**
 * The server's display states (state.rankStates) as look-ups: states (rank -> state),
 * blamedBy (rank -> kinds of the findings that explain it), overdue (ranks that sat in a
 * collective past the stall threshold). Nothing is judged here.
 */
export function derivedStates() {
  const kinds = new Map((state.findings || []).map((f) => [f.id, f.kind]));
  const states = new Map();
  const blamedBy = new Map();
  const overdue = new Set();
  for (const row of state.rankStates || []) {
    states.set(row.rank, row.state);
    if (Array.isArray(row.findings) && row.findings.length) blamedBy.set(row.rank, row.findings.map((id) => kinds.get(id) || id));
    if (row.overdue) overdue.add(row.rank);
  }
  return { states, blamedBy, overdue };
}

export function rankDescriber(ranks, derived, progress) {
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
      // PG.now(): the replayed moment, else the clock (a label, never a verdict)
      out += "\nin " + f.op + " on group " + f.group + (PG.isNum(f.since) ? " for " + PG.fmtDuration(PG.now() - f.since) : "");
    }
    const blamed = derived.blamedBy.get(rank);
    if (blamed) out += "\nblamed by: " + blamed.join(", ");
    return out;
  };
}

export function renderTopology(job, derived, hl, describe) {
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

export function renderRanks(ranks, progress, findGroup, derived, hl) {
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
                ? flights.map((f) => el("div", null, inflightNode(findGroup, Object.assign({ overdue: derived.overdue.has(r.rank) }, f), true)))
                : el("span", { class: "muted", text: progress !== null && (r.status === "running" || r.status === "initializing") ? "idle" : DASH })
            )
          );
        })
      : PG.emptyRow(10, "No rank matches \u201c" + state.ranksFilter.trim() + "\u201d")
  );
}

export function renderGroups(groups) {
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
