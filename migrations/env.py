"""Alembic environment for pgdash: driven from code (``dashboard.storage.database.upgrade``), no ini file."""

from alembic import context

from dashboard.storage.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `pgdash db upgrade`, which passes a connection")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
