"""Ingest: turns what agents send into stored events, live JobStates and findings, without Flask.

A thin coordinator of the rooms that do the work: admission (``dashboard.ingest.admission``: the
token, job and attempt assignment, de-duplication), the state cache (``dashboard.ingest.statecache``),
the live findings books (``dashboard.ingest.livebooks``) and when they are judged
(``dashboard.ingest.diagnosing``), the lag (``dashboard.ingest.lag``), the rewind for
``state?at=`` (``dashboard.history.rewind``) and, clustered, the log's tail
(``dashboard.ingest.follow``). The Socket.IO handlers in ``dashboard.web.sockets`` and the v2
front (``dashboard.ingest.front``) are thin calls into :class:`Ingest`; it knows nothing of who
shows what it holds: readers take what changed (``changed``), subscribe to diagnosis rounds
(``diagnosis.subscribe``) and read states through :meth:`Ingest.read`,
:meth:`Ingest.replay` and :meth:`Ingest.each_held`. All writes run as tasks on
the store's writer thread, so job assignment, de-duplication and the fold into JobState
happen in one serial order: the order of the log.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, TypeVar

from pgdash_agent.wire import (Ack, WireError, validate_batch_envelope, validate_boards,
                               validate_events, validate_read)
from dashboard.ingest.admission import Admission, Refused
from dashboard.ingest.asks import Asks, ReaderLink
from dashboard.console import RefusalLog, listeners
from dashboard.diagnosis import Finding, Settings
from dashboard.diagnosis.incidents import Incident
from dashboard.diagnosis.incidents import incidents as incidents_of
from dashboard.diagnosis.timeline import Timeline
from dashboard.ingest.diagnosing import LiveDiagnosis
from dashboard.ingest.fold import LiveFold, newest_sent
from dashboard.ingest.follow import LogFollower
from dashboard.ingest.guard import LoginGuard
from dashboard.ingest.heard import Heard
from dashboard.ingest.lag import LAG_WARN_S, IngestLag
from dashboard.ingest.livebooks import LiveBooks
from dashboard.history.incident_frames import IncidentFrames
from dashboard.history.keyframes import Keyframes
from dashboard.history.rewind import Rewind
from dashboard.pacing import Pace
from dashboard.state import JobState
from dashboard.statuses import ENDED
from dashboard.ingest.statecache import Changed, StateCache
from dashboard.storage.database import describe_write_error
from dashboard.storage.store import Store
from dashboard.storage.writer import WriterStopped

T = TypeVar("T")

log = logging.getLogger("pgdash.server")

# How long a protocol v1 batch waits for its write before the agent is told to send it again
# (it stays queued and is stored once: the writer drops what it already holds). Half the
# agent's ack timeout (PGDASH_ACK_TIMEOUT_S, 10 s): a v1 agent that gets no answer by then
# reconnects, and at 1,024 ranks behind a 50 s backlog that made 700-800 reconnects a run,
# a thread held per waiting batch, and the crowd of reconnecting ranks a rank_lost critical.
V1_ACK_WAIT_S = 5.0

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
        cluster: with several server processes, this one's membership
            (:class:`dashboard.cluster.node.Membership`: ``owns``, ``touch``, ``tail``); the
            log's tail then folds the states, and only jobs this process owns are diagnosed
            here.
        checkpoint_every_s: how often a folded state is stored (``PGDASH_CHECKPOINT_S``;
            0: never; dashboard.history.rewind).
        keyframe_every_s: how often the page's answer is stored (``PGDASH_KEYFRAME_S``;
            0: never; dashboard.history.keyframes).
        render_keyframe: what is stored of that answer, ``(state, book, at, settings) ->
            bytes`` (dashboard.web.live.keyframe); None: no keyframes.
    """

    def __init__(self, store: Store, token: str | None = None,
                 clock: Callable[[], float] = time.time, max_cached_jobs: int = 32,
                 settings: Settings = Settings(),
                 on_incident: Callable[[str, dict[str, Any], Incident], None] | None = None,
                 guard: LoginGuard | None = None, refusals: RefusalLog | None = None,
                 cluster: Any = None, checkpoint_every_s: float = 300.0,
                 keyframe_every_s: float = 10.0,
                 render_keyframe: Callable[..., bytes] | None = None):
        self.store = store
        self.refusals = refusals
        self.token = token
        self.clock = clock
        self.changed = Changed()  # what readers (the live push) have not taken yet
        self.counters: collections.Counter[str] = collections.Counter()
        self.lag = IngestLag(clock, store.writer.backlog_s)
        # Who the connections heard from, for the rules: a rank the fold reads late is not
        # silent while its agent's frames come in, or wait for their acknowledgement.
        self.heard = Heard(lambda: self.clock())
        settings = self._hearing(settings)
        self.agent_connections = 0  # open v2 connections (dashboard.ingest.front counts them)
        # Set when the server stops (stop()): its connections then close because it leaves,
        # not because the ranks did, so their disconnects are not recorded (a rolling restart
        # must not mark every rank lost).
        self._stopped = threading.Event()
        self.cluster = cluster
        # The server's questions to agents; an incident that opens asks for its ranks' stacks.
        # Clustered, agents connected to the other processes are asked through Redis.
        self.asks = Asks(self.read, lambda: self.clock(), lambda: self.lag.current(),
                         relay=cluster.publish_ask if cluster is not None else None)
        self.books = LiveBooks(store, settings, lambda: self.clock(), self.judged_at,
                               listeners(self.asks.on_incident, on_incident), self.counters,
                               self.changed.job)
        self.cache = StateCache(store, self._load, max_cached_jobs, evicted=self._evicted)
        self._loading = threading.Lock()  # ready
        self.admission = Admission(store, token, lambda: self.clock(), self.counters,
                                   self.state, lambda job_id, state:
                                   (self.cache.add(job_id, state), self.changed.jobs_list.set()),
                                   guard)
        self.keyframes = Keyframes(
            store, keyframe_every_s, None if render_keyframe is None else
            lambda state, book, at: render_keyframe(state, book, at, self.settings))

        def timeline(job_id: int, name: str) -> Timeline:
            return Timeline(job_id, name, self.settings)

        self.rewind = Rewind(store, persist_every_s=checkpoint_every_s, new_state=timeline,
                             keyframes=self.keyframes)
        self.incident_frames = IncidentFrames(
            store, self.keyframes, Rewind(store, max_jobs=1, copies_bytes=0,
                                          persist_every_s=checkpoint_every_s,
                                          new_state=timeline, keyframes=self.keyframes),
            self._replay_prepare, lambda: self.lag.current() > LAG_WARN_S)
        self.fold = LiveFold(store, self.admission, self.cache, self.books, self.rewind,
                             self.keyframes, self.lag, self.counters, self.changed, cluster)
        self.fold.ended = self.incident_frames.ended
        self.diagnosis = LiveDiagnosis(self.cache, self.books, self.lag, self.owns)
        self.follower = None if cluster is None else LogFollower(
            store, self.cache, self.books, self.lag, lambda: self.clock(), self.counters,
            self.changed, self.owns)

    @property
    def stopping(self) -> bool:
        """Whether the server is stopping (stop() was called)."""
        return self._stopped.is_set()

    @property
    def settings(self) -> Settings:
        """The rules' settings (the live books', which a test may swap)."""
        return self.books.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.books.settings = self._hearing(settings)

    def _hearing(self, settings: Settings) -> Settings:
        """``settings`` whose rules ask this server's connections what they heard."""
        return settings if settings.heard else \
            dataclasses.replace(settings, heard=self.heard.heard)

    @property
    def active_incidents(self) -> dict[int, int]:
        """Job id -> its active incidents (the job list), for jobs diagnosed since start."""
        return self.books.active_incidents

    def start(self) -> "Ingest":
        self.admission.start()
        self.store.writer.on_failure(self._resync)
        return self

    def _resync(self) -> None:
        """After a failed write: forget what memory holds and trust the log again."""
        with self.cache.lock:
            self.cache.clear()
            self.admission.reset()

    def owns(self, job_id: int) -> bool:
        """Whether this process diagnoses the job (always, unless clustered)."""
        return self.cluster is None or self.cluster.owns(job_id)

    def read(self, job_id: int, view: Callable[[JobState], Any],
             timeout: float | None = None) -> Any:
        """Run ``view(state)`` while no event is being applied; None if the job is unknown.
        Raises TimeoutError if that takes longer than ``timeout`` seconds to begin."""
        self.ready(job_id, timeout)
        if not self.cache.lock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"job {job_id}'s state was busy for {timeout} s")
        try:
            state = self.state(job_id)
            return None if state is None else view(state)
        finally:
            self.cache.lock.release()

    # -- job states --------------------------------------------------------------------------

    def state(self, job_id: int) -> JobState | None:
        """The folded state of a job (loaded from the log on first use)."""
        return self.cache.state(job_id)

    def ready(self, job_id: int, timeout: float | None = None) -> None:
        """Hold an ended job that is not held yet, folded from its log without the states
        lock (an old job opened on the page: at 1,024 ranks that fold takes seconds, from
        its newest checkpoint, and the live ingest of every other job waited for it behind
        the lock; bench/capacity.py --stored). A running job, a clustered one and one whose
        log grew meanwhile are loaded under the lock, as before, when first read. What
        reads a job calls it first, outside its own locks (the live push's: every page's
        deltas would wait for the fold). Raises TimeoutError if another such fold keeps it
        from beginning for ``timeout`` seconds."""
        if self.cluster is not None or self.cache.held(job_id) is not None:
            return
        if self.cache.lock._is_owned():  # a reader under the states lock: loads under it
            return
        job = self.store.jobs.get(job_id)
        if job is None or job["status"] not in ENDED:
            return
        # One such fold at a time: a second reader of it waits here.
        if not self._loading.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"job {job_id}'s state was busy for {timeout} s")
        try:
            if self.cache.held(job_id) is not None:
                return
            # Beside running jobs it gives them the interpreter (dashboard.pacing: the fold
            # works a quarter of the time, and not at all while ingest is behind its agents);
            # the checkpoint a job's end stored makes it a decode and a short fold.
            # A request waits for it: once the server stops it finishes flat out.
            pace = Pace(lambda: self.lag.current() > LAG_WARN_S, self._stopped,
                        wanted=self._running_jobs, finish=True)
            loaded = self.books.fold(job_id, job["name"], lambda after: self.store.log.events(
                job_id, after=after), pace=pace)
            if loaded.book is not None and loaded.received_at is not None:
                # What the next opening starts from, as if its end had stored it (a job
                # stored by an older pgdash, or whose server was behind as it ended).
                self.rewind.checkpoint_end(Timeline.of(loaded.state, loaded.book),
                                           loaded.received_at)
            with self.cache.lock:
                if self.cache.held(job_id) is None and not self.store.log.any_after(
                        job_id, loaded.state.last_event_id):
                    self.cache.add(job_id, self.books.adopt(job_id, loaded))
        finally:
            self._loading.release()

    def _running_jobs(self) -> bool:
        return any(state.status not in ENDED for _, state in self.cache.items())

    def _load(self, job_id: int, name: str) -> JobState:
        # Clustered, the tail applies what comes after its cursor (read under the states
        # lock), so the load stops there.
        upto = self.cluster.tail.cursor if self.cluster else None
        return self.books.load(job_id, name, lambda after: self.store.log.events(
            job_id, after=after, upto=upto), upto)

    def _evicted(self, job_id: int) -> None:
        """A job's state let go from memory: so are its book and its live keyframe period."""
        self.books.drop(job_id)
        self.keyframes.drop(job_id)

    def judged_at(self) -> float:
        """The moment live verdicts are judged up to (dashboard.ingest.lag.IngestLag.judged_at)."""
        return self.lag.judged_at(self.clock())

    def findings(self, job_id: int) -> list[Finding] | None:
        """Every finding of the job, newest first (None if the job is unknown)."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            if self.store.jobs.get(job_id) is None:
                return None
            return sorted(self.store.findings.of_job(job_id), key=lambda f: -f["first_seen"])
        self.ready(job_id)
        with self.cache.lock:
            return None if self.state(job_id) is None else self.books.findings(job_id)

    def incidents(self, job_id: int) -> list[Incident] | None:
        """Every incident of the job (findings grouped by root cause), newest first."""
        if self.cluster is not None and not self.cluster.owns(job_id):
            found = self.findings(job_id)
            return None if found is None else incidents_of(found)
        self.ready(job_id)
        with self.cache.lock:
            return None if self.state(job_id) is None else self.books.incidents(job_id)

    def replay(self, job_id: int, at: float, view: Callable[[Timeline], T]) -> T | None:
        """``view(timeline)`` of the job as the server saw it at ``at`` (Unix seconds):
        every event received by then folded, and its findings book as it was then (read
        from the job's stored book log for the moments it covers, else judged by the same
        rules on the same moments; see dashboard.history.rewind). None if the job is
        unknown."""
        job = self.store.jobs.get(job_id)
        if job is None:
            return None
        return self.rewind.view(job_id, job["name"], at, view,
                                prepare=self._replay_prepare(job_id))

    def _replay_prepare(self, job_id: int) -> Callable[[Timeline], bool]:
        """What readies a replay's first Timeline: the job's stored book log, read where it
        covers the moments (see Timeline.use_log)."""
        log = self.books.book_log(job_id)
        return lambda timeline: timeline.use_log(log)

    def each_held(self, view: Callable[[int, JobState, list[Finding]], T]) -> list[T]:
        """``view(job id, state, its findings)`` of every job held in memory, while no event
        is being applied."""
        with self.cache.lock:
            return [view(job_id, state,
                         book.findings() if (book := self.books.held(job_id)) else [])
                    for job_id, state in self.cache.items()]

    # -- agent connections -------------------------------------------------------------------

    def connect(self, auth: Any, address: str | None = None) -> tuple[str, int]:
        """Admit an agent connecting from client ``address``; returns ``(session, job_id)``
        once its job is known (:meth:`connect_nowait`, waited for).

        Raises:
            Refused: bad token or malformed auth (the message says what to fix).
        """
        session, job = self.connect_nowait(auth, address)
        return session, job.result(timeout=self.store.writer.submit_timeout)

    def connect_nowait(self, auth: Any,
                       address: str | None = None) -> tuple[str, concurrent.futures.Future]:
        """Admit an agent without waiting: its session and the future of its job id.

        Its connect event is queued for the writer past the queue's bound, as are its
        disconnect's (one of each per connection): under a flood of batches, admitting
        agents must wait for nothing but the writer's turn, and a server that made them wait
        for room would have held every thread that admits agents while the ranks it kept out
        looked lost (a healthy 1,024-rank job beside a CPU hog got 981 rank_lost criticals).

        Raises:
            Refused: bad token or malformed auth (the message says what to fix).
        """
        auth = self._admissible(auth, address)
        session = auth["session"]
        self.heard.connected(session)
        known = self.admission.job_of(session)
        connected = self._server_event("connect", {"rank": auth.get("rank"),
                                                   "host": auth.get("host"),
                                                   "attempt": auth.get("attempt")})

        def admit(conn) -> int:  # one transaction: the job, the session, its connect event
            job_id = self.admission.assign(conn, auth)
            if known is None:
                # A new agent hears that it is in when this commits, and sends from then:
                # its silence is counted from here, not from a request that waited behind
                # the backlog.
                connected["t"] = self.clock()
            self.fold.write(conn, session, job_id, [connected])
            return job_id

        pending = self.store.writer.submit_nowait(admit, bounded=False)
        if known is None:
            return session, pending
        # A reconnection of a session this process already placed: its job is known, so the
        # agent is taken at once and its connect event is queued like a batch (ahead of its
        # next ones: the writer's queue is in order).
        job: concurrent.futures.Future = concurrent.futures.Future()
        job.set_result(known)
        return session, job

    def _admissible(self, auth: Any, address: str | None) -> Any:
        """The checked auth of an agent or host reader; a refusal is logged (once per agent:
        the refusal log counts the rest) and raised."""
        try:
            return self.admission.check(auth, address)
        except Refused as exc:
            if self.refusals is not None:
                self.refusals.refused(auth, address, str(exc))
            raise

    def connect_reader(self, auth: Any, address: str | None,
                       send: Callable[[dict[str, Any]], None]) -> ReaderLink:
        """Admit a host reader (pgdash_agent.reader) whose hello carries the auth of the rank
        that started it: the same token, a session this process has placed or the log holds,
        and ``reader`` (its pid). It is asked for its host's silent ranks (Asks.ask_peers).

        Raises:
            Refused: bad token, not a reader's hello, or its rank's session not known (yet).
        """
        auth = self._admissible(auth, address)
        pid = auth.get("reader")
        if not pid:
            raise Refused("pgdash refused the host reader: its auth has no reader pid")
        job_id = self.admission.job_of(auth["session"])
        if job_id is None:  # placed before a restart, and blocked since: read it from the log
            # (a primary-key read: in WAL mode it never waits for the writer)
            with self.store.engine.connect() as conn:
                found = self.store.sessions.find(conn, auth["session"])
            job_id = None if found is None else found["job_id"]
        if job_id is None:  # pgdash_agent.reader.NOT_YET: it asks again
            raise Refused("pgdash refused the host reader: the rank that started it has not "
                          "connected to this server process (yet)")
        reader = ReaderLink(job_id, auth.get("host") or "", auth["session"], auth.get("rank"),
                            pid, send)
        self.asks.link_reader(reader)
        return reader

    def connect_relay(self, auth: Any, address: str | None) -> None:
        """Admit a host relay (pgdash_agent.relay) whose hello carries the auth of the rank
        that started it (the same token) and ``reader``: the relay's pid. Each agent it
        carries is admitted as on its own connection (its hello, its token).

        Raises:
            Refused: bad token, or not a relay's hello.
        """
        auth = self._admissible(auth, address)
        if not auth.get("reader"):
            raise Refused("pgdash refused the host relay: its auth has no relay pid (reader)")
        self.counters["relays_admitted"] += 1

    def reader_read(self, reader: ReaderLink, body: Any) -> str | None:
        """A host reader's reading: checked, then stored as a ``read`` event of the session
        that started the reader. Returns why it was refused, or None."""
        try:
            read = validate_read(body)
        except WireError as exc:
            self.counters["rejected_readings"] += 1
            return str(exc)
        if not self.asks.reader_asked(reader, read["ask"], read["for_rank"]):
            self.counters["rejected_readings"] += 1
            return (f"rank {read['for_rank']} was not asked of this reader for request "
                    f"{read['ask']!r:.70} (or was answered already)")
        read["reader_pid"] = reader.pid
        self._record_server_event(reader.session, reader.job_id, "read", read)
        return None

    def reader_boards(self, reader: ReaderLink, body: Any) -> str | None:
        """A host reader's last words (pgdash_agent.board): checked, then stored as a
        ``boards`` event of the session that started the reader. Returns why it was refused,
        or None."""
        try:
            boards = validate_boards(body)
        except WireError as exc:
            self.counters["rejected_readings"] += 1
            return str(exc)
        boards["reader_pid"] = reader.pid
        self._record_server_event(reader.session, reader.job_id, "boards", boards)
        return None

    def stop(self) -> None:
        """The server is stopping: disconnects are not recorded, and what the writer still
        holds is stored without being folded (the fold and its judging were what kept an
        overloaded server from exiting for many seconds; a restart folds the stored log)."""
        self._stopped.set()
        self.fold.draining = True
        self.incident_frames.stop()

    def disconnect(self, session: str, goodbye: bool = False) -> None:
        """The connection of ``session`` closed; ``goodbye``: its agent closed it (a killed
        process cannot: its kernel just closes the socket)."""
        owed = self.heard.closed(session)  # before the disconnect's time: nothing heard after
        job_id = self.admission.job_of(session)
        if job_id is not None and not self.stopping:
            body: dict[str, Any] = {"owed_s": round(owed, 1)} if owed >= 0.1 else {}
            if goodbye:
                body["goodbye"] = True
            self._record_server_event(session, job_id, "disconnect", body)

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
            stored = pending.result(timeout=V1_ACK_WAIT_S)
        except concurrent.futures.TimeoutError:
            return self.still_queued(session)
        except Exception as exc:
            return self.write_failed(session, events, exc)
        return self.committed(session, ack, stored)

    def still_queued(self, session: str) -> Ack:
        """The acknowledgement of a v1 batch still waiting for the writer after V1_ACK_WAIT_S:
        not stored yet, so not acknowledged; sent again once the backlog had time to drain,
        instead of a reconnect when the agent's ack timeout runs out."""
        self.heard.answered(session)
        self.counters["v1_acks_deferred"] += 1
        backlog = self.store.writer.backlog_s()
        return {"ok": False, "retry": True, "retry_after": _drain_wait(backlog),
                "error": f"the server is {backlog:.0f} s behind: this batch waits in its write "
                         "queue (sending it again stores it once)"}

    def committed(self, session: str, ack: Ack, stored: int) -> Ack:
        """The acknowledgement of a batch whose write committed."""
        self.heard.answered(session)
        self.admission.release(session)
        return {**ack, "stored": stored}

    def write_failed(self, session: str, events: Any, exc: BaseException) -> Ack:
        """The acknowledgement of a batch whose write failed: the agent sends it again."""
        self.heard.answered(session)
        self.counters["failed_writes"] += 1
        self.admission.hold(session, events, 1.0)
        return {"ok": False, "retry": True, "retry_after": 1.0,
                "error": "server could not store the batch: "
                         + describe_write_error(self.store.url, exc)}

    def batch_nowait(self, session: str, job_id: int,
                     events: Any) -> tuple[Ack, concurrent.futures.Future | None]:
        """Validate a list of events and queue the good ones for the writer.

        Returns the acknowledgement so far and the future of the write (its result: how many
        events were stored), or None when nothing needs writing (then the ack is final).
        """
        self.heard.received(session)  # whatever becomes of the batch: the agent is there
        held = self.admission.held_back(session, events)
        if held is not None:
            return held, None
        if isinstance(events, list) and not self.store.writer.has_room(len(events)):
            return self._overloaded(session, events), None  # not even read: it comes again
        try:
            good, rejected = validate_events(events)
        except WireError as exc:
            self.counters["rejected_batches"] += 1
            return {"ok": False, "error": str(exc), "retry": False}, None
        self.counters["rejected_events"] += len(rejected)
        ack: Ack = {"ok": True, "stored": 0, "rejected": rejected}
        if not good:
            return ack, None
        self._received(session, good)  # before the writer may fold it
        self.asks.arrived(session, job_id, good)  # a snapshot answer shows before it is folded
        try:
            pending = self.store.writer.submit_nowait(
                lambda conn: self.fold.write(conn, session, job_id, good), events=len(good))
        except queue.Full:
            return self._overloaded(session, events), None
        except WriterStopped:
            return {"ok": False, "retry": True, "retry_after": 1.0,
                    "error": "the server is stopping; sending again"}, None
        self.heard.owe(session)
        return ack, pending

    def _received(self, session: str, events: list[Any]) -> None:
        """Events of ``session`` came in, to be folded or sent again: its rank is not silent
        while they wait (dashboard.ingest.lag)."""
        sent = newest_sent(events)
        if sent is not None:
            self.lag.received(session, sent)

    def _overloaded(self, session: str, events: list[Any]) -> Ack:
        """Refuse a batch the writer has no room for: the agent keeps it and sends it again
        once the backlog had time to drain (1-5 s)."""
        self.counters["overloaded_batches"] += 1
        self._received(session, events)
        wait = _drain_wait(self.store.writer.backlog_s())
        self.admission.hold(session, events, wait)  # heard already, by batch_nowait
        return {"ok": False, "retry": True, "retry_after": wait,
                "error": "server overloaded: its write queue is full; sending again"}

    def _server_event(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"seq": None, "t": self.clock(), "kind": kind, "body": body}

    def hold(self, session: str, events: Any, quiet_s: float = 0.0) -> None:
        """Refuse (retry) batches of ``session`` that start past this refused one's first seq
        (see Admission.HOLD_S); its agent was told to wait ``quiet_s`` first. It is there,
        and waits as told."""
        self.heard.received(session)
        self.admission.hold(session, events, quiet_s)

    def _record_server_event(self, session: str, job_id: int, kind: str,
                             body: dict[str, Any]) -> None:
        """Queue a server event of ``session`` without waiting (past the queue's bound: one
        per connection change; see :meth:`connect_nowait`)."""
        event = self._server_event(kind, body)
        try:
            self.store.writer.submit_nowait(
                lambda conn: self.fold.write(conn, session, job_id, [event]), bounded=False)
        except WriterStopped:
            pass  # the server is stopping: its connections close because it leaves


def _drain_wait(backlog_s: float) -> float:
    """How long an agent told to send a batch again waits first: the writer's backlog, 1-5 s."""
    return min(5.0, max(1.0, round(backlog_s, 1)))
