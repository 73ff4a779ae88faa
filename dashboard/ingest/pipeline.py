"""Ingest: turns what agents send into stored events, live JobStates and findings, without Flask.

A thin coordinator of the rooms that do the work: admission (``dashboard.ingest.admission``: the
token, job and attempt assignment, de-duplication), the state cache (``dashboard.ingest.statecache``),
the live findings books (``dashboard.ingest.livebooks``), the lag (``dashboard.ingest.lag``) and the rewind
for ``state?at=`` (``dashboard.history.rewind``). The Socket.IO handlers in ``dashboard.web.app`` and the
v2 front (``dashboard.ingest.front``) are thin calls into :class:`Ingest`. All writes run as tasks on
the store's writer thread, so job assignment, de-duplication and the fold into JobState
happen in one serial order: the order of the log.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import threading
import time
from typing import Any, Callable

from pgdash_agent.wire import Ack, WireError, validate_batch_envelope, validate_events
from dashboard.web import views
from dashboard.ingest.admission import Admission, Refused
from dashboard.console import RefusalLog
from dashboard.diagnosis import Finding, Settings
from dashboard.diagnosis.book import Timeline
from dashboard.diagnosis.incidents import Incident
from dashboard.diagnosis.incidents import incidents as incidents_of
from dashboard.ingest.guard import LoginGuard
from dashboard.ingest.lag import LAG_WARN_S, IngestLag
from dashboard.web.live import sections
from dashboard.ingest.livebooks import LiveBooks
from dashboard.web.metrics import LiveJob
from dashboard.history.rewind import Rewind
from dashboard.state import JobState, StoredEvent
from dashboard.ingest.statecache import StateCache
from dashboard.storage.database import describe_write_error
from dashboard.storage.log import load_body
from dashboard.storage.store import Store


log = logging.getLogger("pgdash.server")

__all__ = ["Ingest", "Refused"]


class Ingest:
    """Job states in memory, kept in step with the event log.

    Args:
        store: the database.
        token: when set, agents must present it (``PGDASH_TOKEN``).
        clock: wall clock for server-observed events (injected for tests).
        max_cached_jobs: finished jobs kept folded in memory; live ones always are.
        settings: the diagnosis rules' settings.
        on_incident: told ``("new" | "resolved" | "escalated", job summary, incident)`` on
            the writer or push thread, so it must not block (dashboard.web.notify queues).
        refusals: told of each refused agent (dashboard.console: one line per agent, then
            counts); None says nothing.
    """

    def __init__(self, store: Store, token: str | None = None,
                 clock: Callable[[], float] = time.time, max_cached_jobs: int = 32,
                 settings: Settings = Settings(),
                 on_incident: Callable[[str, dict[str, Any], Incident], None] | None = None,
                 guard: LoginGuard | None = None, refusals: RefusalLog | None = None):
        self.store = store
        self.refusals = refusals
        self.token = token
        self.clock = clock
        self.dirty: set[int] = set()  # jobs changed since the UI last looked
        self.jobs_dirty = threading.Event()
        self.counters: collections.Counter[str] = collections.Counter()
        self.lag = IngestLag(clock, store.writer.backlog_s)
        self._behind = False  # whether the server last said it is behind
        self.agent_connections = 0  # open v2 connections (dashboard.ingest.front counts them)
        # Several server processes (dashboard.cluster.node.ClusterNode): the log's tail folds the
        # states, and only jobs this process owns are diagnosed here.
        self.cluster = None
        self.books = LiveBooks(store, settings, lambda: self.clock(), self.judged_at,
                               on_incident, self.counters, self._findings_changed)
        self.cache = StateCache(store, self._load, max_cached_jobs, evicted=self.books.drop)
        self.admission = Admission(store, token, lambda: self.clock(), self.counters,
                                   self.state, lambda job_id, state:
                                   (self.cache.add(job_id, state), self.jobs_dirty.set()),
                                   guard)
        self.rewind = Rewind(store, new_state=lambda job_id, name: Timeline(
            job_id, name, self.settings))

    @property
    def settings(self) -> Settings:
        """The rules' settings (the live books', which a test may swap)."""
        return self.books.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.books.settings = settings

    @property
    def states_lock(self) -> threading.RLock:
        return self.cache.lock

    @property
    def active_incidents(self) -> dict[int, int]:
        """Job id -> its active incidents (the job list), for jobs diagnosed since start."""
        return self.books.active_incidents

    def start(self) -> "Ingest":
        self.admission.start()
        self.store.writer.on_write_failure = self._resync
        return self

    def _resync(self) -> None:
        """After a failed write: forget what memory holds and trust the log again."""
        with self.cache.lock:
            self.cache.clear()
            self.admission.reset()

    def read(self, job_id: int, view: Callable[[JobState], Any]) -> Any:
        """Run ``view(state)`` while no event is being applied; None if the job is unknown."""
        with self.cache.lock:
            state = self.state(job_id)
            return None if state is None else view(state)

    # -- job states --------------------------------------------------------------------------

    def state(self, job_id: int) -> JobState | None:
        """The folded state of a job (loaded from the log on first use)."""
        return self.cache.state(job_id)

    def _load(self, job_id: int, name: str) -> JobState:
        # Clustered, the tail applies what comes after its cursor (read under the states
        # lock), so the load stops there.
        upto = self.cluster.tail.cursor if self.cluster else None
        return self.books.load(job_id, name, self.store.log.events(job_id, upto=upto))

    # -- diagnosis ---------------------------------------------------------------------------

    def judged_at(self) -> float:
        """The moment live verdicts are judged up to: now, or, while the server is behind
        (its ingest lag over LAG_WARN_S), now less that lag.

        An overloaded server folds heartbeats late; judged at arrival time the ranks would
        look silent or stuck. Held back by the lag they look as they were when what the
        server has folded so far was current (see dashboard.ingest.lag). A lag under LAG_WARN_S is
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
        def owns(job_id: int) -> bool:
            return self.cluster is None or self.cluster.owns(job_id)

        with self.cache.lock:
            changed = self.books.tick_all(self.cache.items(), owns)
            logs = self.books.take_logs(owns)
        for job_id, found in changed.items():
            self.books.save(job_id, found)
        if not self.books.save_logs(logs):
            with self.cache.lock:
                self.books.stop_recording(job_id for job_id, *_ in logs)

    def _findings_changed(self, job_id: int, count_changed: bool) -> None:
        self.dirty.add(job_id)
        if count_changed:
            self.jobs_dirty.set()

    def findings(self, job_id: int) -> list[Finding] | None:
        """Every finding of the job, newest first (None if the job is unknown)."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            if self.store.jobs.get(job_id) is None:
                return None
            return sorted(self.store.findings.of_job(job_id), key=lambda f: -f["first_seen"])
        with self.cache.lock:
            return None if self.state(job_id) is None else self.books.findings(job_id)

    def incidents(self, job_id: int) -> list[Incident] | None:
        """Every incident of the job (findings grouped by root cause), newest first."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            found = self.findings(job_id)
            return None if found is None else incidents_of(found)
        with self.cache.lock:
            return None if self.state(job_id) is None else self.books.incidents(job_id)

    def state_at(self, job_id: int, at: float) -> dict[str, Any] | None:
        """The job as the server saw it at ``at`` (Unix seconds): every event received by
        then folded, and its findings and incidents as the book had them then (None if the
        job is unknown).

        The findings are those live showed, with the same first/last-seen times: read from
        the job's stored book log for the moments it covers, else judged by the same rules
        and book on the same moments. Scrubbing forward continues the last fold; see
        dashboard.history.rewind.
        """
        job = self.store.jobs.get(job_id)
        if job is None:
            return None

        def read(timeline: Timeline) -> dict[str, Any]:
            state, book = timeline.state, timeline.book_at(at)
            # ``sections``: what the live feed sends (dashboard.web.live), judged at ``at``; the
            # findings and incidents of the book then, grouped once, serve both.
            shown = sections(state, at=at, findings=book.findings(), settings=self.settings)
            return {"at": at, "job": shown["job"], "ranks": shown["ranks"],
                    "groups": shown["groups"],
                    "progress": views.progress_rows(state),
                    "findings": shown["findings"], "incidents": shown["incidents"],
                    "sections": shown}

        log = self.books.book_log(job_id)
        return self.rewind.view(job_id, job["name"], at, read,
                                prepare=lambda timeline: timeline.use_log(log))

    def live_views(self) -> list[LiveJob]:
        """What /metrics exports of every job held in memory."""
        with self.cache.lock:
            return [LiveJob(state.summary(), views.rank_rows(state),
                            book.findings() if (book := self.books.held(job_id)) else [],
                            [{"family": family, "op": op, "source": source,
                              "hist": dict(stats.hist), "sum_us": stats.sum_us,
                              "bytes": stats.bytes}
                             for (family, op, source), (stats, _, _)
                             in state.op_stats().items()])
                    for job_id, state in self.cache.items()]

    def take_dirty(self) -> set[int]:
        """Jobs changed since the last call (for the throttled UI push)."""
        with self.cache.lock:
            dirty, self.dirty = self.dirty, set()
            return dirty

    # -- agent connections -------------------------------------------------------------------

    def connect(self, auth: Any, address: str | None = None) -> tuple[str, int]:
        """Admit an agent connecting from client ``address``; returns ``(session, job_id)``.

        Raises:
            Refused: bad token or malformed auth (the message says what to fix).
        """
        try:
            auth = self.admission.check(auth, address)
        except Refused as exc:
            if self.refusals is not None:
                self.refusals.refused(auth, address, str(exc))
            raise
        session = auth["session"]
        connected = self._server_event("connect", {"rank": auth.get("rank"),
                                                   "host": auth.get("host"),
                                                   "attempt": auth.get("attempt")})

        def admit(conn) -> int:  # one transaction: the job, the session, its connect event
            job_id = self.admission.assign(conn, auth)
            self._store(conn, session, job_id, [connected])
            return job_id

        return session, self.store.writer.submit(admit)

    def disconnect(self, session: str) -> None:
        job_id = self.admission.job_of(session)
        if job_id is not None:
            self._record_server_event(session, job_id, "disconnect", {})

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
            stored = pending.result(timeout=self.store.writer.submit_timeout)
        except Exception as exc:
            return self.write_failed(session, events, exc)
        return self.committed(session, ack, stored)

    def committed(self, session: str, ack: Ack, stored: int) -> Ack:
        """The acknowledgement of a batch whose write committed."""
        self.admission.release(session)
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
        held = self.admission.held_back(session, events)
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
            pending = self.store.writer.submit_nowait(
                lambda conn: self._store(conn, session, job_id, good))
        except queue.Full:
            self.counters["overloaded_batches"] += 1
            self.hold(session, events)
            return {"ok": False, "retry": True, "retry_after": 1.0,
                    "error": "server overloaded: its write queue is full; sending again"}, None
        return ack, pending

    def _server_event(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"seq": None, "t": self.clock(), "kind": kind, "body": body}

    def hold(self, session: str, events: Any) -> None:
        """Refuse (retry) batches of ``session`` that start past this refused one's first seq
        (see Admission.HOLD_S)."""
        self.admission.hold(session, events)

    def _record_server_event(self, session: str, job_id: int, kind: str,
                             body: dict[str, Any]) -> None:
        event = self._server_event(kind, body)
        self.store.writer.submit(lambda conn: self._store(conn, session, job_id, [event]))

    def _store(self, conn, session: str, job_id: int, evs: list[dict[str, Any]]) -> int:
        """Writer thread: drop what is already stored, insert the rest, fold it into state."""
        fresh, last = self.admission.fresh(session, evs)
        self.counters["duplicate_events"] += len(evs) - len(fresh)
        if not fresh:
            return 0
        with self.books.stamping() as now:
            ids = self.store.log.insert(conn, job_id, session, fresh, now,
                                        want_ids=self.cluster is None)
            self.admission.stored(session, last)
            self.counters["stored_events"] += len(fresh)
            if self.cluster is not None:  # the log's tail folds it, here and in the owner
                self.cluster.touch(job_id)
                return len(fresh)
            with self.cache.lock:
                state = self.state(job_id)
                before = state.summary()
                # The moments due before this batch arrived are judged without it.
                # A stored checkpoint when this batch opens a new period: the state and the
                # book as a replay would have them (dashboard.history.rewind).
                self.rewind.checkpoint_live(conn, self.books.timeline(job_id, state), now)
                self.lag.check_pause()  # the writer may be first to run after a pause
                # A batch far later than its session's usual (the server stood still) says
                # the others' news is late too: the moments it spans wait (dashboard.ingest.lag).
                newest = max((ev["t"] for ev in fresh if ev.get("seq") is not None),
                             default=None)
                late = 0.0 if newest is None else self.lag.lateness(session, newest, now)
                self.books.before_fold(conn, job_id, state, now,
                                       late if late > LAG_WARN_S else 0.0)
                for event_id, ev in zip(ids, fresh):
                    stored: StoredEvent = {"id": event_id, "session": session,
                                           "seq": ev.get("seq"), "t": ev["t"],
                                           "received_at": now, "kind": ev["kind"],
                                           "body": ev["body"]}
                    state.apply(stored)
                after = state.summary()
        if newest is not None:
            self.lag.folded(session, newest, now)
        if after != before:
            self.store.jobs.update(conn, job_id, after)
            self.jobs_dirty.set()
        self.dirty.add(job_id)
        return len(fresh)

    def adopt(self, job_id: int) -> None:
        """Clustered: this process now owns the job (new, or taken over from a dead owner):
        hold its state and bring its row in ``jobs`` up to what the log says."""
        with self.cache.lock:
            state = self.state(job_id)
            summary = state.summary() if state is not None else None
            self.dirty.add(job_id)
        if summary is not None:
            self.store.writer.submit(lambda conn: self.store.jobs.update(conn, job_id, summary))
            self.jobs_dirty.set()

    def settled(self, job_id: int) -> bool:
        """Clustered: whether an owned job needs no owner any more (ended and diagnosed since
        its last event, or no longer held here)."""
        with self.cache.lock:
            state = self.cache.held(job_id)
            return state is None or self.books.settled(job_id, state)

    def apply_logged(self, rows: list[dict[str, Any]]) -> None:
        """Clustered: fold rows read from the log's tail into the jobs held in memory (the
        caller holds the states lock); the owner stores the jobs' changed summaries."""
        touched: dict[int, dict[str, Any]] = {}
        newest: dict[str, float] = {}  # per agent session, for the lag (dashboard.ingest.lag)
        for row in rows:
            state = self.cache.held(row["job_id"])
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
            after = self.cache.held(job_id).summary()
            if after != before and self.cluster.owns(job_id):
                # Not waiting: the writer thread may need the states lock held here.
                try:
                    self.store.writer.submit_nowait(
                        lambda conn, j=job_id, a=after: self.store.jobs.update(conn, j, a))
                    self.jobs_dirty.set()
                except queue.Full:
                    self.counters["dropped_job_updates"] += 1
