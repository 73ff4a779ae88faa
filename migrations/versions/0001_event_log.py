"""The event log: jobs, agent sessions and their events.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("world_size", sa.Integer),
        sa.Column("backend", sa.String(64)),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer),
        sa.Column("host", sa.String(256)),
        sa.Column("pid", sa.Integer),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_sessions_job_id_jobs"),
    )
    op.create_index("ix_sessions_job_id", "sessions", ["job_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("session", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs"),
        sa.UniqueConstraint("session", "seq", name="uq_events_session_seq"),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("sessions")
    op.drop_table("jobs")
