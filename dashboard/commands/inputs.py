"""What every ``pgdash`` command shares about its input: the ``--db`` option, the one way a
command refuses what it was given (:class:`BadInput`), and opening the store or a session file
with that refusal instead of a traceback.

Its own room so that each command module (serving, history, database) takes these from one
place, and the command line's wording of a bad --db or a bad file stays the same everywhere.
"""

from __future__ import annotations

import os

import click

from dashboard.config import DEFAULT_DB


class BadInput(click.ClickException):
    """What a command was given cannot work: a database URL, a file, a setting. One line
    ("Error: ..."), exit status 2 as click's own usage errors, never a traceback."""

    exit_code = 2


def db_option(f):
    """The ``--db`` option, alike on every command that opens the database."""
    return click.option(
        "--db", "db", default=lambda: os.environ.get("PGDASH_DB") or DEFAULT_DB,
        show_default="PGDASH_DB, else sqlite:///pgdash.db in the working directory",
        help="SQLAlchemy database URL.")(f)


def shown(db: str) -> str:
    """The --db URL as it may be printed (its password hidden)."""
    from dashboard.storage.database import display_url

    return display_url(db)


def open_store(db: str):
    """The started store of ``db``, or a clear error on the command line."""
    from dashboard.storage.store import Store

    try:
        return Store(db).start()
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def read_archive(path: str):
    """The session file at ``path``, or a clear error that says what to pass instead."""
    from dashboard.history.archive import Archive, ArchiveError

    try:
        with open(path, encoding="utf-8") as f:
            return Archive.read(f, source=path)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}; pass a session file "
                       "made by `pgdash export JOB -o FILE`") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not a text file: expected a pgdash session "
                       "file (made by `pgdash export`)") from None
    except ArchiveError as exc:
        raise BadInput(str(exc)) from None
