"""Several server processes on one database: who owns each job, and the shared log's tail.

Contract (see docs/cluster.md for the operator's view):

- Every process stores what its agents send in the shared event log (PostgreSQL). Storing is
  what acknowledges, so an acknowledged event is in the log whatever happens to any process.
- Each live job has ONE owner process, which alone diagnoses it, stores its findings, updates
  its row in ``jobs`` and pushes it to browsers (through the Socket.IO message queue, so a
  browser on any process sees it). Ownership is a lease: a row in ``job_owners`` with an
  expiry, renewed every ``lease_s / 3`` seconds. When the owner dies its leases run out and
  another process claims the job (it scans for live jobs without a live owner every
  ``lease_s / 3``), folds it from the log, and carries on: takeover within about
  ``lease_s + lease_s / 3`` seconds.
- Every process folds the jobs it holds in memory from the log, by tailing the ``events``
  table in id order (:class:`LogTail`); so what a process answers over HTTP is the log's
  state, whichever process the events came through.

Lease times are the processes' wall clocks: keep the hosts' clocks in step (NTP), as a
lease of a few seconds cannot absorb more skew than a fraction of itself.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Iterable

from dashboard.storage.store import Store

log = logging.getLogger("pgdash.cluster")

DEFAULT_LEASE_S = 5.0
# An id missing below ids already committed is a transaction still in flight (ids are taken
# at insert, committed later) or one rolled back (its ids never appear). Wait this long for
# it before passing over it; if it shows up later after all, it is applied late, not lost.
GAP_WAIT_S = 5.0
# Passed-over ids still looked for, and for how long (bounds).
MAX_LATE_IDS = 10_000
LATE_WAIT_S = 120.0


def owner_name() -> str:
    """This process's name in ``job_owners``: host, pid and a random part (pids repeat)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{secrets.token_hex(4)}"


class LogTail:
    """Reads the shared event log forward, in id order, without skipping what commits late.

    Ids are handed out at insert and become visible at commit, so with several writers id
    101 can be visible before 100. The tail delivers the longest run of consecutive ids it
    has seen; a gap holds the run back for at most ``gap_wait`` seconds (then it is passed
    over, and the id, if it ever commits, is delivered late).
    """

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic,
                 gap_wait: float = GAP_WAIT_S, chunk: int = 5000):
        self.store = store
        self.clock = clock
        self.gap_wait = gap_wait
        self.chunk = chunk
        self.cursor = 0  # every id at or below it was delivered or passed over
        self._ahead: dict[int, dict[str, Any]] = {}  # seen above a gap, not delivered yet
        self._gap_since: float | None = None
        self._late: dict[int, float] = {}  # passed-over id -> when
        self.passed_over = 0
        self.late_delivered = 0

    def start_at_end(self) -> None:
        """Begin after the last id stored now (the past is read per job, on demand)."""
        self.cursor = self.store.log.max_id()

    def poll(self) -> list[dict[str, Any]]:
        """Events that became deliverable since the last call, in log order (late ones
        first). Rows are ``StoredEvent`` dicts plus ``job_id``; bodies still JSON text."""
        out = self._late_rows()
        fetched = self.store.log.events_after(self.cursor, self.chunk)
        for row in fetched:
            if row["id"] > self.cursor:
                self._ahead[row["id"]] = row
        while True:
            nxt = self.cursor + 1
            row = self._ahead.pop(nxt, None)
            if row is not None:
                out.append(row)
                self.cursor = nxt
                self._gap_since = None
                continue
            if not self._ahead:
                break
            now = self.clock()
            if self._gap_since is None:
                self._gap_since = now
            if now - self._gap_since < self.gap_wait:
                break
            # Pass over the whole gap up to the next id we hold.
            first = min(self._ahead)
            for missing in range(nxt, first):
                if len(self._late) < MAX_LATE_IDS:
                    self._late[missing] = now
            self.passed_over += first - nxt
            self.cursor = first - 1
            self._gap_since = None
        return out

    def _late_rows(self) -> list[dict[str, Any]]:
        if not self._late:
            return []
        now = self.clock()
        for event_id, since in list(self._late.items()):
            if now - since > LATE_WAIT_S:
                del self._late[event_id]
        rows = self.store.log.events_by_id(list(self._late)[:1000])
        for row in rows:
            self._late.pop(row["id"], None)
        self.late_delivered += len(rows)
        return rows


class Leases:
    """This process's job leases in ``job_owners`` (portable SQL; own short transactions)."""

    def __init__(self, store: Store, owner: str | None = None, lease_s: float = DEFAULT_LEASE_S,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.owner = owner or owner_name()
        self.lease_s = lease_s
        self.clock = clock
        self.owned: set[int] = set()
        self._lock = threading.Lock()
        self.takeovers = 0  # jobs claimed from an owner whose lease had run out
        self.lost = 0  # leases found taken by another process at renewal

    def owns(self, job_id: int) -> bool:
        return job_id in self.owned

    def claim(self, job_id: int) -> bool:
        """Own the job unless another process holds a live lease on it."""
        now = self.clock()
        got, took_over = self.store.owners.claim(job_id, self.owner, now, now + self.lease_s)
        if got:
            with self._lock:
                self.owned.add(job_id)
            self.takeovers += took_over
        return got

    def renew(self) -> set[int]:
        """Extend every lease; returns the jobs that another process took meanwhile."""
        with self._lock:
            owned = set(self.owned)
        if not owned:
            return set()
        kept = self.store.owners.renew(owned, self.owner, self.clock() + self.lease_s)
        lost = owned - kept
        with self._lock:
            self.owned -= lost
        self.lost += len(lost)
        return lost

    def release(self, job_ids: Iterable[int] | None = None) -> None:
        with self._lock:
            ids = set(self.owned if job_ids is None else job_ids) & self.owned
            self.owned -= ids
        if ids:
            self.store.owners.release(ids, self.owner)

    def orphans(self) -> list[int]:
        """Live jobs (not finished or failed) whose owner's lease ran out, or with none."""
        return self.store.owners.orphans(self.clock())

    def owner_of(self, job_id: int) -> str | None:
        return self.store.owners.owner(job_id, self.clock())


WATCH_CHANNEL = "pgdash:watch"  # Redis channel: "send this browser a snapshot of job J"
ASK_CHANNEL = "pgdash:ask"  # Redis channel: "ask these agents' sessions this question"


class Membership:
    """This process's place in the cluster: which jobs it owns (its leases), the log's tail
    it folds from, the jobs it stored events of lately, and the Redis channel on which
    processes ask a job's owner for a browser's snapshot. Built before ingest, which asks it
    ``owns`` and ``touch``; :class:`ClusterNode` runs its threads.

    Args:
        store: the shared database.
        queue_url: the Redis URL shared by the processes (``--queue`` / ``PGDASH_QUEUE``).
        lease_s: lease length (``--lease`` / ``PGDASH_LEASE_S``); takeover within ~4/3 of it.
    """

    def __init__(self, store: Store, queue_url: str, lease_s: float = DEFAULT_LEASE_S):
        import redis

        self.store = store
        self.leases = Leases(store, lease_s=lease_s)
        self.tail = LogTail(store)
        self.redis = redis.Redis.from_url(queue_url)  # connects on first use
        self.tail_read_at = 0.0  # when the tail was last read (time.time)
        self._touched: set[int] = set()  # jobs this process stored events for lately
        self._touched_lock = threading.Lock()

    @property
    def owner(self) -> str:
        return self.leases.owner

    def owns(self, job_id: int) -> bool:
        return self.leases.owns(job_id)

    def touch(self, job_id: int) -> None:
        """This process stored events of the job: make sure somebody owns it."""
        if not self.leases.owns(job_id):
            with self._touched_lock:
                self._touched.add(job_id)

    def take_touched(self) -> set[int]:
        with self._touched_lock:
            touched, self._touched = self._touched, set()
            return touched

    def request_snapshot(self, job_id: int, sid: str) -> None:
        """Ask the job's owner to send browser ``sid`` (on this process) a snapshot."""
        import json

        self.redis.publish(WATCH_CHANNEL, json.dumps({"job": job_id, "sid": sid}))

    def publish_ask(self, sessions: list[str], message: dict[str, Any],
                    reader: tuple[int, str] | None = None) -> None:
        """Hand a question (dashboard.ingest.asks) for agents connected to no connection of
        this process (or for the host reader of ``reader``: (job, host)) to every process:
        those holding one send it."""
        import json

        self.redis.publish(ASK_CHANNEL, json.dumps({"sessions": sessions, "message": message,
                                                    "reader": reader}))

    def exposition(self) -> str:
        """Prometheus lines for this process's part of the cluster (appended to /metrics)."""
        age = time.time() - self.tail_read_at if self.tail_read_at else float("nan")
        figures = [
            ("pgdash_cluster_owned_jobs", "gauge", "Jobs this process owns (diagnoses).",
             len(self.leases.owned)),
            ("pgdash_cluster_takeovers_total", "counter",
             "Jobs this process took over from an owner whose lease ran out.",
             self.leases.takeovers),
            ("pgdash_cluster_leases_lost_total", "counter",
             "Leases another process took while this one held them (a pause past --lease).",
             self.leases.lost),
            ("pgdash_cluster_tail_age_seconds", "gauge",
             "Seconds since this process last read the event log's tail.", age),
            ("pgdash_cluster_tail_held_events", "gauge",
             "Events read but held back behind an id not yet committed.",
             len(self.tail._ahead)),
            ("pgdash_cluster_tail_passed_over_total", "counter",
             "Ids passed over after waiting for them (rolled-back inserts).",
             self.tail.passed_over),
            ("pgdash_cluster_tail_late_total", "counter",
             "Passed-over ids that committed after all and were folded late.",
             self.tail.late_delivered),
        ]
        lines = []
        for name, kind, text, value in figures:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"


class ClusterNode:
    """Runs this process's part of the cluster: tails the log into the jobs held in memory,
    keeps and takes leases, and answers other processes' snapshot requests for owned jobs.

    Args:
        membership: this process's :class:`Membership`.
        follower: ingest's side (:class:`dashboard.ingest.follow.LogFollower`): ``follow``
            folds the tail, ``settled`` says a job needs no owner, ``adopt`` takes one on.
        on_snapshot_request: ``(job_id, sid)``: send browser ``sid`` a snapshot of an owned
            job (the live push).
        on_ask: ``(sessions, message, reader)``: a question another process relayed for
            agents (or a host reader: (job, host)) that may be connected here (Asks.deliver).
        tail_s: seconds between reads of the log's tail.
    """

    def __init__(self, membership: Membership, follower,
                 on_snapshot_request: Callable[[int, str], None] | None = None,
                 tail_s: float = 0.2,
                 on_ask: Callable[..., None] | None = None):
        self.membership = membership
        self.leases, self.tail = membership.leases, membership.tail
        self.follower = follower
        self.on_snapshot_request = on_snapshot_request
        self.on_ask = on_ask
        self.tail_s = tail_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "ClusterNode":
        self.tail.start_at_end()
        for target, name in ((self._tail_loop, "pgdash-tail"),
                             (self._lease_loop, "pgdash-leases"),
                             (self._listen, "pgdash-watch-requests")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop and hand this process's jobs over at once (no waiting for leases to run
        out)."""
        self._stop.set()
        try:
            self.leases.release()
        except Exception:
            log.exception("pgdash: could not release job leases; they expire in %.0f s",
                          self.leases.lease_s)

    # -- threads -------------------------------------------------------------------------

    def tail_once(self) -> int:
        """Fold what the log gained into the jobs held in memory; returns rows read."""
        read = self.follower.follow(self.tail.poll)
        self.membership.tail_read_at = time.time()
        return read

    def _tail_loop(self) -> None:
        while not self._stop.wait(self.tail_s):
            try:
                self.tail_once()
            except Exception:
                log.exception("pgdash: reading the event log's tail failed; retrying")

    def lease_once(self) -> None:
        lost = self.leases.renew()
        if lost:
            log.warning("pgdash: another process took over job(s) %s", sorted(lost))
        # An ended job that was diagnosed to the end needs nobody: let it go, so the leases
        # renewed stay the live jobs (late events of it make whoever stores them claim it).
        done = {j for j in self.leases.owned if self.follower.settled(j)}
        if done:
            self.leases.release(done)
        wanted = self.membership.take_touched()
        wanted.update(self.leases.orphans())
        for job_id in sorted(wanted):
            if not self.leases.owns(job_id) and self.leases.claim(job_id):
                log.info("pgdash: %s now owns job %d", self.membership.owner, job_id)
                self.follower.adopt(job_id)

    def _lease_loop(self) -> None:
        period = self.leases.lease_s / 3
        while True:
            try:
                self.lease_once()
            except Exception:
                log.exception("pgdash: renewing or claiming job leases failed; retrying")
            if self._stop.wait(period):
                return

    def _listen(self) -> None:
        import json

        while not self._stop.is_set():
            try:
                pubsub = self.membership.redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(WATCH_CHANNEL, ASK_CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    channel = message["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else channel
                    try:
                        request = json.loads(message["data"])
                        if channel == ASK_CHANNEL:
                            sessions = [str(s) for s in request["sessions"]]
                            question = dict(request["message"])
                            reader = request.get("reader")  # (from an older process: none)
                            reader = None if reader is None else (int(reader[0]),
                                                                  str(reader[1]))
                        else:
                            job_id, sid = int(request["job"]), str(request["sid"])
                    except (ValueError, KeyError, TypeError, IndexError):
                        log.warning("pgdash: ignored a malformed message on %s", channel)
                        continue
                    if channel == ASK_CHANNEL:
                        if self.on_ask is not None:
                            self.on_ask(sessions, question, reader)
                    elif self.membership.owns(job_id) and self.on_snapshot_request is not None:
                        self.on_snapshot_request(job_id, sid)
            except Exception:
                log.exception("pgdash: the Redis snapshot-request channel failed; "
                              "reconnecting")
                self._stop.wait(1.0)
