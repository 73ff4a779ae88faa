/*
 * pgdash: helpers shared by every page. Plain ES2018, no build step.
 *
 * Everything is on the one export, PG (ES modules throughout: `import { PG } from`):
 *   DOM      el(), clear(), emptyRow(), empty()
 *   format   fmtNum(), fmtUs(), fmtBytes(), fmtDuration(), fmtAgo(), fmtTime(), fmtRanks()
 *   widgets  badge(), ago(), since(), timeCell(), overdueAt()
 *   time     now() (the moment on screen: setViewAt(ts), else clockNow(): the browser
 *            clock corrected by the server's Date header), tick()
 *   data     url(), fetchJSON(), changed()
 *   sorting  sortBy(), sortHeader()
 *   live     connectLive()  (Socket.IO namespace /ui, re-watches on every reconnect),
 *            setMoment() (the indicator says "Replay" or "Ended" instead of "Live")
 *
 * Server data only ever reaches the page through textContent / setAttribute on
 * elements built here; nothing in pgdash parses server data as HTML.
 */

// ---------------------------------------------------------------- DOM --

/**
 * Build an element. `props` may hold:
 *   class      string (className)
 *   text       string (textContent)
 *   dataset    {key: value}
 *   on         {eventName: handler}
 *   anything else is set with setAttribute (null/undefined/false skipped,
 *   true sets an empty attribute). Attributes named on* are refused, and
 *   href values must be site-relative paths.
 * Children may be strings/numbers (become text nodes), nodes, arrays, or
 * null/undefined/false (skipped).
 */
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "on") {
        for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
      } else {
        if (/^on/i.test(key)) throw new Error("el(): use props.on, not attribute " + key);
        if (key === "href" && !/^\/(?!\/)/.test(String(value)) && String(value)[0] !== "#") {
          throw new Error("el(): href must be a site-relative path");
        }
        node.setAttribute(key, value === true ? "" : String(value));
      }
    }
  }
  appendChildren(node, children);
  return node;
}

function appendChildren(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) appendChildren(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace all children of `node` with `children` (same rules as el()). */
function clear(node, ...children) {
  node.textContent = "";
  appendChildren(node, children);
  return node;
}

/** A full-width table row with a muted message. */
function emptyRow(colspan, text) {
  return el("tr", { class: "empty-row" }, el("td", { colspan: colspan, text: text }));
}

/** A muted block-level empty-state message. */
function empty(text) {
  return el("p", { class: "empty", text: text });
}

// ------------------------------------------------------------- format --

const DASH = "\u2014";

function isNum(x) {
  return typeof x === "number" && isFinite(x);
}

/** Three significant digits, without trailing noise: 1.25, 12.5, 125. */
function sig3(x) {
  const a = Math.abs(x);
  if (a < 10) return x.toFixed(2).replace(/\.?0+$/, "");
  if (a < 100) return x.toFixed(1).replace(/\.0$/, "");
  return x.toFixed(0);
}

function fmtNum(n) {
  return isNum(n) ? n.toLocaleString("en-US") : DASH;
}

/** Microseconds in readable units: 850 µs, 1.25 ms, 2.5 s. */
function fmtUs(us) {
  if (!isNum(us)) return DASH;
  // Thresholds sit where rounding would otherwise print "1000 µs".
  if (Math.abs(us) < 999.5) return sig3(us) + " \u00b5s";
  if (Math.abs(us) < 999.5e3) return sig3(us / 1000) + " ms";
  return sig3(us / 1e6) + " s";
}

/** Bytes in binary units: 512 B, 4 KiB, 1.5 MiB. */
function fmtBytes(b) {
  if (!isNum(b)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = b;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return (i === 0 && Math.abs(v) >= 10 ? String(Math.round(v)) : sig3(v)) + " " + units[i];
}

/** Seconds as a compact duration: 42 s, 3 m 05 s, 2 h 07 m, 3 d 04 h. */
function fmtDuration(sec) {
  if (!isNum(sec)) return DASH;
  const s = Math.max(0, Math.floor(sec));
  const pad = (n) => String(n).padStart(2, "0");
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + pad(s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + pad(Math.floor((s % 3600) / 60)) + " m";
  return Math.floor(s / 86400) + " d " + pad(Math.floor((s % 86400) / 3600)) + " h";
}

/** "5 s ago" relative to PG.now(); clock skew never yields negative ages. */
function fmtAgo(ts) {
  if (!isNum(ts)) return DASH;
  const d = now() - ts;
  if (d < 1) return "just now";
  return fmtDuration(d) + " ago";
}

/** Local wall time, "2024-05-01 14:03:22". */
function fmtTime(ts) {
  if (!isNum(ts)) return DASH;
  const d = new Date(ts * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return (
    d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds())
  );
}

/** Rank lists compressed into ranges: [0,1,2,3,6] -> "0\u20133, 6". */
function fmtRanks(ranks) {
  if (!Array.isArray(ranks) || ranks.length === 0) return DASH;
  const sorted = ranks.filter(isNum).slice().sort((a, b) => a - b);
  const parts = [];
  let start = sorted[0];
  let prev = sorted[0];
  for (let i = 1; i <= sorted.length; i++) {
    const r = sorted[i];
    if (r === prev + 1) {
      prev = r;
      continue;
    }
    parts.push(start === prev ? String(start) : prev === start + 1 ? start + ", " + prev : start + "\u2013" + prev);
    start = prev = r;
  }
  return parts.join(", ");
}

// ------------------------------------------------------------ widgets --

const STATUS_CLASSES = {
  initializing: "st-initializing",
  running: "st-running",
  finished: "st-finished",
  exited: "st-exited",
  failed: "st-failed",
  lost: "st-lost",
};

/** Status pill. The CSS class comes from a fixed list, the text is data. */
function badge(status) {
  const text = status === null || status === undefined || status === "" ? "unknown" : String(status);
  const cls = STATUS_CLASSES[text] || "st-unknown";
  return el("span", { class: "badge " + cls, text: text });
}

/** A span showing "N s ago" that keeps itself current (see tick()). */
function ago(ts) {
  if (!isNum(ts)) return el("span", { class: "muted", text: DASH });
  return el("span", { class: "ago", title: fmtTime(ts), dataset: { ago: String(ts) }, text: fmtAgo(ts) });
}

/** A span showing the time elapsed since ts ("3 m 05 s"), kept current. */
function since(ts) {
  if (!isNum(ts)) return el("span", { class: "muted", text: DASH });
  return el("span", { class: "since", title: "since " + fmtTime(ts), dataset: { since: String(ts) }, text: fmtDuration(now() - ts) });
}

/** An absolute timestamp with the relative age as tooltip. */
function timeCell(ts) {
  if (!isNum(ts)) return el("span", { class: "muted", text: DASH });
  return el("time", { datetime: new Date(ts * 1000).toISOString(), title: fmtAgo(ts), text: fmtTime(ts) });
}

/**
 * Give `node` the class "overdue" once PG.now() passes `ts` (re-checked every
 * second without re-rendering). Returns node. A non-number ts does nothing.
 */
function overdueAt(node, ts) {
  if (!isNum(ts)) return node;
  node.dataset.overdueAt = String(ts);
  node.classList.toggle("overdue", now() >= ts);
  return node;
}

// --------------------------------------------------------------- time --

// Ages ("last seen 3 s ago") compare server timestamps with the browser
// clock. If the two disagree by more than a couple of seconds (the Date
// header has 1 s resolution), correct by the offset seen on API responses.
let clockOffset = 0;

// A page that shows a past moment (the job page's replay) sets it here: every relative
// label ("5 s ago") is then measured from that moment, the same each time it is opened.
let viewAt = null;

/** The moment relative labels are measured from: the one on screen, else the clock. */
function now() {
  return viewAt !== null ? viewAt : clockNow();
}

/** The browser clock, corrected by the server's Date header. */
function clockNow() {
  return Date.now() / 1000 + clockOffset;
}

/** Show relative times as of `ts` (Unix seconds), or as of the clock again (null). */
function setViewAt(ts) {
  viewAt = isNum(ts) ? ts : null;
}

function noteServerDate(res, t0, t1) {
  const header = res.headers.get("Date");
  const server = header ? Date.parse(header) : NaN;
  if (!isFinite(server)) return;
  const estimate = (server + 500 - (t0 + t1) / 2) / 1000;
  clockOffset = Math.abs(estimate) > 2 ? estimate : 0;
}

const tickers = [];

/** Register fn to run once a second (after relative times are refreshed). */
function tick(fn) {
  tickers.push(fn);
}

function refreshRelativeTimes() {
  for (const node of document.querySelectorAll("[data-ago]")) {
    node.textContent = fmtAgo(Number(node.dataset.ago));
  }
  for (const node of document.querySelectorAll("[data-since]")) {
    node.textContent = fmtDuration(now() - Number(node.dataset.since));
  }
  const t = now();
  for (const node of document.querySelectorAll("[data-overdue-at]")) {
    node.classList.toggle("overdue", t >= Number(node.dataset.overdueAt));
  }
  for (const fn of tickers) {
    try {
      fn();
    } catch (err) {
      console.error(err);
    }
  }
}
setInterval(refreshRelativeTimes, 1000);

// --------------------------------------------------------------- data --

/** Prefix for every URL (non-empty when mounted below a path prefix). */
function url(path) {
  const root = (document.body.dataset.root || "").replace(/\/+$/, "");
  return root + path;
}

/** GET a JSON API path; throws Error with .status on HTTP errors. */
async function fetchJSON(path) {
  const t0 = Date.now();
  const res = await fetch(url(path), { headers: { Accept: "application/json" }, cache: "no-store" });
  noteServerDate(res, t0, Date.now());
  let body = null;
  try {
    body = await res.json();
  } catch (_err) {
    body = null;
  }
  if (!res.ok) {
    const msg = body && typeof body.error === "string" ? body.error : res.status + " " + res.statusText;
    const err = new Error(msg);
    err.status = res.status;
    throw err;
  }
  markUpdated();
  return body;
}

const memo = new Map();

/**
 * True when `value` differs from what was last passed under `key`.
 * Lets sections skip rebuilding (and losing text selection) on no-op updates.
 */
function changed(key, value) {
  const s = JSON.stringify(value);
  if (memo.get(key) === s) return false;
  memo.set(key, s);
  return true;
}

// ------------------------------------------------------------ sorting --

/**
 * Sort a copy of rows by column `key` ("asc"/"desc"). `get(row, key)` gives the
 * value to compare; numbers compare numerically, strings naturally ("2" < "10"),
 * null/undefined always last.
 */
function sortBy(rows, key, dir, get) {
  const sign = dir === "desc" ? -1 : 1;
  const getter = get || ((row, k) => row[k]);
  return rows
    .map((row, i) => ({ row, i, v: getter(row, key) }))
    .sort((a, b) => {
      const an = a.v === null || a.v === undefined;
      const bn = b.v === null || b.v === undefined;
      if (an || bn) return an === bn ? a.i - b.i : an ? 1 : -1;
      let c;
      if (typeof a.v === "number" && typeof b.v === "number") c = a.v - b.v;
      else c = String(a.v).localeCompare(String(b.v), undefined, { numeric: true });
      return c !== 0 ? sign * c : a.i - b.i;
    })
    .map((x) => x.row);
}

/**
 * A clickable <th>. `sort` is {key, dir}; clicking calls onSort(newSort).
 * Numeric columns get class "num" and start descending.
 */
function sortHeader(label, key, sort, onSort, numeric) {
  const active = sort.key === key;
  const th = el("th", {
    scope: "col",
    class: (numeric ? "num " : "") + "sortable" + (active ? " sorted" : ""),
    "aria-sort": active ? (sort.dir === "asc" ? "ascending" : "descending") : "none",
  });
  const arrow = active ? (sort.dir === "asc" ? "\u25b2" : "\u25bc") : "";
  th.appendChild(
    el(
      "button",
      {
        type: "button",
        on: {
          click: () => {
            const dir = active ? (sort.dir === "asc" ? "desc" : "asc") : numeric ? "desc" : "asc";
            onSort({ key: key, dir: dir });
          },
        },
      },
      label,
      el("span", { class: "sort-arrow", "aria-hidden": "true", text: arrow })
    )
  );
  return th;
}

// --------------------------------------------------------------- live --

// The indicator lives in base.html: #live (data-state), #live-text, #live-updated.
const LIVE_TEXT = {
  connecting: "Connecting\u2026",
  live: "Live",
  reconnecting: "Reconnecting\u2026",
  offline: "Offline",
};
let lastUpdate = null;
let socketState = "connecting";
// What the page shows instead of the connection, when "Live" would not be true of it:
// {state, text, title} (the job page: a replayed moment, or a job that ended), else null.
let moment = null;

function setLiveState(state) {
  socketState = state;
  paintLive();
}

function paintLive() {
  const box = document.getElementById("live");
  if (!box) return;
  box.dataset.state = moment ? moment.state : socketState;
  box.title = moment && moment.title ? moment.title : "";
  const text = document.getElementById("live-text");
  if (text) text.textContent = moment ? moment.text : LIVE_TEXT[socketState] || socketState;
  renderUpdated();
}

/**
 * Say what the page shows when it is not the live present: `m` = {state: "replay" |
 * "ended", text, title}; null gives the connection's state back to the indicator.
 */
function setMoment(m) {
  const same = JSON.stringify(m || null) === JSON.stringify(moment);
  moment = m ? { state: String(m.state), text: String(m.text), title: m.title ? String(m.title) : "" } : null;
  if (!same) paintLive();
}

/** Record that fresh data arrived (REST or socket). */
function markUpdated() {
  lastUpdate = Date.now() / 1000;
  renderUpdated();
}

function renderUpdated() {
  const node = document.getElementById("live-updated");
  if (!node) return;
  if (lastUpdate === null || moment) {
    node.textContent = ""; // a replayed moment or an ended job is not "updated 3 s ago"
    const box = document.getElementById("live");
    if (box) box.classList.remove("stale");
    return;
  }
  const age = Date.now() / 1000 - lastUpdate;
  node.textContent = "updated " + (age < 1 ? "just now" : fmtDuration(age) + " ago");
  const box = document.getElementById("live");
  if (box) box.classList.toggle("stale", box.dataset.state !== "live" && age > 15);
}
tick(renderUpdated);

/**
 * Connect to the /ui namespace and keep watching.
 *   opts.watch   payload for the "watch" event, sent after every (re)connect
 *                (and again every opts.rewatchMs, 5 s, while the server refuses it)
 *   opts.events  {eventName: handler(payload)}
 *   opts.refresh optional async fn; polled every opts.pollMs (10 s) while the
 *                socket is not connected, so the page stays useful without it.
 * Returns {connected(): bool, socket}.
 */
function connectLive(opts) {
  const pollMs = opts.pollMs || 10000;
  let socket = null;
  const handle = {
    socket: null,
    connected: () => Boolean(socket && socket.connected),
    // Ask again for what opts.watch names (the server answers with a fresh snapshot).
    rewatch: () => {
      if (socket && socket.connected) sendWatch();
    },
  };

  if (opts.refresh) {
    setInterval(() => {
      if (!handle.connected()) opts.refresh().catch((err) => console.warn("refresh failed:", err));
    }, pollMs);
  }

  if (typeof window.io !== "function") {
    setLiveState("offline");
    console.warn("socket.io client missing; falling back to polling");
    return handle;
  }

  const root = (document.body.dataset.root || "").replace(/\/+$/, "");
  socket = window.io("/ui", { path: root + "/socket.io" });
  handle.socket = socket;
  // Sizes of the last messages received (characters of each Engine.IO text packet), for
  // bench/page.py; counting costs nothing next to parsing them.
  handle.received = [];
  socket.io.on("open", () => {
    socket.io.engine.on("packet", (packet) => {
      if (packet.type !== "message" || typeof packet.data !== "string") return;
      handle.received.push(packet.data.length);
      if (handle.received.length > 1000) handle.received.splice(0, 500);
    });
  });
  setLiveState("connecting");

  // "connect" fires on the first connection and again after each reconnect,
  // and the server forgets what we watched when the connection drops.
  socket.on("connect", () => {
    setLiveState("live");
    sendWatch();
  });
  // The server acks with {"ok": false, "error"} when it cannot watch yet (for
  // example a job that has not registered): ask again until it can.
  function sendWatch() {
    const sid = socket.id;
    socket.emit("watch", opts.watch, (ack) => {
      if (!ack || ack.ok !== false) return;
      console.info("pgdash: watch refused (" + ack.error + "); retrying");
      setTimeout(() => {
        if (socket.connected && socket.id === sid) sendWatch();
      }, opts.rewatchMs || 5000);
    });
  }
  socket.on("disconnect", (reason) => {
    setLiveState("reconnecting");
    // A server-side disconnect is not retried automatically by the client.
    if (reason === "io server disconnect") setTimeout(() => socket.connect(), 2000);
  });
  socket.on("connect_error", () => {
    setLiveState("reconnecting");
    // Rejected by the namespace (not a transport error): no auto-retry.
    if (!socket.active) setTimeout(() => socket.connect(), 5000);
  });
  for (const [name, fn] of Object.entries(opts.events || {})) {
    socket.on(name, (payload) => {
      markUpdated();
      try {
        fn(payload);
      } catch (err) {
        console.error("error handling '" + name + "' event:", err);
      }
    });
  }
  return handle;
}

export const PG = Object.freeze({
  el, clear, emptyRow, empty,
  DASH, isNum, fmtNum, fmtUs, fmtBytes, fmtDuration, fmtAgo, fmtTime, fmtRanks,
  badge, ago, since, timeCell, overdueAt,
  now, clockNow, setViewAt, tick,
  url, fetchJSON, changed, markUpdated, setMoment,
  sortBy, sortHeader,
  connectLive,
});
