"""A stored session as one portable file, and the replay of its findings over time.

The file is JSON Lines (``pgdash export``, ``GET /api/jobs/<id>/export``)::

    {"format": "pgdash-session", "version": 1, "job": {"name", "status", ...},
     "exported_at": unix seconds}                                  (older files: no time)
    {"session": {"id", "rank", "host", "pid", "first_seen"}}      one per agent session
    {"event": {"session", "seq", "t", "received_at", "kind", "body"}}   the log, in order

``pgdash import`` validates every line (the event bodies as the server validates an agent's)
and stores the job anew, or nothing; the new job is marked imported, with the file's name and
the export's time. ``pgdash replay`` folds the log with the same JobState
and judges it with the same findings book on the same moments as live, so it prints the
findings the live page showed, when it showed them.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from typing import Any, Iterable, Iterator

from pgdash_agent.wire import (MAX_NAME, SERVER_KINDS, WireError, validate_event,
                               validate_server_event)
from dashboard.diagnosis import Finding, Settings
from dashboard.diagnosis.book import Change, with_grid
from dashboard.diagnosis.timeline import Timeline
from dashboard.state import JobState, StoredEvent
from dashboard.storage.schema import JOB_FIELDS
from dashboard.storage.store import Store

FORMAT = "pgdash-session"
VERSION = 1
MAX_LINE = 4_000_000  # characters; an agent's batch is at most MAX_MESSAGE_BYTES too


class ArchiveError(ValueError):
    """A session file that cannot be read; the message names the line and what is wrong."""


def export_lines(store: Store, job_id: int, now: float | None = None) -> Iterator[str] | None:
    """The job as lines of the session file, exported at ``now`` (default: the clock's);
    None if there is no such job."""
    job = store.jobs.get(job_id)
    if job is None:
        return None
    exported_at = time.time() if now is None else now

    def lines() -> Iterator[str]:
        yield _line({"format": FORMAT, "version": VERSION,
                     "job": {"name": job["name"], **{k: job[k] for k in JOB_FIELDS}},
                     "exported_at": exported_at})
        for session in store.sessions.of_job(job_id):
            yield _line({"session": session})
        for ev in store.log.events(job_id):
            yield _line({"event": {k: ev[k] for k in ("session", "seq", "t", "received_at",
                                                      "kind", "body")}})

    return lines()


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


class Archive:
    """A session file read and validated: ``job``, ``sessions``, ``events`` (log order)."""

    def __init__(self, job: dict[str, Any], sessions: list[dict[str, Any]],
                 events: list[dict[str, Any]], exported_at: float | None = None):
        self.job, self.sessions, self.events = job, sessions, events
        self.exported_at = exported_at  # when the file was made, if it says (pgdash >= 0007)

    @classmethod
    def read(cls, lines: Iterable[str], source: str = "the file") -> "Archive":
        """Parse and check every line; raises ArchiveError naming the first bad one."""
        job = exported_at = None
        sessions: dict[str, dict[str, Any]] = {}
        events: list[dict[str, Any]] = []
        seen: set[tuple[str, int]] = set()
        for number, text in enumerate(lines, 1):
            where = f"{source}, line {number}"
            if len(text) > MAX_LINE:
                raise ArchiveError(f"{where}: longer than {MAX_LINE} characters")
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise ArchiveError(f"{where}: not JSON ({exc}); a pgdash session file (made "
                                   "by `pgdash export`) holds one JSON object per line") from None
            except RecursionError:
                raise ArchiveError(f"{where}: JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise ArchiveError(f"{where}: expected a JSON object")
            if job is None:
                job = _header(obj, where)
                exported_at = obj.get("exported_at") if _finite(obj.get("exported_at")) \
                    else None
            elif "session" in obj:
                session = _session(obj["session"], where)
                sessions[session["id"]] = session
            elif "event" in obj:
                ev = _event(obj["event"], sessions, where)
                if ev["seq"] is not None:  # the log holds each (session, seq) once
                    key = (ev["session"], ev["seq"])
                    if key in seen:
                        raise ArchiveError(f"{where}: event seq {ev['seq']} of session "
                                           f"{ev['session']!r:.70} appears twice")
                    seen.add(key)
                events.append(ev)
            else:
                raise ArchiveError(f"{where}: expected a \"session\" or an \"event\" object")
        if job is None:
            raise ArchiveError(f"{source} is empty: expected a pgdash session file "
                               "(made by `pgdash export`)")
        return cls(job, list(sessions.values()), events, exported_at)

    def state(self) -> JobState:
        return JobState(0, self.job["name"]).apply_all(self.stored_events())

    def stored_events(self) -> Iterator[StoredEvent]:
        for i, ev in enumerate(self.events, 1):
            yield {"id": i, **ev}  # type: ignore[misc]


def _header(obj: dict[str, Any], where: str) -> dict[str, Any]:
    if obj.get("format") != FORMAT:
        raise ArchiveError(f"{where}: not a pgdash session file (its first line must have "
                           f"\"format\": \"{FORMAT}\"; make one with `pgdash export`)")
    if obj.get("version") != VERSION:
        raise ArchiveError(f"{where}: session file version {obj.get('version')!r:.20}; this "
                           f"pgdash reads version {VERSION}: use the pgdash that exported it")
    job = obj.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("name"), str) or \
            not job["name"] or len(job["name"]) > 256:
        name = job.get("name") if isinstance(job, dict) else None
        raise ArchiveError(f"{where}: job.name must be a non-empty string of at most 256 "
                           f"characters, got {name!r:.60}{'...' if len(repr(name)) > 60 else ''}")
    return job


def _session(session: Any, where: str) -> dict[str, Any]:
    if not isinstance(session, dict) or not isinstance(session.get("id"), str) or \
            not 0 < len(session["id"]) <= 64:
        raise ArchiveError(f"{where}: session.id must be a string of 1 to 64 characters")
    for key in ("rank", "pid"):  # the store's columns are 32-bit integers (PostgreSQL)
        value = session.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not -2**31 <= value < 2**31):
            raise ArchiveError(f"{where}: session.{key} must be a 32-bit integer or null, got "
                               f"{value!r:.40}")
    host = session.get("host")
    if host is not None and (not isinstance(host, str) or len(host) > MAX_NAME):
        raise ArchiveError(f"{where}: session.host must be a string of at most {MAX_NAME} "
                           f"characters or null, got {host!r:.40}")
    if not _finite(session.get("first_seen")):
        raise ArchiveError(f"{where}: session.first_seen must be a time in Unix seconds")
    return {k: session.get(k) for k in ("id", "rank", "host", "pid", "first_seen")}


def _event(ev: Any, sessions: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(ev, dict):
        raise ArchiveError(f"{where}: event must be an object")
    if not isinstance(ev.get("session"), str) or ev["session"] not in sessions:
        raise ArchiveError(f"{where}: event.session {ev.get('session')!r:.70} is not a "
                           "session listed before it")
    if not _finite(ev.get("received_at")):
        raise ArchiveError(f"{where}: event.received_at must be a time in Unix seconds")
    fields = {k: ev.get(k) for k in ("seq", "t", "kind", "body")}
    try:
        if isinstance(ev.get("kind"), str) and ev["kind"] in SERVER_KINDS:  # the server's own
            checked = validate_server_event(fields, "event")
        else:
            checked = validate_event(fields, "event")
    except WireError as exc:
        raise ArchiveError(f"{where}: {exc}") from None
    # Stored as checked: fields this version does not know are left out, as from an agent.
    return {"session": ev["session"], "received_at": ev["received_at"], **checked}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def import_archive(store: Store, archive: Archive, now: float, source: str = "") -> int:
    """Store the archive as a new job, in one transaction; returns its id.

    The job keeps the original's name and is marked imported from ``source`` (the file's
    path; its name is kept) at the archive's export time: a stored mark, not a changed
    name, so the name still finds the original's exports, traces and notes, while no agent
    reporting under that name joins the record (Store.jobs.latest_named). Session ids get a fresh
    prefix, so a file imported twice (or next to the job it came from) stays a job of its own.
    """
    prefix = uuid.uuid4().hex[:8] + ":"
    state = archive.state()
    origin = (os.path.basename(source.rstrip("/")) or "a session file")[:256]

    def write(conn) -> int:
        job_id = store.jobs.create(conn, archive.job["name"], now, imported_from=origin,
                                   exported_at=archive.exported_at)
        for s in archive.sessions:
            store.sessions.create(conn, (prefix + s["id"])[:64], job_id, s["rank"], s["host"],
                                  s["pid"], s["first_seen"])
        store.log.insert_archived(conn, job_id, [
            {**ev, "session": (prefix + ev["session"])[:64]} for ev in archive.events])
        store.jobs.update(conn, job_id, state.summary())
        return job_id

    return store.writer.submit(write)


def replay(archive: Archive, settings: Settings, step: float | None = None,
           until: float | None = None) -> Iterator[tuple[float, str, Finding]]:
    """``(moment, change, finding)`` as the live server saw them: the log folded in the
    order it arrived, judged by the same book (dashboard.diagnosis.book) on the same grid
    of moments as live (every ``step`` seconds, default ``settings.diagnose_every``), up to
    ``until`` after the last event (default 2 x the hang threshold). ``change`` is "new",
    "changed" (severity or blamed ranks) or "resolved"."""
    timeline = replay_timeline(archive, settings if step is None else
                               with_grid(settings, step), until)
    for changes in timeline.changes or []:
        for change, f in changes.findings:
            if change is not Change.UPDATED:  # (not the text: a hang's says how long)
                yield changes.at, change.value, f


def replay_timeline(archive: Archive, settings: Settings,
                    until: float | None = None) -> Timeline:
    """The archive's log folded and judged through ``until`` seconds after its last event
    (default 2 x the hang threshold): ``.state``, ``.book`` and every tick's ``.changes``."""
    timeline = Timeline(0, archive.job["name"], settings)
    timeline.changes = []
    events = list(archive.stored_events())
    for ev in events:
        timeline.apply(ev)
    if events:
        timeline.advance(max(ev["received_at"] for ev in events) + (
            2 * settings.hang_after if until is None else until))
    return timeline
