"""Ingest: turns what agents send into stored events and live JobState, without Flask.

The Socket.IO handlers in ``dashboard.app`` are thin calls into :class:`Ingest`. All writes run
as tasks on the store's writer thread, so job assignment, de-duplication and the fold into
JobState happen in one serial order: the order of the log.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hmac
import logging
import queue
import threading
import time
from typing import Any, Callable

from agent.wire import (Ack, Auth, WireError, validate_auth, validate_batch_envelope,
                        validate_events)
from dashboard.diagnosis import Finding, Settings, diagnose
from dashboard.incidents import Incident, active_count, incidents
from dashboard.lag import LAG_WARN_S, IngestLag
from dashboard.metrics import LiveJob
from dashboard.rewind import Rewind
from dashboard.state import JobState, StoredEvent
from dashboard.storage import Store, describe_write_error, load_body


log = logging.getLogger("pgdash.server")


class Refused(Exception):
    """An agent may not connect; the text tells its user what to do."""


class Ingest:
    """Job states in memory, kept in step with the event log.

    Args:
        store: the database.
        token: when set, agents must present it (``PGDASH_TOKEN``).
        clock: wall clock for server-observed events (injected for tests).
        max_cached_jobs: finished jobs kept folded in memory; live ones always are.
    """

    def __init__(self, store: Store, token: str | None = None,
                 clock: Callable[[], float] = time.time, max_cached_jobs: int = 32,
                 settings: Settings = Settings(),
                 on_incident: Callable[[str, dict[str, Any], Incident], None] | None = None):
        self.store = store
        self.settings = settings
        # on_incident("new" | "resolved", job summary, incident): told on the writer or push
        # thread, so it must not block (dashboard.notify queues and returns).
        self.on_incident = on_incident
        # job id -> incident id -> (active, severity) when last told
        self._incidents: dict[int, dict[str, tuple[bool, str]]] = {}
        self.active_incidents: dict[int, int] = {}  # job id -> active incidents (job list)
        # job id -> finding id -> finding, every finding seen since the state was loaded;
        # those no longer reported by diagnose() stay, marked inactive.
        self._findings: dict[int, dict[str, Finding]] = {}
        # job id -> (state.applied, the time judged) at the last diagnosis
        self._diagnosed: dict[int, tuple[int, float]] = {}
        self.token = token
        self.clock = clock
        self.max_cached_jobs = max_cached_jobs
        self._states: collections.OrderedDict[int, JobState] = collections.OrderedDict()
        self._states_lock = threading.RLock()
        self._max_seq: dict[str, int] = {}
        self._session_jobs: dict[str, int] = {}
        self.dirty: set[int] = set()  # jobs changed since the UI last looked
        self.jobs_dirty = threading.Event()
        self.counters: collections.Counter[str] = collections.Counter()
        self.rewind = Rewind(store)
        self.lag = IngestLag(clock, store.backlog_s)
        self._behind = False  # whether the server last said it is behind
        self.agent_connections = 0  # open v2 connections (dashboard.front counts them)
        self._holds: dict[str, tuple[int, float]] = {}  # session -> (first seq, until)
        # Several server processes (dashboard.cluster.ClusterNode): the log's tail folds the
        # states, and only jobs this process owns are diagnosed here.
        self.cluster = None

    @property
    def states_lock(self) -> threading.RLock:
        return self._states_lock

    def start(self) -> "Ingest":
        self._max_seq = self.store.max_seqs()
        self.store.on_write_failure = self._resync
        return self

    def _resync(self) -> None:
        """After a failed write: forget what memory holds and trust the log again."""
        with self._states_lock:
            self._states.clear()
            self._findings.clear()
            self._diagnosed.clear()
            self._incidents.clear()
            self._session_jobs.clear()
            self._max_seq = self.store.max_seqs()

    def read(self, job_id: int, view: Callable[[JobState], Any]) -> Any:
        """Run ``view(state)`` while no event is being applied; None if the job is unknown."""
        with self._states_lock:
            state = self.state(job_id)
            return None if state is None else view(state)

    # -- job states --------------------------------------------------------------------------

    def state(self, job_id: int) -> JobState | None:
        """The folded state of a job (loaded from the log on first use)."""
        with self._states_lock:
            state = self._states.get(job_id)
            if state is not None:
                self._states.move_to_end(job_id)
                return state
        job = self.store.get_job(job_id)
        if job is None:
            return None
        with self._states_lock:
            state = self._states.get(job_id)
            if state is None:
                # Clustered, the tail applies what comes after its cursor (read under this
                # lock), so the load stops there.
                upto = self.cluster.tail.cursor if self.cluster else None
                state = JobState(job_id, job["name"]).apply_all(
                    self.store.job_events(job_id, upto=upto))
                self._states[job_id] = state
                self._evict()
            return state

    def _evict(self) -> None:
        for job_id in list(self._states):
            if len(self._states) <= self.max_cached_jobs:
                return
            if self._states[job_id].status in ("finished", "failed"):
                del self._states[job_id]
                self._findings.pop(job_id, None)
                self._diagnosed.pop(job_id, None)
                self._incidents.pop(job_id, None)

    # -- diagnosis ---------------------------------------------------------------------------

    def judged_at(self) -> float:
        """The moment live verdicts are judged at: now, less the server's own ingest lag.

        An overloaded server folds heartbeats late; judged at arrival time the ranks would
        look silent or stuck. Judged at ``now - lag`` they look as they were when what the
        server has folded so far was current (see dashboard.lag).
        """
        lag = self.lag.current()
        if (lag > LAG_WARN_S) != self._behind:
            self._behind = not self._behind
            if self._behind:
                log.warning("pgdash: ingest is %.1f s behind the agents; verdicts that this "
                            "lag could explain are held until it catches up", lag)
            else:
                log.warning("pgdash: ingest caught up with the agents")
        return self.clock() - lag

    def diagnose_live(self) -> None:
        """Re-diagnose jobs that are running or changed, at the current time (less the
        server's own lag); store and mark what changed."""
        now = self.judged_at()
        changed: dict[int, list[Finding]] = {}
        with self._states_lock:
            for job_id, state in list(self._states.items()):
                if self.cluster is not None and not self.cluster.owns(job_id):
                    continue  # its owner diagnoses it
                if state.status in ("finished", "failed") and \
                        self._settled(job_id, state):
                    continue
                rows = self._update_findings(job_id, state, now)
                if rows:
                    changed[job_id] = rows
                    self.dirty.add(job_id)
        for job_id, rows in changed.items():
            self._save_findings(job_id, rows)

    def _settled(self, job_id: int, state: JobState) -> bool:
        """Whether an ended job's findings can no longer change: diagnosed since its last
        event, late enough that no grace period of the rules was still running."""
        last = self._diagnosed.get(job_id)
        return last is not None and last[0] == state.applied and \
            last[1] >= (state.last_event_at or 0.0) + self.settings.reconnect_grace

    def findings(self, job_id: int) -> list[Finding] | None:
        """Every finding of the job, newest first (None if the job is unknown)."""
        rows: list[Finding] = []
        if self.cluster is not None and not self.cluster.owns(job_id):
            if self.store.get_job(job_id) is None:
                return None
            return sorted(self.store.job_findings(job_id), key=lambda f: -f["first_seen"])
        with self._states_lock:
            state = self.state(job_id)
            if state is None:
                return None
            if job_id not in self._findings:  # e.g. an old job first opened after a restart
                rows = self._update_findings(job_id, state, self.judged_at())
            # Copies: the book marks a finding resolved in place, and the live feed compares
            # what it sent last with what it is given now (the same dicts would never differ).
            found = sorted((dict(f) for f in self._findings[job_id].values()),
                           key=lambda f: -f["first_seen"])
        self._save_findings(job_id, rows)
        return found

    def incidents(self, job_id: int) -> list[Incident] | None:
        """Every incident of the job (findings grouped by root cause), newest first."""
        found = self.findings(job_id)
        return None if found is None else incidents(found)

    def _save_findings(self, job_id: int, rows: list[Finding]) -> None:
        """Store changed findings; never under the states lock (the writer takes it too)."""
        if rows:
            self.store.submit(lambda conn: self.store.save_findings(conn, job_id, rows))

    def _update_findings(self, job_id: int, state: JobState, now: float) -> list[Finding]:
        """Fold a fresh diagnosis into the job's findings; returns those that changed."""
        book = self._findings.get(job_id)
        if book is None:  # first look since start: what earlier runs concluded, then today's
            book = self._findings[job_id] = {f["id"]: f for f in self.store.job_findings(job_id)}
            # What was already known is not news to whoever listens for incidents.
            self._incidents[job_id] = {i["id"]: (i["active"], i["severity"])
                                       for i in incidents(book.values())}
        before = {fid: _gist(f) for fid, f in book.items()}
        current = {f["id"]: f for f in diagnose(state, now, self.settings)}
        for fid, f in current.items():
            old = book.get(fid)
            if old is not None:
                f["first_seen"] = min(f["first_seen"], old["first_seen"])
            book[fid] = f
        for fid, f in book.items():
            if fid not in current:
                f["active"] = False
        self._diagnosed[job_id] = (state.applied, now)
        changed = [f for fid, f in book.items() if before.get(fid) != _gist(f)]
        if changed:
            self._track_incidents(job_id, state, book)
        return changed

    def _track_incidents(self, job_id: int, state: JobState, book: dict[str, Finding]) -> None:
        """Count active incidents (for the job list) and tell ``on_incident`` of each one
        that appeared, resolved, or turned critical (a stall that became a hang) since the
        last diagnosis."""
        found = incidents(book.values())
        known = self._incidents.setdefault(job_id, {})
        count = active_count(found)
        if self.active_incidents.get(job_id) != count:
            self.active_incidents[job_id] = count
            self.jobs_dirty.set()
        for inc in found:
            was = known.get(inc["id"])
            now = known[inc["id"]] = (inc["active"], inc["severity"])
            if was is None:
                event = "new" if inc["active"] else None
            elif was[0] != now[0]:
                event = "new" if inc["active"] else "resolved"
            elif inc["active"] and inc["severity"] == "critical" != was[1]:
                event = "escalated"
            else:
                event = None
            if self.on_incident is None or event is None:
                continue
            try:
                self.on_incident(event, state.summary(), inc)
            except Exception:  # a listener's fault must not stop diagnosis
                self.counters["incident_listener_errors"] += 1
        for iid in set(known) - {i["id"] for i in found}:
            # merged into another incident (a hang that turned out to be a crash): over
            del known[iid]

    def state_at(self, job_id: int, at: float) -> dict[str, Any] | None:
        """The job as the server saw it at ``at`` (Unix seconds): every event received by
        then folded, and diagnosed at that moment (None if the job is unknown).

        The same fold and the same rules as live, so the findings are those that were
        active then. Scrubbing forward continues the last fold; see dashboard.rewind.
        """
        job = self.store.get_job(job_id)
        if job is None:
            return None

        def read(state: JobState) -> dict[str, Any]:
            found = diagnose(state, at, self.settings)
            return {"at": at, "job": state.summary(), "ranks": state.rank_rows(),
                    "groups": state.group_rows(),
                    "progress": state.progress_rows(),
                    "findings": found, "incidents": incidents(found)}

        return self.rewind.view(job_id, job["name"], at, read)

    def live_views(self) -> list[LiveJob]:
        """What /metrics exports of every job held in memory."""
        with self._states_lock:
            return [LiveJob(state.summary(), state.rank_rows(),
                            list(self._findings.get(job_id, {}).values()),
                            [{"family": family, "op": op, "source": source,
                              "hist": dict(stats.hist), "sum_us": stats.sum_us,
                              "bytes": stats.bytes}
                             for (family, op, source), (stats, _, _)
                             in state.op_stats().items()])
                    for job_id, state in self._states.items()]

    def take_dirty(self) -> set[int]:
        """Jobs changed since the last call (for the throttled UI push)."""
        with self._states_lock:
            dirty, self.dirty = self.dirty, set()
            return dirty

    # -- agent connections -------------------------------------------------------------------

    def connect(self, auth: Any) -> tuple[str, int]:
        """Admit an agent; returns ``(session, job_id)``.

        Raises:
            Refused: bad token or malformed auth (the message says what to fix).
        """
        try:
            auth = validate_auth(auth)
        except WireError as exc:
            self.counters["refused_connections"] += 1
            raise Refused(f"pgdash refused the agent: {exc}") from None
        offered = auth.get("token") or ""
        if self.token and not hmac.compare_digest(  # constant time: no timing oracle
                self.token.encode("utf-8"), offered.encode("utf-8", "surrogatepass")):
            self.counters["refused_connections"] += 1
            raise Refused("pgdash refused the agent: wrong or missing token; set PGDASH_TOKEN "
                          "on the training hosts to the server's --token")
        session = auth["session"]
        connected = self._server_event("connect", {"rank": auth.get("rank"),
                                                   "host": auth.get("host"),
                                                   "attempt": auth.get("attempt")})

        def admit(conn) -> int:  # one transaction: the job, the session, its connect event
            job_id = self._assign(conn, auth)
            self._store(conn, session, job_id, [connected])
            return job_id

        return session, self.store.submit(admit)

    def disconnect(self, session: str) -> None:
        job_id = self._session_jobs.get(session)
        if job_id is not None:
            self._record_server_event(session, job_id, "disconnect", {})

    def _assign(self, conn, auth: Auth) -> int:
        """Writer thread: the job this session belongs to, creating it if needed."""
        session = auth["session"]
        # The agent resends from what it was acknowledged, possibly by another server
        # process: dedupe against what the log holds for it, not what this process saw.
        self._max_seq[session] = max(self._max_seq.get(session, 0),
                                     self.store.session_max_seq(conn, session))
        known = self._session_jobs.get(session)
        if known is None:
            self.store.lock_job_name(conn, auth["job"])
            row = self.store.find_session(conn, session)
            known = row["job_id"] if row else None
        if known is None:
            now = self.clock()
            latest = self.store.latest_job(conn, auth["job"])
            state = self.state(latest["id"]) if latest else None
            if state is not None and _joins(state, auth.get("rank"), session,
                                            auth.get("attempt") or 0):
                known = latest["id"]
            else:  # first launch under this name, or a new launch reusing it
                known = self.store.create_job(conn, auth["job"], now)
                with self._states_lock:
                    self._states[known] = JobState(known, auth["job"])
                self.jobs_dirty.set()
            self.store.create_session(conn, session, known, auth.get("rank"),
                                      auth.get("host"), auth.get("pid"), now)
        self._session_jobs[session] = known
        return known

    # -- events ------------------------------------------------------------------------------

    def batch(self, session: str, job_id: int, payload: Any) -> Ack:
        """Validate and store one protocol v1 batch; returns the agent's acknowledgement once
        it is committed."""
        try:
            validate_batch_envelope(payload)
        except WireError as exc:
            self.counters["rejected_batches"] += 1
            return {"ok": False, "error": str(exc), "retry": False}
        events = payload.get("events")  # checked by batch_nowait
        ack, pending = self.batch_nowait(session, job_id, events)
        if pending is None:
            return ack
        try:
            stored = pending.result(timeout=self.store.submit_timeout)
        except Exception as exc:
            return self.write_failed(session, events, exc)
        return self.committed(session, ack, stored)

    def committed(self, session: str, ack: Ack, stored: int) -> Ack:
        """The acknowledgement of a batch whose write committed."""
        self._holds.pop(session, None)
        return {**ack, "stored": stored}

    def write_failed(self, session: str, events: Any, exc: BaseException) -> Ack:
        """The acknowledgement of a batch whose write failed: the agent sends it again."""
        self.counters["failed_writes"] += 1
        self.hold(session, events)
        return {"ok": False, "retry": True, "retry_after": 1.0,
                "error": "server could not store the batch: "
                         + describe_write_error(self.store.url, exc)}

    def batch_nowait(self, session: str, job_id: int,
                     events: Any) -> tuple[Ack, concurrent.futures.Future | None]:
        """Validate a list of events and queue the good ones for the writer.

        Returns the acknowledgement so far and the future of the write (its result: how many
        events were stored), or None when nothing needs writing (then the ack is final).
        """
        held = self._held_back(session, events)
        if held is not None:
            return held, None
        try:
            good, rejected = validate_events(events)
        except WireError as exc:
            self.counters["rejected_batches"] += 1
            return {"ok": False, "error": str(exc), "retry": False}, None
        self.counters["rejected_events"] += len(rejected)
        ack: Ack = {"ok": True, "stored": 0, "rejected": rejected}
        if not good:
            return ack, None
        try:
            pending = self.store.submit_nowait(
                lambda conn: self._store(conn, session, job_id, good))
        except queue.Full:
            self.counters["overloaded_batches"] += 1
            self.hold(session, events)
            return {"ok": False, "retry": True, "retry_after": 1.0,
                    "error": "server overloaded: its write queue is full; sending again"}, None
        return ack, pending

    def _server_event(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"seq": None, "t": self.clock(), "kind": kind, "body": body}

    # A batch refused with retry=True (rate limit, failed write) leaves a gap in the session's
    # sequence. Storing a later batch first would raise the session's highest stored seq past
    # the gap, and the resent batch would then be dropped as a duplicate: lost although the
    # agent resent it. So later batches are refused too until the gap is resent, for at most
    # HOLD_S seconds (an agent that had to drop the gap's events must not be blocked forever).
    HOLD_S = 30.0

    def hold(self, session: str, events: Any) -> None:
        """Refuse (retry) batches of ``session`` that start past this refused one's first seq."""
        first = _first_seq(events)
        if first is not None:
            held = self._holds.get(session)
            if held is None or first < held[0]:
                self._holds[session] = (first, time.monotonic() + self.HOLD_S)

    def _held_back(self, session: str, events: Any) -> Ack | None:
        held = self._holds.get(session)
        if held is None:
            return None
        first = _first_seq(events)
        if first is None or first <= held[0] or time.monotonic() > held[1]:
            return None
        self.counters["held_batches"] += 1
        return {"ok": False, "retry": True, "retry_after": 0.1,
                "error": f"an earlier batch (from seq {held[0]}) was not stored yet; "
                         "send it again first"}

    def _record_server_event(self, session: str, job_id: int, kind: str,
                             body: dict[str, Any]) -> None:
        event = self._server_event(kind, body)
        self.store.submit(lambda conn: self._store(conn, session, job_id, [event]))

    def _store(self, conn, session: str, job_id: int, evs: list[dict[str, Any]]) -> int:
        """Writer thread: drop what is already stored, insert the rest, fold it into state."""
        last = self._max_seq.get(session, 0)
        fresh = []
        for ev in evs:
            seq = ev.get("seq")
            if seq is None:
                fresh.append(ev)
            elif seq > last:
                fresh.append(ev)
                last = seq
        if not fresh:
            self.counters["duplicate_events"] += len(evs)
            return 0
        now = self.clock()
        ids = self.store.insert_events(conn, job_id, session, fresh, now)
        if self.cluster is not None:  # the log's tail folds it, here and in the owner
            self._max_seq[session] = last
            self.counters["duplicate_events"] += len(evs) - len(fresh)
            self.counters["stored_events"] += len(fresh)
            self.cluster.touch(job_id)
            return len(fresh)
        with self._states_lock:
            state = self.state(job_id)
            self.rewind.checkpoint_live(conn, state, now)
            before = state.summary()
            for event_id, ev in zip(ids, fresh):
                stored: StoredEvent = {"id": event_id, "session": session,
                                       "seq": ev.get("seq"), "t": ev["t"], "received_at": now,
                                       "kind": ev["kind"], "body": ev["body"]}
                state.apply(stored)
            after = state.summary()
        newest = max((ev["t"] for ev in fresh if ev.get("seq") is not None), default=None)
        if newest is not None:
            self.lag.folded(session, newest, now)
        if after != before:
            self.store.update_job(conn, job_id, after)
            self.jobs_dirty.set()
        self._max_seq[session] = last
        self.counters["duplicate_events"] += len(evs) - len(fresh)
        self.counters["stored_events"] += len(fresh)
        self.dirty.add(job_id)
        return len(fresh)

    def adopt(self, job_id: int) -> None:
        """Clustered: this process now owns the job (new, or taken over from a dead owner):
        hold its state and bring its row in ``jobs`` up to what the log says."""
        with self._states_lock:
            state = self.state(job_id)
            summary = state.summary() if state is not None else None
            self.dirty.add(job_id)
        if summary is not None:
            self.store.submit(lambda conn: self.store.update_job(conn, job_id, summary))
            self.jobs_dirty.set()

    def settled(self, job_id: int) -> bool:
        """Clustered: whether an owned job needs no owner any more (ended and diagnosed since
        its last event, or no longer held here)."""
        with self._states_lock:
            state = self._states.get(job_id)
            return state is None or (state.status in ("finished", "failed")
                                     and self._settled(job_id, state))

    def apply_logged(self, rows: list[dict[str, Any]]) -> None:
        """Clustered: fold rows read from the log's tail into the jobs held in memory (the
        caller holds the states lock); the owner stores the jobs' changed summaries."""
        touched: dict[int, dict[str, Any]] = {}
        newest: dict[str, float] = {}  # per agent session, for the lag (dashboard.lag)
        for row in rows:
            state = self._states.get(row["job_id"])
            if state is None:
                continue  # not held here: loaded from the log when first needed
            if row["job_id"] not in touched:
                touched[row["job_id"]] = state.summary()
            state.apply({"id": row["id"], "session": row["session"], "seq": row["seq"],
                         "t": row["t"], "received_at": row["received_at"],
                         "kind": row["kind"], "body": load_body(row)})
            if row["seq"] is not None:
                newest[row["session"]] = max(row["t"], newest.get(row["session"], row["t"]))
        # Here the fold follows the log's tail, so the lag includes the time events took to
        # reach this process through the database.
        now = self.clock()
        for session, t in newest.items():
            self.lag.folded(session, t, now)
        for job_id, before in touched.items():
            self.dirty.add(job_id)
            after = self._states[job_id].summary()
            if after != before and self.cluster.owns(job_id):
                # Not waiting: the writer thread may need the states lock held here.
                try:
                    self.store.submit_nowait(
                        lambda conn, j=job_id, a=after: self.store.update_job(conn, j, a))
                    self.jobs_dirty.set()
                except queue.Full:
                    self.counters["dropped_job_updates"] += 1


def _first_seq(events: Any) -> int | None:
    """The lowest seq in a batch, if it has a readable one (the batch is not validated yet)."""
    try:
        seqs = [ev["seq"] for ev in events]
        return min(s for s in seqs if isinstance(s, int) and not isinstance(s, bool))
    except (TypeError, KeyError, ValueError):
        return None


def _gist(finding: Finding) -> tuple:
    """What makes a finding worth pushing and storing again (not its last_seen)."""
    return (finding["active"], finding["severity"], finding["summary"], finding["ranks"])


def _joins(state: JobState, rank: int | None, session: str, attempt: int = 0) -> bool:
    """Whether a new agent session with this rank belongs to the job's current launch.

    A later attempt (torchrun restarted the job after a failure) is the same job, even ended.
    An earlier attempt than the job's, or a rank number already held by another session of
    the same attempt, means a new launch reusing the name. A known rank joins even an ended
    job: a rank whose agent connects late (a fast job, a slow link) must not split the launch
    in two. An unknown rank joins only a job still going.
    """
    if attempt != state.attempt:
        return attempt > state.attempt
    if state.claims(rank, session, attempt):
        return False
    return rank is not None or state.status not in ("finished", "failed")
