"""Replay: a job's state and findings book folded together through its log (``Timeline``), and
the live book's stored history read back instead of judged again (``BookLog``).

The book itself (dashboard.diagnosis.book) says how findings become a lifecycle on one grid of
moments; this module is what walks a job's stored log along that grid after the fact: for
``pgdash replay`` (dashboard.history.archive), ``state?at=`` (dashboard.history.rewind) and
checkpoints of either. Live ingest folds the same :class:`Timeline` around a state and book it
advances in step (``Timeline.of``).

A Timeline is as picklable as the JobState and Book it holds: it travels in checkpoints
(dashboard.storage.codec lists it). No Flask, no SQL, no clock.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from dashboard.diagnosis.book import Book, Changes, LogRow, copy_book
from dashboard.diagnosis.core import Settings
from dashboard.state import JobState, StoredEvent


class BookLog:
    """A live book's stored history (dashboard.storage.store's ``book_log``), covering every grid
    moment from ``start`` to ``through``: the book as of any of them, read instead of judged.

    A replay that judged those moments again would come to the same findings (one grid, one
    book: see dashboard.diagnosis.book's docstring), at the cost of one diagnosis per moment,
    which a 256-rank job pays at 45-80 ms each; ``state?at=`` and a server's restart read them.

    Args:
        settings: the book's settings (the grid).
        start, through: the moments covered (the book judged every grid moment between).
        read: ``read(until) -> (rows, judged)``: the finding rows (``id`` not "") up to
            ``until`` in order, and the last marker moment up to ``until`` (or None).
    """

    def __init__(self, settings: Settings, start: float, through: float,
                 read: Callable[[float], tuple[list[LogRow], float | None]]):
        self.settings, self.start, self.through, self._read = settings, start, through, read

    def covers_before(self, received_at: float) -> bool:
        """Whether every moment due before an event received at ``received_at`` is covered."""
        g = self.settings.diagnose_every
        return math.ceil(received_at / g) - 1 <= round(self.through / g)

    def book_at(self, at: float) -> Book:
        """The book as it was at moment ``at`` (at most ``through``), judged through it."""
        at = min(at, self.through)
        rows, judged = self._read(at)
        latest: dict[str, LogRow] = {}
        for row in rows:
            latest[row.id] = row
        known = []
        for row in latest.values():
            f = row.finding
            if f["active"] and judged is not None and judged > row.at:
                f = {**f, "last_seen": judged}  # still active when the book last judged
            known.append(f)
        book = Book(self.settings, known)
        book.ticked = math.floor(at / self.settings.diagnose_every + 1e-9)
        return book


class Timeline:
    """A job's state and book advanced together through its log, in log order: what
    replay and ``state?at=`` fold. Quacks as much like JobState as dashboard.history.rewind needs
    (``apply``, ``sessions``), and is as picklable.

    Given a :class:`BookLog` (:meth:`use_log`), the moments it covers are read from it,
    not judged: the book is then made from the log when the fold passes its end."""

    def __init__(self, job_id: int, name: str, settings: Settings = Settings()):
        self.state = JobState(job_id, name)
        self.book: Book | None = Book(settings)  # None: moments up to the log's end are read
        self.changes: list[Changes] | None = None  # kept only when asked (archive.replay)
        self.log: BookLog | None = None
        self.log_from = 0.0  # the start of the log the book was left to
        self.recording = False  # whether the book records its history (record)

    @classmethod
    def of(cls, state: JobState, book: Book) -> "Timeline":
        """A timeline of a state and book advanced elsewhere (live ingest) in step."""
        timeline = cls.__new__(cls)
        timeline.state, timeline.book, timeline.changes, timeline.log = state, book, None, None
        timeline.log_from, timeline.recording = 0.0, False
        return timeline

    def __getstate__(self) -> dict[str, Any]:
        # The log is read again by whoever loads it; a stored timeline records nothing.
        return {**self.__dict__, "log": None, "recording": False}

    def __setstate__(self, data: dict[str, Any]) -> None:
        self.__dict__.update({"log": None, "log_from": 0.0, "recording": False, **data})

    def use_log(self, log: BookLog | None) -> bool:
        """Read the moments ``log`` covers instead of judging them, where it covers every
        moment this timeline's book has not judged. False if the timeline cannot go on: its
        book was left to a log (it came from a checkpoint) that no longer covers its state."""
        book, self.log = self.book, None
        if log is None:
            return book is not None
        if book is None:  # left to a log before: this one must cover as much
            if log.start > self.log_from or (self.state.last_event_at is not None and
                                             not log.covers_before(self.state.last_event_at)):
                return False
        elif book.ticked is not None and not log.start <= book.judged_through <= log.through:
            return True  # the book has judged past the log, or the log starts too late
        self.log, self.log_from = log, log.start
        self.book = None  # a fresh book: whether the log starts early enough, the first
        return True       # event says (apply)

    def record(self) -> None:
        """Have the book record its history (Book.record), also a book made from the log."""
        self.recording = True
        if self.book is not None:
            self.book.record()

    @property
    def sessions(self) -> dict[str, Any]:
        return self.state.sessions

    @property
    def job_id(self) -> int:
        return self.state.job_id

    @property
    def last_event_id(self) -> int:
        return self.state.last_event_id

    @property
    def judged_through(self) -> float | None:
        return self.current_book().judged_through

    def current_book(self) -> Book:
        """The book, made from the log at its end if the fold has not passed it yet."""
        if self.book is None:
            self.book = self.log.book_at(self.log.through)
            last = self.state.last_event_at
            if last is not None and last < self.log.through:
                # Live judged this state after its last event: an ended job's book may be
                # settled (Book.settled), as live's was, rather than judge again.
                self.book._applied = self.state.applied
            if self.recording:
                self.book.record()
        return self.book

    def apply(self, ev: StoredEvent) -> None:
        """Judge the moments due before ``ev`` arrived, then fold it."""
        if self.book is None:
            if not self.state.applied and self.log.start > ev["received_at"]:
                self.book, self.log = Book(self.log.settings), None  # a log begun later
                if self.recording:
                    self.book.record()
            elif self.log.covers_before(ev["received_at"]):
                self.state.apply(ev)  # the log has those moments
                return
        book = self.current_book()
        if book.ticked is None:
            book.start(ev["received_at"])
        else:
            self._keep(book.tick_before(self.state, ev["received_at"]))
        self.state.apply(ev)

    def advance(self, at: float) -> None:
        """Judge the moments due up to ``at`` (no event received by then may come later)."""
        self._keep(self.current_book().tick_through(self.state, at))

    def settled_book(self, at: float) -> Book:
        """The book as of ``at`` where no event received by ``at`` is still to come (a fold
        passing it): the moments due up to ``at`` are judged on this timeline's own book,
        as the next event would have them."""
        if self.log is None or at > self.log.through:
            self.advance(at)
        return self.book_at(at)

    def book_at(self, at: float) -> Book:
        """The book as of ``at``, leaving this timeline where it is (a cursor that a later
        event continues from must not have judged moments past that event)."""
        if self.log is not None and at <= self.log.through:
            return self.log.book_at(at)
        book = copy_book(self.current_book())
        book.tick_through(self.state, at)
        return book

    def _keep(self, changes: list[Changes]) -> None:
        if self.changes is not None:
            self.changes.extend(changes)
