"""Live findings: the books (dashboard.diagnosis.book) of the jobs held in memory, ticked on
the grid as live events are folded, stored when they change, and told to listeners.

A moment T of the grid must be judged with exactly the events received by T, as replay
judges it. Events are stamped (``received_at``) on the writer thread, then folded under the
states lock. So: before a batch is folded, the moments due before its stamp are judged
(``before_fold``); the timer judges the moments due by now (``tick_all``), never one at or
past a stamp whose batch is not folded yet (``stamping``). While the server is behind (its
lag over LAG_WARN_S), moments past ``judged_at()`` wait: those are then judged with later
events already folded, which replay cannot know (README, "One lifecycle").
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from dashboard.diagnosis import Finding, Settings
from dashboard.diagnosis.book import Book, Changes, LogRow
from dashboard.diagnosis.incidents import Incident
from dashboard.diagnosis.timeline import BookLog, Timeline
from dashboard.pacing import PACE_EVENTS, Pace
from dashboard.state import JobState, StoredEvent
from dashboard.storage.store import Store
from dashboard.storage.writer import WriterStopped

log = logging.getLogger("pgdash.ingest")


class LiveBooks:
    """Args:
        store: the database (findings stored by earlier runs; changed ones saved).
        settings: the rules' settings and the grid.
        clock: wall clock (injected for tests).
        judged_at: the moment verdicts may be judged up to (now, less the lag when behind).
        on_incident: told ``(event, job summary, incident)``; must not block.
        counters: Ingest's counters (listener errors).
        changed: told of each job whose findings changed (the live feed, the job list).
    """

    # A job first held since this server started (an old job opened, an imported one, one
    # running across a restart) has its book rebuilt from its log, on the grid, as replay
    # builds it (the moments its book log covers are read, not judged), unless that takes
    # more than this many diagnoses (a long job: about an hour of moments) or this long (a
    # big job: 256 ranks judge ~15 moments a second, and a running job's load holds up
    # ingest meanwhile): then the findings stored by earlier runs are its book.
    RECOMPUTE_MAX_DIAGNOSES = 7200
    RECOMPUTE_MAX_S = 10.0

    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float],
                 judged_at: Callable[[], float],
                 on_incident: Callable[[str, dict[str, Any], Incident], None] | None,
                 counters: collections.Counter[str], changed: Callable[[int, bool], None]):
        self.store, self.settings, self.clock = store, settings, clock
        self.judged_at, self.on_incident = judged_at, on_incident
        self.counters, self._changed = counters, changed
        self.active_incidents: dict[int, int] = {}  # job id -> active incidents (job list)
        self._books: dict[int, Book] = {}
        # The arrival time being stamped on a batch not folded yet (writer thread): the
        # timer may judge moments before it only.
        self._stamp_lock = threading.Lock()
        self._stamping: float | None = None

    # -- the writer's side -------------------------------------------------------------------

    @contextlib.contextmanager
    def stamping(self) -> Iterator[float]:
        """Writer thread: the arrival time to stamp on a batch, held pending until it is
        folded (the block ends)."""
        with self._stamp_lock:
            now = self._stamping = self.clock()
        try:
            yield now
        finally:
            with self._stamp_lock:
                self._stamping = None

    def before_fold(self, conn, job_id: int, state: JobState, received_at: float,
                    late: float = 0.0) -> None:
        """Writer thread, states lock held: judge the moments due before a batch received at
        ``received_at`` is folded. While the server is behind, only those up to
        ``judged_at()``; for a batch ``late`` seconds late, only those up to its lateness
        back (it may be the first thing read after the server stood still)."""
        book = self._books.get(job_id)
        if book is None:
            if state.applied:  # held since before its book could be rebuilt: from now
                book = self.book(job_id, received_at)
            else:  # a new job: its grid starts at its first event, as in replay
                book = self._books[job_id] = Book(self.settings)
                book.record()
                book.start(received_at)
                return
        due = book.judged_through
        if due is not None and received_at - due <= self.settings.diagnose_every:
            return  # nothing due (cheap: no lag measured)
        held = min(self.judged_at(), received_at - late)
        found = book.tick_through(state, held) if held < received_at else \
            book.tick_before(state, received_at)
        if found:
            self._told(job_id, state, book, found)
            self.store.findings.save(conn, job_id, changed_rows(found))

    # -- the timer's side --------------------------------------------------------------------

    def tick_all(self, states: Iterable[tuple[int, JobState]],
                 owns: Callable[[int], bool]) -> dict[int, list[Changes]]:
        """States lock held: judge the moments due now for every job held that this process
        owns; returns what changed, by job, to be stored (``save``) once the lock is let go."""
        tick = self._tick_now()
        out: dict[int, list[Changes]] = {}
        for job_id, state in states:
            if not owns(job_id):
                continue  # its owner diagnoses it
            book = self.book(job_id, self.clock())
            found = tick(book, state)
            if found:
                out[job_id] = found
                self._told(job_id, state, book, found)
        return out

    def save(self, job_id: int, found: list[Changes]) -> None:
        """Queue changed findings for the writer; never under the states lock (the writer
        takes it too). Not waited for: behind a backlog the wait ran out, and the round's
        book log was lost with it ("live diagnosis failed", bench/capacity.py at 1,024
        ranks beside a CPU hog)."""
        rows = changed_rows(found)
        if rows:
            try:
                self.store.writer.submit_nowait(
                    lambda conn: self.store.findings.save(conn, job_id, rows), bounded=False)
            except WriterStopped:
                pass  # the server is stopping: a restart judges the stored log again

    def _tick_now(self) -> Callable[[Book, JobState], list[Changes]]:
        """How to judge the moments due now (states lock held, so every event folded was
        stamped before this): up to now (less the lag, when behind), but never at or past
        the arrival time of a batch stamped and not folded yet."""
        with self._stamp_lock:  # no batch is stamped meanwhile; later ones are stamped later
            stamping, now = self._stamping, self.judged_at()
        if stamping is not None and stamping <= now:
            return lambda book, state: book.tick_before(state, stamping)
        return lambda book, state: book.tick_through(state, now)

    # -- books -------------------------------------------------------------------------------

    def load(self, job_id: int, name: str, events: Callable[[int], Iterable[StoredEvent]],
             upto: int | None = None) -> JobState:
        """Fold a job's log into its state and its book (states lock held): :meth:`fold`,
        then :meth:`adopt`."""
        return self.adopt(job_id, self.fold(job_id, name, events, upto))

    def fold(self, job_id: int, name: str, events: Callable[[int], Iterable[StoredEvent]],
             upto: int | None = None, pace: Pace | None = None) -> "Loaded":
        """A job's state and book folded from its log, from the newest stored checkpoint on
        (``events(after)``: the log after that id, up to id ``upto`` when given); no lock
        needed, nothing here changed; ``pace()`` is called every PACE_EVENTS events.
        The moments its stored book log covers are read, the others judged while
        affordable; past RECOMPUTE_MAX_DIAGNOSES or RECOMPUTE_MAX_S of work (the pace's
        pauses left out) the book starts from the stored findings (:meth:`adopt`)."""
        book_log = self.book_log(job_id)
        timeline = self._checkpoint(job_id, book_log, upto)
        if timeline is None:
            timeline = Timeline(job_id, name, self.settings)
            timeline.use_log(book_log)
        timeline.record()
        state = timeline.state
        start = deadline = time.monotonic() + self.RECOMPUTE_MAX_S
        folding: Timeline | None = timeline
        received_at = None
        for n, ev in enumerate(events(state.last_event_id), 1):
            if pace is not None and not n % PACE_EVENTS:
                pace()
                deadline = start + pace.paused_s
            if folding is not None and self._too_dear(folding.book, deadline):
                folding = None
            if folding is not None:
                folding.apply(ev)
            else:
                state.apply(ev)
            received_at = ev["received_at"]
        book = folding.current_book() if folding is not None and state.applied else None
        return Loaded(state, book, deadline, received_at)

    def _checkpoint(self, job_id: int, book_log: BookLog | None,
                    upto: int | None) -> Timeline | None:
        """The job's newest stored checkpoint up to id ``upto`` (dashboard.history.rewind
        stores them every PGDASH_CHECKPOINT_S of the log, live and by scrubs), ready to fold
        on from; None where there is none, or it cannot be read or go on with the stored
        book log."""
        found = self.store.checkpoints.load(job_id, math.inf, upto=upto)
        timeline = None if found is None else found[2]
        if not isinstance(timeline, Timeline) or not timeline.use_log(book_log):
            return None
        if timeline.book is not None:
            timeline.book.diagnosed = 0  # what this load costs is counted (_too_dear)
        self.counters["checkpoints_loaded_live"] += 1
        return timeline

    def adopt(self, job_id: int, loaded: "Loaded") -> JobState:
        """States lock held: a state :meth:`fold` made is held from now on; its book is
        judged up to now and becomes the job's (unless rebuilding it cost too much: then
        the stored findings are its book, made when first asked)."""
        state, book, deadline, _ = loaded
        if book is None:
            return state
        book.settings = self.settings  # one from a checkpoint has its own, and no `heard`
        # A job still "running" whose agents went silent long ago (the server was down,
        # or the whole job lost its network): catching up would judge every moment since,
        # 86,400 a day. Its book then starts from the stored findings, as above.
        if book.diagnosed + book.due(state, self.judged_at()) > self.RECOMPUTE_MAX_DIAGNOSES:
            return state
        self._tick_now()(book, state)
        if not self._too_dear(book, deadline):
            book.keep(self.store.findings.of_job(job_id))
            self._books[job_id] = book
            if book.active_incidents:
                self.active_incidents[job_id] = book.active_incidents
        return state

    def _too_dear(self, book: Book | None, deadline: float) -> bool:
        """Whether rebuilding ``book`` has cost more judgements or time than allowed."""
        return book is not None and book.diagnosed > 0 and (
            book.diagnosed > self.RECOMPUTE_MAX_DIAGNOSES or time.monotonic() > deadline)

    def book_log(self, job_id: int) -> BookLog | None:
        """The job's stored book log (None if it has none)."""
        span = self.store.findings.log_span(job_id)
        if span is None:
            return None

        def read(until: float) -> tuple[list[LogRow], float | None]:
            rows, judged = self.store.findings.log_rows(job_id, until)
            return [LogRow(*row) for row in rows], judged

        return BookLog(self.settings, span[0], span[1], read)

    def take_logs(self, owns: Callable[[int], bool]
                  ) -> list[tuple[int, float | None, list[LogRow], float]]:
        """States lock held: what each book recorded since last taken, with the moment it
        is judged through: (job, since, rows, through), for :meth:`save_logs`."""
        out = []
        for job_id, book in self._books.items():
            taken = book.take_log()  # a job another process owns: its owner stores its log
            if taken is not None and owns(job_id):
                out.append((job_id, taken[0], taken[1], book.judged_through))
        return out

    def save_logs(self, logs: list[tuple[int, float | None, list[LogRow], float]]) -> bool:
        """Queue what :meth:`take_logs` took for the writer, in the order taken, without
        waiting (never under the states lock). False if the writer's queue is full: those
        jobs must stop recording (:meth:`stop_recording`), or a later record would claim
        the moments of these rows without them. (A failed write drops every book.)"""
        if not logs:
            return True
        try:
            self.store.writer.submit_nowait(lambda conn: [self.store.findings.save_log(conn, *log)
                                                          for log in logs])
        except queue.Full:
            self.counters["book_log_dropped"] += 1
            return False
        return True

    def stop_recording(self, job_ids: Iterable[int]) -> None:
        """States lock held: these books record nothing more (their stored log ends where
        it was last stored; a later load records again from there)."""
        for job_id in job_ids:
            book = self._books.get(job_id)
            if book is not None:
                book.stop_recording()

    def book(self, job_id: int, now: float) -> Book:
        """The job's book (states lock held): one not rebuilt from its log begins with what
        earlier runs concluded, judged from ``now`` on."""
        book = self._books.get(job_id)
        if book is None:
            book = self._books[job_id] = Book(self.settings, self.store.findings.of_job(job_id))
            book.record()
            book.start(now)
            if book.active_incidents:
                self.active_incidents[job_id] = book.active_incidents
        return book

    def held(self, job_id: int) -> Book | None:
        return self._books.get(job_id)

    def timeline(self, job_id: int, state: JobState) -> Timeline | None:
        """The live fold of a job as a replay's Timeline (the same objects, not copies: for
        a checkpoint taken at once), or None while it has no book."""
        book = self._books.get(job_id)
        return None if book is None else Timeline.of(state, book)

    def findings(self, job_id: int) -> list[Finding]:
        """Every finding of a job held here, newest first (states lock held)."""
        return self.book(job_id, self.judged_at()).findings()

    def incidents(self, job_id: int) -> list[Incident]:
        return self.book(job_id, self.judged_at()).incidents()

    def settled(self, job_id: int, state: JobState) -> bool:
        book = self._books.get(job_id)
        return book is not None and book.settled(state)

    def drop(self, job_id: int) -> None:
        self._books.pop(job_id, None)

    def _told(self, job_id: int, state: JobState, book: Book, found: list[Changes]) -> None:
        """After ticks that changed findings (states lock held): mark the job for the live
        feed, count its active incidents (job list), tell ``on_incident`` of each incident
        that appeared, resolved, or turned critical."""
        count_changed = self.active_incidents.get(job_id) != book.active_incidents
        self.active_incidents[job_id] = book.active_incidents
        self._changed(job_id, count_changed)
        if self.on_incident is None:
            return
        for changes in found:
            for event, inc in changes.incidents:
                try:
                    self.on_incident(event.value, state.summary(), inc)
                except Exception:  # a listener's fault must not stop diagnosis
                    self.counters["incident_listener_errors"] += 1


def changed_rows(found: list[Changes]) -> list[Finding]:
    """The findings that ticks changed, each once, as it was last."""
    return list({f["id"]: f for changes in found for _, f in changes.findings}.values())


class Loaded(NamedTuple):
    """A job folded from its log (LiveBooks.fold), not held yet."""

    state: JobState
    book: Book | None  # None: the stored findings are its book
    deadline: float  # time.monotonic() past which rebuilding its book cost too much
    received_at: float | None  # the arrival of the last event folded (None: none was)
