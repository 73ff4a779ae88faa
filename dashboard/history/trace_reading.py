"""The fold read as a timeline: each event JobState applies becomes trace events.

Pure (no Flask, no SQL, no clock). :class:`TraceReading` is the :class:`~dashboard.state.
StateObserver` of a JobState that folds the job's log: who a session is (its rank, host and
process id, when it was first seen) and the job's groups are read from the fold, never folded
here a second time. What it keeps itself is what only a timeline needs and a state at one
moment has no use for: spans (a collective from the first heartbeat that caught it in flight to
the one that saw it done, a rendezvous from its start to its outcome) and the last interval of
each counter, so that a counter steps back to zero where a quiet stretch follows. The mapping
of each event kind to trace events is in :mod:`dashboard.history.trace`'s docstring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pgdash_agent.wire import hist_bucket_value
from dashboard.history.trace_file import TraceFile, cut_text
from dashboard.history.trace_snapshots import draw_completed, snapshot_args
from dashboard.state import FLIGHT_OP, JobState, RankState, StoredEvent

# Kinds JobState folds that the timeline does not draw, and why. tests/unit/test_trace.py holds
# every other kind the fold folds to a reading here, so a new kind is drawn by decision.
NOT_DRAWN = {"left": "destroy_process_group: the trace predates the kind, and drawing it "
                     "changes the file, for a change of its own",
             "boards": "a host reader's last words (the collective each rank was in when it "
                       "ended): not drawn yet, a change of the file of its own"}
MAX_PENDING = 10_000  # events held back while their session's rank is still unknown
# Seconds of slack when matching an interval's longest call to a collective's known bounds:
# the agent rounds inflight_since to microseconds.
MATCH_SLACK_S = 1e-3


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
    """The spans of one agent session (one process of one rank) still open on the timeline."""

    id: str
    pid: int | None = None  # its process in the file, once its rank is known (or never is)
    last_t: float | None = None  # its last event (a disconnect too): where open spans end
    init: dict[str, Any] | None = None  # init_start body and arrival time, until it ends
    open: dict[str, _Sighting] = dataclasses.field(default_factory=dict)  # group -> sighting
    # (group, op) -> (interval start, interval end, longest call in us)
    last_stats: dict[tuple[str, str], tuple[float, float, float]] = dataclasses.field(
        default_factory=dict)
    stats_end: dict[str, float] = dataclasses.field(default_factory=dict)  # group -> last end
    ops: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # group -> ops seen
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    gpu_lost: bool = False
    # the end of the newest collective drawn from its snapshots (the next one's ring overlaps)
    completed_until: float = 0.0
    exited: bool = False  # since its exit, until it connects again: its disconnect is routine
    pending: list[StoredEvent] = dataclasses.field(default_factory=list)


class TraceReading:
    """Turns the events a JobState applies into a :class:`TraceFile`'s events.

    Args:
        file: where the trace events go.
    """

    def __init__(self, file: TraceFile):
        self.file = file
        self.state: JobState | None = None
        self.sessions: dict[str, _Session] = {}
        self.pending = 0  # events held back in all sessions together

    # -- what the fold applied -----------------------------------------------------------------

    def applied(self, state: JobState, rank: RankState, ev: StoredEvent) -> None:
        self.state = state
        s = self.sessions.get(ev["session"])
        if s is None:
            s = self.sessions[ev["session"]] = _Session(ev["session"])
        if s.pid is None:
            known = rank.rank if _is_rank(rank.rank) else None
            if known is None and self.pending < MAX_PENDING:
                s.pending.append(ev)  # its rank may come with init_done: wait for it
                self.pending += 1
                return
            self._place(s, rank, known)
        self._read(s, rank, ev)

    def _place(self, s: _Session, rank: RankState, known: int | None) -> None:
        """Give a session its process (its rank's, or one of its own) and read what waited."""
        s.pid = self.file.rank_process(known) if known is not None else \
            self.file.session_process(s.id)
        waiting, s.pending = s.pending, []
        self.pending -= len(waiting)
        for ev in waiting:
            self._read(s, rank, ev)

    def _read(self, s: _Session, rank: RankState, ev: StoredEvent) -> None:
        t = ev["t"]
        s.last_t = t if s.last_t is None else max(s.last_t, t)
        reading = getattr(self, "_on_" + ev["kind"], None)
        if reading is not None:
            reading(s, rank, ev["body"], t)

    def group_label(self, group: str, long: bool = True) -> str:
        """"group G", and with ``long`` its description as the fold knows it."""
        label = f"group {group}"
        desc = (self.state.groups.get(group) or {}).get("desc") if self.state else None
        if long and desc and desc not in ("undefined", group):
            label += f" · {desc}"
        return label

    # -- one reading per event kind --------------------------------------------------------------

    def _on_hello(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        process = self.file.processes[s.pid]
        process["host"] = rank.host or None
        process["os_pid"] = rank.pid

    def _on_connect(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        s.exited = False
        if body.get("host"):
            process = self.file.processes[s.pid]
            process["host"] = process["host"] or body["host"]
        self._lifecycle(s, t, "agent connected", {"session": s.id})

    def _on_disconnect(self, s: _Session, rank: RankState, body: dict[str, Any],
                       t: float) -> None:
        if s.exited:
            return  # the usual end of a session after its exit: nothing to show
        self._end_spans(s, "its connection closed while this was in flight")
        self._lifecycle(s, t, "agent disconnected", {"session": s.id})

    def _on_init_start(self, s: _Session, rank: RankState, body: dict[str, Any],
                       t: float) -> None:
        s.init = {"arrived_at": t, **body}

    def _on_init_done(self, s: _Session, rank: RankState, body: dict[str, Any],
                      t: float) -> None:
        self._rendezvous(s, t, {**body, "result": "done"}, "init_process_group")

    def _on_init_failed(self, s: _Session, rank: RankState, body: dict[str, Any],
                        t: float) -> None:
        self._rendezvous(s, t, {**body, "error": cut_text(body["error"]), "result": "failed"},
                         "init_process_group (failed)")
        self._on_error(s, rank, {**body, "where": "init_process_group"}, t)

    def _rendezvous(self, s: _Session, t: float, outcome: dict[str, Any], name: str) -> None:
        arrived = t - outcome["duration_s"]
        args = {**(s.init or {}), **outcome, "arrived_at": arrived}
        s.init = None
        self.file.complete("instants", s.pid, self.file.tid(s.pid, "lifecycle"), arrived, t,
                           name, args, cat="init")

    def _on_group(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        placed = self.file.processes[s.pid]["rank"]
        if placed is None or placed in body["ranks"]:
            self.file.tid(s.pid, "group:" + body["name"])

    def _on_coll_stats(self, s: _Session, rank: RankState, body: dict[str, Any],
                       t: float) -> None:
        # The agent's first interval opens as it is made, just before its hello; nothing it
        # recorded began before the hello (the wrappers go in after it), so the counters
        # start there rather than before the job's first event.
        first = rank.first_seen
        start = max(body["start"], first) if first is not None else body["start"]
        end = body["end"]
        seconds = max(end - start, 1e-3)
        per_group: dict[str, list[dict[str, Any]]] = {}
        for row in body["rows"]:
            per_group.setdefault(row["group"], []).append(row)
            s.last_stats[(row["group"], row["op"])] = (start, end, row["max_us"])
        for group, rows in per_group.items():
            last_end = s.stats_end.get(group)
            # Back-to-back intervals share their boundary exactly; a gap is at least one of
            # the agent's ticks, and nothing ran in it.
            if last_end is not None and start > last_end + 1e-3:
                self._zero_counters(s, group, last_end)
            s.stats_end[group] = end
            ops = s.ops.setdefault(group, set())
            ops.update(r["op"] for r in rows)
            label = self.group_label(group, long=False)
            for name, args in _interval_counters(rows, sorted(ops), seconds):
                self.file.counter("counters", s.pid, start, f"{label} {name}", args)

    def _zero_counters(self, s: _Session, group: str, t: float) -> None:
        label = self.group_label(group, long=False)
        # Kept with the collectives, not thinned with the counters: a dropped zero would draw
        # the last busy interval across the whole quiet stretch after it.
        for name, args in _interval_counters([], sorted(s.ops.get(group, ())), 1.0):
            self.file.counter("collectives", s.pid, t, f"{label} {name}", args)

    def _on_heartbeat(self, s: _Session, rank: RankState, body: dict[str, Any],
                      t: float) -> None:
        for row in body["groups"]:
            group = row["group"]
            flight, seq, since, done, op, progress = _in_flight(row)
            self.file.counter("counters", s.pid, t,
                              f"{self.group_label(group, long=False)} seq", progress)
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
            self.file.counter("counters", s.pid, t, "agent dropped events",
                              dict(dropped) or {"all": 0})

    def _close(self, s: _Session, seen: _Sighting, completed_by: float, end: str,
               completed: bool, unfinished: str) -> None:
        """Draw a sighting as an X event (its end: see :func:`_finish`)."""
        del s.open[seen.group]
        stats = s.last_stats.get((seen.group, seen.op)) if completed else None
        finish, how = _finish(seen, completed_by, stats)
        args = {"group": seen.group, "seq": seen.seq, "op": seen.op, "source": seen.source,
                "dtype": seen.dtype, "bytes": seen.nbytes, "end": end,
                "end_from": how, "seen_in_flight": [seen.first_seen, seen.last_seen],
                "completed_by": completed_by if completed else None}
        name = seen.op if completed else f"{seen.op} ({unfinished})"
        self.file.complete("collectives", s.pid, self.file.tid(s.pid, "group:" + seen.group),
                           seen.since, finish, name, args, cat="collective")

    def _end_spans(self, s: _Session, end: str, unfinished: str = "never completed") -> None:
        for seen in list(s.open.values()):
            self._close(s, seen, seen.last_seen, end, completed=False, unfinished=unfinished)
        for group, last_end in list(s.stats_end.items()):
            self._zero_counters(s, group, last_end)
        s.stats_end.clear()

    def _on_error(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        group = body.get("group")
        track = "group:" + group if group else "lifecycle"
        self.file.instant("instants", s.pid, self.file.tid(s.pid, track), t,
                          f"error: {body['error_type']}",
                          {**body, "error": cut_text(body["error"])}, cat="error")

    def _on_stack(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        self.file.instant("instants", s.pid, self.file.tid(s.pid, "group:" + body["group"]), t,
                          f"stack: {body['op']} #{body['seq']}",
                          {**body, "stack": cut_text(body["stack"], keep_end=True)},
                          cat="stack")

    def _on_snapshot(self, s: _Session, rank: RankState, body: dict[str, Any],
                     t: float) -> None:
        self._lifecycle(s, t, f"snapshot ({body.get('reason') or 'asked'})",
                        snapshot_args(body), cat="snapshot")
        s.completed_until = draw_completed(self.file, s.pid, body, s.completed_until)

    def _on_read(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        """The host reader this session's rank started read a silent rank from outside."""
        self._lifecycle(s, t, f"rank {body['for_rank']} read from outside (host reader)",
                        {"ask": body["ask"], "took_ms": body.get("took_ms"),
                         "reader_pid": body.get("reader_pid"),
                         "dump": cut_text(body.get("peer_dump") or body.get("native_error")
                                          or "", keep_end=True)}, cat="snapshot")

    def _on_gpu(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
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
                self.file.counter("counters", s.pid, t, name, args)
        for xid in body["xids"]:
            self._lifecycle(s, t, f"GPU XID {xid}", {"uuid": body["uuid"], "xid": xid},
                            cat="gpu")
        if body["lost"] and not s.gpu_lost:
            self._lifecycle(s, t, "GPU lost", {"uuid": body["uuid"]}, cat="gpu")
        s.gpu_lost = body["lost"]

    def _on_exit(self, s: _Session, rank: RankState, body: dict[str, Any], t: float) -> None:
        s.exited = True
        self._end_spans(s, "the rank exited while this was in flight")
        name = "exit" if body["clean"] else f"exit (failed: {body.get('reason') or 'unknown'})"
        self._lifecycle(s, t, name, body, cat="exit")

    def _lifecycle(self, s: _Session, t: float, name: str, args: dict[str, Any],
                   cat: str = "event") -> None:
        self.file.instant("instants", s.pid, self.file.tid(s.pid, "lifecycle"), t, name, args,
                          cat=cat)

    # -- the end of the log -------------------------------------------------------------------

    def finish(self) -> None:
        """Place the sessions whose rank never became known; end what is still open."""
        for s in list(self.sessions.values()):
            rank = self.state.sessions[s.id] if self.state else None
            if s.pid is None:  # its rank never became known
                self._place(s, rank, None)
            if s.init is not None and s.last_t is not None:
                arrived = s.init["arrived_at"]
                self.file.complete("instants", s.pid, self.file.tid(s.pid, "lifecycle"),
                                   arrived, s.last_t, "init_process_group (never finished)",
                                   {**s.init, "result": "no init_done or init_failed by the "
                                    "session's last event"}, cat="init")
                s.init = None
            self._end_spans(s, "still in flight when the log ends", "still in flight")


def _in_flight(row: dict[str, Any]) -> tuple[bool, int, float | None, int, str | None,
                                              dict[str, int]]:
    """A heartbeat's row of one group as ``(flight, seq, since, completed, op, progress)``:
    the agent's own counters, or the Flight Recorder's where only it saw the group's
    collectives (DDP's, in C++); ``op`` is None when nothing is in flight."""
    if not row["entered"] and row.get("fr_enqueued"):
        seq, since, done = row["fr_enqueued"], row.get("fr_inflight_since"), \
            row.get("fr_completed", 0)
        op = FLIGHT_OP if since is not None else None
        return True, seq, since, done, op, {"enqueued": seq, "completed": done}
    seq, since, done = row["entered"], row.get("inflight_since"), row["completed"]
    return False, seq, since, done, row.get("inflight_op"), {"entered": seq, "completed": done}


def _finish(seen: _Sighting, completed_by: float,
            stats: tuple[float, float, float] | None) -> tuple[float, str]:
    """Where a sighting's X event ends, and why (see dashboard.history.trace's docstring):
    the last heartbeat that saw it in flight, or, when it completed, the longest call of its
    op in the interval it completed in, if that lies within the bounds the heartbeats give.
    ``stats`` is that interval ``(start, end, longest call in us)``, None when it never
    completed."""
    finish = seen.last_seen
    how = "last heartbeat that saw it in flight (a lower bound)"
    if stats is not None and seen.source == "python" and stats[1] > seen.last_seen:
        longest = stats[2] / 1e6
        if seen.last_seen - seen.since - MATCH_SLACK_S <= longest <= \
                completed_by - seen.since + MATCH_SLACK_S:
            finish = max(seen.since + longest, seen.last_seen)
            how = f"the longest {seen.op} of the interval it completed in"
    return max(seen.since, min(finish, max(completed_by, seen.last_seen))), how


def _interval_counters(rows: list[dict[str, Any]], ops: list[str],
                       seconds: float) -> list[tuple[str, dict[str, Any]]]:
    """A group's counters for one interval (all ops it has run so far, 0 for the ones that
    did not run in it): busy %, collectives/s per op, latency p50/p99 per op."""
    rates = dict.fromkeys(ops, 0.0)
    latency = {}
    for op in ops:
        latency[f"{op} p50"] = latency[f"{op} p99"] = 0.0
    busy = 0.0
    for r in rows:
        rates[r["op"]] = round(r["count"] / seconds, 3)
        p50, p99 = _percentiles(r["hist"], r["max_us"])
        latency[f"{r['op']} p50"], latency[f"{r['op']} p99"] = p50, p99
        busy += r["sum_us"]
    # A call counts whole in the interval it completed in (that is all a summary says), so
    # one long wait would read as several hundred percent: capped, as the page's heat map is.
    busy_pct = min(100.0, round(busy / seconds / 1e4, 2))
    return [("busy %", {"busy": busy_pct}), ("collectives/s", rates),
            ("latency (us)", latency)]


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


def _is_rank(rank: Any) -> bool:
    return isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
