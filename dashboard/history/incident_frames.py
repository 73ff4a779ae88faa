"""Incident frames: an ended job folded toward each of its incident marks in the background,
so that the keyframes around them (dashboard.history.keyframes: a second apart, from
FINE_BEFORE_S before each mark to FINE_AFTER_S after) are stored before anyone scrubs there.

The live fold asks for it as a job ends, and the page as it opens one (``GET
/api/jobs/<id>/incidents``: a job stored before, or by another server): the first visit to an
incident of a big job then shows it at once, second by second, where it would fold seconds
of log first (~20 s at 1,024 ranks). Jobs that get no keyframes (too small: their moments fold
in a fraction of a second), and running ones (their incidents are still being judged), are
left alone.

Its folds run on a Rewind of their own (no in-memory copies, its own lock), so a user's
scrub never waits for one; they share the process (its CPU, its interpreter lock) with
ingest, so they are paced (dashboard.pacing: a quarter of the time, in slices of work), one
job at a time, at most JOBS waiting, each asked once per process; a mark whose moments are
stored already is skipped (after a restart a job costs a read per mark); and while the
server is behind its agents they wait, live ingest first, giving the job up after
BEHIND_WAIT_S.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from dashboard.history.keyframes import FINE_AFTER_S, FINE_BEFORE_S, FINE_S, Keyframes
from dashboard.history.rewind import Rewind
from dashboard.pacing import GaveUp, Pace, Stopped
from dashboard.storage.store import Store
from dashboard.storage.writer import WriterStopped

log = logging.getLogger("pgdash.incident_frames")

JOBS = 8  # jobs waiting at most; more are not asked (the page asks again on its next visit)
BEHIND_WAIT_S = 120.0
SETTLE_S = 5.0  # a job the live fold saw end is prepared this much later (stored by then)


class IncidentFrames:
    """Args:
        store: the database.
        keyframes: the server's (what it stores, which marks a job has, whether a job is big
            enough).
        rewind: the folds' own (Ingest makes it like its own, without copies); its pace
            becomes this object's.
        prepare: ``job id -> `` what readies a fold's first state (Ingest.replay's: the
            job's stored book log).
        behind: whether the server is behind its agents now.
    """

    def __init__(self, store: Store, keyframes: Keyframes, rewind: Rewind,
                 prepare: Callable[[int], Callable[[Any], bool]],
                 behind: Callable[[], bool]):
        self.store, self.keyframes, self.rewind = store, keyframes, rewind
        self.prepare = prepare
        self._stop = threading.Event()
        self.pace = rewind.pace = Pace(behind, self._stop, give_up_s=BEHIND_WAIT_S)
        self.marks_folded = 0  # marks whose moments a fold here stored (/metrics, the bench)
        self._asked: set[int] = set()
        self._queue: queue.Queue[tuple[int, float] | None] = queue.Queue(JOBS)  # (job, when)
        self.settle_s = SETTLE_S
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def ask(self, job_id: int) -> bool:
        """Have the moments around the job's incident marks stored, in the background (once
        per process); False if it was asked before, the job gets none (running, or too
        small for keyframes) or there is no room now."""
        return self._ask(job_id, self._job_row(job_id) is not None, 0.0)

    def ended(self, job_id: int) -> None:
        """The live fold saw the job end (writer thread, its row not committed yet): asked
        once the writer committed that (a task queued behind it is done), and SETTLE_S
        later, when its findings are stored too."""
        try:
            committed = self.store.writer.submit_nowait(lambda conn: None, bounded=False)
        except WriterStopped:
            return
        committed.add_done_callback(lambda _: self._ask(job_id, True, self.settle_s))

    def _ask(self, job_id: int, wanted: bool, after_s: float) -> bool:
        with self._lock:
            if not wanted or job_id in self._asked or self._stop.is_set():
                return False
            try:
                self._queue.put_nowait((job_id, time.monotonic() + after_s))
            except queue.Full:
                return False
            self._asked.add(job_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="pgdash-incident-frames")
                self._thread.start()
        return True

    @property
    def jobs(self) -> int:
        """Jobs waiting or under way (/metrics)."""
        return self._queue.unfinished_tasks

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until every job asked so far is done (tests, the bench); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 1.0) -> None:
        """No more jobs; the one under way stops at its next mark."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            asked = self._queue.get()
            try:
                if asked is None or self._stop.is_set():
                    return
                job_id, due = asked
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                self._job(job_id)
            except Stopped:
                return
            except GaveUp:
                log.info("pgdash: job %s's incidents not prepared: the server stayed behind "
                         "its agents for %g s", asked[0], BEHIND_WAIT_S)
            except Exception:  # an optimisation: the page folds the moments instead
                log.exception("pgdash: the moments around job %s's incidents were not "
                              "prepared; scrubbing there folds them instead", asked[0])
            finally:
                self._queue.task_done()

    def _job_row(self, job_id: int) -> dict[str, Any] | None:
        """The job's row if it ended and is big enough for keyframes, else None."""
        job = self.store.jobs.get(job_id)
        frames = self.keyframes
        if (job is None or job["ended_at"] is None or not frames.every_s
                or frames.render is None or (job["world_size"] or 0) < frames.min_ranks):
            return None
        return job

    def _job(self, job_id: int) -> None:
        job = self._job_row(job_id)
        if job is None:
            return
        frames = self.keyframes
        for mark in frames.marks_of(job_id):
            # Done before (by this, or a scrub there) when the seconds just before it are
            # stored: the live server stores none of those, but for one on its grid.
            if self._stop.is_set() or all(frames.stored(job_id, mark - k * FINE_S)
                                          for k in (1, 2, 3)):
                continue
            self.pace.wait_while_behind()
            # From before the first moment (a fold starts from the checkpoint before where
            # it goes), then on through the last: the fold stores those it passes.
            self.pace.start()
            for at in (mark - FINE_BEFORE_S, mark + FINE_AFTER_S):
                self.rewind.view(job_id, job["name"], at, lambda _: None,
                                 prepare=self.prepare(job_id))
            self.marks_folded += 1
