"""Trace export: a job's event log and findings as Chrome-trace / Perfetto JSON.

Pure (no Flask, no SQL, no clock): :func:`build_trace` folds stored events (log order, as
``Store.job_events`` yields them) plus the job's findings and incidents into
``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``, which
https://ui.perfetto.dev and ``chrome://tracing`` open. :func:`json_chunks` writes it out in
pieces, so a server can stream it.

Layout. One process per rank (``process_name`` "rank N (host)", sorted by rank; pid = rank + 1,
because viewers treat pid 0 as the kernel's idle task), one more for the job ("job NAME:
findings and incidents", on top), and one for any agent session whose rank never became known.
In each rank: a "lifecycle" thread (rendezvous, errors, exit, connection) and one thread per
process group the rank reported ("group 0 · default_pg"). Thread ids are unique across the
file and kept apart from pids, so no viewer takes a group's thread for another rank's process.
Times are the ranks' own clocks (Unix time in microseconds, as the agents sent it).

What the agent sends, and what it becomes here (``pgdash_agent/core.py``, ``pgdash_agent/collectives.py``):

- ``heartbeat`` (every PGDASH_INTERVAL_S, 1 s by default): per group the sequence numbers
  entered and completed and the collective in flight (op, dtype, bytes, since when). A
  collective is therefore known individually only if a heartbeat caught it in flight: it
  becomes an ``X`` event on the group's thread from ``inflight_since`` to the last heartbeat
  that still saw it (a lower bound of its end), named by its op. When the next heartbeat shows it
  completed, the latency summary of the interval it completed in (``coll_stats``, sent just
  before that heartbeat) refines the end: the interval's longest call of that op, if it lies
  within the bounds the two heartbeats give (it must be this call when this call had already
  run longer than the interval; otherwise it is an estimate inside the known bounds). ``args``
  say which end was used, the sequence number, dtype and bytes. A collective that never
  completed (the rank exited, its connection dropped, or the log ends) keeps the lower bound
  and says so in its name: "(never completed)" when the rank exited or its connection closed,
  "(still in flight)" at the end of the log, "(end unknown)" when an ``async_op`` call was
  overtaken by the next one before a heartbeat saw it complete. Groups whose collectives run
  in C++ (DDP's reducer) are seen through the Flight Recorder's counters instead: "C++
  collective" events, same rules, no refinement.
  The sequence numbers become a counter "group G seq" (entered, completed): a flat line is a
  stuck group.
- ``coll_stats`` (per interval, per group and op: count, bytes, latency histogram): counters
  per group: "busy %" (time inside the group's collectives per interval, a call counted in the
  interval it completed in, at most 100), "collectives/s" per op and "latency (us)" p50/p99
  per op; set back to 0 where an interval with none follows.
- ``init_start``/``init_done``/``init_failed``: ``X`` "init_process_group" on the lifecycle
  thread from arrival to success or failure (to the session's last event if neither came).
- ``error``, ``stack``, ``exit``, ``connect``/``disconnect`` (but not the one that follows an
  exit), GPU XIDs and a GPU falling off the bus: instants (``ph: "i"``; errors and stacks on
  their group's thread when they name one).
- ``gpu``: counters "GPU utilisation %", "GPU memory used (MiB)", "GPU temperature (C)",
  "GPU power (W)".
- Findings and incidents (passed in; see :func:`build_trace`): an instant at ``first_seen`` on
  every blamed rank (scope "p") and a global one (scope "g") on the job's process; a finding
  no longer active gets a "last seen" instant at ``last_seen`` too.

Bounds. At most ``max_events`` events besides the process and thread names, which are always
kept. Over it, whole kinds are thinned evenly over time (one kept in 2, 4, 8, ... of every
counter and every thread), cheapest first: counters, then collectives, then instants,
findings and incidents last; the file's
``metadata.cut`` says what was dropped and how many. Memory stays within the cap too:
thinning happens while the log is read. Texts (errors, stacks, evidence) are cut to
:data:`TEXT_LIMIT` characters, saying so; the session file (``pgdash export``) keeps them
whole.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Hashable, Iterable, Iterator, Mapping

from pgdash_agent.wire import MAX_RANKS, hist_bucket_value
from dashboard.state import StoredEvent

DEFAULT_MAX_EVENTS = 1_000_000  # PGDASH_TRACE_MAX_EVENTS / --max-events
TEXT_LIMIT = 4_096  # characters of an error text, stack or finding evidence kept in args
FLIGHT_OP = "C++ collective"  # a collective only the Flight Recorder saw (as JobState says)
JOB_PID = MAX_RANKS + 2  # the job's own process: findings and incidents
FIRST_TID = 1 << 22  # above every pid, so a tid never equals another process's pid
MAX_PENDING = 10_000  # events held back while their session's rank is still unknown
# Seconds of slack when matching an interval's longest call to a collective's known bounds:
# the agent rounds inflight_since to microseconds.
MATCH_SLACK_S = 1e-3
FORMAT_VERSION = 1


class TraceError(ValueError):
    """A bad trace request; the text names the parameter and what to send instead."""


# -- request parameters -----------------------------------------------------------------------

def trace_query(args: Mapping[str, str], max_events_limit: int) -> tuple[
        float | None, float | None, int]:
    """``(start, end, max_events)`` from query parameters (``?start=&end=&max_events=``).

    Raises:
        TraceError: a value is not a time in Unix seconds, ``start`` is after ``end``, or
            ``max_events`` is not an integer from 1 to ``max_events_limit`` (the server's
            PGDASH_TRACE_MAX_EVENTS).
    """
    start = _time_arg(args.get("start"), "start")
    end = _time_arg(args.get("end"), "end")
    check_window(start, end)
    raw = args.get("max_events")
    if raw is None:
        return start, end, max_events_limit
    if not raw.isdigit() or not 1 <= int(raw) <= max_events_limit:
        raise TraceError(f"max_events must be an integer from 1 to {max_events_limit} "
                         f"(the server's PGDASH_TRACE_MAX_EVENTS); got {raw!r:.40}")
    return start, end, int(raw)


def _time_arg(raw: str | None, name: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise TraceError(f"{name} must be a time in Unix seconds, e.g. ?{name}=1764000000.5; "
                         f"got {raw!r:.40}")
    return value


def check_window(start: float | None, end: float | None) -> None:
    """Raise TraceError if ``start`` or ``end`` is not a finite time or ``start`` is after
    ``end``."""
    for name, value in (("start", start), ("end", end)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise TraceError(f"{name} must be a time in Unix seconds, got {value!r:.40}")
    if start is not None and end is not None and start > end:
        raise TraceError(f"start ({start}) is after end ({end}): both are Unix seconds and "
                         "the window runs from start to end")


# -- the trace --------------------------------------------------------------------------------

@dataclasses.dataclass
class _Sighting:
    """A collective a heartbeat caught in flight on one rank."""

    group: str
    seq: int
    op: str
    since: float
    first_seen: float
    last_seen: float
    source: str  # "python" (the agent's wrappers) or "flight_recorder"
    dtype: str | None = None
    nbytes: int | None = None


@dataclasses.dataclass
class _Session:
    """What the builder keeps per agent session (one process of one rank)."""

    id: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    os_pid: int | None = None
    first_t: float | None = None
    last_t: float | None = None
    init: dict[str, Any] | None = None  # init_start body and arrival time, until it ends
    open: dict[str, _Sighting] = dataclasses.field(default_factory=dict)  # group -> sighting
    # (group, op) -> (interval start, interval end, longest call in us)
    last_stats: dict[tuple[str, str], tuple[float, float, float]] = dataclasses.field(
        default_factory=dict)
    stats_end: dict[str, float] = dataclasses.field(default_factory=dict)  # group -> last end
    ops: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # group -> ops seen
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    gpu_lost: bool = False
    exited: bool = False
    pending: list[StoredEvent] = dataclasses.field(default_factory=list)


class _Thinned:
    """One kind of event, thinned evenly over time when the file would grow past its cap.

    Thinning counts per series (one counter of one rank, one thread), so every series keeps
    the same share spread over its time: a stride over the mixed stream would keep one counter
    of each interval's few and drop the others whole.
    """

    def __init__(self, name: str):
        self.name = name
        self.items: list[tuple[int, dict[str, Any]]] = []  # (index in its series, event)
        self.series: dict[Hashable, int] = {}  # series -> its events seen so far
        self.stride = 1  # keep the events whose index in their series is a multiple of it
        self.dropped = 0

    def turn(self, series: Hashable) -> int | None:
        """The next event's index in its series if it is to be kept, else None (counted)."""
        index = self.series.get(series, 0)
        self.series[series] = index + 1
        if self.stride and index % self.stride == 0:
            return index
        self.dropped += 1
        return None

    def shed(self) -> None:
        """Keep one in twice as many of each series as before. When that frees nothing (each
        series is down to its first event), keep every other event; once one is left, none."""
        if len(self.items) <= 1:
            self.stride = 0  # none of this kind fits any more
            keep: list[tuple[int, dict[str, Any]]] = []
        else:
            self.stride *= 2
            keep = [item for item in self.items if item[0] % self.stride == 0]
            if len(keep) == len(self.items):
                keep = self.items[::2]
        self.dropped += len(self.items) - len(keep)
        self.items = keep


# Cheapest first: what goes when the cap is reached.
KINDS = ("counters", "collectives", "instants", "findings")


class TraceBuilder:
    """Folds a job's stored events into trace events; see the module docstring.

    Args:
        start, end: keep only what happened in this window (Unix seconds; an ``X`` event is
            kept if it overlaps it). The whole log is still read: what a rank is and what was
            in flight before ``start`` is known only from it.
        max_events: the most events besides process and thread names.
    """

    def __init__(self, start: float | None = None, end: float | None = None,
                 max_events: int = DEFAULT_MAX_EVENTS):
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise TraceError(f"max_events must be a positive integer, got {max_events!r:.40}")
        check_window(start, end)
        self.start, self.end, self.max_events = start, end, max_events
        self.kinds = {k: _Thinned(k) for k in KINDS}
        self.kept = 0
        self.sessions: dict[str, _Session] = {}
        self.pending = 0  # events held back in all sessions together
        self.groups: dict[str, dict[str, Any]] = {}  # name -> group event body
        self.processes: dict[int, dict[str, Any]] = {}  # pid -> {"rank", "host", "sort"}
        self.threads: dict[tuple[int, str], int] = {}  # (pid, track) -> tid
        self.unranked = 0

    # -- input -------------------------------------------------------------------------------

    def add_events(self, events: Iterable[StoredEvent]) -> "TraceBuilder":
        for ev in events:
            self.add_event(ev)
        return self

    def add_event(self, ev: StoredEvent) -> None:
        s = self.sessions.get(ev["session"])
        if s is None:
            s = self.sessions[ev["session"]] = _Session(ev["session"])
        if s.rank is None:
            rank = _rank_of(ev)
            if rank is None and self.pending < MAX_PENDING:
                s.pending.append(ev)  # its rank may come with init_done: wait for it
                self.pending += 1
                return
            self._place(s, rank)
        self._apply(s, ev)

    def _place(self, s: _Session, rank: int | None) -> None:
        """Give a session its process (its rank's, or one of its own) and replay what waited."""
        s.rank = rank
        if rank is not None:
            s.pid = rank + 1
            self.processes.setdefault(s.pid, {"rank": rank, "host": None, "sort": rank})
        else:
            self.unranked += 1
            s.pid = JOB_PID + self.unranked
            self.processes[s.pid] = {"rank": None, "host": None, "sort": MAX_RANKS + self.unranked,
                                     "session": s.id}
        waiting, s.pending = s.pending, []
        self.pending -= len(waiting)
        for ev in waiting:
            self._apply(s, ev)

    def add_findings(self, findings: Iterable[dict[str, Any]], what: str = "finding") -> None:
        """Findings (or incidents, ``what="incident"``) as instants; see the module docstring."""
        for f in findings:
            prefix = "" if what == "finding" else what + " "
            label = f"{prefix}{f['kind']}: {f.get('summary', '')}"
            args = {"id": f.get("id"), "kind": f["kind"], "severity": f.get("severity"),
                    "ranks": f.get("ranks"), "group": f.get("group"),
                    "summary": f.get("summary"), "hint": f.get("hint"),
                    "active": f.get("active"), "first_seen": f.get("first_seen"),
                    "last_seen": f.get("last_seen")}
            if "findings" in f:
                args["findings"] = f["findings"]
            if "evidence" in f:
                args["evidence"] = _evidence(f["evidence"])
            moments = [(f["first_seen"], label)]
            if f.get("active") is False and f.get("last_seen") is not None:
                moments.append((f["last_seen"], f"{prefix}{f['kind']} last seen"))
            for t, name in moments:
                self._instant("findings", JOB_PID, self._tid(JOB_PID, "findings"), t, name,
                              args, scope="g", cat=what)
                for rank in f.get("ranks") or ():
                    pid = rank + 1
                    self.processes.setdefault(pid, {"rank": rank, "host": None, "sort": rank})
                    self._instant("findings", pid, self._tid(pid, "lifecycle"), t, name, args,
                                  scope="p", cat=what)

    # -- the fold ----------------------------------------------------------------------------

    def _apply(self, s: _Session, ev: StoredEvent) -> None:
        t, body = ev["t"], ev["body"]
        s.last_t = t if s.last_t is None else max(s.last_t, t)
        s.first_t = t if s.first_t is None else min(s.first_t, t)
        handler = getattr(self, "_on_" + ev["kind"], None)
        if handler is not None:
            handler(s, body, t)

    def _on_hello(self, s: _Session, body: dict[str, Any], t: float) -> None:
        s.host = body.get("host") or s.host
        s.os_pid = body.get("pid") or s.os_pid
        self.processes[s.pid]["host"] = s.host
        self.processes[s.pid]["os_pid"] = s.os_pid

    def _on_connect(self, s: _Session, body: dict[str, Any], t: float) -> None:
        s.exited = False
        if body.get("host"):
            s.host = body["host"]
            self.processes[s.pid]["host"] = self.processes[s.pid]["host"] or s.host
        self._instant("instants", s.pid, self._tid(s.pid, "lifecycle"), t, "agent connected",
                      {"session": s.id})

    def _on_disconnect(self, s: _Session, body: dict[str, Any], t: float) -> None:
        if s.exited:
            return  # the usual end of a session after its exit: nothing to show
        self._end_session(s, "its connection closed while this was in flight")
        self._instant("instants", s.pid, self._tid(s.pid, "lifecycle"), t,
                      "agent disconnected", {"session": s.id})

    def _on_init_start(self, s: _Session, body: dict[str, Any], t: float) -> None:
        s.init = {"arrived_at": t, **body}

    def _on_init_done(self, s: _Session, body: dict[str, Any], t: float) -> None:
        self._rendezvous(s, t, {**body, "result": "done"}, "init_process_group")

    def _on_init_failed(self, s: _Session, body: dict[str, Any], t: float) -> None:
        self._rendezvous(s, t, {**body, "error": _cut(body["error"]), "result": "failed"},
                         "init_process_group (failed)")
        self._error(s, {**body, "where": "init_process_group"}, t)

    def _rendezvous(self, s: _Session, t: float, outcome: dict[str, Any], name: str) -> None:
        arrived = t - outcome["duration_s"]
        args = {**(s.init or {}), **outcome, "arrived_at": arrived}
        s.init = None
        self._complete("instants", s.pid, self._tid(s.pid, "lifecycle"), arrived, t, name,
                       args, cat="init")

    def _on_group(self, s: _Session, body: dict[str, Any], t: float) -> None:
        self.groups[body["name"]] = body
        if s.rank is None or s.rank in body["ranks"]:
            self._tid(s.pid, "group:" + body["name"])

    def _on_coll_stats(self, s: _Session, body: dict[str, Any], t: float) -> None:
        # The agent's first interval opens as it is made, just before its hello; nothing it
        # recorded began before the hello (the wrappers go in after it), so the counters
        # start there rather than before the job's first event.
        start = max(body["start"], s.first_t) if s.first_t is not None else body["start"]
        end = body["end"]
        seconds = max(end - start, 1e-3)
        per_group: dict[str, list[dict[str, Any]]] = {}
        for row in body["rows"]:
            per_group.setdefault(row["group"], []).append(row)
            s.last_stats[(row["group"], row["op"])] = (start, end, row["max_us"])
        for group, rows in per_group.items():
            label = self._group_label(group)
            last_end = s.stats_end.get(group)
            # Back-to-back intervals share their boundary exactly; a gap is at least one of
            # the agent's ticks, and nothing ran in it.
            if last_end is not None and start > last_end + 1e-3:
                self._zero_counters(s, group, last_end)
            s.stats_end[group] = end
            ops = s.ops.setdefault(group, set())
            ops.update(r["op"] for r in rows)
            rates = dict.fromkeys(sorted(ops), 0.0)
            latency = {}
            for op in sorted(ops):
                latency[f"{op} p50"] = latency[f"{op} p99"] = 0.0
            busy = 0.0
            for r in rows:
                rates[r["op"]] = round(r["count"] / seconds, 3)
                p50, p99 = _percentiles(r["hist"], r["max_us"])
                latency[f"{r['op']} p50"], latency[f"{r['op']} p99"] = p50, p99
                busy += r["sum_us"]
            # A call counts whole in the interval it completed in (that is all a summary
            # says), so one long wait would read as several hundred percent: capped, as the
            # page's heat map is.
            busy_pct = min(100.0, round(busy / seconds / 1e4, 2))
            for name, args in ((f"{label} busy %", {"busy": busy_pct}),
                               (f"{label} collectives/s", rates),
                               (f"{label} latency (us)", latency)):
                self._counter("counters", s.pid, start, name, args)

    def _zero_counters(self, s: _Session, group: str, t: float) -> None:
        label = self._group_label(group)
        ops = sorted(s.ops.get(group, ()))
        latency = {}
        for op in ops:
            latency[f"{op} p50"] = latency[f"{op} p99"] = 0.0
        # Kept with the collectives, not thinned with the counters: a dropped zero would draw
        # the last busy interval across the whole quiet stretch after it.
        for name, args in ((f"{label} busy %", {"busy": 0.0}),
                           (f"{label} collectives/s", dict.fromkeys(ops, 0.0)),
                           (f"{label} latency (us)", latency)):
            self._counter("collectives", s.pid, t, name, args)

    def _on_heartbeat(self, s: _Session, body: dict[str, Any], t: float) -> None:
        for row in body["groups"]:
            group = row["group"]
            flight = not row["entered"] and bool(row.get("fr_enqueued"))
            if flight:
                seq, since, done = row["fr_enqueued"], row.get("fr_inflight_since"), \
                    row.get("fr_completed", 0)
                op = FLIGHT_OP if since is not None else None
                progress = {"enqueued": seq, "completed": done}
            else:
                seq, since, done = row["entered"], row.get("inflight_since"), row["completed"]
                op = row.get("inflight_op")
                progress = {"entered": seq, "completed": done}
            self._counter("counters", s.pid, t, f"{self._group_label(group)} seq", progress)
            seen = s.open.get(group)
            if seen is not None:
                if op is not None and since is not None and seen.seq == seq and \
                        seen.since == since:
                    seen.last_seen = t
                    continue
                if done >= seen.seq:
                    end = "completed"
                elif seq > seen.seq:
                    end = "the next collective was entered before this one completed (async)"
                else:
                    end = "it left the heartbeats without completing"
                self._close(s, seen, t if since is None else min(t, since), end,
                            completed=done >= seen.seq, unfinished="end unknown")
            if op is not None and since is not None:
                s.open[group] = _Sighting(group, seq, op, since, t, t,
                                          "flight_recorder" if flight else "python",
                                          row.get("inflight_dtype"), row.get("inflight_bytes"))
        dropped = body.get("dropped") or {}
        if dropped != s.dropped:
            s.dropped = dict(dropped)
            self._counter("counters", s.pid, t, "agent dropped events", dict(dropped) or {"all": 0})

    def _close(self, s: _Session, seen: _Sighting, completed_by: float, end: str,
               completed: bool, unfinished: str) -> None:
        """Emit a sighting as an X event; see the module docstring for how its end is chosen."""
        del s.open[seen.group]
        finish = seen.last_seen
        how = "last heartbeat that saw it in flight (a lower bound)"
        stats = s.last_stats.get((seen.group, seen.op)) if completed else None
        if stats is not None and seen.source == "python" and stats[1] > seen.last_seen:
            longest = stats[2] / 1e6
            if seen.last_seen - seen.since - MATCH_SLACK_S <= longest <= \
                    completed_by - seen.since + MATCH_SLACK_S:
                finish = max(seen.since + longest, seen.last_seen)
                how = f"the longest {seen.op} of the interval it completed in"
        finish = max(seen.since, min(finish, max(completed_by, seen.last_seen)))
        args = {"group": seen.group, "seq": seen.seq, "op": seen.op, "source": seen.source,
                "dtype": seen.dtype, "bytes": seen.nbytes, "end": end,
                "end_from": how, "seen_in_flight": [seen.first_seen, seen.last_seen],
                "completed_by": completed_by if completed else None}
        name = seen.op if completed else f"{seen.op} ({unfinished})"
        self._complete("collectives", s.pid, self._tid(s.pid, "group:" + seen.group),
                       seen.since, finish, name, args, cat="collective")

    def _end_session(self, s: _Session, end: str, unfinished: str = "never completed") -> None:
        for seen in list(s.open.values()):
            self._close(s, seen, seen.last_seen, end, completed=False, unfinished=unfinished)
        for group, last_end in list(s.stats_end.items()):
            self._zero_counters(s, group, last_end)
        s.stats_end.clear()

    def _on_error(self, s: _Session, body: dict[str, Any], t: float) -> None:
        self._error(s, body, t)

    def _error(self, s: _Session, body: dict[str, Any], t: float) -> None:
        group = body.get("group")
        track = "group:" + group if group else "lifecycle"
        self._instant("instants", s.pid, self._tid(s.pid, track), t,
                      f"error: {body['error_type']}",
                      {**body, "error": _cut(body["error"])}, cat="error")

    def _on_stack(self, s: _Session, body: dict[str, Any], t: float) -> None:
        self._instant("instants", s.pid, self._tid(s.pid, "group:" + body["group"]), t,
                      f"stack: {body['op']} #{body['seq']}",
                      {**body, "stack": _cut(body["stack"], keep_end=True)}, cat="stack")

    def _on_gpu(self, s: _Session, body: dict[str, Any], t: float) -> None:
        v = body["values"]
        mem = v.get("mem_used")
        for name, args in (
                ("GPU utilisation %", {"gpu": v.get("util_gpu"), "memory": v.get("util_mem")}),
                ("GPU memory used (MiB)",
                 {"used": round(mem / 2**20, 1) if mem is not None else None}),
                ("GPU temperature (C)", {"temp": v.get("temp_c")}),
                ("GPU power (W)", {"power": v.get("power_w")})):
            args = {k: x for k, x in args.items() if x is not None}
            if args:
                self._counter("counters", s.pid, t, name, args)
        lifecycle = self._tid(s.pid, "lifecycle")
        for xid in body["xids"]:
            self._instant("instants", s.pid, lifecycle, t, f"GPU XID {xid}",
                          {"uuid": body["uuid"], "xid": xid}, cat="gpu")
        if body["lost"] and not s.gpu_lost:
            self._instant("instants", s.pid, lifecycle, t, "GPU lost",
                          {"uuid": body["uuid"]}, cat="gpu")
        s.gpu_lost = body["lost"]

    def _on_exit(self, s: _Session, body: dict[str, Any], t: float) -> None:
        s.exited = True
        self._end_session(s, "the rank exited while this was in flight")
        clean = body["clean"]
        self._instant("instants", s.pid, self._tid(s.pid, "lifecycle"), t,
                      "exit" if clean else f"exit (failed: {body.get('reason') or 'unknown'})",
                      body, cat="exit")

    # -- output ------------------------------------------------------------------------------

    def finish(self, job: Mapping[str, Any] | None = None,
               incidents_given: bool = False) -> dict[str, Any]:
        """The trace: process/thread names first, then every event kept, in time order."""
        for s in list(self.sessions.values()):
            if s.pid is None:  # its rank never became known
                self._place(s, None)
            if s.init is not None and s.last_t is not None:
                arrived = s.init["arrived_at"]
                self._complete("instants", s.pid, self._tid(s.pid, "lifecycle"), arrived,
                               s.last_t, "init_process_group (never finished)",
                               {**s.init, "result": "no init_done or init_failed by the "
                                "session's last event"}, cat="init")
                s.init = None
            self._end_session(s, "still in flight when the log ends", "still in flight")
        events = [e for kind in self.kinds.values() for _, e in kind.items]
        events.sort(key=lambda e: e["ts"])
        meta = self._names(job)
        cut = {k.name: {"dropped": k.dropped, "kept_one_in": k.stride or None}
               for k in self.kinds.values() if k.dropped}
        metadata = {
            "source": "pgdash", "format_version": FORMAT_VERSION,
            "job": dict(job) if job is not None else None,
            "clock": "ts is Unix time in microseconds on each rank's own clock",
            "window": {"start": self.start, "end": self.end},
            "max_events": self.max_events,
            "events": len(events), "names": len(meta),
            "cut": cut,
            "note": ("thinned evenly over time to stay within max_events; the session file "
                     "(pgdash export) keeps everything" if cut else None),
            "incidents": "included" if incidents_given else "none given",
        }
        return {"traceEvents": meta + events, "displayTimeUnit": "ms", "metadata": metadata}

    def _names(self, job: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        meta: list[dict[str, Any]] = []
        job_name = (job or {}).get("name")
        for pid, p in sorted(self.processes.items()):
            if pid == JOB_PID:
                name = f"job {job_name}: findings and incidents" if job_name else \
                    "job: findings and incidents"
                sort = -1
            elif p["rank"] is None:
                name, sort = f"session {p['session'][:8]} (rank unknown)", p["sort"]
            else:
                host = f" ({p['host']})" if p.get("host") else ""
                name, sort = f"rank {p['rank']}{host}", p["sort"]
            meta.append(_meta(pid, 0, "process_name", {"name": name}))
            meta.append(_meta(pid, 0, "process_sort_index", {"sort_index": sort}))
            if p.get("os_pid"):  # to match the rank with its own logs
                meta.append(_meta(pid, 0, "process_labels", {"labels": f"pid {p['os_pid']}"}))
        for (pid, track), tid in sorted(self.threads.items(), key=lambda kv: kv[1]):
            if track.startswith("group:"):
                group = track[6:]
                name, sort = self._group_label(group, long=True), 1 + _group_rank(group)
            else:
                name, sort = track, 0
            meta.append(_meta(pid, tid, "thread_name", {"name": name}))
            meta.append(_meta(pid, tid, "thread_sort_index", {"sort_index": sort}))
        return meta

    # -- helpers -----------------------------------------------------------------------------

    def _tid(self, pid: int, track: str) -> int:
        key = (pid, track)
        tid = self.threads.get(key)
        if tid is None:
            tid = self.threads[key] = FIRST_TID + len(self.threads)
            if pid == JOB_PID:
                self.processes.setdefault(JOB_PID, {"rank": None, "host": None, "sort": -1})
        return tid

    def _group_label(self, group: str, long: bool = False) -> str:
        label = f"group {group}"
        desc = (self.groups.get(group) or {}).get("desc")
        if long and desc and desc not in ("undefined", group):
            label += f" · {desc}"
        return label

    def _within(self, t0: float, t1: float) -> bool:
        return (self.start is None or t1 >= self.start) and (self.end is None or t0 <= self.end)

    def _keep(self, kind: _Thinned, index: int, event: dict[str, Any]) -> None:
        kind.items.append((index, event))
        self.kept += 1
        while self.kept > self.max_events:
            victim = next(k for k in self.kinds.values() if k.items)
            self.kept -= len(victim.items)
            victim.shed()
            self.kept += len(victim.items)

    def _instant(self, kind: str, pid: int, tid: int, t: float, name: str,
                 args: dict[str, Any], scope: str = "t", cat: str = "event") -> None:
        if not self._within(t, t):
            return
        thinned = self.kinds[kind]
        index = thinned.turn((pid, tid))
        if index is not None:
            self._keep(thinned, index, {"name": name, "cat": cat, "ph": "i", "s": scope,
                                        "pid": pid, "tid": tid, "ts": _us(t), "args": args})

    def _complete(self, kind: str, pid: int, tid: int, t0: float, t1: float, name: str,
                  args: dict[str, Any], cat: str) -> None:
        if not self._within(t0, t1):
            return
        thinned = self.kinds[kind]
        index = thinned.turn((pid, tid))
        if index is not None:
            self._keep(thinned, index, {"name": name, "cat": cat, "ph": "X", "pid": pid,
                                        "tid": tid, "ts": _us(t0),
                                        "dur": round(max(0.0, t1 - t0) * 1e6, 3),
                                        "args": args})

    def _counter(self, kind: str, pid: int, t: float, name: str, args: dict[str, Any]) -> None:
        if not args or not self._within(t, t):
            return
        thinned = self.kinds[kind]
        index = thinned.turn(("C", pid, name))
        if index is not None:
            self._keep(thinned, index, {"name": name, "cat": "counter", "ph": "C", "pid": pid,
                                        "tid": self._tid(pid, "lifecycle"), "ts": _us(t),
                                        "args": args})


def build_trace(events: Iterable[StoredEvent], *, findings: Iterable[dict[str, Any]] = (),
                incidents: Iterable[dict[str, Any]] = (), job: Mapping[str, Any] | None = None,
                start: float | None = None, end: float | None = None,
                max_events: int = DEFAULT_MAX_EVENTS) -> dict[str, Any]:
    """A job as Chrome-trace / Perfetto JSON (see the module docstring for the mapping).

    Args:
        events: the job's stored events in log order (``Store.job_events``).
        findings: the job's findings (the ``Finding`` shape of ``dashboard.diagnosis``).
        incidents: the job's incidents (``{"id", "kind", "severity", "ranks", "summary",
            "hint", "findings", "first_seen", "last_seen", "active"}``), when the server
            groups findings into them; none by default.
        job: the job's row (name, status, ...), copied into ``metadata.job``.
        start, end: the window to keep, Unix seconds (None: open).
        max_events: the most events besides process and thread names.

    Raises:
        TraceError: ``start`` after ``end``, or ``max_events`` not a positive integer.
    """
    builder = TraceBuilder(start, end, max_events)
    builder.add_events(events)
    incidents = list(incidents)
    builder.add_findings(incidents, what="incident")
    builder.add_findings(findings)
    return builder.finish(job, incidents_given=bool(incidents))


def json_chunks(trace: dict[str, Any], events_per_chunk: int = 2000) -> Iterator[str]:
    """The trace as JSON text, a few thousand events at a time (for streaming)."""
    yield '{"traceEvents":[\n'
    events = trace["traceEvents"]
    for i in range(0, len(events), events_per_chunk):
        part = ",\n".join(_dump(e) for e in events[i:i + events_per_chunk])
        yield part if i == 0 else ",\n" + part
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    yield "\n]," + _dump(rest)[1:] + "\n"


def _dump(obj: Any) -> str:
    # Finding evidence may hold anything JSON can; NaN would make the file unreadable.
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def _us(t: float) -> int:
    return round(t * 1e6)


def _percentiles(hist: list[list[int]], max_us: float) -> tuple[float, float]:
    """p50 and p99 (us) of one summary row's histogram, as ``LatencyStats.percentile`` gives
    them (never above the row's maximum), in one pass: this runs for every row of the log."""
    total = sum(n for _, n in hist)
    if not total:
        return 0.0, 0.0
    found: list[float] = []
    seen = 0
    targets = [0.5 * total, 0.99 * total]
    for bucket, n in sorted(hist):
        seen += n
        while targets and seen >= targets[0]:
            targets.pop(0)
            found.append(round(min(hist_bucket_value(bucket), max_us), 3))
    while len(found) < 2:
        found.append(round(max_us, 3))
    return found[0], found[1]


def _rank_of(ev: StoredEvent) -> int | None:
    """The rank an event says its session is, if it says one."""
    body = ev["body"]
    if ev["kind"] in ("hello", "connect", "init_done", "init_start"):
        rank = body.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
            return rank
    return None


def _group_rank(name: str) -> int:
    return int(name) if name.isdigit() else 1 << 20


def _cut(text: str, keep_end: bool = False) -> str:
    """A text of at most about TEXT_LIMIT characters, saying how much was left out."""
    if len(text) <= TEXT_LIMIT:
        return text
    left = len(text) - TEXT_LIMIT
    note = f"[{left} more characters in the session file (pgdash export)]"
    return note + "\n" + text[-TEXT_LIMIT:] if keep_end else text[:TEXT_LIMIT] + "\n" + note


def _evidence(evidence: Any) -> Any:
    try:
        text = _dump(evidence)
    except ValueError:  # NaN or infinity somewhere in it: JSON cannot carry them
        return {"cut": "evidence holds a value JSON cannot carry (NaN or infinity); GET "
                       "/api/jobs/<id>/findings has it", "start": repr(evidence)[:TEXT_LIMIT]}
    if len(text) <= TEXT_LIMIT:
        return evidence
    return {"cut": f"evidence is {len(text)} characters of JSON; GET /api/jobs/<id>/findings "
                   "has it whole", "start": text[:TEXT_LIMIT]}
