"""The live fold: on the writer thread, a batch's new events are stored and folded into
the job's state, in the order of the log.

One task per batch, in one transaction: drop what the session stored already (admission),
insert the rest, judge the findings book's moments due before the batch arrived
(dashboard.ingest.livebooks), store a checkpoint and a keyframe when the batch opens a new
period (dashboard.history.rewind, dashboard.history.keyframes), fold, store the job's changed
summary and mark the job changed.
Clustered, the log's tail folds instead (dashboard.ingest.follow); as the server stops, the
batches still queued are only stored.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Callable

from dashboard.history.keyframes import Keyframes
from dashboard.history.rewind import Rewind
from dashboard.ingest.admission import Admission
from dashboard.ingest.lag import LAG_WARN_S, IngestLag
from dashboard.ingest.livebooks import LiveBooks
from dashboard.ingest.statecache import Changed, StateCache
from dashboard.state import StoredEvent
from dashboard.storage.store import Store


class LiveFold:
    """Args:
        store: the database.
        admission: what each session stored already.
        cache: the jobs' states held in memory.
        books: their findings books.
        rewind: stores checkpoints of the live fold.
        keyframes: stores the page's answer at moments of the live fold.
        lag: the server's lag.
        counters: Ingest's counters.
        changed: told of each job that changed.
        cluster: with several server processes, this one's membership (``touch``).
    """

    def __init__(self, store: Store, admission: Admission, cache: StateCache, books: LiveBooks,
                 rewind: Rewind, keyframes: Keyframes, lag: IngestLag,
                 counters: collections.Counter[str], changed: Changed, cluster: Any = None):
        self.store, self.admission, self.cache, self.books = store, admission, cache, books
        self.rewind, self.keyframes, self.lag, self.counters = rewind, keyframes, lag, counters
        self.changed, self.cluster = changed, cluster
        # Set as the server stops: batches still queued are stored, not folded or judged (a
        # restart folds the log from the last checkpoint, as after a crash).
        self.draining = False
        # Told of each job big enough for keyframes that ended (its summary's ended_at set
        # by a batch), on the writer thread before the batch is committed; must not block.
        self.ended: Callable[[int], None] | None = None

    def write(self, conn, session: str, job_id: int, evs: list[dict[str, Any]]) -> int:
        """Writer thread: drop what is already stored, insert the rest, fold it into state."""
        fresh, last = self.admission.fresh(session, evs)
        self.counters["duplicate_events"] += len(evs) - len(fresh)
        if not fresh:
            sent = newest_sent(evs)
            if sent is not None:  # all sent again: what was received is folded already
                self.lag.read_through(session, sent)
            return 0
        with self.books.stamping() as now:
            ids = self.store.log.insert(conn, job_id, session, fresh, now,
                                        want_ids=self.cluster is None)
            self.admission.stored(session, last)
            self.counters["stored_events"] += len(fresh)
            if self.cluster is not None:  # the log's tail folds it, here and in the owner
                self.cluster.touch(job_id)
                return len(fresh)
            if self.draining:
                return len(fresh)
            with self.cache.lock:
                state = self.cache.state(job_id)
                before = state.summary()
                # The moments due before this batch arrived are judged without it.
                # A stored checkpoint when this batch opens a new period: the state and the
                # book as a replay would have them (dashboard.history.rewind).
                self.rewind.checkpoint_live(conn, self.books.timeline(job_id, state), now)
                self.lag.check_pause()  # the writer may be first to run after a pause
                # A batch far later than its session's usual (the server stood still) says
                # the others' news is late too: the moments it spans wait (dashboard.ingest.lag).
                newest = newest_sent(fresh)
                late = 0.0 if newest is None else self.lag.lateness(session, newest, now)
                late = late if late > LAG_WARN_S else 0.0
                keyframe = self.keyframes.opened(job_id, state, now)
                if keyframe is not None:  # the page's answer at the moment this batch is after
                    self.books.before_fold(conn, job_id, state,
                                           math.nextafter(keyframe, math.inf), late)
                    self.keyframes.live(conn, job_id, state, self.books.held(job_id),
                                        keyframe)
                self.books.before_fold(conn, job_id, state, now, late)
                for event_id, ev in zip(ids, fresh):
                    stored: StoredEvent = {"id": event_id, "session": session,
                                           "seq": ev.get("seq"), "t": ev["t"],
                                           "received_at": now, "kind": ev["kind"],
                                           "body": ev["body"]}
                    state.apply(stored)
                after = state.summary()
                ends_now = after["ended_at"] is not None and before["ended_at"] is None
                if ends_now:  # what opening it later starts from (Ingest.ready)
                    self.rewind.checkpoint_end(self.books.timeline(job_id, state), now)
                ended = ends_now and self.keyframes.made_for(state)  # incident frames
        if newest is not None:
            self.lag.folded(session, newest, now)
        if after != before:
            self.store.jobs.update(conn, job_id, after)
            if ended and self.ended is not None:
                self.ended(job_id)
        self.changed.job(job_id, list_changed=after != before)
        return len(fresh)


def newest_sent(events: list[Any]) -> float | None:
    """The newest event time (the agent's clock) among events an agent sent (server events,
    without a seq, have the server's). Events not validated yet (a batch refused before it
    was read) count where their seq and time are numbers."""
    return max((t for ev in events if isinstance(ev, dict) and ev.get("seq") is not None
                and type(t := ev.get("t")) in (float, int) and math.isfinite(t)), default=None)
