"""The one writer thread: every write to the database goes through it.

One thread protects the single write connection (as SQLite wants): tasks wait in a bounded
queue, and the writer runs whatever is queued together in one transaction (group commit).
A full queue is the server's backpressure on agents' batches (``submit_nowait`` raises
``queue.Full``): full when ``queue_limit`` tasks wait, or when the agents' events waiting and
being written reach ``events_limit``. Counted in tasks alone, the queue held what every
agent's window of unacknowledged batches holds: at 1,024 ranks behind a backlog, four batches
of 200 events per agent, ~11 KB of Python objects per event, and the server grew to 6 GB.

The server's own writes are not refused and never wait for room: a connection's connect and
disconnect (one per connection, so bounded by the connections), the findings, compaction.
Had they waited for room behind a flood of batches, an overloaded server would have held
every thread that admits agents, and agents that could not get back in would have looked
lost. Reads use their own pooled connections and never wait for the writer (SQLite runs in
WAL mode).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from typing import Any, Callable

import sqlalchemy as sa

log = logging.getLogger("pgdash.storage")

Task = Callable[[sa.Connection], Any]
# Agents' events queued or in the transaction being written, at most: ~230 MB of decoded
# events at the largest latency summaries measured (bench/capacity.py), and seconds of a
# 1,024-rank job's traffic at the agent's defaults.
EVENTS_LIMIT = 20_000
# After stop(), how long agents' batches still queued are written before the rest are failed.
# They are not acknowledged yet (v2's connections are closed by then; a v1 batch failed gets
# `retry`), so their agents send them again, to this server restarted or another, whose log
# stores each event once: a SIGTERM loses nothing acknowledged. The server's own writes
# (connects, disconnects, findings) are always written. A 512-rank v1 job's queue took 4.2 s
# to write, one time 8.1 s.
STOP_GRACE_S = 1.0
STOP_BATCH_EVENTS = 200  # agents' events a transaction takes once stopping


class WriterStopped(RuntimeError):
    """A write submitted after the writer stopped (the server is shutting down)."""


class Writer:
    """Runs write tasks on one thread, a batch of them to a transaction.

    Args:
        engine: the database.
        batch_limit: the most tasks one transaction takes.
        queue_limit: the most tasks waiting for ``submit_nowait`` to queue one more (past it,
            it raises queue.Full); the server's own writes (``submit``, and
            ``submit_nowait(bounded=False)``) are queued past it.
        events_limit: the most agents' events (the ``events`` of bounded tasks) queued or in
            the transaction being written; one transaction takes at most half of it.
        before_commit: called with the connection after a batch's tasks, inside their
            transaction (the event log inserts the rows its tasks deferred).
        after_rollback: called after a failed transaction, before the failure listeners
            (the event log forgets what it deferred and numbered).
    """

    def __init__(self, engine: sa.Engine, *, batch_limit: int = 2000,
                 queue_limit: int = 10_000, events_limit: int = EVENTS_LIMIT,
                 before_commit: Callable[[sa.Connection], None] = lambda conn: None,
                 after_rollback: Callable[[], None] = lambda: None):
        self.engine = engine
        self.batch_limit = batch_limit
        self.submit_timeout = 30.0
        self._before_commit, self._after_rollback = before_commit, after_rollback
        self.queue_limit = queue_limit
        self.events_limit = events_limit
        self._events = 0  # agents' events queued or being written (under _events_lock)
        self._events_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()  # bounded by submit_nowait (see queue_limit)
        self._thread = threading.Thread(target=self._loop, name="pgdash-writer", daemon=True)
        self._stopping = False
        self._closed = False  # set by stop(): what is submitted from then on fails at once
        self._shed_after = float("inf")  # monotonic time from which agents' batches are failed
        self.commits = 0
        self.write_errors = 0
        # Called on the writer thread after a failed transaction, so that whoever keeps
        # derived state in memory can drop it and re-read what was really stored.
        self._failure_listeners: list[Callable[[], None]] = []

    def on_failure(self, listener: Callable[[], None]) -> None:
        """Subscribe ``listener()``: called on the writer thread after a failed transaction."""
        self._failure_listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Commit the server's own writes queued, and the agents' batches the writer reaches
        within ``grace_s`` (the rest fail with WriterStopped: see STOP_GRACE_S), then end the
        thread (at most 10 s). Writes submitted from then on raise WriterStopped at once
        instead of waiting for a thread that is gone."""
        if self._closed:
            return
        self._shed_after = time.monotonic() + grace_s
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10)
        self._fail_queued()

    def submit(self, task: Task, timeout: float | None = 30.0) -> Any:
        """Run ``task(conn)`` on the writer thread inside a transaction; return its result.

        Tasks queued together share one transaction (group commit). If the transaction fails,
        every task in it gets the exception.
        """
        return self.submit_nowait(task, bounded=False).result(timeout=timeout)

    def submit_nowait(self, task: Task, bounded: bool = True,
                      events: int = 1) -> concurrent.futures.Future:
        """Queue ``task`` for the writer without waiting; the future holds its result.

        Args:
            bounded: refuse it when the queue is full (an agent's batch); False for the
                server's own writes, bounded otherwise (one per connection change).
            events: how many agents' events the task writes (a bounded task's share of
                ``events_limit``).

        Raises:
            queue.Full: the write queue is at its bound (the server is overloaded).
        """
        weight = 0
        if bounded:
            with self._events_lock:
                if not self.has_room(events):
                    raise queue.Full
                weight = max(1, events)
                self._events += weight
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self._enqueue((task, future, time.monotonic(), weight))
        except WriterStopped:
            self._written(weight)
            raise
        return future

    def has_room(self, events: int) -> bool:
        """Whether an agent's batch of ``events`` events would be queued now (one is, into an
        empty budget, whatever its size)."""
        return self.queued() < self.queue_limit and (
            self._events == 0 or self._events + events <= self.events_limit)

    def queued_events(self) -> int:
        """Agents' events queued or being written."""
        return self._events

    def _written(self, weight: int) -> None:
        if weight:
            with self._events_lock:
                self._events -= weight

    def _enqueue(self, item: tuple) -> None:
        """Queue ``item`` (never waits: the queue has no bound of its own); one queued as the
        writer stopped is failed, not left waiting."""
        if self._closed:
            raise WriterStopped("the database writer has stopped: the server is shutting down")
        self._queue.put(item)
        if self._closed and not self._thread.is_alive():
            self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._written(item[3])
                if not item[1].done():
                    item[1].set_exception(WriterStopped("the database writer has stopped"))

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until everything queued so far is committed (tests, shutdown)."""
        self.submit(lambda conn: None, timeout=timeout)

    def queued(self) -> int:
        """Tasks waiting for the writer."""
        return self._queue.qsize()

    def backlog_s(self) -> float:
        """Seconds the oldest queued write has waited for the writer (0.0 if none)."""
        with self._queue.mutex:
            head = self._queue.queue[0] if self._queue.queue else None
        return time.monotonic() - head[2] if head else 0.0

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, events = [item], item[3]
            # At most batch_limit tasks and half the events' budget a transaction: the
            # agents' acknowledgements wait for its commit, and its events fill memory. Once
            # stopping, small ones, so that the grace is looked at often (one of 1,789 events
            # took 3.2 s in a 512-rank v1 server).
            most = self.events_limit // 2 if not self._closed else STOP_BATCH_EVENTS
            while len(batch) < self.batch_limit and events < most:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._stopping = True
                    break
                batch.append(nxt)
                events += nxt[3]
            if self._closed and time.monotonic() > self._shed_after:
                batch = self._shed(batch)
            try:
                self._run(batch)
            finally:
                self._written(events)
            if self._stopping:
                return

    @staticmethod
    def _shed(batch: list[tuple[Task, concurrent.futures.Future, float, int]]
              ) -> list[tuple[Task, concurrent.futures.Future, float, int]]:
        """The server's own tasks of ``batch``; its agents' batches fail, unwritten."""
        kept = []
        for item in batch:
            if item[3]:
                item[1].set_exception(WriterStopped(
                    "not stored: the server stopped first; the agent sends it again"))
            else:
                kept.append(item)
        return kept

    def _run(self, batch: list[tuple[Task, concurrent.futures.Future, float, int]]) -> None:
        results = []
        try:
            with self.engine.begin() as conn:
                if self.engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("SELECT 1")  # take the connection now
                for task, *_ in batch:
                    results.append(task(conn))
                self._before_commit(conn)
            self.commits += 1
        except Exception as exc:
            self._after_rollback()
            self.write_errors += 1
            log.exception("pgdash: write failed; %d task(s) not stored", len(batch))
            for listener in self._failure_listeners:
                listener()
            for _, future, *_ in batch:
                future.set_exception(exc)
            return
        for (_, future, *_), result in zip(batch, results):
            future.set_result(result)
