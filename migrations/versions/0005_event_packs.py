"""Event packs: a job's events of one compaction cell stored together, compressed as one.

New table ``event_packs`` (dashboard.storage.packs, dashboard.storage.packformat); ``events``
keeps its rows until the compactor (dashboard.storage.compaction) packs them, so upgrading is
instant and reads back the same. A downgrade unpacks every pack back into rows first, so
that nothing stored is lost.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_packs",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("first_id", sa.Integer, nullable=False),
        sa.Column("last_id", sa.Integer, nullable=False),
        sa.Column("first_at", sa.Float, nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("thinned", sa.Boolean, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "first_id", name="pk_event_packs"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_event_packs_job_id_jobs"),
    )
    # A follower tails every job's log by id (Store.log.events_after).
    op.create_index("ix_event_packs_first_id", "event_packs", ["first_id"])
    op.create_index("ix_event_packs_last_id", "event_packs", ["last_id"])


def downgrade() -> None:
    from dashboard.storage.codec import encode_body
    from dashboard.storage.packformat import decode_pack

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT job_id, data FROM event_packs")).fetchall()
    for job_id, data in rows:
        conn.execute(sa.text(
            "INSERT INTO events (id, job_id, session, seq, t, received_at, kind, body, body_z) "
            "VALUES (:id, :job_id, :session, :seq, :t, :received_at, :kind, '', :body_z)"),
            [{**{k: ev[k] for k in ("id", "session", "seq", "t", "received_at", "kind")},
              "job_id": job_id, "body_z": encode_body(ev["body"])}
             for ev in decode_pack(data)])
    op.drop_index("ix_event_packs_last_id", "event_packs")
    op.drop_index("ix_event_packs_first_id", "event_packs")
    op.drop_table("event_packs")
