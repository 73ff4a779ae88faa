"""Job owners: which server process folds and diagnoses each job (a lease, renewed).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_owners",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_owners"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_owners_job_id_jobs"),
    )


def downgrade() -> None:
    op.drop_table("job_owners")
