"""Keyframes: the page's whole answer for a job at moments on a grid (``state?at=``), so that
scrubbing and playing a big stored job read a moment instead of folding one.

Jobs stored before have none; a scrub that folds through their grid moments stores them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "keyframes",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("answer", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "at", name="pk_keyframes"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_keyframes_job_id_jobs"),
    )


def downgrade() -> None:
    op.drop_table("keyframes")
