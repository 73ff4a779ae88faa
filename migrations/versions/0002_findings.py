"""Findings: what diagnosis concluded, kept across restarts (resolved ones included).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "findings",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("id", sa.String(160), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "id", name="pk_findings"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_findings_job_id_jobs"),
    )


def downgrade() -> None:
    op.drop_table("findings")
