"""The state cache: jobs' folded JobStates held in memory, loaded from the log on first use.

Live jobs stay held; ended ones beyond ``max_cached_jobs`` are let go (least recently used
first) and folded again from the log when next asked for. One re-entrant lock guards the
held states: whoever applies events or reads a state holds it.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Iterator

from dashboard.statuses import ENDED
from dashboard.state import JobState
from dashboard.storage.store import Store



class StateCache:
    """Args:
        store: the database (a job's name, for the load).
        load: ``(job_id, name) -> JobState``: the job folded from its log.
        max_cached_jobs: ended jobs kept folded in memory; live ones always are.
        evicted: told of each job let go.
    """

    def __init__(self, store: Store, load: Callable[[int, str], JobState],
                 max_cached_jobs: int = 32, evicted: Callable[[int], None] = lambda job: None):
        self.store, self._load = store, load
        self.max_cached_jobs = max_cached_jobs
        self._evicted = evicted
        self.lock = threading.RLock()
        self._held: collections.OrderedDict[int, JobState] = collections.OrderedDict()

    def state(self, job_id: int) -> JobState | None:
        """The folded state of a job (loaded from the log on first use); None if unknown."""
        with self.lock:
            state = self._held.get(job_id)
            if state is not None:
                self._held.move_to_end(job_id)
                return state
        job = self.store.jobs.get(job_id)
        if job is None:
            return None
        with self.lock:
            state = self._held.get(job_id)
            if state is None:
                state = self._held[job_id] = self._load(job_id, job["name"])
                self._evict()
            return state

    def held(self, job_id: int) -> JobState | None:
        """The state if held now (never loads)."""
        return self._held.get(job_id)

    def add(self, job_id: int, state: JobState) -> None:
        with self.lock:
            self._held[job_id] = state
            self._evict()

    def items(self) -> Iterator[tuple[int, JobState]]:
        """The held states (a copy of the list: callers may load others meanwhile)."""
        return iter(list(self._held.items()))

    def clear(self) -> None:
        with self.lock:
            for job_id in list(self._held):
                del self._held[job_id]
                self._evicted(job_id)

    def _evict(self) -> None:
        for job_id in list(self._held):
            if len(self._held) <= self.max_cached_jobs:
                return
            if self._held[job_id].status in ENDED:
                del self._held[job_id]
                self._evicted(job_id)


class Changed:
    """What changed since a reader last looked: jobs whose state or findings changed, and
    whether the jobs list did. Ingest marks; whoever shows jobs (the live push) takes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: set[int] = set()
        self.jobs_list = threading.Event()  # set when a job's row (or incident count) changed

    def job(self, job_id: int, list_changed: bool = False) -> None:
        with self._lock:
            self._jobs.add(job_id)
        if list_changed:
            self.jobs_list.set()

    def take(self) -> set[int]:
        """The jobs changed since the last call."""
        with self._lock:
            jobs, self._jobs = self._jobs, set()
            return jobs
