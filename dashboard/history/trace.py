"""Trace export: a job's event log and findings as Chrome-trace / Perfetto JSON.

Pure (no Flask, no SQL, no clock): :func:`build_trace` turns stored events (log order, as
``Store.log.events`` yields them) plus the job's findings and incidents into
``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``, which
https://ui.perfetto.dev and ``chrome://tracing`` open. :func:`json_chunks` writes it out in
pieces, so a server can stream it.

The events are folded once, by the same :class:`~dashboard.state.JobState` as the live state;
:class:`~dashboard.history.trace_reading.TraceReading` watches that fold and draws each event
it applies, and :class:`~dashboard.history.trace_file.TraceFile` keeps what is drawn within
the window and the cap. This module holds the request parameters, the findings and the
whole; a new event kind is folded in JobState and drawn by one reading in trace_reading.

Layout. One process per rank (``process_name`` "rank N (host)", sorted by rank; pid = rank + 1,
because viewers treat pid 0 as the kernel's idle task), one more for the job ("job NAME:
findings and incidents", on top), and one for any agent session whose rank never became known.
In each rank: a "lifecycle" thread (rendezvous, errors, exit, connection) and one thread per
process group the rank reported ("group 0 · default_pg"). Thread ids are unique across the
file and kept apart from pids, so no viewer takes a group's thread for another rank's process.
Times are the ranks' own clocks (Unix time in microseconds, as the agents sent it).

What the agent sends (``pgdash_agent/reports.py``, ``process_groups.py``, ``failures.py``), and
what it becomes here:

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

import math
from typing import Any, Iterable, Iterator, Mapping

from dashboard.history.trace_file import (DEFAULT_MAX_EVENTS, JOB_PID, TEXT_LIMIT, TraceError,
                                          TraceFile, check_window, dump)
from dashboard.history.trace_reading import TraceReading
from dashboard.state import JobState, StoredEvent

__all__ = ["DEFAULT_MAX_EVENTS", "JOB_PID", "TEXT_LIMIT", "TraceError", "build_trace",
           "check_window", "json_chunks", "trace_query"]


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


# -- the trace --------------------------------------------------------------------------------

def build_trace(events: Iterable[StoredEvent], *, findings: Iterable[dict[str, Any]] = (),
                incidents: Iterable[dict[str, Any]] = (), job: Mapping[str, Any] | None = None,
                start: float | None = None, end: float | None = None,
                max_events: int = DEFAULT_MAX_EVENTS) -> dict[str, Any]:
    """A job as Chrome-trace / Perfetto JSON (see the module docstring for the mapping).

    Args:
        events: the job's stored events in log order (``Store.log.events``).
        findings: the job's findings (the ``Finding`` shape of ``dashboard.diagnosis``).
        incidents: the job's incidents (``{"id", "kind", "severity", "ranks", "summary",
            "hint", "findings", "first_seen", "last_seen", "active"}``), when the server
            groups findings into them; none by default.
        job: the job's row (name, status, ...), copied into ``metadata.job``.
        start, end: the window to keep, Unix seconds (None: open). The whole log is still
            read: what a rank is and what was in flight before ``start`` is known only
            from it.
        max_events: the most events besides process and thread names.

    Raises:
        TraceError: ``start`` after ``end``, or ``max_events`` not a positive integer.
    """
    file = TraceFile(start, end, max_events)
    reading = TraceReading(file)
    JobState((job or {}).get("id") or 0, (job or {}).get("name") or "",
             observer=reading).apply_all(events)
    reading.finish()
    incidents = list(incidents)
    _draw_findings(file, incidents, what="incident")
    _draw_findings(file, findings)
    return file.document(job, reading.group_label, incidents_given=bool(incidents))


def _draw_findings(file: TraceFile, findings: Iterable[dict[str, Any]],
                   what: str = "finding") -> None:
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
            file.instant("findings", JOB_PID, file.tid(JOB_PID, "findings"), t, name, args,
                         scope="g", cat=what)
            for rank in f.get("ranks") or ():
                pid = file.rank_process(rank)
                file.instant("findings", pid, file.tid(pid, "lifecycle"), t, name, args,
                             scope="p", cat=what)


def json_chunks(trace: dict[str, Any], events_per_chunk: int = 2000) -> Iterator[str]:
    """The trace as JSON text, a few thousand events at a time (for streaming)."""
    yield '{"traceEvents":[\n'
    events = trace["traceEvents"]
    for i in range(0, len(events), events_per_chunk):
        part = ",\n".join(dump(e) for e in events[i:i + events_per_chunk])
        yield part if i == 0 else ",\n" + part
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    yield "\n]," + dump(rest)[1:] + "\n"


def _evidence(evidence: Any) -> Any:
    try:
        text = dump(evidence)
    except ValueError:  # NaN or infinity somewhere in it: JSON cannot carry them
        return {"cut": "evidence holds a value JSON cannot carry (NaN or infinity); GET "
                       "/api/jobs/<id>/findings has it", "start": repr(evidence)[:TEXT_LIMIT]}
    if len(text) <= TEXT_LIMIT:
        return evidence
    return {"cut": f"evidence is {len(text)} characters of JSON; GET /api/jobs/<id>/findings "
                   "has it whole", "start": text[:TEXT_LIMIT]}
