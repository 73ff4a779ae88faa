"""The ``pgdash`` command line: serve, demo, snapshot, export, import, replay, db upgrade.

This module is the entry point (``pgdash = "dashboard.cli:main"``): the ``pgdash`` group, the
console logging every command shares, and the list of subcommands. Each subcommand lives in
dashboard/commands/ by concern: serving.py (serve, demo), snapshot.py (a running job's stacks),
history.py (export, import, replay), database.py (db upgrade), and inputs.py for what they share
(--db, BadInput).
"""

from __future__ import annotations

import logging

import click

from dashboard.commands.database import db
from dashboard.commands.history import export_cmd, import_cmd, replay_cmd
from dashboard.commands.serving import demo, serve
from dashboard.commands.snapshot import snapshot_cmd


@click.group()
@click.version_option(package_name="pgdash")
def cli() -> None:
    """pgdash: live diagnosis of PyTorch distributed training jobs."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.WARNING)
    werkzeug.addFilter(_quiet_websocket_close)


def _quiet_websocket_close(record: logging.LogRecord) -> bool:
    """Werkzeug logs the bytes left on a closed websocket as a '400 Bad request'; harmless."""
    return "code 400, message Bad" not in record.getMessage()


for command in (serve, demo, snapshot_cmd, export_cmd, import_cmd, replay_cmd, db):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="pgdash")


if __name__ == "__main__":
    main()
