/*
 * pgdash job page: two moments compared. "Compare from here" keeps the moment on screen as
 * A; every moment shown after it (B) says what changed from A (GET /api/jobs/<id>/compare,
 * dashboard/web/compare.py): ranks whose state changed, groups whose progress diverged,
 * latencies that moved, findings that appeared or resolved. The server decides all of it.
 */
import { PG } from "../common.js";
import { $, JOB_ID } from "./ctx.js";

const { el, clear } = PG;

let pinned = null; // moment A (Unix seconds)
let asked = 0; // answers to older comparisons are dropped

/** Keep ``at`` as moment A (null: stop comparing). */
export function pin(at) {
  pinned = at;
  asked++;
  const box = $("compare");
  box.hidden = pinned === null;
  if (pinned === null) clear(box);
  else clear(box, el("p", { class: "small muted", text: "A is " + PG.fmtTime(pinned) + ": move to another moment to see what changed since." }), clearButton());
}

function clearButton() {
  return el("button", { type: "button", class: "compare-clear", text: "Stop comparing", on: { click: () => pin(null) } });
}

/** The page now shows moment ``b``: say what changed from A. */
export async function compareTo(b) {
  if (pinned === null || b === pinned) return;
  const ticket = ++asked;
  let body;
  try {
    body = await PG.fetchJSON("/api/jobs/" + JOB_ID + "/compare?a=" + pinned + "&b=" + b);
  } catch (err) {
    if (ticket === asked) clear($("compare"), el("p", { class: "replay-error", text: "Could not compare: " + err.message }), clearButton());
    return;
  }
  if (ticket !== asked) return;
  render(body);
}

function item(...children) {
  return el("li", null, ...children);
}

function render(c) {
  const span = c.b - c.a;
  const head = "From A " + PG.fmtTime(c.a) + " to B " + PG.fmtTime(c.b) + " (" + (span < 0 ? "\u2212" : "+") + PG.fmtDuration(Math.abs(span)) + ")";
  const lists = [];
  const add = (title, rows) => {
    if (rows.length) lists.push(el("div", { class: "compare-part" }, el("div", { class: "ev-label", text: title }), el("ul", null, rows)));
  };
  add("Ranks whose state changed", c.ranks.map((r) => item(el("span", { class: "blamed", text: "rank " + r.rank }), " " + (r.a || "absent") + " \u2192 " + r.b + (r.reason ? ": " + r.reason : ""))));
  add("Groups whose progress diverged", c.groups.map((g) => item(el("span", { class: "mono", text: g.group }), " (" + g.family + ") " + (g.a || "absent") + " \u2192 " + g.b + (g.b_behind.length ? "; behind: " + g.b_behind.map(([r, n]) => "rank " + r + " by " + n).join(", ") : "") + (g.advanced !== null ? "; its front advanced " + g.advanced : ""))));
  add("Latencies that moved (median p50 of the 10 s before each)", c.latencies.map((l) => item(el("span", { class: "mono", text: l.op }), " on " + l.family + ": " + PG.fmtUs(l.a_p50_us) + " \u2192 " + PG.fmtUs(l.b_p50_us) + " (\u00d7" + l.factor + ")")));
  add("Findings that appeared", c.findings.appeared.map((f) => item(el("span", { class: "mono", text: f.kind }), " " + f.summary)));
  add("Findings that resolved", c.findings.resolved.map((f) => item(el("span", { class: "mono", text: f.kind }), " " + f.summary)));
  clear($("compare"), el("p", { class: "compare-head", text: head }), lists.length ? lists : el("p", { class: "empty", text: "Nothing the page shows changed." }), clearButton());
  $("compare").dataset.b = String(c.b);
}

/** Wire the pin button (replay.js calls compareTo after each moment it shows). */
export function setupCompare(currentMoment) {
  $("replay-pin").addEventListener("click", () => {
    const at = currentMoment();
    if (at !== null) pin(at);
  });
}
