"""Folded states of stored jobs at past moments, kept so that scrubbing does not refold.

``GET /api/jobs/<id>/state?at=`` (and the page's replay slider) asks for the state at one
moment after another. Folding the log from its start each time costs the whole log per
request: minutes for a big job. Rewind keeps, per job, a cursor (the last state it built
and the last event in it) that a later moment continues from, and checkpoints (copies taken
every ``spacing`` log positions while folding, spread out as they grow in number) that an earlier moment starts from. Copies are taken
only of states of at most ``copy_sessions`` agent sessions: a 1,024-rank state is tens of
megabytes, so a big job keeps its cursor alone (forward is cheap, backward refolds).

Moments are arrival times (``received_at``), which the single writer thread stamps in log
order; a state "at T" holds every event that arrived by T.
"""

from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import threading
from typing import Any, Callable, TypeVar

from dashboard.state import JobState
from dashboard.storage import Store

T = TypeVar("T")


@dataclasses.dataclass
class _Point:
    at: float  # when the last event in the state arrived: usable for any moment from then
    last_id: int  # the state holds the events up to this id
    state: Any  # a JobState, or what ``new_state`` makes (with ``apply`` and ``sessions``)


class Rewind:
    """Args:
        new_state: ``(job_id, name) -> `` an empty fold: a JobState by default; Ingest
            folds a ``dashboard.diagnosis.book.Timeline`` (state and findings book), which
            deep-copies and pickles like one.
    """

    def __init__(self, store: Store, max_jobs: int = 4, checkpoints: int = 16,
                 spacing: int = 2000, copy_sessions: int = 256,
                 new_state: Callable[[int, str], Any] = JobState):
        self.store = store
        self.new_state = new_state
        self.max_jobs, self.max_checkpoints = max_jobs, checkpoints
        self.spacing, self.copy_sessions = spacing, copy_sessions
        self._lock = threading.Lock()
        self._cursors: collections.OrderedDict[int, _Point] = collections.OrderedDict()
        self._checkpoints: dict[int, list[_Point]] = {}  # by job, in log order
        self._spacing: dict[int, int] = {}  # by job: events between checkpoints
        self.events_read = 0  # for tests: what scrubbing cost

    def view(self, job_id: int, name: str, at: float, read: Callable[[Any], T]) -> T:
        """``read(state)`` of the job at moment ``at`` (the state is only valid inside)."""
        with self._lock:
            start = self._start(job_id, name, at)
            point = self._fold(job_id, start, at)
            self._cursors[job_id] = point
            self._cursors.move_to_end(job_id)
            while len(self._cursors) > self.max_jobs:
                old, _ = self._cursors.popitem(last=False)
                self._checkpoints.pop(old, None)
                self._spacing.pop(old, None)
            return read(point.state)

    def _start(self, job_id: int, name: str, at: float) -> _Point:
        cursor = self._cursors.pop(job_id, None)
        marks = self._checkpoints.get(job_id, [])
        i = bisect.bisect_right([m.at for m in marks], at)
        best = marks[i - 1] if i else None
        if cursor is not None and cursor.at <= at and (best is None or
                                                       cursor.last_id >= best.last_id):
            return cursor  # continue forward, in place
        if best is not None:
            return _Point(best.at, best.last_id, copy.deepcopy(best.state))
        return _Point(float("-inf"), 0, self.new_state(job_id, name))

    def _fold(self, job_id: int, point: _Point, at: float) -> _Point:
        state, last_id, last_at = point.state, point.last_id, point.at
        marks = self._checkpoints.get(job_id) or []
        marked = max((m.last_id for m in marks if m.last_id <= last_id), default=0)
        for ev in self.store.job_events(job_id, after=last_id):
            self.events_read += 1
            if ev["received_at"] > at:
                break
            state.apply(ev)
            last_id, last_at = ev["id"], ev["received_at"]
            if last_id - marked >= self._spacing.setdefault(job_id, self.spacing):
                marked = last_id
                self._mark(job_id, _Point(last_at, last_id, state))
        return _Point(last_at, last_id, state)

    def _mark(self, job_id: int, point: _Point) -> None:
        if len(point.state.sessions) > self.copy_sessions:
            return
        marks = self._checkpoints.setdefault(job_id, [])
        if any(m.last_id == point.last_id for m in marks):
            return
        marks.append(_Point(point.at, point.last_id, copy.deepcopy(point.state)))
        marks.sort(key=lambda m: m.last_id)
        if len(marks) > self.max_checkpoints:  # keep them spread: every other one, twice
            del marks[1::2]                     # as far apart from now on
            self._spacing[job_id] *= 2
