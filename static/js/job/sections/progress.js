/* pgdash job page: progress per group (sequence numbers per rank), as the server judged it. */
import { PG } from "../../common.js";
import { $, PROGRESS_DETAIL_ROWS, state, text, groupLabel, inflightNode, sortGroups } from "../ctx.js";

const { el, clear, DASH } = PG;

/**
 * One group's progress as the server judged it (state.groupStates, dashboard/web/views.py):
 * its members (the group's, and any rank that reported), each with its progress row or null, the ranks behind (only once the others
 * have waited long enough to matter) and whether that wait is overdue.
 */
function groupProgress(group, key, rows, judged) {
  const byRank = new Map();
  for (const row of rows) byRank.set(row.rank, row);
  const g = judged.get(String(key));
  const members = new Set(group && Array.isArray(group.ranks) ? group.ranks : []);
  for (const r of byRank.keys()) members.add(r);
  const behind = new Map((g && Array.isArray(g.behind) ? g.behind : []).map(([rank, n]) => [rank, n]));
  return {
    ranks: Array.from(members).sort((a, b) => a - b),
    byRank,
    behind,
    overdue: Boolean(g && g.state === "overdue"),
    family: g && g.family != null ? String(g.family) : String(key),
    maxE: g && PG.isNum(g.max_seq) ? g.max_seq : null,
  };
}

function judgedGroups() {
  return new Map((state.groupStates || []).map((g) => [String(g.group), g]));
}

export function renderProgress(groups, progress, findGroup, hl, describe) {
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
  const judged = judgedGroups();
  if (progress.length > PROGRESS_DETAIL_ROWS) {
    renderProgressStrips(box, keys, rowsByGroup, findGroup, hl, describe, judged);
    return;
  }
  const overdueRanks = new Set((state.rankStates || []).filter((r) => r.overdue).map((r) => r.rank));
  box.__strips = null;
  clear(
    box,
    keys.map((key) => {
      const g = findGroup(key);
      const gp = groupProgress(g, key, rowsByGroup.get(key) || [], judged);
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
              return el("div", { class: "pg-cell nodata" + hlc, dataset: { rank: String(rank) }, title: describe(rank).split("\n")[0] + "\nno progress reported" }, el("span", { class: "pg-rank", text: "r" + rank }), el("span", { class: "pg-seq", text: DASH }));
            }
            const lag = gp.behind.get(rank);
            const cell = el(
              "div",
              {
                class: "pg-cell" + (lag !== undefined ? " behind" + (gp.overdue ? " overdue" : "") : "") + (row.inflight_op != null ? " busy" : "") + hlc,
                dataset: { rank: String(rank) },
                // The rank's state as everywhere on the page (the server's), then its progress.
                title: describe(rank).split("\n").slice(0, 2).join("\n") + "\nentered " + text(row.entered) + ", completed " + text(row.completed) + (lag !== undefined ? " \u2014 furthest behind" : ""),
              },
              el("span", { class: "pg-rank", text: "r" + rank }),
              el("span", { class: "pg-seq" }, text(row.entered), el("span", { class: "pg-slash", text: " / " }), text(row.completed)),
              lag !== undefined ? el("span", { class: "pg-lag", text: lag + " behind" }) : null,
              row.inflight_op != null ? inflightNode(findGroup, { op: row.inflight_op, since: row.inflight_since, overdue: overdueRanks.has(rank) }, false) : null
            );
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
 * the server judged the wait overdue), and the ranks behind named in text.
 */
function renderProgressStrips(box, keys, rowsByGroup, findGroup, hl, describe, judged) {
  const fams = new Map();
  for (const key of keys) {
    const j = judged.get(String(key));
    const fam = j && j.family != null ? String(j.family) : String(key);
    if (!fams.has(fam)) fams.set(fam, []);
    fams.get(fam).push(key);
  }
  const model = [];
  for (const [fam, gkeys] of fams) {
    const cells = []; // [rank, lag, overdue, entered]
    let maxSeq = null;
    const behind = [];
    for (const key of gkeys) {
      const gp = groupProgress(findGroup(key), key, rowsByGroup.get(key) || [], judged);
      if (gp.maxE !== null && (maxSeq === null || gp.maxE > maxSeq)) maxSeq = gp.maxE;
      const overdue = gp.overdue;
      for (const rank of gp.ranks) {
        const row = gp.byRank.get(rank);
        const lag = gp.behind.get(rank);
        const notable = lag !== undefined; // the server lists a rank behind only once it matters
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
    clear(box, el("p", { class: "muted small", text: "One strip per group family, one column per rank: grey while the group moves, amber behind while the others wait for it, red once that wait is overdue." }), rows);
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
