"""Storage: the only module that imports SQLAlchemy.

Tables (created by the Alembic migrations in ``migrations/``):

- ``jobs``: one row per job, with a cached summary (status, world size, ...) for fast listing;
- ``sessions``: one row per agent process, mapping it to its job;
- ``events``: the event log, the source of truth. ``(session, seq)`` is unique. Bodies are
  stored compact (``body_z``, see dashboard.storage.codec; ``body`` is then empty); rows written before
  revision 0004 keep their JSON ``body`` and read back the same. dashboard.storage.compaction thins
  routine events beyond the recent window (see there for what detail that gives up);
- ``event_packs``: older events of ``events``, one job's events of one compaction cell per
  row, stored column by column and compressed together (dashboard.storage.codec's pack format;
  written by dashboard.storage.compaction). Every read of the log merges packs and rows in id order,
  so readers see one log. Each agent session's newest event, and its newest with a seq,
  always stay rows: what admission (``max_seqs``, ``session_max_seq``) and the compactor
  (``session_last_arrivals``) read of a session's end needs no pack;
- ``checkpoints``: folded JobStates at moments of the log (dashboard.history.rewind), so that
  scrubbing backwards starts from the nearest one, also after a restart.

Writes go through one writer thread fed by a queue (one thread protects the single write
connection, as SQLite wants), which groups whatever is queued into one transaction. Reads use
their own pooled connections; SQLite runs in WAL mode so they never block the writer.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import sqlalchemy as sa
from sqlalchemy import event as sa_event

from dashboard.storage.codec import Pack, decode_body, encode_body, encode_pack, open_pack, raw_body
from dashboard.resources import resource_dir

log = logging.getLogger("pgdash.storage")

metadata = sa.MetaData(naming_convention={
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("world_size", sa.Integer),
    sa.Column("backend", sa.String(64)),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    # How the job was launched (its rank 0's Hello) and its current attempt (migration 0007).
    sa.Column("command", sa.String(512)),
    sa.Column("launcher", sa.String(64)),
    sa.Column("launcher_id", sa.String(256)),
    sa.Column("attempt", sa.Integer),
    # A job ``pgdash import`` made: the file's name and when the original was exported (the
    # file says, from pgdash 0007 on). NULL for a job agents reported here.
    sa.Column("imported_from", sa.String(256)),
    sa.Column("exported_at", sa.Float),
)

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("rank", sa.Integer),
    sa.Column("host", sa.String(256)),
    sa.Column("pid", sa.Integer),
    sa.Column("first_seen", sa.Float, nullable=False),
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("session", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer),
    sa.Column("t", sa.Float, nullable=False),
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("body", sa.Text, nullable=False),  # JSON; "" when body_z holds the body
    sa.Column("body_z", sa.LargeBinary),  # dashboard.storage.codec.encode_body (revision 0004)
    sa.UniqueConstraint("session", "seq", name="uq_events_session_seq"),
    sa.Index("ix_events_job_id_id", "job_id", "id"),
)

findings = sa.Table(
    "findings", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("id", sa.String(160), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("first_seen", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)

# A folded JobState after every event that arrived before ``at`` (dashboard.history.rewind), as
# dashboard.storage.codec.encode_state bytes: written by the server only.
checkpoints = sa.Table(
    "checkpoints", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("last_id", sa.Integer, primary_key=True),  # the state holds events up to this
    sa.Column("at", sa.Float, nullable=False),  # arrival time of that last event
    sa.Column("state", sa.LargeBinary, nullable=False),
)

# One job's events of one compaction cell (dashboard.storage.compaction), as dashboard.storage.codec pack
# bytes; the events it holds are no longer rows of ``events`` (revision 0005).
event_packs = sa.Table(
    "event_packs", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("first_id", sa.Integer, primary_key=True),  # the ids of its first
    sa.Column("last_id", sa.Integer, nullable=False),  # and last event
    sa.Column("first_at", sa.Float, nullable=False),  # their arrival times
    sa.Column("last_at", sa.Float, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),  # events in it
    sa.Column("thinned", sa.Boolean, nullable=False),  # compacted as its age asks: final
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Index("ix_event_packs_first_id", "first_id"),
    sa.Index("ix_event_packs_last_id", "last_id"),
)

PACKS_AHEAD = 1  # packs a job's read decodes per round trip (one is a whole cell)


class UnreadablePack(ValueError):
    """A stored pack this pgdash cannot read; the message names the row and what to do."""


_SQLITE_INSERT_EVENT = ("INSERT INTO events (id, job_id, session, seq, t, received_at, kind, "
                        "body, body_z) VALUES (?, ?, ?, ?, ?, ?, ?, '', ?)")
_json_encoder = msgspec.json.Encoder()


def encode_json(value: Any) -> str:
    """JSON text of a stored body (msgspec: ~10x faster than the json module)."""
    return _json_encoder.encode(value).decode()


decode_json = msgspec.json.decode


def _event_id(ev: dict[str, Any]) -> int:
    return ev["id"]


def load_body(row: Any) -> dict[str, Any]:
    """The body of a stored event row, whichever form it was stored in (a dict already for
    an event read from a pack)."""
    if isinstance(row["body"], dict):
        return row["body"]
    packed = row["body_z"]
    return decode_body(packed) if packed is not None else decode_json(row["body"])


# What each job's live findings book concluded, moment by moment (dashboard.diagnosis.book's
# BookLog): ``state?at=`` and a restarted server read the book as of a moment here instead of
# judging every moment again. ``id`` "" with no body marks a moment the book judged.
book_log = sa.Table(
    "book_log", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("at", sa.Float, primary_key=True),
    sa.Column("id", sa.String(160), primary_key=True),
    sa.Column("body", sa.LargeBinary),  # dashboard.storage.codec.encode_body of the finding
)

# The grid moments each job's book_log covers: every one from start_at to through_at.
book_spans = sa.Table(
    "book_spans", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("start_at", sa.Float, nullable=False),
    sa.Column("through_at", sa.Float, nullable=False),
)

# One row per job that some server process owns (several processes share one database, see
# dashboard.cluster.node): the owner alone folds and diagnoses the job, while its lease lasts.
job_owners = sa.Table(
    "job_owners", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)

# What a job's summary (JobState.summary) keeps up to date in its row.
JOB_FIELDS = ("status", "world_size", "backend", "started_at", "ended_at", "command",
              "launcher", "launcher_id", "attempt")


def _with_run(query: sa.Select) -> sa.Select:
    """``query`` over ``jobs`` with a ``run`` column: the jobs of the same name up to each
    (by the name's index)."""
    earlier = jobs.alias("earlier")
    run = (sa.select(sa.func.count()).select_from(earlier)
           .where(earlier.c.name == jobs.c.name, earlier.c.id <= jobs.c.id)
           .scalar_subquery())
    return query.add_columns(run.label("run"))


class DatabaseUnusable(ValueError):
    """``--db`` names no database pgdash can use: a misspelt or unsupported URL, a missing
    driver, a folder that is not there, a server that does not answer. The message is one line:
    what is wrong, and a URL of the right form."""


# What --db accepts, as every message about it shows it.
DB_EXAMPLES = ("sqlite:///pgdash.db (a file in the working directory) or "
               "postgresql+psycopg://USER@HOST:5432/DB")
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
PG_CONNECT_TIMEOUT_S = 10  # an address that drops packets fails within this, not minutes


def database_url(url: str) -> sa.URL:
    """The ``--db`` URL, parsed and checked before anything connects; PostgreSQL without a
    driver named gets the installed one (psycopg 2, else psycopg 3).

    Raises:
        DatabaseUnusable: the URL cannot be parsed, names a backend pgdash does not store in
            (SQLite and PostgreSQL), a driver that is not installed, or a SQLite file whose
            folder does not exist.
    """
    knob = "--db / PGDASH_DB"
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise DatabaseUnusable(f"{knob} {url!r:.200} is not a database URL; pgdash stores in "
                               f"SQLite or PostgreSQL, e.g. {DB_EXAMPLES}") from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend == "postgres":
        driver = parsed.drivername[len("postgres"):] or "+psycopg"
        right = parsed.set(drivername="postgresql" + driver).render_as_string(hide_password=True)
        raise DatabaseUnusable(f"{knob} {shown}: SQLAlchemy spells PostgreSQL 'postgresql', "
                               f"not 'postgres': use {right}")
    if backend in ("redis", "rediss", "unix"):
        raise DatabaseUnusable(f"{knob} {shown} is a Redis URL, which goes to --queue "
                               f"(several server processes); --db takes the database: "
                               f"{DB_EXAMPLES}")
    if backend not in SUPPORTED_BACKENDS:
        raise DatabaseUnusable(f"{knob} {shown}: pgdash stores in SQLite or PostgreSQL, not "
                               f"{backend!r:.40}; e.g. {DB_EXAMPLES}")
    if backend == "postgresql":
        parsed = _postgres_driver(parsed, shown)
    elif parsed.database and parsed.database != ":memory:":
        path = Path(parsed.database).expanduser().resolve()
        if not path.parent.is_dir():
            what = (f"{path.parent} is a file, not a folder" if path.parent.exists() else
                    f"folder {path.parent} does not exist (mkdir -p {path.parent} creates it)")
            raise DatabaseUnusable(f"{knob} {shown}: {what}; or pick a file in an existing "
                                   f"folder, e.g. sqlite:///{Path.cwd() / 'pgdash.db'}")
        if path.is_dir():
            raise DatabaseUnusable(f"{knob} {shown}: {path} is a folder; name a file in it, "
                                   f"e.g. sqlite:///{path / 'pgdash.db'}")
    return parsed


def _postgres_driver(parsed: sa.URL, shown: str) -> sa.URL:
    """``parsed`` with an installed, synchronous PostgreSQL driver, or DatabaseUnusable."""
    import importlib.util

    if parsed.drivername == "postgresql":  # SQLAlchemy would pick psycopg2, installed or not
        for module, driver in (("psycopg2", "postgresql+psycopg2"),
                               ("psycopg", "postgresql+psycopg")):
            if importlib.util.find_spec(module) is not None:
                return parsed.set(drivername=driver)
        raise DatabaseUnusable(f"--db / PGDASH_DB {shown}: no PostgreSQL driver is installed: "
                               "pip install 'pgdash[postgres]' (psycopg 3), then use "
                               "postgresql+psycopg://USER@HOST:5432/DB")
    try:
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except (sa.exc.NoSuchModuleError, ImportError) as exc:
        raise DatabaseUnusable(f"--db / PGDASH_DB {shown}: driver {parsed.get_driver_name()!r} "
                               f"cannot be loaded ({exc}); pgdash uses psycopg 3: pip install "
                               "'pgdash[postgres]' and use postgresql+psycopg://USER@HOST/DB"
                               ) from None
    if getattr(dialect, "is_async", False):
        raise DatabaseUnusable(f"--db / PGDASH_DB {shown}: {parsed.get_driver_name()} is an "
                               "asyncio driver; pgdash needs a synchronous one: "
                               "postgresql+psycopg://USER@HOST/DB")
    return parsed


def check_connection(engine: sa.Engine) -> None:
    """Open (and close) one connection, so that a database that cannot be reached is named
    in one line before anything else happens.

    Raises:
        DatabaseUnusable: the server refused or did not answer, the login failed, or the
            SQLite file cannot be opened or is no database.
    """
    try:
        with engine.connect():
            pass
    except sa.exc.DBAPIError as exc:
        raise DatabaseUnusable(connection_problem(engine.url, exc)) from None


def connection_problem(url: sa.URL, exc: BaseException) -> str:
    """What a failed connection to ``url`` means, in one line (never the password)."""
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())[:400]
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or ":memory:").expanduser().resolve()
        if "not a database" in text:
            return (f"--db / PGDASH_DB: {path} is not an SQLite database ({text}); pass a new "
                    f"file name or the file of an earlier pgdash, e.g. sqlite:///pgdash.db")
        return (f"--db / PGDASH_DB: cannot open the SQLite database {path} ({text}); check "
                f"that this user may create and write files in {path.parent} (SQLite also "
                f"writes {path.name}-wal and {path.name}-shm beside it)")
    where = f"{url.host or 'localhost'}:{url.port or 5432}"
    text = text if text.endswith((".", "?", "!")) else text + "."
    return (f"--db / PGDASH_DB: could not connect to PostgreSQL at {where} (database "
            f"{url.database or '(default)'}, user {url.username or '(default)'}): {text} "
            f"Check that PostgreSQL runs and listens there, and the user, password and "
            f"database in the URL, e.g. postgresql+psycopg://pgdash@127.0.0.1:5432/pgdash")


def display_url(url: str) -> str:
    """``url`` as it may be shown (a password hidden); unparseable text as it is."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def make_engine(url: str, busy_timeout_s: float = 30.0) -> sa.Engine:
    """An engine for ``url`` (checked by :func:`database_url`; nothing connects yet); SQLite
    gets WAL, a busy timeout and foreign keys.

    Raises:
        DatabaseUnusable: see :func:`database_url`.
    """
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(parsed, connect_args={"check_same_thread": False,
                                                   "timeout": busy_timeout_s})

        @sa_event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            # Only a new file takes it (before its first table): then Store.reclaim gives
            # the pages compaction frees back to the file system. Asked only of an empty
            # file: on any other it waits for the lock of a write in progress (busy
            # timeout), and a connection opened inside a writer task waited for itself.
            if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    connect_args = {} if "connect_timeout" in parsed.query else \
        {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    return sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


MIGRATION_LOCK = 0x70676461  # "pgda": the advisory lock key that serialises migrations


def upgrade(url_or_engine: str | sa.Engine, revision: str = "head") -> None:
    """Bring the schema up to ``revision`` with Alembic (``pgdash db upgrade``)."""
    from alembic import command
    from alembic.config import Config

    engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    check_connection(engine)
    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations", "env.py")))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Several server processes starting together: one migrates, the others wait
            # for it and then find nothing to do.
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def describe_write_error(url: str, exc: BaseException) -> str:
    """What a failed write means for the user, naming the database (never its password)."""
    try:
        parsed = sa.engine.make_url(url)
        where = (str(Path(parsed.database).expanduser().resolve())
                 if parsed.get_backend_name() == "sqlite" and parsed.database
                 else parsed.render_as_string(hide_password=True))
    except Exception:
        where = "the database"
    text = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300]
    if "locked" in text or "busy" in text:
        return (f"database {where} is locked by another process ({text}); pgdash keeps the "
                "batch for a retry: end whatever holds the lock (a sqlite3 shell, a backup), "
                "or raise PGDASH_DB_BUSY_TIMEOUT_S")
    if "full" in text or "No space" in text:
        return (f"database {where} cannot grow: its disk is full ({text}); pgdash keeps the "
                "batch for a retry and resumes once there is space")
    return f"could not write to database {where}: {text}"


class Store:
    """The database: reads from any thread, writes through :meth:`submit` on one thread."""

    def __init__(self, url: str, *, batch_limit: int = 2000, queue_limit: int = 10_000,
                 busy_timeout_s: float = 30.0):
        self.url = url
        self.engine = make_engine(url, busy_timeout_s)
        self.batch_limit = batch_limit
        self.submit_timeout = 30.0
        self._queue: queue.Queue = queue.Queue(maxsize=queue_limit)
        self._thread = threading.Thread(target=self._write_loop, name="pgdash-writer",
                                        daemon=True)
        self._stopping = False
        self.commits = 0
        self.write_errors = 0
        self.unreadable_packs = 0  # passed over by events_after / events_by_id (logged)
        # (job id, moment) -> the [start, end) of arrival time that keeps one checkpoint, where
        # the compactor thins them (dashboard.storage.compaction), else None.
        self.checkpoint_span: Callable[[int, float], tuple[float, float] | None] | None = None
        self._next_id: int | None = None  # see _allocate_ids
        self._deferred: list[tuple] = []  # event rows of this transaction, see insert_events
        self._deferred_rows: list[dict[str, Any]] = []  # the same, other databases
        # Called on the writer thread after a failed transaction, so that whoever keeps
        # derived state in memory can drop it and re-read what was really stored.
        self.on_write_failure: Callable[[], None] | None = None

    def start(self) -> "Store":
        upgrade(self.engine)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._stopping = True
            self._queue.put(None)
            self._thread.join(timeout=10)
        self.engine.dispose()

    # -- writing -----------------------------------------------------------------------------

    def submit(self, task: Callable[[sa.Connection], Any],
               timeout: float | None = 30.0) -> Any:
        """Run ``task(conn)`` on the writer thread inside a transaction; return its result.

        Tasks queued together share one transaction (group commit). If the transaction fails,
        every task in it gets the exception.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((task, future, time.monotonic()), timeout=timeout)
        return future.result(timeout=timeout)

    def submit_nowait(self, task: Callable[[sa.Connection], Any]) -> concurrent.futures.Future:
        """Queue ``task`` for the writer without waiting; the future holds its result.

        Raises:
            queue.Full: the write queue is at its bound (the server is overloaded).
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put_nowait((task, future, time.monotonic()))
        return future

    def backlog_s(self) -> float:
        """Seconds the oldest queued write has waited for the writer (0.0 if none)."""
        with self._queue.mutex:
            head = self._queue.queue[0] if self._queue.queue else None
        return time.monotonic() - head[2] if head else 0.0

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.batch_limit:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._stopping = True
                    break
                batch.append(nxt)
            self._run(batch)
            if self._stopping:
                return

    def _run(self, batch: list[tuple[Callable, concurrent.futures.Future, float]]) -> None:
        results = []
        self._deferred = []
        self._deferred_rows = []
        try:
            with self.engine.begin() as conn:
                if self.engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("SELECT 1")  # take the connection now
                for task, _, _ in batch:
                    results.append(task(conn))
                if self._deferred:
                    conn.exec_driver_sql(_SQLITE_INSERT_EVENT, self._deferred)
                if self._deferred_rows:
                    conn.execute(sa.insert(events), self._deferred_rows)
            self.commits += 1
        except Exception as exc:
            self._next_id = None  # rolled back: number from what is really stored
            self.write_errors += 1
            log.exception("pgdash: write failed; %d task(s) not stored", len(batch))
            if self.on_write_failure is not None:
                self.on_write_failure()
            for _, future, _ in batch:
                future.set_exception(exc)
            return
        for (_, future, _), result in zip(batch, results):
            future.set_result(result)

    # -- statements used by the writer tasks -------------------------------------------------

    @staticmethod
    def find_session(conn: sa.Connection, session: str) -> dict[str, Any] | None:
        row = conn.execute(sa.select(sessions).where(sessions.c.id == session)).mappings().first()
        return dict(row) if row else None

    @staticmethod
    def latest_job(conn: sa.Connection, name: str) -> dict[str, Any] | None:
        """The newest job agents reported under ``name`` (an imported job is a record of
        another server's: no agent joins it)."""
        row = conn.execute(sa.select(jobs).where(jobs.c.name == name,
                                                 jobs.c.imported_from.is_(None))
                           .order_by(jobs.c.id.desc()).limit(1)).mappings().first()
        return dict(row) if row else None

    @staticmethod
    def create_job(conn: sa.Connection, name: str, now: float, imported_from: str | None = None,
                   exported_at: float | None = None) -> int:
        return conn.execute(sa.insert(jobs).values(
            name=name, created_at=now, status="initializing", imported_from=imported_from,
            exported_at=exported_at)).inserted_primary_key[0]

    @staticmethod
    def create_session(conn: sa.Connection, session: str, job_id: int, rank: int | None,
                       host: str | None, pid: int | None, now: float) -> None:
        conn.execute(sa.insert(sessions).values(id=session, job_id=job_id, rank=rank,
                                                host=host, pid=pid, first_seen=now))

    def insert_events(self, conn: sa.Connection, job_id: int, session: str,
                      rows: list[dict[str, Any]], now: float,
                      want_ids: bool = True) -> list[int]:
        """Insert events; returns their ids in order (``[]`` off SQLite with ``want_ids``
        false).

        On SQLite, the one writer numbers the rows itself (from MAX(id), read once) and
        inserts all of a transaction's rows with one executemany of the
        driver just before it commits: a few microseconds a row, where a RETURNING insert
        through SQLAlchemy cost ~0.15 ms a batch, the largest share of the writer's time per
        rank. Other databases, which several server processes may write at once, number
        rows themselves (RETURNING). A caller that needs no ids (several processes: the
        log's tail folds what was stored) has its rows inserted with the whole transaction's,
        in one executemany before the commit: on PostgreSQL a RETURNING insert per batch is
        one round trip each, which kept the one writer waiting on the network most of its
        time at a few hundred ranks (``bench/capacity.py --processes``).
        """
        if not rows:
            return []
        if self.engine.dialect.name == "sqlite":
            first = self._allocate_ids(conn, len(rows))
            self._deferred.extend(
                (first + i, job_id, session, row.get("seq"), row["t"], now, row["kind"],
                 encode_body(row["body"])) for i, row in enumerate(rows))
            return list(range(first, first + len(rows)))
        params = [{"job_id": job_id, "session": session, "seq": row.get("seq"), "t": row["t"],
                   "received_at": now, "kind": row["kind"], "body": "",
                   "body_z": encode_body(row["body"])}
                  for row in rows]
        if not want_ids:
            self._deferred_rows.extend(params)
            return []
        result = conn.execute(
            sa.insert(events).returning(events.c.id, sort_by_parameter_order=True), params)
        return [r[0] for r in result]

    def _allocate_ids(self, conn: sa.Connection, n: int) -> int:
        """Writer thread, SQLite: the first of ``n`` fresh event ids. The one writer is the
        only one to insert events, so MAX(id) is read once (and again after a rollback).
        Packs never hide the newest id: the compactor leaves each session's newest event a
        row (dashboard.storage.compaction), and a deleted job's ids are nobody's."""
        if self._next_id is None:
            self._next_id = (conn.exec_driver_sql("SELECT MAX(id) FROM events").scalar()
                             or 0) + 1
        first = self._next_id
        self._next_id += n
        return first

    def insert_archived_events(self, conn: sa.Connection, job_id: int,
                               rows: list[dict[str, Any]]) -> None:
        """Insert events that carry their own arrival time (an imported session file)."""
        if rows:
            first = self._allocate_ids(conn, len(rows)) \
                if self.engine.dialect.name == "sqlite" else None
            conn.execute(sa.insert(events), [
                {**({"id": first + i} if first is not None else {}),
                 "job_id": job_id, "session": r["session"], "seq": r["seq"], "t": r["t"],
                 "received_at": r["received_at"], "kind": r["kind"], "body": "",
                 "body_z": encode_body(r["body"])} for i, r in enumerate(rows)])

    @staticmethod
    def update_job(conn: sa.Connection, job_id: int, summary: dict[str, Any]) -> None:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id)
                     .values(**{k: summary[k] for k in JOB_FIELDS if k in summary}))

    @staticmethod
    def save_findings(conn: sa.Connection, job_id: int, rows: list[dict[str, Any]]) -> None:
        """Insert or replace findings (portable: delete then insert, in one transaction)."""
        if not rows:
            return
        conn.execute(sa.delete(findings).where(findings.c.job_id == job_id,
                                               findings.c.id.in_([f["id"] for f in rows])))
        conn.execute(sa.insert(findings), [
            {"job_id": job_id, "id": f["id"], "kind": f["kind"], "severity": f["severity"],
             "active": f["active"], "first_seen": f["first_seen"], "last_seen": f["last_seen"],
             "body": json.dumps(f)} for f in rows])

    @staticmethod
    def save_book_log(conn: sa.Connection, job_id: int, since: float | None,
                      rows: list[tuple[float, str, dict[str, Any] | None]],
                      through: float) -> None:
        """Writer thread: add what a live book recorded, which covers its moments through
        ``through``. ``since`` (first call of a book only): where its record begins; one
        that does not continue the stored span starts the job's log afresh (the moments
        between were judged by nobody)."""
        span = conn.execute(sa.select(book_spans.c.start_at, book_spans.c.through_at)
                            .where(book_spans.c.job_id == job_id)).first()
        if since is not None and (span is None or not span[0] <= since <= span[1]):
            conn.execute(sa.delete(book_log).where(book_log.c.job_id == job_id))
            conn.execute(sa.delete(book_spans).where(book_spans.c.job_id == job_id))
            conn.execute(sa.insert(book_spans).values(job_id=job_id, start_at=since,
                                                      through_at=max(since, through)))
        elif span is None:
            return  # its span was started afresh by another record: these rows are not it
        elif through > span[1]:
            conn.execute(sa.update(book_spans).where(book_spans.c.job_id == job_id)
                         .values(through_at=through))
        if not rows:
            return
        values = [{"job_id": job_id, "at": at, "id": fid,
                   "body": None if f is None else encode_body(f)} for at, fid, f in rows]
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        conn.execute(insert(book_log).on_conflict_do_nothing(), values)

    # -- reading -----------------------------------------------------------------------------

    def book_span(self, job_id: int) -> tuple[float, float] | None:
        """The moments the job's book log covers (start, through), if it has one."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(book_spans.c.start_at, book_spans.c.through_at)
                               .where(book_spans.c.job_id == job_id)).first()
        return (row[0], row[1]) if row else None

    def book_log_rows(self, job_id: int, until: float
                      ) -> tuple[list[tuple[float, str, dict[str, Any]]], float | None]:
        """The job's book log up to ``until``: its finding rows in order, and the last
        moment marked judged (None if none)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(book_log.c.at, book_log.c.id, book_log.c.body)
                                .where(book_log.c.job_id == job_id, book_log.c.at <= until,
                                       book_log.c.id != "")
                                .order_by(book_log.c.at, book_log.c.id)).all()
            judged = conn.execute(sa.select(sa.func.max(book_log.c.at))
                                  .where(book_log.c.job_id == job_id, book_log.c.at <= until,
                                         book_log.c.id == "")).scalar()
        return [(at, fid, decode_body(body)) for at, fid, body in rows], judged

    def job_findings(self, job_id: int) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(findings.c.body).where(findings.c.job_id == job_id))
            return [json.loads(body) for (body,) in rows]

    def max_seqs(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(events.c.session, sa.func.max(events.c.seq))
                                .where(events.c.seq.is_not(None))
                                .group_by(events.c.session))
            return {s: m for s, m in rows}

    def list_jobs(self, limit: int = 500) -> list[dict[str, Any]]:
        """The newest jobs first, each with ``run``: how many jobs of its name came up to it
        (1 for the first), which tells apart launches that reused a name."""
        with self.engine.connect() as conn:
            rows = conn.execute(_with_run(sa.select(jobs)).order_by(jobs.c.id.desc())
                                .limit(limit))
            return [dict(r) for r in rows.mappings()]

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row and its ``run`` (see list_jobs), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(_with_run(sa.select(jobs)).where(jobs.c.id == job_id)) \
                .mappings().first()
            return dict(row) if row else None

    def job_sessions(self, job_id: int) -> list[dict[str, Any]]:
        """The job's agent sessions (id, rank, host, pid, first_seen), oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(sessions.c.id, sessions.c.rank, sessions.c.host, sessions.c.pid,
                          sessions.c.first_seen)
                .where(sessions.c.job_id == job_id)
                .order_by(sessions.c.first_seen, sessions.c.id)).mappings().all()
        return [dict(r) for r in rows]

    def job_events(self, job_id: int, chunk: int = 5000, after: int = 0,
                   upto: int | None = None, raw: bool = False) -> Iterator[dict[str, Any]]:
        """The job's events in log order (those with an id above ``after``, and at most
        ``upto`` when given), as StoredEvent dicts: rows and packs merged (``raw``: bodies
        as dashboard.storage.codec.RawBody where they are MessagePack, for moving them unread).

        Raises:
            UnreadablePack: a pack of this job that this pgdash cannot read (the message
                names it and what to do); other jobs read on.
        """
        while True:
            with self.engine.connect() as conn:
                rows, packs, cutoff = self._read_log(conn, job_id, after, upto, chunk,
                                                     PACKS_AHEAD)
            last = after
            for ev in self._merge(rows, packs, after, cutoff, raw):
                if ev["id"] != last:  # a row packed between the two reads comes twice
                    last = ev["id"]
                    yield ev
            if cutoff is None or (upto is not None and cutoff >= upto):
                return
            after = cutoff

    def _read_log(self, conn: sa.Connection, job_id: int | None, after: int,
                  upto: int | None, limit: int, packs_ahead: int
                  ) -> tuple[list[Any], list[Any], int | None]:
        """Rows and packs holding the log's next events after id ``after`` (one job's, or
        every job's): (rows, pack rows, cutoff), complete up to id ``cutoff`` (None: to the
        end). Rows are read first: a cell packed between the two statements (PostgreSQL
        reads each in its own snapshot) then shows up twice, never not at all."""
        pwhere = [] if job_id is None else [event_packs.c.job_id == job_id]
        ahead = [*pwhere, event_packs.c.first_id > after]
        if upto is not None:
            ahead.append(event_packs.c.first_id <= upto)
        firsts = conn.execute(sa.select(event_packs.c.first_id).where(*ahead)
                              .order_by(event_packs.c.first_id)
                              .limit(packs_ahead + 1)).scalars().all()
        cutoff = upto
        if len(firsts) > packs_ahead:
            # Every pack not read starts above this: the log is complete below it.
            cutoff = firsts[-1] - 1 if cutoff is None else min(cutoff, firsts[-1] - 1)
        where = [events.c.id > after]
        if job_id is not None:
            where.append(events.c.job_id == job_id)
        if cutoff is not None:
            where.append(events.c.id <= cutoff)
        rows = conn.execute(sa.select(events).where(*where).order_by(events.c.id)
                            .limit(limit)).mappings().all()
        if len(rows) == limit:
            cutoff = rows[-1]["id"] if cutoff is None else min(cutoff, rows[-1]["id"])
        # The packs' bytes after the rows, by range: one committed since the first statement
        # is read too (its rows were then gone already).
        cols = (event_packs.c.job_id, event_packs.c.first_id, event_packs.c.last_id,
                event_packs.c.data)
        packs = conn.execute(sa.select(*cols).where(
            *pwhere, event_packs.c.first_id <= after, event_packs.c.last_id > after)).all()
        if cutoff is not None:
            ahead.append(event_packs.c.first_id <= cutoff)
        packs += conn.execute(sa.select(*cols).where(*ahead)
                              .order_by(event_packs.c.first_id)).all()
        return rows, packs, cutoff

    @staticmethod
    def _open(row: Any) -> Pack:
        try:
            return open_pack(row.data)
        except ValueError as exc:
            raise UnreadablePack(
                f"table event_packs, job {row.job_id}, the pack of events {row.first_id} to "
                f"{row.last_id}: {exc}. If a newer pgdash wrote this database, upgrade "
                f"pgdash; otherwise delete that row (DELETE FROM event_packs WHERE job_id = "
                f"{row.job_id} AND first_id = {row.first_id}): its events are lost, the rest "
                f"of the job reads on") from None

    def _merge(self, rows: list[Any], packs: list[Any], after: int,
               cutoff: int | None, raw: bool = False) -> Iterator[dict[str, Any]]:
        """StoredEvent dicts of rows and packs in id order (a pack's decoded lazily)."""
        body = (lambda r: raw_body(r["body_z"]) if r["body_z"] is not None else load_body(r)) \
            if raw else load_body
        row_events = ({"id": r["id"], "session": r["session"], "seq": r["seq"], "t": r["t"],
                       "received_at": r["received_at"], "kind": r["kind"],
                       "body": body(r)} for r in rows)
        if not packs:
            return row_events
        return heapq.merge(row_events, *(self._open(p).events(after, cutoff, raw)
                                         for p in packs), key=_event_id)

    # -- compaction and checkpoints (dashboard.storage.compaction, dashboard.history.rewind) -------------------

    def event_spans(self) -> list[tuple[int, float, float]]:
        """(job id, first and last arrival time) of every job with events (index lookups:
        arrival order is id order; a job's newest events are rows, its oldest maybe packed)."""
        with self.engine.connect() as conn:
            out = []
            for (job_id,) in conn.execute(sa.select(jobs.c.id).order_by(jobs.c.id)).all():
                lo, hi = conn.execute(sa.select(sa.func.min(events.c.id)).where(
                    events.c.job_id == job_id)).scalar(), conn.execute(sa.select(
                        sa.func.max(events.c.id)).where(events.c.job_id == job_id)).scalar()
                packed = conn.execute(sa.select(sa.func.min(event_packs.c.first_at),
                                                sa.func.max(event_packs.c.last_at))
                                      .where(event_packs.c.job_id == job_id)).first()
                if lo is None and packed[0] is None:
                    continue
                at = dict(conn.execute(sa.select(events.c.id, events.c.received_at)
                                       .where(events.c.id.in_((lo, hi)))).all()) \
                    if lo is not None else {}
                firsts = [x for x in (at.get(lo), packed[0]) if x is not None]
                lasts = [x for x in (at.get(hi), packed[1]) if x is not None]
                out.append((job_id, min(firsts), max(lasts)))
            return out

    def session_last_arrivals(self, job_id: int) -> dict[str, float]:
        """Per agent session of the job, when its newest event arrived (index lookups)."""
        newest = (sa.select(events.c.session, sa.func.max(events.c.id).label("last"))
                  .where(events.c.session.in_(sa.select(sessions.c.id)
                                              .where(sessions.c.job_id == job_id)))
                  .group_by(events.c.session).subquery())
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(newest.c.session, events.c.received_at)
                                .join(events, events.c.id == newest.c.last)).all()
        return {session: at for session, at in rows}

    def events_until(self, job_id: int, after: int, end: float,
                     raw: bool = False) -> Iterator[dict[str, Any]]:
        """The job's events after id ``after`` that arrived before ``end``, in log order."""
        for ev in self.job_events(job_id, chunk=2000, after=after, raw=raw):
            if ev["received_at"] >= end:
                return
            yield ev

    @staticmethod
    def compact_events(conn: sa.Connection, updates: dict[int, dict[str, Any]],
                       deletes: list[int]) -> None:
        """Writer thread: rewrite summaries and delete the events they replace, atomically."""
        if updates:
            conn.execute(sa.update(events).where(events.c.id == sa.bindparam("event_id"))
                         .values(body="", body_z=sa.bindparam("packed")),
                         [{"event_id": i, "packed": encode_body(b)} for i, b in updates.items()])
        for i in range(0, len(deletes), 500):
            conn.execute(sa.delete(events).where(events.c.id.in_(deletes[i:i + 500])))

    def session_newest_ids(self, job_id: int) -> set[int]:
        """Per agent session of the job, the ids of its newest event and of its newest with
        a seq: the events that stay rows (see the module's docstring)."""
        in_job = events.c.session.in_(sa.select(sessions.c.id)
                                      .where(sessions.c.job_id == job_id))
        with self.engine.connect() as conn:
            newest = conn.execute(sa.select(sa.func.max(events.c.id)).where(in_job)
                                  .group_by(events.c.session)).scalars().all()
            with_seq = conn.execute(sa.select(sa.func.max(events.c.id))
                                    .where(in_job, events.c.seq.is_not(None))
                                    .group_by(events.c.session)).scalars().all()
        return set(newest) | set(with_seq)

    def job_packs(self, job_id: int) -> list[dict[str, Any]]:
        """The job's packs without their bytes (first_id, last_id, first_at, last_at, n,
        thinned), in log order."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(
                event_packs.c.first_id, event_packs.c.last_id, event_packs.c.first_at,
                event_packs.c.last_at, event_packs.c.n, event_packs.c.thinned)
                .where(event_packs.c.job_id == job_id)
                .order_by(event_packs.c.first_id)).mappings().all()
        return [dict(r) for r in rows]

    @staticmethod
    def pack_row(job_id: int, events_in: list[dict[str, Any]],
                 thinned: bool) -> dict[str, Any]:
        """The ``event_packs`` row of StoredEvent dicts (id order), encoded here: on the
        caller's thread, not the writer's."""
        return {"job_id": job_id, "first_id": events_in[0]["id"],
                "last_id": events_in[-1]["id"],
                "first_at": min(ev["received_at"] for ev in events_in),
                "last_at": max(ev["received_at"] for ev in events_in), "n": len(events_in),
                "thinned": thinned, "data": encode_pack(events_in)}

    @staticmethod
    def write_pack(conn: sa.Connection, job_id: int, pack: dict[str, Any] | None,
                   replaces: list[int], row_ids: list[int]) -> None:
        """Writer thread: store ``pack`` (a :meth:`pack_row`) in place of the job's packs
        starting at ids ``replaces`` and of the rows ``row_ids`` (those still rows; the
        others were packed already), in the caller's transaction: a crash leaves either the
        old form or the new, never neither."""
        if replaces:
            conn.execute(sa.delete(event_packs).where(event_packs.c.job_id == job_id,
                                                      event_packs.c.first_id.in_(replaces)))
        for i in range(0, len(row_ids), 500):
            conn.execute(sa.delete(events).where(events.c.id.in_(row_ids[i:i + 500])))
        if pack is not None:
            conn.execute(sa.insert(event_packs).values(**pack))

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

    def checkpoint_list(self, job_id: int) -> list[tuple[int, float]]:
        """(last id, moment) of the job's stored checkpoints, oldest first."""
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(
                sa.select(checkpoints.c.last_id, checkpoints.c.at)
                .where(checkpoints.c.job_id == job_id).order_by(checkpoints.c.last_id))]

    @staticmethod
    def delete_checkpoints(conn: sa.Connection, job_id: int, last_ids: list[int]) -> None:
        for i in range(0, len(last_ids), 500):
            conn.execute(sa.delete(checkpoints).where(
                checkpoints.c.job_id == job_id, checkpoints.c.last_id.in_(last_ids[i:i + 500])))

    def save_checkpoint(self, conn: sa.Connection, job_id: int, last_id: int, at: float,
                        state: bytes) -> None:
        """Writer thread: store a checkpoint unless :meth:`checkpoint_wanted` says no."""
        if self._checkpoint_wanted(conn, job_id, last_id, at):
            conn.execute(sa.insert(checkpoints).values(job_id=job_id, last_id=last_id, at=at,
                                                       state=state))

    def checkpoint_wanted(self, job_id: int, last_id: int, at: float) -> bool:
        """Whether a checkpoint of the job's log up to ``last_id`` at moment ``at`` would be
        stored: not if the job has one at that moment or place, or if the compactor thinned
        that stretch of the log to fewer (``checkpoint_span``; a scrub would store again
        what thinning removed, each time). Asked before the state is encoded."""
        with self.engine.connect() as conn:
            return self._checkpoint_wanted(conn, job_id, last_id, at)

    def _checkpoint_wanted(self, conn: sa.Connection, job_id: int, last_id: int,
                           at: float) -> bool:
        if conn.execute(sa.select(checkpoints.c.last_id).where(
                checkpoints.c.job_id == job_id,
                sa.or_(checkpoints.c.last_id == last_id, checkpoints.c.at == at))).first():
            return False
        span = self.checkpoint_span(job_id, at) if self.checkpoint_span else None
        return span is None or not conn.execute(sa.select(checkpoints.c.last_id).where(
            checkpoints.c.job_id == job_id, checkpoints.c.at >= span[0],
            checkpoints.c.at < at)).first()

    def checkpoint_before(self, job_id: int, at: float,
                          above: int = 0) -> tuple[int, float, bytes] | None:
        """The newest stored checkpoint usable at moment ``at`` (last id, its moment, state
        bytes), if one holds more of the log than id ``above``."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(checkpoints.c.last_id, checkpoints.c.at,
                                         checkpoints.c.state)
                               .where(checkpoints.c.job_id == job_id, checkpoints.c.at <= at,
                                      checkpoints.c.last_id > above)
                               .order_by(checkpoints.c.last_id.desc()).limit(1)).first()
        return (row[0], row[1], bytes(row[2])) if row else None

    def checkpoint_moments(self, job_id: int) -> set[float]:
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(checkpoints.c.at)
                                               .where(checkpoints.c.job_id == job_id))}

    # -- several server processes (dashboard.cluster.node) -----------------------------------------

    @staticmethod
    def session_max_seq(conn: sa.Connection, session: str) -> int:
        """The highest seq stored for an agent session (0 if none): where its resend
        starts, whichever server process stored the rest."""
        found = conn.execute(sa.select(sa.func.max(events.c.seq))
                             .where(events.c.session == session)).scalar()
        return found or 0

    @staticmethod
    def lock_job_name(conn: sa.Connection, name: str) -> None:
        """Serialise the choice of a job for a name across server processes until commit
        (PostgreSQL advisory lock; SQLite's single writer serialises it already)."""
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(name))))

    def max_event_id(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.max(events.c.id))).scalar() or 0

    @staticmethod
    def _row_dict(r) -> dict[str, Any]:
        return {"id": r["id"], "job_id": r["job_id"], "session": r["session"], "seq": r["seq"],
                "t": r["t"], "received_at": r["received_at"], "kind": r["kind"],
                "body": r["body"], "body_z": r["body_z"]}

    def events_after(self, after: int, limit: int) -> list[dict[str, Any]]:
        """Events of every job with an id above ``after``, in id order (bodies as stored:
        the caller parses, with :func:`load_body`, only those of the jobs it holds). Those
        read from packs carry their body parsed already; a pack this pgdash cannot read is
        logged and passed over (its ids then look missing), so one job's damage never stops
        the others' tail."""
        with self.engine.connect() as conn:
            rows, packs, cutoff = self._read_log(conn, None, after, None, limit, 4)
        out = {r["id"]: self._row_dict(r) for r in rows}
        for p in packs:
            for ev in self._pack_events(p, after, cutoff):
                out.setdefault(ev["id"], ev)
        return [out[i] for i in sorted(out)]

    def _pack_events(self, pack_row: Any, after: int = 0, upto: int | None = None,
                     only: set[int] | None = None) -> list[dict[str, Any]]:
        """Events of a pack as ``events_after`` rows (with ``job_id``), [] if unreadable."""
        try:
            pack = self._open(pack_row)
        except UnreadablePack as exc:
            self.unreadable_packs += 1
            log.error("pgdash: %s", exc)
            return []
        found = pack.events(after, upto) if only is None else \
            (ev for i in sorted(only) for ev in pack.events(i - 1, i))  # no other body built
        return [dict(ev, job_id=pack_row.job_id, body_z=None) for ev in found]

    def events_by_id(self, ids: list[int]) -> list[dict[str, Any]]:
        if not ids:
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(events).where(events.c.id.in_(ids))
                                .order_by(events.c.id)).mappings().all()
            found = {r["id"]: self._row_dict(r) for r in rows}
            missing = set(ids) - set(found)
            packs = conn.execute(sa.select(
                event_packs.c.job_id, event_packs.c.first_id, event_packs.c.last_id,
                event_packs.c.data).where(event_packs.c.first_id <= max(missing),
                                          event_packs.c.last_id >= min(missing))).all() \
                if missing else []
        for p in packs:
            for ev in self._pack_events(p, only=missing):
                found.setdefault(ev["id"], ev)
        return [found[i] for i in sorted(found)]

    def claim_job(self, job_id: int, owner: str, now: float,
                  expires_at: float) -> tuple[bool, bool]:
        """Take or renew the job's lease unless another owner's is still running.

        Returns (owned now, taken over from an expired owner)."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(job_owners.c.owner, job_owners.c.expires_at)
                               .where(job_owners.c.job_id == job_id)).first()
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(sa.insert(job_owners).values(
                            job_id=job_id, owner=owner, expires_at=expires_at))
                    return True, False
                except sa.exc.IntegrityError:  # another process inserted it first
                    return False, False
            if row.owner != owner and row.expires_at >= now:
                return False, False
            # The guard repeats the check, so of two processes racing for an expired lease
            # only one updates the row.
            done = conn.execute(sa.update(job_owners).where(
                job_owners.c.job_id == job_id, job_owners.c.owner == row.owner,
                job_owners.c.expires_at == row.expires_at).values(
                owner=owner, expires_at=expires_at)).rowcount
            return done == 1, done == 1 and row.owner != owner

    def renew_jobs(self, job_ids: set[int], owner: str, expires_at: float) -> set[int]:
        """Extend the owner's leases; returns the jobs it still holds."""
        with self.engine.begin() as conn:
            conn.execute(sa.update(job_owners).where(job_owners.c.owner == owner,
                                                     job_owners.c.job_id.in_(job_ids))
                         .values(expires_at=expires_at))
            rows = conn.execute(sa.select(job_owners.c.job_id).where(
                job_owners.c.owner == owner, job_owners.c.job_id.in_(job_ids)))
            return {r[0] for r in rows}

    def release_jobs(self, job_ids: set[int], owner: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(job_owners).where(job_owners.c.owner == owner,
                                                     job_owners.c.job_id.in_(job_ids)))

    def orphan_jobs(self, now: float, limit: int = 1000) -> list[int]:
        """Jobs still going whose lease ran out, or that nobody ever claimed."""
        query = (sa.select(jobs.c.id)
                 .select_from(jobs.outerjoin(job_owners, job_owners.c.job_id == jobs.c.id))
                 .where(jobs.c.status.not_in(("finished", "failed")),
                        sa.or_(job_owners.c.job_id.is_(None), job_owners.c.expires_at < now))
                 .order_by(jobs.c.id).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)]

    def job_owner(self, job_id: int, now: float) -> str | None:
        """The process holding a live lease on the job, if any."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(job_owners.c.owner).where(
                job_owners.c.job_id == job_id, job_owners.c.expires_at >= now)).scalar()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until everything queued so far is committed (tests, shutdown)."""
        self.submit(lambda conn: None, timeout=timeout)
