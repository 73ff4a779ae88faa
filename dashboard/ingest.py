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
from typing import Any, Callable, Iterable

from agent.wire import (Ack, Auth, WireError, validate_auth, validate_batch_envelope,
                        validate_events)
from dashboard.diagnosis import Finding, Settings
from dashboard.diagnosis.book import Book, Changes, Timeline
from dashboard.diagnosis.incidents import Incident
from dashboard.diagnosis.incidents import incidents as incidents_of
from dashboard.lag import LAG_WARN_S, IngestLag
from dashboard.metrics import LiveJob
from dashboard.rewind import Rewind
from dashboard.state import JobState, StoredEvent
from dashboard.storage import Store, decode_json, describe_write_error


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
        self.active_incidents: dict[int, int] = {}  # job id -> active incidents (job list)
        # job id -> its findings and incidents over time (dashboard.diagnosis.book), ticked
        # on the same grid of moments as replay: before each batch is folded, and by
        # diagnose_live. Made when the job's state is first held here.
        self._books: dict[int, Book] = {}
        # The arrival time being stamped on a batch not folded yet (writer thread): the
        # timer may judge moments before it only, so that a moment is judged with every
        # event received by then (what replay folds), never with part of them.
        self._stamp_lock = threading.Lock()
        self._stamping: float | None = None
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
        self.rewind = Rewind(store, new_state=lambda job_id, name: Timeline(
            job_id, name, self.settings))
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
            self._books.clear()
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
                state = self._load(job_id, job["name"], self.store.job_events(job_id, upto=upto))
                self._states[job_id] = state
                self._evict()
            return state

    # A job first held since this server started (an old job opened, an imported one, one
    # running across a restart) has its book rebuilt from its log, on the grid, as replay
    # builds it, unless that takes more than this many diagnoses (a long job: about two
    # hours of moments): then the findings stored by earlier runs are its book.
    RECOMPUTE_MAX_DIAGNOSES = 7200

    def _load(self, job_id: int, name: str, events: Iterable[StoredEvent]) -> JobState:
        """Fold a job's log into its state and, while affordable, its book (states lock held)."""
        timeline: Timeline | None = Timeline(job_id, name, self.settings)
        state = timeline.state
        for ev in events:
            if timeline is not None and timeline.book.diagnosed > self.RECOMPUTE_MAX_DIAGNOSES:
                timeline = None
            if timeline is not None:
                timeline.apply(ev)
            else:
                state.apply(ev)
        if timeline is not None and state.applied:
            book = timeline.book
            self._tick_now()(book, state)
            if book.diagnosed <= self.RECOMPUTE_MAX_DIAGNOSES:
                book.keep(self.store.job_findings(job_id))
                self._books[job_id] = book
                if book.active_incidents:
                    self.active_incidents[job_id] = book.active_incidents
        return state

    def _evict(self) -> None:
        for job_id in list(self._states):
            if len(self._states) <= self.max_cached_jobs:
                return
            if self._states[job_id].status in ("finished", "failed"):
                del self._states[job_id]
                self._books.pop(job_id, None)

    # -- diagnosis ---------------------------------------------------------------------------

    def judged_at(self) -> float:
        """The moment live verdicts are judged up to: now, or, while the server is behind
        (its ingest lag over LAG_WARN_S), now less that lag.

        An overloaded server folds heartbeats late; judged at arrival time the ranks would
        look silent or stuck. Held back by the lag they look as they were when what the
        server has folded so far was current (see dashboard.lag). A lag under LAG_WARN_S is
        not held back: the grid's moments are then judged with exactly the events received
        by each, as replay judges them (dashboard.diagnosis.book).
        """
        lag = self.lag.current()
        if (lag > LAG_WARN_S) != self._behind:
            self._behind = not self._behind
            if self._behind:
                log.warning("pgdash: ingest is %.1f s behind the agents; verdicts that this "
                            "lag could explain are held until it catches up", lag)
            else:
                log.warning("pgdash: ingest caught up with the agents")
        return self.clock() - (lag if self._behind else 0.0)

    def diagnose_live(self) -> None:
        """Judge the grid's moments due by now (less the server's lag, when behind) for
        every job held here; store and mark what changed."""
        changed: dict[int, list[Changes]] = {}
        with self._states_lock:
            tick = self._tick_now()
            for job_id, state in list(self._states.items()):
                if self.cluster is not None and not self.cluster.owns(job_id):
                    continue  # its owner diagnoses it
                book = self._book(job_id, self.clock())
                found = tick(book, state)
                if found:
                    changed[job_id] = found
                    self._told(job_id, state, book, found)
        for job_id, found in changed.items():
            self._save_findings(job_id, found)

    def _tick_now(self) -> Callable[[Book, JobState], list[Changes]]:
        """How to judge the moments due now (states lock held, so every event folded was
        stamped before this): up to now (less the lag, when behind), but never at or past
        the arrival time of a batch stamped and not folded yet."""
        with self._stamp_lock:  # no batch is stamped meanwhile; later ones are stamped later
            stamping, now = self._stamping, self.judged_at()
        if stamping is not None and stamping <= now:
            return lambda book, state: book.tick_before(state, stamping)
        return lambda book, state: book.tick_through(state, now)

    def _book(self, job_id: int, now: float) -> Book:
        """The job's book (the caller holds the states lock): a job first seen since this
        server started begins with what earlier runs concluded, judged from ``now`` on."""
        book = self._books.get(job_id)
        if book is None:
            book = self._books[job_id] = Book(self.settings, self.store.job_findings(job_id))
            book.start(now)
            if book.active_incidents:
                self.active_incidents[job_id] = book.active_incidents
        return book

    def _told(self, job_id: int, state: JobState, book: Book, found: list[Changes]) -> None:
        """After ticks that changed findings (states lock held): mark the job for the live
        feed, count its active incidents (job list), tell ``on_incident`` of each incident
        that appeared, resolved, or turned critical."""
        self.dirty.add(job_id)
        if self.active_incidents.get(job_id) != book.active_incidents:
            self.active_incidents[job_id] = book.active_incidents
            self.jobs_dirty.set()
        if self.on_incident is None:
            return
        for changes in found:
            for event, inc in changes.incidents:
                try:
                    self.on_incident(event.value, state.summary(), inc)
                except Exception:  # a listener's fault must not stop diagnosis
                    self.counters["incident_listener_errors"] += 1

    def findings(self, job_id: int) -> list[Finding] | None:
        """Every finding of the job, newest first (None if the job is unknown)."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            if self.store.get_job(job_id) is None:
                return None
            return sorted(self.store.job_findings(job_id), key=lambda f: -f["first_seen"])
        with self._states_lock:
            state = self.state(job_id)
            if state is None:
                return None
            return self._book(job_id, self.judged_at()).findings()

    def incidents(self, job_id: int) -> list[Incident] | None:
        """Every incident of the job (findings grouped by root cause), newest first."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            found = self.findings(job_id)
            return None if found is None else incidents_of(found)
        with self._states_lock:
            state = self.state(job_id)
            if state is None:
                return None
            return self._book(job_id, self.judged_at()).incidents()

    def _save_findings(self, job_id: int, found: list[Changes]) -> None:
        """Store changed findings; never under the states lock (the writer takes it too)."""
        rows = _changed_rows(found)
        if rows:
            self.store.submit(lambda conn: self.store.save_findings(conn, job_id, rows))

    def _tick_before_fold(self, conn, job_id: int, state: JobState, received_at: float) -> None:
        """Writer thread, states lock held: judge the moments due before a batch received at
        ``received_at`` is folded, so that each is judged with exactly the events received
        by then. While the server is behind, only those up to ``judged_at()``."""
        book = self._books.get(job_id)
        if book is None:
            if state.applied:  # held since before this server started: judged from now
                book = self._book(job_id, received_at)
            else:  # a new job: its grid starts at its first event, as in replay
                book = self._books[job_id] = Book(self.settings)
                book.start(received_at)
                return
        due = book.judged_through
        if due is not None and received_at - due <= self.settings.diagnose_every:
            return  # nothing due (cheap: no lag measured)
        held = self.judged_at()
        found = book.tick_through(state, held) if held < received_at else \
            book.tick_before(state, received_at)
        if found:
            self._told(job_id, state, book, found)
            self.store.save_findings(conn, job_id, _changed_rows(found))

    def state_at(self, job_id: int, at: float) -> dict[str, Any] | None:
        """The job as the server saw it at ``at`` (Unix seconds): every event received by
        then folded, and its findings and incidents as the book had them then (None if the
        job is unknown).

        The same fold, rules and book, ticked on the same moments as live, so the findings
        are those live showed, with the same first/last-seen times. Scrubbing forward
        continues the last fold; see dashboard.rewind.
        """
        job = self.store.get_job(job_id)
        if job is None:
            return None

        def read(timeline: Timeline) -> dict[str, Any]:
            state, book = timeline.state, timeline.book_at(at)
            return {"at": at, "job": state.summary(), "ranks": state.rank_rows(),
                    "groups": state.group_rows(),
                    "progress": state.progress_rows(),
                    "findings": book.findings(), "incidents": book.incidents()}

        return self.rewind.view(job_id, job["name"], at, read)

    def live_views(self) -> list[LiveJob]:
        """What /metrics exports of every job held in memory."""
        with self._states_lock:
            return [LiveJob(state.summary(), state.rank_rows(),
                            self._books[job_id].findings() if job_id in self._books else [],
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
        with self._stamp_lock:
            now = self._stamping = self.clock()
        try:
            return self._insert_and_fold(conn, session, job_id, evs, fresh, last, now)
        finally:
            with self._stamp_lock:
                self._stamping = None

    def _insert_and_fold(self, conn, session: str, job_id: int, evs: list[dict[str, Any]],
                         fresh: list[dict[str, Any]], last: int, now: float) -> int:
        ids = self.store.insert_events(conn, job_id, session, fresh, now)
        if self.cluster is not None:  # the log's tail folds it, here and in the owner
            self._max_seq[session] = last
            self.counters["duplicate_events"] += len(evs) - len(fresh)
            self.counters["stored_events"] += len(fresh)
            self.cluster.touch(job_id)
            return len(fresh)
        with self._states_lock:
            state = self.state(job_id)
            before = state.summary()
            self._tick_before_fold(conn, job_id, state, now)
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
                                     and job_id in self._books
                                     and self._books[job_id].settled(state))

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
                         "kind": row["kind"], "body": decode_json(row["body"])})
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


def _changed_rows(found: list[Changes]) -> list[Finding]:
    """The findings that ticks changed, each once, as it was last."""
    return list({f["id"]: f for changes in found for _, f in changes.findings}.values())
