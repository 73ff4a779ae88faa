"""Compact storage: event bodies as compact bytes, and persistent JobState checkpoints.

Rows stored before keep their JSON ``body`` (``body_z`` NULL) and read back unchanged:
nothing is rewritten, so upgrading a big database is instant and loses nothing; compaction
(dashboard.storage.compaction) re-encodes the old rows it touches.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("events", sa.Column("body_z", sa.LargeBinary))
    op.create_table(
        "checkpoints",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("last_id", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "last_id", name="pk_checkpoints"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_checkpoints_job_id_jobs"),
    )


def downgrade() -> None:
    # Compact bodies back to JSON first, so that a downgraded database reads them.
    import json

    from dashboard.storage.codec import decode_body

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, body_z FROM events WHERE body_z IS NOT NULL"))
    for event_id, packed in rows.fetchall():
        conn.execute(sa.text("UPDATE events SET body = :b WHERE id = :i"),
                     {"b": json.dumps(decode_body(packed)), "i": event_id})
    op.drop_table("checkpoints")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("body_z")
