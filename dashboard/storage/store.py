"""The database, as callers hold it: one :class:`Store` owns the engine and the one writer
thread, and exposes the tables by job:

- ``store.writer``: every write, as a task run on the one writer thread (group commit,
  bounded queue: dashboard.storage.writer);
- ``store.jobs`` and ``store.sessions``: jobs, the agent sessions that report to them, and
  where each session's part of the log ends (dashboard.storage.jobs);
- ``store.log``: the event log, rows and packs read as one (dashboard.storage.log);
- ``store.packs``: older events packed by the compactor (dashboard.storage.packs);
- ``store.checkpoints``: folded states at moments of the log (dashboard.storage.checkpoints);
- ``store.keyframes``: the page's answers at moments on a grid (dashboard.storage.keyframes);
- ``store.findings``: each job's findings and its findings book's log
  (dashboard.storage.findings);
- ``store.owners``: which server process owns a live job (dashboard.storage.owners).

The tables are in dashboard.storage.schema; the ``--db`` URL, the engine and migrations in
dashboard.storage.database. Only dashboard.storage speaks SQL. Reads use their own pooled
connections; SQLite runs in WAL mode so they never block the writer. A method that takes a
``conn`` runs inside a writer task::

    store.writer.submit(lambda conn: store.jobs.create(conn, "train.py", now))
"""

from __future__ import annotations

from dashboard.storage.checkpoints import Checkpoints
from dashboard.storage.database import make_engine, upgrade
from dashboard.storage.findings import StoredFindings
from dashboard.storage.jobs import Jobs, Sessions
from dashboard.storage.keyframes import StoredKeyframes
from dashboard.storage.log import EventLog
from dashboard.storage.owners import JobOwners
from dashboard.storage.packs import Packs
from dashboard.storage.writer import Writer


class Store:
    """The database: reads from any thread, writes through ``writer`` on one thread."""

    def __init__(self, url: str, *, batch_limit: int = 2000, queue_limit: int = 10_000,
                 busy_timeout_s: float = 30.0):
        self.url = url
        self.engine = make_engine(url, busy_timeout_s)
        self.log = EventLog(self.engine)
        self.writer = Writer(self.engine, batch_limit=batch_limit, queue_limit=queue_limit,
                             before_commit=self.log.flush, after_rollback=self.log.rolled_back)
        self.jobs = Jobs(self.engine)
        self.sessions = Sessions(self.engine)
        self.packs = Packs(self.engine)
        self.checkpoints = Checkpoints(self.engine)
        self.keyframes = StoredKeyframes(self.engine)
        self.findings = StoredFindings(self.engine)
        self.owners = JobOwners(self.engine)

    def start(self) -> "Store":
        """Bring the schema up to date, then start the writer."""
        upgrade(self.engine)
        self.writer.start()
        return self

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the connections."""
        self.writer.stop()
        self.engine.dispose()

    def reclaim(self) -> None:
        """SQLite: give the file's free pages back to the file system (after compaction). A
        database created before pgdash set ``auto_vacuum`` keeps reusing them instead."""
        if self.engine.dialect.name != "sqlite":
            return  # PostgreSQL's autovacuum makes the space reusable
        raw = self.engine.raw_connection()
        try:
            # executescript steps the pragma to its end (a plain execute frees one page)
            raw.driver_connection.executescript("PRAGMA incremental_vacuum;")
        finally:
            raw.close()
