"""The live push: sends watching browsers a snapshot of their job, then throttled deltas.

It only renders: ingest says what changed (``ingest.changed``) and when a round of live
diagnosis ended (``ingest.diagnosis.subscribe``); the push computes the page's sections of
those jobs (dashboard.web.live) and sends each room what its members do not have yet.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask_socketio import SocketIO, join_room

from pgdash_agent.wire import UI_NAMESPACE
from dashboard.ingest.lag import LAG_WARN_S
from dashboard.ingest.pipeline import Ingest
from dashboard.web.joblist import jobs_payload
from dashboard.web.live import Feed, ViewCache, sections

log = logging.getLogger("pgdash.server")


class LivePush:
    """Sends watching browsers a snapshot of their job, then throttled deltas of it.

    At most one message per job per ``interval`` goes to its room, whatever the rank count;
    the message format is in :mod:`dashboard.web.live`. A lock keeps the push thread and a new
    watcher's snapshot in one order, so every delta a room gets applies to what each of its
    members has.

    Args:
        socketio: the server's Socket.IO (its ``/ui`` namespace).
        ingest: what it shows.
        interval: seconds between two messages to one job's room (``PGDASH_PUSH_INTERVAL``).
        cluster: with several server processes, this one's
            :class:`dashboard.cluster.node.Membership` (only a job's owner pushes it).
    """

    def __init__(self, socketio: SocketIO, ingest: Ingest, interval: float, cluster=None):
        self.socketio = socketio
        self.ingest = ingest
        self.interval = interval
        self.cluster = cluster
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._feeds: dict[int, Feed] = {}  # watched jobs: what their rooms were sent last
        self._pushed_at: dict[int, float] = {}  # job id -> when it was last sent (monotonic)
        self._judged_at: dict[int, float] = {}  # job id -> the event time its feed was judged at
        self._rejudge = threading.Event()  # a diagnosis round ended: judge every feed again
        self.cache = ViewCache()
        ingest.diagnosis.subscribe(self._rejudge.set)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgdash-push", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _sections(self, job_id: int) -> dict[str, Any] | None:
        # Judged at the server's event time, the same function replay uses (state?at=).
        at = self.ingest.judged_at()
        found = self.ingest.findings(job_id)
        if found is None:
            return None
        self._judged_at[job_id] = at
        return self.ingest.read(job_id, lambda s: sections(
            s, self.cache, at=at, findings=found, settings=self.ingest.settings))

    def watch(self, job_id: int, sid: str) -> bool:
        """Bring the job's room up to date, then add ``sid`` with a snapshot; False if there
        is no such job."""
        if self.cluster is not None and not self.cluster.owns(job_id) and \
                self.cluster.leases.owner_of(job_id) is not None:
            # Another process owns it: its deltas reach this room through the message
            # queue, and it sends the snapshot they build on.
            if self.ingest.store.jobs.get(job_id) is None:
                return False
            join_room(self._room(job_id), sid=sid, namespace=UI_NAMESPACE)
            self.cluster.request_snapshot(job_id, sid)
            return True
        self.ingest.ready(job_id)  # an ended job's fold, before every page's deltas wait
        with self._lock:
            if not self._push(job_id):
                return False
            join_room(self._room(job_id), sid=sid, namespace=UI_NAMESPACE)
            self.socketio.emit("job", self._snapshot(job_id), to=sid, namespace=UI_NAMESPACE)
            return True

    def _snapshot(self, job_id: int) -> dict[str, Any]:
        return {**self._feeds[job_id].snapshot(job_id), **self._clock_fields(),
                "at": self._judged_at.get(job_id)}

    def _clock_fields(self) -> dict[str, Any]:
        """The server's time, and how far behind the agents its ingest is when that is worth
        saying (dashboard.ingest.lag: verdicts are held that long); the page shows them as given."""
        lag = self.ingest.lag.current()
        return {"server_time": self.ingest.clock(),
                "server_behind_s": round(lag, 1) if lag >= LAG_WARN_S else None}

    def send_snapshot(self, job_id: int, sid: str) -> None:
        """Clustered: a browser on another process watches a job this one owns."""
        with self._lock:
            if self._push(job_id):
                self.socketio.emit("job", self._snapshot(job_id), to=sid,
                                   namespace=UI_NAMESPACE)

    @staticmethod
    def _room(job_id: int) -> str:
        return f"job:{job_id}"

    def _push(self, job_id: int) -> bool:
        """Under the lock: send the job's room what changed since it was last sent."""
        fresh = self._sections(job_id)
        if fresh is None:
            return False
        self._pushed_at[job_id] = time.monotonic()
        feed = self._feeds.get(job_id)
        if feed is None:
            # Clustered, a job's next owner starts a feed of its own: versions that its
            # watchers cannot mistake for the last owner's (they then ask for a snapshot).
            first = 1 if self.cluster is None else int(time.time() * 1000) % 2**31
            self._feeds[job_id] = Feed(fresh, version=first)
            return True
        message = feed.advance(job_id, fresh)
        if message is not None:
            message.update(self._clock_fields(), at=self._judged_at.get(job_id))
            self.socketio.emit("job_delta", message, to=self._room(job_id),
                               namespace=UI_NAMESPACE)
        return True

    def _watched(self, job_id: int) -> bool:
        """Whether any browser watches the job (an unwatched job costs nothing)."""
        if self.cluster is not None:
            return True  # watchers on other processes are not visible from here
        try:
            participants = self.socketio.server.manager.get_participants(
                UI_NAMESPACE, self._room(job_id))
            return next(iter(participants), None) is not None
        except (AttributeError, KeyError):
            return True  # a manager without that API: push as before

    def _run(self) -> None:
        jobs_pushed_at = 0.0  # when the jobs list was last sent
        waiting: set[int] = set()  # changed jobs not pushed yet (throttled)
        changed = self.ingest.changed
        # Wake often, push each changed job as soon as its own interval allows: an update
        # waits ~0.05 s for the loop instead of half an interval on average.
        tick = min(self.interval, 0.05)
        while not self._stop.wait(tick):
            try:
                started = time.monotonic()
                if self._rejudge.is_set():
                    # A rank's display state changes with time alone (a wait turns into
                    # "behind"): judge every watched job again; unchanged sends nothing.
                    self._rejudge.clear()
                    waiting |= set(self._feeds)
                if changed.jobs_list.is_set() and started - jobs_pushed_at >= self.interval:
                    changed.jobs_list.clear()
                    jobs_pushed_at = started
                    self.socketio.emit("jobs", jobs_payload(self.ingest), to="jobs",
                                       namespace=UI_NAMESPACE)
                waiting |= changed.take()
                if self.cluster is not None:  # only the owner pushes a job
                    waiting = {j for j in waiting if self.cluster.owns(j)}
                for job_id in sorted(waiting):
                    if time.monotonic() - self._pushed_at.get(job_id, 0.0) < self.interval:
                        continue
                    waiting.discard(job_id)
                    self.ingest.ready(job_id)
                    with self._lock:
                        if self._watched(job_id):
                            self._push(job_id)
                        else:  # nobody left to send deltas to: the next watcher starts anew
                            self._feeds.pop(job_id, None)
            except Exception:
                log.exception("pgdash: live push failed; retrying next interval")
