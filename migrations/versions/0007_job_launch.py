"""How each job was launched, its current attempt, and whether it was imported.

The jobs list tells apart launches that share a name by their command, launcher, attempt and
start (the agent's Hello says the first three since this revision; older jobs keep NULL), and
marks a job ``pgdash import`` made with the file it came from and when that was exported.
Every column is nullable: rows stored before read as "not said".

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-15
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (
    ("command", sa.String(512)),
    ("launcher", sa.String(64)),
    ("launcher_id", sa.String(256)),
    ("attempt", sa.Integer),
    ("imported_from", sa.String(256)),
    ("exported_at", sa.Float),
)


def upgrade() -> None:
    # Plain ALTER TABLE ... ADD COLUMN on SQLite and PostgreSQL alike: no table is copied.
    for name, kind in COLUMNS:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # SQLite drops columns by copying the table (batch mode), as 0004's downgrade does.
    with op.batch_alter_table("jobs") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
