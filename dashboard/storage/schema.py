"""The tables, as SQLAlchemy sees them (the Alembic migrations in ``migrations/`` create them).

- ``jobs``: one row per job, with a cached summary (status, world size, ...) for fast listing;
- ``sessions``: one row per agent process, mapping it to its job;
- ``events``: the event log, the source of truth. ``(session, seq)`` is unique. Bodies are
  stored compact (``body_z``, see dashboard.storage.codec; ``body`` is then empty); rows written before
  revision 0004 keep their JSON ``body`` and read back the same. dashboard.storage.compaction thins
  routine events beyond the recent window (see there for what detail that gives up);
- ``event_packs``: older events of ``events``, one job's events of one compaction cell per
  row, stored column by column and compressed together (dashboard.storage.packformat;
  written by dashboard.storage.compaction). Every read of the log merges packs and rows in id order,
  so readers see one log (dashboard.storage.log). Each agent session's newest event, and its
  newest with a seq, always stay rows: what admission (``Sessions.max_seqs``,
  ``Sessions.max_seq``) and the compactor (``Sessions.last_arrivals``) read of a session's
  end needs no pack;
- ``findings``: each job's current findings; ``book_log`` and ``book_spans``: what its
  findings book concluded, moment by moment (dashboard.storage.findings);
- ``checkpoints``: folded JobStates at moments of the log (dashboard.history.rewind), so that
  scrubbing backwards starts from the nearest one, also after a restart;
- ``keyframes``: the page's whole answer for a job (``state?at=``) at moments on a grid
  (dashboard.history.keyframes), so that scrubbing a big job reads a moment instead of
  folding one;
- ``job_owners``: which server process owns a live job (dashboard.storage.owners).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(naming_convention={
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("world_size", sa.Integer),
    sa.Column("backend", sa.String(64)),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    # How the job was launched (its rank 0's Hello) and its current attempt (migration 0007).
    sa.Column("command", sa.String(512)),
    sa.Column("launcher", sa.String(64)),
    sa.Column("launcher_id", sa.String(256)),
    sa.Column("attempt", sa.Integer),
    # A job ``pgdash import`` made: the file's name and when the original was exported (the
    # file says, from pgdash 0007 on). NULL for a job agents reported here.
    sa.Column("imported_from", sa.String(256)),
    sa.Column("exported_at", sa.Float),
)

# What a job's summary (JobState.summary) keeps up to date in its row.
JOB_FIELDS = ("status", "world_size", "backend", "started_at", "ended_at", "command",
              "launcher", "launcher_id", "attempt")

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("rank", sa.Integer),
    sa.Column("host", sa.String(256)),
    sa.Column("pid", sa.Integer),
    sa.Column("first_seen", sa.Float, nullable=False),
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("session", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer),
    sa.Column("t", sa.Float, nullable=False),
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("body", sa.Text, nullable=False),  # JSON; "" when body_z holds the body
    sa.Column("body_z", sa.LargeBinary),  # dashboard.storage.codec.encode_body (revision 0004)
    sa.UniqueConstraint("session", "seq", name="uq_events_session_seq"),
    sa.Index("ix_events_job_id_id", "job_id", "id"),
)

findings = sa.Table(
    "findings", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("id", sa.String(160), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),
    sa.Column("first_seen", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)

# A folded JobState after every event that arrived before ``at`` (dashboard.history.rewind), as
# dashboard.storage.codec.encode_state bytes: written by the server only.
checkpoints = sa.Table(
    "checkpoints", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("last_id", sa.Integer, primary_key=True),  # the state holds events up to this
    sa.Column("at", sa.Float, nullable=False),  # arrival time of that last event
    sa.Column("state", sa.LargeBinary, nullable=False),
)

# ``GET /api/jobs/<id>/state?at=`` of a job at a moment on a grid, zlib of what
# dashboard.web.live.keyframe makes of it (dashboard.history.keyframes), written by the server
# only (revision 0008).
keyframes = sa.Table(
    "keyframes", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("at", sa.Float, primary_key=True),
    sa.Column("answer", sa.LargeBinary, nullable=False),
)

# One job's events of one compaction cell (dashboard.storage.compaction), as
# dashboard.storage.packformat bytes; the events it holds are no longer rows of ``events``
# (revision 0005).
event_packs = sa.Table(
    "event_packs", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("first_id", sa.Integer, primary_key=True),  # the ids of its first
    sa.Column("last_id", sa.Integer, nullable=False),  # and last event
    sa.Column("first_at", sa.Float, nullable=False),  # their arrival times
    sa.Column("last_at", sa.Float, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),  # events in it
    sa.Column("thinned", sa.Boolean, nullable=False),  # compacted as its age asks: final
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Index("ix_event_packs_first_id", "first_id"),
    sa.Index("ix_event_packs_last_id", "last_id"),
)

# What each job's live findings book concluded, moment by moment (dashboard.diagnosis.timeline's
# BookLog): ``state?at=`` and a restarted server read the book as of a moment here instead of
# judging every moment again. ``id`` "" with no body marks a moment the book judged.
book_log = sa.Table(
    "book_log", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("at", sa.Float, primary_key=True),
    sa.Column("id", sa.String(160), primary_key=True),
    sa.Column("body", sa.LargeBinary),  # dashboard.storage.codec.encode_body of the finding
)

# The grid moments each job's book_log covers: every one from start_at to through_at.
book_spans = sa.Table(
    "book_spans", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("start_at", sa.Float, nullable=False),
    sa.Column("through_at", sa.Float, nullable=False),
)

# One row per job that some server process owns (several processes share one database, see
# dashboard.cluster.node): the owner alone folds and diagnoses the job, while its lease lasts.
job_owners = sa.Table(
    "job_owners", metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)
