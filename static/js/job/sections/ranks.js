/* pgdash job page: the topology, the ranks table and the groups table, coloured by the
 * display states the server judged (dashboard/web/views.py). */
import { PG } from "../../common.js";
import { PGTopology } from "../../topology.js";
import { $, RANK_ROWS, state, text, groupLabel, inflightNode, inflightByRank, rankStats, sortGroups } from "../ctx.js";
import { selectRank } from "./findings.js";

const { el, clear, DASH } = PG;

// The server's vocabulary (dashboard/web/display.py DISPLAY_STATES), in its order.
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
 * The server's display states (state.rankStates, dashboard/web/views.py rank_states) as
 * look-ups: states (rank -> state), rows (rank -> its row: reason, since, waiting),
 * blamedBy (rank -> kinds of the findings that explain it), overdue (ranks that sat in a
 * collective past the stall threshold). Nothing is judged here: the table, the topology,
 * progress and the heat map all read a rank's state from this one place. Before the live
 * feed's first message (the REST load) the ranks' own status from the same server stands
 * in, everywhere alike.
 */
export function derivedStates() {
  const kinds = new Map((state.findings || []).map((f) => [f.id, f.kind]));
  const states = new Map();
  const rows = new Map();
  const blamedBy = new Map();
  const overdue = new Set();
  const judged = Array.isArray(state.rankStates) && state.rankStates.length ? state.rankStates : null;
  for (const row of judged || []) {
    states.set(row.rank, row.state);
    rows.set(row.rank, row);
    if (Array.isArray(row.findings) && row.findings.length) blamedBy.set(row.rank, row.findings.map((id) => kinds.get(id) || id));
    if (row.overdue) overdue.add(row.rank);
  }
  if (!judged) {
    for (const r of (state.job && state.job.ranks) || []) states.set(r.rank, STATE_TEXT[r.status] ? r.status : "unknown");
  }
  return { states, rows, blamedBy, overdue };
}

/** A rank's state as the page says it everywhere: its label, and why (server's words). */
export function stateLabel(st) {
  return STATE_TEXT[st] || STATE_TEXT.unknown;
}

/** "since 17:25:03" of a state row (a time of day: the same whenever it is looked at). */
function sinceText(row) {
  return row && PG.isNum(row.since) ? "since " + PG.fmtTime(row.since).slice(11) : "";
}

/** The state cell of the ranks table: the state's badge, then its reason. */
function stateCell(st, row) {
  const why = row && row.reason ? String(row.reason) : "";
  const when = sinceText(row);
  return [
    el("span", { class: "rank-state", dataset: { state: st } }, stateLabel(st)),
    why || when ? el("span", { class: "rank-reason", text: [why, when].filter(Boolean).join(" \u00b7 ") }) : null,
  ];
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
    parts.push(stateLabel(derived.states.get(rank) || "unknown"));
    let out = parts.join(" \u00b7 ");
    const row = derived.rows.get(rank);
    if (row && row.reason) out += "\n" + row.reason + (sinceText(row) ? " (" + sinceText(row) + ")" : "");
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
  // Counted by the one state each rank has on the page (the topology's legend counts the same).
  const stateOf = (r) => derived.states.get(r.rank) || "unknown";
  const byState = new Map();
  for (const r of list) byState.set(stateOf(r), (byState.get(stateOf(r)) || 0) + 1);
  $("ranks-summary").textContent =
    list.length + (list.length === 1 ? " rank on " : " ranks on ") + hosts.size + (hosts.size === 1 ? " host \u00b7 " : " hosts \u00b7 ") +
    STATES.filter((st) => byState.get(st)).map((st) => byState.get(st) + " " + stateLabel(st)).join(", ");

  // Filter ("517", "node003", "hung"); highlighted and troubled ranks come first when
  // there are more ranks than rows.
  const needle = state.ranksFilter.trim().toLowerCase();
  let shown = list;
  if (needle) {
    shown = list.filter((r) => String(r.rank) === needle || String(r.host || "").toLowerCase().includes(needle) || stateOf(r).startsWith(needle) || stateLabel(stateOf(r)).startsWith(needle));
  }
  if (shown.length > RANK_ROWS) {
    const first = shown.filter((r) => hl.has(r.rank) || !["running", "waiting", "exited"].includes(stateOf(r)));
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
          const st = stateOf(r);
          const bad = st === "failed" || st === "lost" || st === "hung";
          return el(
            "tr",
            { class: (bad ? "row-bad" : "") + (hl.has(r.rank) ? " hl" : "") || null, dataset: { rank: String(r.rank), state: st } },
            el("td", { class: "num strong", text: text(r.rank) }),
            el("td", { class: "mono", text: text(r.host) }),
            el("td", { class: "num", text: text(r.local_rank) }),
            el("td", { class: "num mono", text: text(r.pid) }),
            el("td", { class: "mono", text: text(r.device) }),
            el("td", { class: "state-cell" }, stateCell(st, derived.rows.get(r.rank))),
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
                : el("span", { class: "muted", text: DASH })
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
