"""The findings book's history: what each job's live book concluded, moment by moment.

``state?at=`` and a restarted server read a job's findings as of a moment from it instead of
judging every moment of the job again (dashboard.diagnosis.timeline.BookLog). Jobs stored before
have no log and are judged as before; the first time one is loaded its book is recorded.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "book_log",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("id", sa.String(160), nullable=False),
        sa.Column("body", sa.LargeBinary),
        sa.PrimaryKeyConstraint("job_id", "at", "id", name="pk_book_log"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_book_log_job_id_jobs"),
    )
    op.create_table(
        "book_spans",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("start_at", sa.Float, nullable=False),
        sa.Column("through_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_book_spans"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_book_spans_job_id_jobs"),
    )


def downgrade() -> None:
    op.drop_table("book_spans")
    op.drop_table("book_log")
