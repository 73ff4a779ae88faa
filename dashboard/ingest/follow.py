"""Clustered ingest (several server processes, dashboard.cluster): fold the shared log's tail
into the jobs held here, adopt jobs this process comes to own, say when one needs no owner.

The cluster's threads drive it (dashboard.cluster.node); it knows nothing of leases: the
``owns`` it is given says which jobs this process diagnoses and stores the rows of.
"""

from __future__ import annotations

import collections
import queue
from typing import Any, Callable

from dashboard.ingest.lag import IngestLag
from dashboard.ingest.livebooks import LiveBooks
from dashboard.ingest.statecache import Changed, StateCache
from dashboard.storage.log import load_body
from dashboard.storage.store import Store


class LogFollower:
    """Args:
        store: the shared database.
        cache: the jobs' states held in memory.
        books: their findings books.
        lag: the server's lag (here it includes the time events took through the database).
        clock: wall clock.
        counters: Ingest's counters.
        changed: told of each job that changed.
        owns: whether this process owns a job.
    """

    def __init__(self, store: Store, cache: StateCache, books: LiveBooks, lag: IngestLag,
                 clock: Callable[[], float], counters: collections.Counter[str],
                 changed: Changed, owns: Callable[[int], bool]):
        self.store, self.cache, self.books, self.lag = store, cache, books, lag
        self.clock, self.counters, self.changed, self.owns = clock, counters, changed, owns

    def follow(self, poll: Callable[[], list[dict[str, Any]]]) -> int:
        """Fold what ``poll()`` reads of the log's tail (read under the states lock, so a
        job loaded meanwhile stops where the tail goes on); returns the rows read."""
        with self.cache.lock:
            rows = poll()
            if rows:
                self.apply_logged(rows)
        return len(rows)

    def adopt(self, job_id: int) -> None:
        """This process now owns the job (new, or taken over from a dead owner): hold its
        state and bring its row in ``jobs`` up to what the log says."""
        with self.cache.lock:
            state = self.cache.state(job_id)
            summary = state.summary() if state is not None else None
            self.changed.job(job_id)
        if summary is not None:
            self.store.writer.submit(lambda conn: self.store.jobs.update(conn, job_id, summary))
            self.changed.jobs_list.set()

    def settled(self, job_id: int) -> bool:
        """Whether an owned job needs no owner any more (ended and diagnosed since its last
        event, or no longer held here)."""
        with self.cache.lock:
            state = self.cache.held(job_id)
            return state is None or self.books.settled(job_id, state)

    def apply_logged(self, rows: list[dict[str, Any]]) -> None:
        """Fold rows read from the log's tail into the jobs held in memory (states lock
        held); the owner stores the jobs' changed summaries."""
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
            self.changed.job(job_id)
            after = self.cache.held(job_id).summary()
            if after != before and self.owns(job_id):
                # Not waiting: the writer thread may need the states lock held here.
                try:
                    self.store.writer.submit_nowait(
                        lambda conn, j=job_id, a=after: self.store.jobs.update(conn, j, a))
                    self.changed.jobs_list.set()
                except queue.Full:
                    self.counters["dropped_job_updates"] += 1
