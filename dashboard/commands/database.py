"""``pgdash db``: database maintenance, today ``pgdash db upgrade`` (create or migrate the
schema). Its own group so that maintenance commands gather here, apart from serving and history.
"""

from __future__ import annotations

import click

from dashboard.commands.inputs import BadInput, db_option, shown


@click.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@db_option
def db_upgrade(db: str) -> None:
    """Create or migrate the database schema to the latest version."""
    from dashboard.storage.database import upgrade

    try:
        upgrade(db)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    click.echo(f"pgdash: database {shown(db)} is up to date")
