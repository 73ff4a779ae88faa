"""Folded states of stored jobs at past moments, kept so that scrubbing does not refold.

``GET /api/jobs/<id>/state?at=`` (and the page's replay slider) asks for the state at one
moment after another. Folding the log from its start each time costs the whole log per
request: minutes for a big job. Rewind keeps, per job, a cursor (the last state it built
and the last event in it) that a later moment continues from, and checkpoints (copies taken
every ``spacing`` events folded, and at least EVENTS_PER_SESSION_COPIED per agent session,
spread out as they grow in number or outgrow ``copies_bytes``) that an earlier moment starts
from. A copy of a 1,024-rank state is ~7 MB (zlib 1 of its pickle, 0.5 s to take and as
long to restore, against ~25 s of that job's log to fold): a job scrubbed back and forth
keeps about 16 of them, spread over what was scrubbed. Backwards past them, a moment starts
from the stored checkpoints below.

Persistent checkpoints (the ``checkpoints`` table) are what a big job scrubs backwards from,
and what any job starts from after a restart: the state is stored each time a fold crosses
a multiple of ``persist_every_s`` seconds of arrival time (the state then holds exactly the
events that arrived before that moment), the live fold as it happens (on the writer
thread, in the transaction of the batch that crosses it: no second fold), and a rewind
fold where the live one did not (a job stored before, or while the server was down). One function pair stores and
loads a state, dashboard.storage.codec's ``encode_state`` / ``decode_state``. Their moments are
multiples of the compaction cell (dashboard.storage.compaction), so compaction never rewrites what
a stored checkpoint holds half of; it holds ``compacting`` meanwhile, and in-memory points go.

Moments are arrival times (``received_at``), which the single writer thread stamps in log
order; a state "at T" holds every event that arrived by T.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

from dashboard.diagnosis.timeline import Timeline
from dashboard.history.keyframes import Keyframes
from dashboard.pacing import PACE_EVENTS
from dashboard.storage.codec import compress_state, decode_state, encode_state, pickle_state
from dashboard.state import JobState
from dashboard.storage.store import Store

log = logging.getLogger("pgdash.rewind")

T = TypeVar("T")
# In-memory copies of folded states, all jobs together (Rewind's ``copies_bytes``): 16 of a
# 1,024-rank job's.
COPIES_BYTES = 128 * 2**20


@dataclasses.dataclass
class _Point:
    at: float  # when the last event in the state arrived: usable for any moment from then
    last_id: int  # the state holds the events up to this id
    state: Any  # a JobState, or what ``new_state`` makes (with ``apply`` and ``sessions``)
    folded: int = 0  # events folded into it since it was copied, loaded or made


@dataclasses.dataclass
class _Copy:
    """An in-memory checkpoint: the state as dashboard.storage.codec bytes (a pickle is about ten
    times quicker to take and to restore than a deep copy, and a tenth of its memory)."""

    at: float
    last_id: int
    data: bytes


class Rewind:
    """Args:
        new_state: ``(job_id, name) -> `` an empty fold: a JobState by default; Ingest
            folds a ``dashboard.diagnosis.timeline.Timeline`` (state and findings book), which
            dashboard.storage.codec stores like one. Stored checkpoints hold what it makes.
        pace: called every PACE_EVENTS (dashboard.pacing) events a fold reads (a
            background fold's: it may sleep, or raise to give the fold up); None: folds run
            flat out.
    """

    # Copies this many events folded per agent session apart cost a scrub about a seventh
    # more than the fold alone: a 256-rank state copies in ~0.35 s (pickle and zlib 1) and
    # folds ~10,000 events a second (bench/storage.py --scrub-only --verbose).
    EVENTS_PER_SESSION_COPIED = 100

    def __init__(self, store: Store, max_jobs: int = 4, checkpoints: int = 16,
                 spacing: int = 2000, copies_bytes: int = COPIES_BYTES,
                 persist_every_s: float = 300.0,
                 new_state: Callable[[int, str], Any] = JobState,
                 keyframes: Keyframes | None = None, pace: Callable[[], None] | None = None):
        self.store, self.pace = store, pace
        self.new_state = new_state
        self.keyframes = keyframes  # stored where a fold of Timelines passes their moments
        self.persist_every_s = persist_every_s  # PGDASH_CHECKPOINT_S; 0: none stored
        self._persisted: dict[int, set[float]] = {}  # by job: moments stored already
        self.checkpoints_loaded = 0  # for tests and the bench
        self.checkpoints_saved = 0
        self._live_period: dict[int, float] = {}  # by job: the period of its last live batch
        self.max_jobs, self.max_checkpoints = max_jobs, checkpoints
        self.spacing, self.copies_bytes = spacing, copies_bytes  # 0: no copies
        self._lock = threading.Lock()
        self._cursors: collections.OrderedDict[int, _Point] = collections.OrderedDict()
        self._checkpoints: dict[int, list[_Copy]] = {}  # by job, in log order
        self._spacing: dict[int, int] = {}  # by job: events between checkpoints
        self.events_read = 0  # for tests: what scrubbing cost
        self._compressor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="pgdash-checkpoint")  # live checkpoints, off the writer

    def view(self, job_id: int, name: str, at: float, read: Callable[[Any], T],
             prepare: Callable[[Any], bool] | None = None) -> T:
        """``read(state)`` of the job at moment ``at`` (the state is only valid inside).
        ``prepare(state)`` readies the state the fold starts from; False: it cannot be used
        (the fold starts from the job's first event instead)."""
        with self._lock:
            start = self._start(job_id, name, at)
            if prepare is not None and not prepare(start.state):
                start = _Point(float("-inf"), 0, self.new_state(job_id, name))
                prepare(start.state)
            point = self._fold(job_id, start, at)
            self._cursors[job_id] = point
            self._cursors.move_to_end(job_id)
            while len(self._cursors) > self.max_jobs:
                old, _ = self._cursors.popitem(last=False)
                self._checkpoints.pop(old, None)
                self._spacing.pop(old, None)
            return read(point.state)

    def cursor(self, job_id: int) -> Any | None:
        """The state the job's last view was read from (None if none is kept)."""
        with self._lock:
            point = self._cursors.get(job_id)
            return None if point is None else point.state

    def _start(self, job_id: int, name: str, at: float) -> _Point:
        cursor = self._cursors.pop(job_id, None)
        marks = self._checkpoints.get(job_id, [])
        i = bisect.bisect_right([m.at for m in marks], at)
        best = marks[i - 1] if i else None
        near = cursor if cursor is not None and cursor.at <= at else None
        # A stored checkpoint costs a decode: worth it over the cursor only if far ahead.
        above = max(best.last_id if best else 0, near.last_id + self.spacing if near else 0)
        stored = self._load(job_id, at, above)
        if stored is not None:
            return stored
        if near is not None and (best is None or near.last_id >= best.last_id):
            return near
        if best is not None:
            return _Point(best.at, best.last_id, decode_state(best.data))
        return _Point(float("-inf"), 0, self.new_state(job_id, name))

    def _load(self, job_id: int, at: float, above: int) -> _Point | None:
        """The stored checkpoint nearest before ``at``, if it is ahead of id ``above``."""
        if not self.persist_every_s:
            return None
        found = self.store.checkpoints.load(job_id, at, above)
        if found is None:
            return None
        self.checkpoints_loaded += 1
        return _Point(found[1], found[0], found[2])

    def _persist(self, job_id: int, boundary: float, last_id: int, state: Any) -> None:
        """Store the state as the checkpoint at ``boundary`` (once; never waits for it)."""
        done = self._persisted.get(job_id)
        if done is None:
            done = self._persisted[job_id] = self.store.checkpoints.moments(job_id)
        if boundary in done:
            return
        done.add(boundary)
        if self.store.checkpoints.wanted(job_id, last_id, boundary):
            self._save(job_id, last_id, boundary, state)

    def checkpoint_live(self, conn, state: Any, now: float) -> None:
        """Writer thread, before a live batch that arrived at ``now`` is applied to the job's
        live ``state``: store the state if ``now`` starts a new period (it then holds exactly
        what arrived before the period's start)."""
        every = self.persist_every_s
        if not every or state is None:
            return
        boundary = math.floor(now / every) * every
        previous = self._live_period.get(state.job_id)
        self._live_period[state.job_id] = boundary
        # Unknown previous period (first batch since the state was loaded): the state might
        # hold events of this one already; the next period's start is stored instead.
        if previous is None or boundary <= previous or not state.last_event_id:
            return
        # A findings book that judged moments past the period's start cannot stand for the
        # state there (a scrub to such a moment would see later verdicts): a fold that
        # passes this period stores it instead.
        if (getattr(state, "judged_through", None) or boundary) > boundary:
            return
        self._save(state.job_id, state.last_event_id, boundary, state)

    def checkpoint_end(self, state: Any, received_at: float) -> None:
        """A job's end just folded from a batch that arrived at ``received_at`` (the writer
        thread, states lock held; or an ended job folded from its log as it is opened, whose
        last event arrived then): store the state as a checkpoint just after that, so that
        opening the job on a restarted server decodes it (~0.5 s at 1,024 ranks) instead of
        folding up to PGDASH_CHECKPOINT_S of its log (half a minute at that size, more
        beside live jobs). Pickled here, as a period's checkpoint is (0.2-0.5 s at 1,024
        ranks, once a job). Events that arrive later (a rank's exit after the others') are
        folded on from it."""
        if not self.persist_every_s or state is None or not state.last_event_id:
            return
        # A book that did not judge every moment before the batch (verdicts held back while
        # the server was behind its agents) would judge them with the job's end folded
        # already; a fold from the job's log judges them as they were.
        if state.book is None or state.book.due(state.state,
                                                math.nextafter(received_at, -math.inf)):
            return
        self._persist(state.job_id, math.nextafter(received_at, math.inf),
                      state.last_event_id, state)

    def _save(self, job_id: int, last_id: int, at: float, state: Any) -> None:
        """Store ``state`` as the checkpoint at ``at``: pickled here (before the fold goes
        on), compressed and queued for the writer on another thread (zlib 6 of a 1,024-rank
        state takes about a second: neither the writer nor a scrub waits for it)."""
        self._compressor.submit(self._save_compressed, job_id, last_id, at,
                                pickle_state(state))
        self.checkpoints_saved += 1

    def _save_compressed(self, job_id: int, last_id: int, at: float, raw: bytes) -> None:
        data = compress_state(raw)
        try:
            self.store.writer.submit_nowait(lambda conn: self.store.checkpoints.save(
                conn, job_id, last_id, at, data))
        except queue.Full:  # an overloaded writer: a fold that passes this moment stores it
            self.checkpoints_saved -= 1
            self._persisted.get(job_id, set()).discard(at)

    def wait_saved(self, timeout: float = 30.0) -> None:
        """Wait until the checkpoints taken so far (live and by scrubs) are queued for the
        writer."""
        self._compressor.submit(lambda: None).result(timeout=timeout)

    @contextlib.contextmanager
    def compacting(self, job_id: int, start: float, end: float) -> Iterator[None]:
        """Held while compaction rewrites the log's arrivals in [start, end): no fold reads
        half of the old rows and half of the new. Then drop in-memory states whose last
        event lies there (one may hold part of what a summary now stands for)."""
        with self._lock:
            yield
            cursor = self._cursors.get(job_id)
            if cursor is not None and start <= cursor.at < end:
                del self._cursors[job_id]
            marks = self._checkpoints.get(job_id)
            if marks:
                marks[:] = [m for m in marks if not start <= m.at < end]

    def _fold(self, job_id: int, point: _Point, at: float) -> _Point:
        state, last_id, last_at, folded = point.state, point.last_id, point.at, point.folded
        every = self.persist_every_s
        keyframes = self.keyframes if isinstance(state, Timeline) else None
        pace = self.pace
        for ev in self.store.log.events(job_id, after=last_id, keep=True):
            self.events_read += 1
            if pace is not None and not self.events_read % PACE_EVENTS:
                pace()
            if every and last_id:
                boundary = math.floor(ev["received_at"] / every) * every
                if last_at < boundary:  # the state holds exactly what arrived before it
                    self._persist(job_id, boundary, last_id, state)
            if keyframes is not None and last_id:
                # The moments passed up to the one asked for (none of the log is missing).
                until = min(ev["received_at"], math.nextafter(at, math.inf))
                for moment in keyframes.passing(job_id, state.state, last_at, until, at):
                    keyframes.take(job_id, moment, state.state, state.settled_book(moment))
            if ev["received_at"] > at:
                break
            state.apply(ev)
            last_id, last_at = ev["id"], ev["received_at"]
            # Counted in events folded, not ids: where compaction thinned the log, ids are
            # far apart (a copy every few events cost a 256-rank scrub seconds).
            folded += 1
            if folded >= self._spacing.get(job_id, self.spacing) and \
                    folded >= self.EVENTS_PER_SESSION_COPIED * len(state.sessions):
                folded = 0
                self._mark(job_id, _Point(last_at, last_id, state))
        return _Point(last_at, last_id, state, folded)

    def _mark(self, job_id: int, point: _Point) -> None:
        if not self.copies_bytes:
            return
        marks = self._checkpoints.setdefault(job_id, [])
        if any(m.last_id == point.last_id for m in marks):
            return
        copy = _Copy(point.at, point.last_id, encode_state(point.state, level=1))
        if len(copy.data) * 2 > self.copies_bytes:  # a state this big keeps its cursor alone:
            self._thinned(job_id)                    # tried ever more rarely
            return
        marks.append(copy)
        marks.sort(key=lambda m: m.last_id)
        if len(marks) > self.max_checkpoints:
            self._thin(job_id)
        held = {job: sum(len(m.data) for m in kept) for job, kept in self._checkpoints.items()}
        while sum(held.values()) > self.copies_bytes:  # the job holding most gives way
            most = max(held, key=held.get)
            self._thin(most)
            held[most] = sum(len(m.data) for m in self._checkpoints[most])

    def _thin(self, job_id: int) -> None:
        """Keep the job's copies spread: every other one goes (the oldest stays), and they
        are taken twice as far apart from now on; the last one goes too if it alone is left."""
        marks = self._checkpoints[job_id]
        del marks[1 if len(marks) > 1 else 0::2]
        self._thinned(job_id)

    def _thinned(self, job_id: int) -> None:
        self._spacing[job_id] = 2 * self._spacing.get(job_id, self.spacing)

    def _copies_held(self) -> int:
        return sum(len(m.data) for marks in self._checkpoints.values() for m in marks)
