"""The ``--db`` database: its URL checked before anything connects, the engine (SQLite in WAL
mode, or PostgreSQL), the schema brought up to date, and what a failed connection or write
means in one line a user can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event

from dashboard.resources import resource_dir


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


# Values bound in one ``IN (...)`` at most (SQLite's limit on a statement's variables).
IN_CHUNK = 500


def delete_in(conn: sa.Connection, column: sa.Column, values: list, *where: Any) -> None:
    """Writer thread: delete the rows of ``column``'s table whose ``column`` is one of
    ``values`` (and that meet ``where``), IN_CHUNK values a statement."""
    for i in range(0, len(values), IN_CHUNK):
        conn.execute(sa.delete(column.table).where(*where, column.in_(values[i:i + IN_CHUNK])))


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
    text = (str(getattr(exc, "orig", None) or exc).splitlines() or [type(exc).__name__])[0][:300]
    if "locked" in text or "busy" in text:
        return (f"database {where} is locked by another process ({text}); pgdash keeps the "
                "batch for a retry: end whatever holds the lock (a sqlite3 shell, a backup), "
                "or raise PGDASH_DB_BUSY_TIMEOUT_S")
    if "full" in text or "No space" in text:
        return (f"database {where} cannot grow: its disk is full ({text}); pgdash keeps the "
                "batch for a retry and resumes once there is space")
    return f"could not write to database {where}: {text}"
