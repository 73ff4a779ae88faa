"""The trace file as it is written: processes, threads, and the events kept within a cap.

Pure (no Flask, no SQL, no clock). :class:`TraceFile` knows nothing of agents or events: the
reading of the fold (:mod:`dashboard.history.trace_reading`) and the findings
(:func:`dashboard.history.trace.build_trace`) hand it instants, complete (``X``) events and
counters, and it gives them threads, drops what lies outside the window, thins them evenly over
time once there are more than ``max_events`` (cheapest kind first, see :data:`KINDS`), and
writes the process and thread names (always kept) ahead of the events, in time order.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Hashable, Mapping

from pgdash_agent.wire import MAX_RANKS

DEFAULT_MAX_EVENTS = 1_000_000  # PGDASH_TRACE_MAX_EVENTS / --max-events
TEXT_LIMIT = 4_096  # characters of an error text, stack or finding evidence kept in args
JOB_PID = MAX_RANKS + 2  # the job's own process: findings and incidents
FIRST_TID = 1 << 22  # above every pid, so a tid never equals another process's pid
FORMAT_VERSION = 1
# Cheapest first: what goes when the cap is reached.
KINDS = ("counters", "collectives", "instants", "findings")


class TraceError(ValueError):
    """A bad trace request; the text names the parameter and what to send instead."""


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


class TraceFile:
    """The trace being written; see the module docstring.

    Args:
        start, end: keep only what happened in this window (Unix seconds; an ``X`` event is
            kept if it overlaps it).
        max_events: the most events besides process and thread names.

    Raises:
        TraceError: ``start`` after ``end``, or ``max_events`` not a positive integer.
    """

    def __init__(self, start: float | None = None, end: float | None = None,
                 max_events: int = DEFAULT_MAX_EVENTS):
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise TraceError(f"max_events must be a positive integer, got {max_events!r:.40}")
        check_window(start, end)
        self.start, self.end, self.max_events = start, end, max_events
        self.kinds = {k: _Thinned(k) for k in KINDS}
        self.kept = 0
        self.processes: dict[int, dict[str, Any]] = {}  # pid -> {"rank", "host", "sort", ...}
        self.threads: dict[tuple[int, str], int] = {}  # (pid, track) -> tid
        self.unranked = 0  # sessions whose rank never became known

    def rank_process(self, rank: int) -> int:
        """The pid of a rank's process, made on first use: rank + 1, because viewers take
        pid 0 for the kernel's idle task."""
        self.processes.setdefault(rank + 1, {"rank": rank, "host": None, "sort": rank})
        return rank + 1

    def session_process(self, session: str) -> int:
        """The pid of a process of its own for a session whose rank never became known,
        after the job's."""
        self.unranked += 1
        pid = JOB_PID + self.unranked
        self.processes[pid] = {"rank": None, "host": None, "sort": MAX_RANKS + self.unranked,
                               "session": session}
        return pid

    def tid(self, pid: int, track: str) -> int:
        """The thread of a track ("lifecycle", "findings", "group:NAME") in a process."""
        key = (pid, track)
        tid = self.threads.get(key)
        if tid is None:
            tid = self.threads[key] = FIRST_TID + len(self.threads)
            if pid == JOB_PID:
                self.processes.setdefault(JOB_PID, {"rank": None, "host": None, "sort": -1})
        return tid

    def instant(self, kind: str, pid: int, tid: int, t: float, name: str,
                args: dict[str, Any], scope: str = "t", cat: str = "event") -> None:
        if self._within(t, t):
            self._add(kind, (pid, tid), lambda: {
                "name": name, "cat": cat, "ph": "i", "s": scope, "pid": pid, "tid": tid,
                "ts": _us(t), "args": args})

    def complete(self, kind: str, pid: int, tid: int, t0: float, t1: float, name: str,
                 args: dict[str, Any], cat: str) -> None:
        if self._within(t0, t1):
            self._add(kind, (pid, tid), lambda: {
                "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(t0),
                "dur": round(max(0.0, t1 - t0) * 1e6, 3), "args": args})

    def counter(self, kind: str, pid: int, t: float, name: str, args: dict[str, Any]) -> None:
        if args and self._within(t, t):
            # The thread is made only for a counter kept (one lifecycle thread per process).
            self._add(kind, ("C", pid, name), lambda: {
                "name": name, "cat": "counter", "ph": "C", "pid": pid,
                "tid": self.tid(pid, "lifecycle"), "ts": _us(t), "args": args})

    def document(self, job: Mapping[str, Any] | None, group_label: Callable[[str], str],
                 incidents_given: bool = False) -> dict[str, Any]:
        """The trace: process/thread names first, then every event kept, in time order.
        ``group_label`` names a group's thread ("group 0 · default_pg")."""
        events = [e for kind in self.kinds.values() for _, e in kind.items]
        events.sort(key=lambda e: e["ts"])
        meta = self._names(job, group_label)
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

    def _names(self, job: Mapping[str, Any] | None,
               group_label: Callable[[str], str]) -> list[dict[str, Any]]:
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
                name, sort = group_label(group), 1 + _group_rank(group)
            elif track.startswith("completed:"):  # dashboard.history.trace_snapshots
                group = track[len("completed:"):]
                name = f"{group_label(group)} · completed (from snapshots)"
                sort = 1 + _group_rank(group)
            else:
                name, sort = track, 0
            meta.append(_meta(pid, tid, "thread_name", {"name": name}))
            meta.append(_meta(pid, tid, "thread_sort_index", {"sort_index": sort}))
        return meta

    def _within(self, t0: float, t1: float) -> bool:
        return (self.start is None or t1 >= self.start) and (self.end is None or t0 <= self.end)

    def _add(self, kind: str, series: Hashable, event: Callable[[], dict[str, Any]]) -> None:
        """Keep an event of a kind (made by ``event()``) if its turn in its series comes;
        shed the cheapest kind while the file holds more than max_events."""
        thinned = self.kinds[kind]
        index = thinned.turn(series)
        if index is None:
            return
        thinned.items.append((index, event()))
        self.kept += 1
        while self.kept > self.max_events:
            victim = next(k for k in self.kinds.values() if k.items)
            self.kept -= len(victim.items)
            victim.shed()
            self.kept += len(victim.items)


def dump(obj: Any) -> str:
    """Compact JSON; finding evidence may hold anything JSON can, and NaN would make the file
    unreadable (ValueError)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)


def cut_text(text: str, keep_end: bool = False) -> str:
    """A text of at most about TEXT_LIMIT characters, saying how much was left out."""
    if len(text) <= TEXT_LIMIT:
        return text
    left = len(text) - TEXT_LIMIT
    note = f"[{left} more characters in the session file (pgdash export)]"
    return note + "\n" + text[-TEXT_LIMIT:] if keep_end else text[:TEXT_LIMIT] + "\n" + note


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def _us(t: float) -> int:
    return round(t * 1e6)


def _group_rank(name: str) -> int:
    return int(name) if name.isdigit() else 1 << 20
