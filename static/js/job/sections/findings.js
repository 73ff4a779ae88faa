/* pgdash job page: incidents and findings, with their hints, evidence and selection. */
import { PG } from "../../common.js";
import { $, hooks, state, text, groupLabel, severityOf, attemptCount, JOB_ID } from "../ctx.js";
import { openRequest } from "./snapshots.js";

const { el, clear, DASH } = PG;


function selectFinding(id) {
  const same = state.selection && state.selection.kind === "finding" && state.selection.id === id;
  state.selection = same ? null : { kind: "finding", id: id };
  hooks.render();
}

function selectIncident(id) {
  const same = state.selection && state.selection.kind === "incident" && state.selection.id === id;
  state.selection = same ? null : { kind: "incident", id: id };
  hooks.render();
}

export function selectRank(rank) {
  const same = state.selection && state.selection.kind === "rank" && state.selection.rank === rank;
  state.selection = same ? null : { kind: "rank", rank: rank };
  hooks.render();
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
    } else if (key === "traceback" && Array.isArray(v)) {
      // As Python prints it (the raising frame last); pgdash's own frames were left out.
      const lines = v.map((fr) => '  File "' + String(fr && fr.file) + '", line ' + String(fr && fr.line) + ", in " + String(fr && fr.function) + (fr && fr.code ? "\n    " + String(fr.code) : ""));
      blocks.push(el("div", { class: "ev-block" }, el("div", { class: "ev-label", text: "Traceback (most recent call last)" }), el("pre", { class: "ev-text", text: lines.join("\n") })));
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

/**
 * What the blamed rank is doing: its training thread's stack from the snapshot the server
 * asked for when the incident opened (or later), the line it stands in first.
 */
function snapshotNode(snap) {
  if (!snap || typeof snap !== "object") return null;
  const w = snap.where;
  const at = w ? String(w.file).split("/").pop() + ":" + w.line + " in " + w.function + (w.code ? ": " + w.code : "") : "";
  return el(
    "div",
    { class: "ev-block incident-snapshot" },
    el("div", { class: "ev-label" }, "What rank " + snap.rank + " is doing (" + String(snap.thread || "its training thread") + ", asked ", PG.ago(snap.t), ")"),
    at ? el("div", { class: "mono snapshot-where", text: at }) : null,
    el("pre", { class: "ev-text", text: String(snap.stack || "") }),
    snap.ask ? el("button", { type: "button", class: "snapshot-open", text: "Every rank asked, and their last collectives", on: { click: () => openRequest(snap.ask) } }) : null
  );
}

/** Ask the incident's ranks again (POST /api/jobs/<id>/snapshots); the answer arrives live. */
async function askAgain(inc, button) {
  button.disabled = true;
  try {
    const res = await fetch(PG.url("/api/jobs/" + JOB_ID + "/snapshots"), {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ ranks: inc.ranks }),
    });
    const body = await res.json().catch(() => ({}));
    button.textContent = res.ok ? "Asked: the answer shows here" : String(body.error || res.status);
  } catch (err) {
    button.textContent = "Could not ask: " + err.message;
  }
  setTimeout(() => {
    button.disabled = false;
    button.textContent = "Snapshot again";
  }, 3000);
}

export function renderIncidents(incidents) {
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
          snapshotNode(inc.snapshot),
          inc.active && ranks.length && !state.replay
            ? el("button", { class: "snapshot-ask", type: "button", text: inc.snapshot ? "Snapshot again" : "Snapshot " + (ranks.length === 1 ? "rank " : "ranks ") + PG.fmtRanks(ranks), on: { click: (ev) => askAgain(inc, ev.target) } })
            : null,
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

export function renderFindings(findings, findGroup) {
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
