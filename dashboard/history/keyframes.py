"""Keyframes: a job's whole ``state?at=`` answer, stored at every multiple of ``every_s``
seconds of arrival time, so that dragging the page's slider and playing a big stored job
read a moment instead of folding one.

A moment that is not stored costs a fold from the nearest checkpoint
(dashboard.history.rewind): seconds at 1,024 ranks. A keyframe costs a read, a zlib inflate
and a splice (a 1,024-rank answer is ~1.7 MB of JSON, ~100 kB stored:
dashboard.web.live.keyframe). ``GET /api/jobs/<id>/state?at=T&within=S`` answers with the
newest keyframe in [T - S, T] when there is one (its ``at`` says which moment it shows), and
folds T otherwise; the page asks so while the slider moves or plays, and for the exact moment
where it stops.

A keyframe at K is made where a fold passes K with the state holding exactly the events that
arrived by K (what ``state?at=K`` folds), rendered by ``render`` (what is stored of the
page's answer: dashboard.web.live.keyframe) with the book as of K:

- by the live fold, on the writer thread, at the first batch that arrived after K (``opened``,
  ``live``): the live book is judged through K first (the moments the batch would have had
  judged anyway), or less far when the server is behind its agents and holds its verdicts
  back (the keyframe then shows them as the page did). Where the book had judged past K
  already (the timer ran first) it is skipped, counted in ``skipped``, as are the moments
  that would take the writer past LIVE_SHARE of its time (rendering one costs ~0.3 s at
  1,024 ranks);
- by a fold for ``state?at=`` that passes K (``passing``): what live skipped, jobs stored before
  keyframes, and clustered jobs (their owner folds the log's tail, which makes none).

Around each incident (where it began, and where it ended once resolved: the marks the page's
Shift+arrows stop at) a fold toward a moment near a mark stores more: the mark itself and the
moments FINE_S apart from FINE_BEFORE_S before it to FINE_AFTER_S after, aligned on the mark
(so that the page's one-second steps from it land on them). The first visit to a mark folds
there as before and stores those before it on its way, stepping on stores those after; from
then on the incident forms second by second while the slider moves near it, Play steps
through it and ←/→ step from it, each moment a read. A live server cannot make them (an
incident begins before it is judged: the moments are past); the marks are the job's stored
findings', read again after MARKS_TTL_S.

It is encoded and compressed on the folding thread (the answer may share objects with the
state that the next event changes): the live fold stores it in its own transaction, a scrub
through the writer. A keyframe keeps the moment as
it was folded then: compaction later thins the log's detail, not the keyframes; beyond its
window and away from findings it keeps only those at multiples of ``PGDASH_KEYFRAME_KEEP_S``
(30 s), which a scrub does not store again. ``every_s`` is the disk-for-scrub-speed setting
(``PGDASH_KEYFRAME_S``; measured in docs/deploy.md).
"""

from __future__ import annotations

import bisect
import collections
import logging
import math
import queue
import threading
import time
import zlib
from typing import Callable

import sqlalchemy as sa

from dashboard.diagnosis.book import Book
from dashboard.diagnosis.incidents import incidents, marks
from dashboard.state import JobState
from dashboard.storage.store import Store
from dashboard.storage.writer import WriterStopped

log = logging.getLogger("pgdash.keyframes")

Render = Callable[[JobState, Book, float], bytes]

LEVEL = 6  # zlib level: 1,024 ranks, 1.7 MB of JSON: 132 kB in 15 ms, against 156 kB at level 1
# Jobs with fewer ranks get none (the page drags them by exact moments: at 8 ranks one folds
# in ~50 ms; and an answer's fixed part would cost a small job more per rank: ~130 kB per
# rank-hour at 8 ranks, ~45 kB at 1,024). static/js/job/replay.js's KEYFRAME_RANKS.
MIN_RANKS = 128
# The jobs whose stored moments are remembered (what scrubs pass; read again when needed).
KNOWN_JOBS = 16
# The most of the writer's time live keyframes take: after one that took d seconds to render,
# the job's next is at least d / LIVE_SHARE seconds later (1,024 ranks: ~0.3 s, so every
# 20 s instead of 10). Each render holds the job's batches back meanwhile (bench/capacity.py:
# at 1,024 ranks one every 10 s raised freshness p95 by half a second). A moment left out
# is stored by a scrub that passes it; the page takes a keyframe up to 30 s back.
LIVE_SHARE = 0.02
# Around each incident's marks: a moment every FINE_S from FINE_BEFORE_S before the mark to
# FINE_AFTER_S after (a hang's first mark is its stall's, ~10 s after the ranks stopped:
# the 30 s before show it form). At 1,024 ranks 41 keyframes, ~4 MB, a mark; the first
# MAX_MARKS marks of a job get them. A running job's marks are read again after MARKS_TTL_S.
FINE_S = 1.0
FINE_BEFORE_S = 30.0
FINE_AFTER_S = 10.0
MAX_MARKS = 16
MARKS_TTL_S = 30.0


class Keyframes:
    """Args:
        store: the database.
        every_s: the grid (seconds of arrival time); 0: no keyframes.
        render: what is stored of a state and book at a moment (its answer is made of it where
            it is read: dashboard.web.live.keyframe and keyframe_answer); None: no keyframes.
        min_ranks: jobs with fewer ranks get none.
    """

    def __init__(self, store: Store, every_s: float = 10.0, render: Render | None = None,
                 min_ranks: int = MIN_RANKS):
        self.store, self.every_s, self.render = store, every_s, render
        self.min_ranks = min_ranks
        self.live_share = LIVE_SHARE  # (tests of what a keyframe holds lift it)
        self.made = 0  # rendered (live or by a fold)
        self.skipped = 0  # live moments left to scrubs: judged past, or over the writer's budget
        self.failed = 0  # answers that could not be rendered or stored
        self._lock = threading.Lock()
        # By job, the most recently scrubbed last: moments stored or on their way.
        self._moments: collections.OrderedDict[int, set[float]] = collections.OrderedDict()
        self._live_period: dict[int, float] = {}  # by job held: the period of its last batch
        self._live_after: dict[int, float] = {}  # by job held: no live keyframe before this
        # By job, the most recently folded last: (when read, its incident marks).
        self._marks: collections.OrderedDict[int, tuple[float, list[float]]] = \
            collections.OrderedDict()
        # Per folding thread (a scrub's, dashboard.history.incident_frames'): ``held``, ((job,
        # the moment its fold goes toward), the moments around the marks near it).
        self._fine_for = threading.local()

    def made_for(self, state: JobState) -> bool:
        """Whether keyframes are made for this job (on, and it is big enough)."""
        return bool(self.every_s) and self.render is not None and \
            len(state.rank_index()) >= self.min_ranks

    def opened(self, job_id: int, state: JobState, now: float) -> float | None:
        """Writer thread, states lock held, before a batch that arrived at ``now`` is folded:
        the grid moment before ``now`` if this batch is the first after it (the state then
        holds exactly what arrived by then), else None. The caller judges the book through
        that moment and passes both to :meth:`live`."""
        if not self.made_for(state):
            return None
        # The last grid moment before now (a batch that arrived at a grid moment belongs to
        # it: state?at= holds what arrived by then).
        boundary = (math.ceil(now / self.every_s) - 1) * self.every_s
        previous = self._live_period.get(job_id)
        self._live_period[job_id] = boundary
        # Unknown previous period (the first batch since the state was loaded): the state
        # might hold events after the moment already.
        if previous is None or boundary <= previous or not state.last_event_id:
            return None
        if boundary < self._live_after.get(job_id, -math.inf):  # the writer's budget
            self.skipped += 1
            return None
        return boundary

    def live(self, conn: sa.Connection, job_id: int, state: JobState, book: Book | None,
             at: float) -> None:
        """Store the keyframe at the moment :meth:`opened` gave, with the live book judged up
        to it. A book judged past it (the timer ran first) has verdicts from after it: none.
        One not judged up to it is a server behind, holding its verdicts back: the keyframe
        keeps them as the page showed them then (a replay may judge those seconds later)."""
        judged = None if book is None else book.judged_through
        if judged is None or judged > at + 1e-6:
            self.skipped += 1
            return
        start = time.perf_counter()
        self.take(job_id, at, state, book, conn)
        self._live_after[job_id] = at + (time.perf_counter() - start) / self.live_share

    def passing(self, job_id: int, state: JobState, last_at: float, until: float,
                toward: float | None = None) -> list[float]:
        """The moments from ``last_at`` (when the last event folded into ``state`` arrived)
        to ``until`` (exclusive: the next event's arrival) that have no keyframe yet: on the
        grid, and, for a fold toward moment ``toward``, around the incident marks it is
        near. The state holds exactly what arrived by each."""
        every = self.every_s
        if not every or not math.isfinite(last_at):
            return []
        first = math.ceil(last_at / every) * every
        fine = () if toward is None else self._fine_moments(job_id, toward)
        i = bisect.bisect_left(fine, last_at)
        # (most events pass none: cheap first)
        if first >= until and (i == len(fine) or fine[i] >= until):
            return []
        if not self.made_for(state):
            return []
        moments = set()
        k = first
        while k < until:
            moments.add(k)
            k = round(k + every, 6)
        while i < len(fine) and fine[i] < until:
            moments.add(fine[i])
            i += 1
        known, wanted = self._known(job_id), self.store.keyframes.wanted
        # (not one compaction removed)
        return [k for k in sorted(moments) if k not in known and wanted(job_id, k)]

    def _fine_moments(self, job_id: int, toward: float) -> list[float]:
        """The moments around those of the job's incident marks that ``toward`` is near
        (FINE_BEFORE_S before the mark to FINE_AFTER_S after), sorted: a scrub to an
        incident stores that incident's, not every one it passes on its way."""
        held = getattr(self._fine_for, "held", None)
        if held is not None and held[0] == (job_id, toward):
            return held[1]
        steps = range(-round(FINE_BEFORE_S / FINE_S), round(FINE_AFTER_S / FINE_S) + 1)
        fine = sorted({mark + k * FINE_S for mark in self.marks_of(job_id)
                       if mark - FINE_BEFORE_S <= toward <= mark + FINE_AFTER_S
                       for k in steps})
        self._fine_for.held = ((job_id, toward), fine)
        return fine

    def marks_of(self, job_id: int) -> list[float]:
        """The job's first MAX_MARKS incident marks (its stored findings'; a running job's
        are read again after MARKS_TTL_S)."""
        now = time.monotonic()
        held = self._marks.get(job_id)
        if held is None or now - held[0] >= MARKS_TTL_S:
            held = (now, marks(incidents(self.store.findings.of_job(job_id)))[:MAX_MARKS])
            with self._lock:
                _remember(self._marks, job_id, held)
        return held[1]

    def stored(self, job_id: int, at: float) -> bool:
        """Whether the job has a keyframe at ``at`` (stored or on its way)."""
        return at in self._known(job_id)

    def near(self, job_id: int, at: float, within: float) -> bytes | None:
        """What ``render`` made of the job's newest keyframe in [at - within, at], or None."""
        found = self.store.keyframes.newest(job_id, at - within, at)
        if found is None:
            return None
        try:
            return zlib.decompress(found[1])
        except zlib.error:
            log.error("pgdash: keyframe of job %s at %s unreadable; folding instead",
                      job_id, found[0])
            return None

    def drop(self, job_id: int) -> None:
        """The job's live state was let go (Ingest's cache): its next batch is a first."""
        self._live_period.pop(job_id, None)
        self._live_after.pop(job_id, None)

    def _known(self, job_id: int) -> set[float]:
        with self._lock:
            known = self._moments.get(job_id)
            if known is None:
                known = self.store.keyframes.moments(job_id)
            _remember(self._moments, job_id, known)
            return known

    def take(self, job_id: int, at: float, state: JobState, book: Book,
             conn: sa.Connection | None = None) -> None:
        """Store the keyframe at ``at`` of ``state`` and ``book`` (exactly those at ``at``:
        the live fold's, in its transaction ``conn``, or a moment :meth:`passing` listed,
        through the writer)."""
        try:
            raw = self.render(state, book, at)
        except Exception:  # a keyframe is an optimisation: the moment is folded instead
            self.failed += 1
            if self.failed == 1:  # the rest are counted (PGDASH /metrics)
                log.exception("pgdash: keyframe of job %s at %s not rendered; scrubbing "
                              "folds the moments instead", job_id, at)
            return
        with self._lock:  # (live: once per period by itself, so only where a scrub remembers)
            known = self._moments.get(job_id)
            if known is not None:
                known.add(at)
        self.made += 1
        # Compressed here (15 ms at 1,024 ranks): a thread of its own cost the server tens
        # of megabytes of memory (glibc gives each allocating thread its own heap).
        data = zlib.compress(raw, LEVEL)
        del raw
        if conn is not None:  # the live fold's own transaction
            self.store.keyframes.save(conn, job_id, at, data)
            return
        try:
            self.store.writer.submit_nowait(
                lambda conn: self.store.keyframes.save(conn, job_id, at, data))
        except (queue.Full, WriterStopped):  # overloaded or stopping: a later fold stores it
            self.failed += 1
            with self._lock:
                self._moments.get(job_id, set()).discard(at)


def _remember(cache: collections.OrderedDict, job_id: int, value: object) -> None:
    """``value`` as the job's entry of ``cache``, the most recently used of its KNOWN_JOBS
    (the least recently used beyond them let go). The caller holds the lock."""
    cache[job_id] = value
    cache.move_to_end(job_id)
    while len(cache) > KNOWN_JOBS:
        cache.popitem(last=False)
