"""When live diagnosis runs: the timer that judges the findings books' grid as time passes,
and tells its subscribers when a round ended.

Batches judge the moments due before them as they are folded (dashboard.ingest.livebooks);
this thread judges the moments that no batch has judged yet, so a rank that went silent is
found silent. The live push subscribes: a rank's display state changes with time alone (a
wait turns into "behind"), so after a round every watched job is judged again for the page.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from dashboard.config import DIAGNOSE_EVERY_S
from dashboard.ingest.lag import IngestLag
from dashboard.ingest.livebooks import LiveBooks
from dashboard.ingest.statecache import StateCache

log = logging.getLogger("pgdash.server")


class LiveDiagnosis:
    """Args:
        cache: the jobs' states held in memory.
        books: their findings books.
        lag: the server's lag (a pause is said before anything is judged).
        owns: whether this process diagnoses a job (clustered: its owner only).
        tick_s: how often the timer wakes.
    """

    def __init__(self, cache: StateCache, books: LiveBooks, lag: IngestLag,
                 owns: Callable[[int], bool], tick_s: float = 0.05):
        self.cache, self.books, self.lag, self.owns = cache, books, lag, owns
        self.tick_s = tick_s
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called on the timer's thread after each round; must not block."""
        self._listeners.append(listener)

    def run(self) -> None:
        """Judge the grid's moments due by now (less the server's lag, when behind) for
        every job held here that this process owns; store and mark what changed."""
        with self.cache.lock:
            changed = self.books.tick_all(self.cache.items(), self.owns)
            logs = self.books.take_logs(self.owns)
        for job_id, found in changed.items():
            self.books.save(job_id, found)
        if not self.books.save_logs(logs):
            with self.cache.lock:
                self.books.stop_recording(job_id for job_id, *_ in logs)

    def start(self) -> "LiveDiagnosis":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pgdash-diagnosis",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        next_round = 0.0
        while not self._stop.wait(self.tick_s):
            self.lag.check_pause()  # a pause is said before anything is judged
            started = time.monotonic()
            if started < next_round:
                continue
            try:
                # Diagnosis of a 1,024-rank job takes ~45 ms of a GIL it shares with ingest:
                # judge the moments of the findings book's grid (every 0.5 s) that no batch
                # has judged yet, at most a quarter of the time.
                self.run()
                for listener in self._listeners:
                    listener()
            except Exception:
                log.exception("pgdash: live diagnosis failed; retrying next interval")
            next_round = started + max(DIAGNOSE_EVERY_S, 4 * (time.monotonic() - started))
