"""Jobs and the agent sessions that report to them: their rows, and where each session's
part of the log ends (where its resend starts, what the compactor must leave as rows).

Methods that take ``conn`` run on the writer thread, inside its transaction; the others
read with a pooled connection of their own.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dashboard.storage.schema import JOB_FIELDS, events, jobs, sessions


def _with_run(query: sa.Select) -> sa.Select:
    """``query`` over ``jobs`` with a ``run`` column: the jobs of the same name up to each
    (by the name's index)."""
    earlier = jobs.alias("earlier")
    run = (sa.select(sa.func.count()).select_from(earlier)
           .where(earlier.c.name == jobs.c.name, earlier.c.id <= jobs.c.id)
           .scalar_subquery())
    return query.add_columns(run.label("run"))


class Jobs:
    """The ``jobs`` table: one row per job, its summary kept up to date."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    @staticmethod
    def create(conn: sa.Connection, name: str, now: float, imported_from: str | None = None,
               exported_at: float | None = None) -> int:
        return conn.execute(sa.insert(jobs).values(
            name=name, created_at=now, status="initializing", imported_from=imported_from,
            exported_at=exported_at)).inserted_primary_key[0]

    @staticmethod
    def latest_named(conn: sa.Connection, name: str) -> dict[str, Any] | None:
        """The newest job agents reported under ``name`` (an imported job is a record of
        another server's: no agent joins it)."""
        row = conn.execute(sa.select(jobs).where(jobs.c.name == name,
                                                 jobs.c.imported_from.is_(None))
                           .order_by(jobs.c.id.desc()).limit(1)).mappings().first()
        return dict(row) if row else None

    @staticmethod
    def lock_name(conn: sa.Connection, name: str) -> None:
        """Serialise the choice of a job for a name across server processes until commit
        (PostgreSQL advisory lock; SQLite's single writer serialises it already)."""
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(name))))

    @staticmethod
    def update(conn: sa.Connection, job_id: int, summary: dict[str, Any]) -> None:
        """Keep the job's row to its summary (JobState.summary's JOB_FIELDS)."""
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id)
                     .values(**{k: summary[k] for k in JOB_FIELDS if k in summary}))

    def get(self, job_id: int) -> dict[str, Any] | None:
        """The job's row and its ``run`` (see :meth:`newest`), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(_with_run(sa.select(jobs)).where(jobs.c.id == job_id)) \
                .mappings().first()
            return dict(row) if row else None

    def newest(self, limit: int = 500) -> list[dict[str, Any]]:
        """The newest jobs first, each with ``run``: how many jobs of its name came up to it
        (1 for the first), which tells apart launches that reused a name."""
        with self.engine.connect() as conn:
            rows = conn.execute(_with_run(sa.select(jobs)).order_by(jobs.c.id.desc())
                                .limit(limit))
            return [dict(r) for r in rows.mappings()]


class Sessions:
    """The ``sessions`` table (one row per agent process) and each session's end of the log."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    @staticmethod
    def find(conn: sa.Connection, session: str) -> dict[str, Any] | None:
        row = conn.execute(sa.select(sessions).where(sessions.c.id == session)).mappings().first()
        return dict(row) if row else None

    @staticmethod
    def create(conn: sa.Connection, session: str, job_id: int, rank: int | None,
               host: str | None, pid: int | None, now: float) -> None:
        conn.execute(sa.insert(sessions).values(id=session, job_id=job_id, rank=rank,
                                                host=host, pid=pid, first_seen=now))

    def of_job(self, job_id: int) -> list[dict[str, Any]]:
        """The job's agent sessions (id, rank, host, pid, first_seen), oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(sessions.c.id, sessions.c.rank, sessions.c.host, sessions.c.pid,
                          sessions.c.first_seen)
                .where(sessions.c.job_id == job_id)
                .order_by(sessions.c.first_seen, sessions.c.id)).mappings().all()
        return [dict(r) for r in rows]

    @staticmethod
    def max_seq(conn: sa.Connection, session: str) -> int:
        """The highest seq stored for an agent session (0 if none): where its resend
        starts, whichever server process stored the rest."""
        found = conn.execute(sa.select(sa.func.max(events.c.seq))
                             .where(events.c.session == session)).scalar()
        return found or 0

    def max_seqs(self) -> dict[str, int]:
        """Every session's highest stored seq (those with any)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(events.c.session, sa.func.max(events.c.seq))
                                .where(events.c.seq.is_not(None))
                                .group_by(events.c.session))
            return {s: m for s, m in rows}

    def last_arrivals(self, job_id: int) -> dict[str, float]:
        """Per agent session of the job, when its newest event arrived (index lookups)."""
        newest = (sa.select(events.c.session, sa.func.max(events.c.id).label("last"))
                  .where(events.c.session.in_(sa.select(sessions.c.id)
                                              .where(sessions.c.job_id == job_id)))
                  .group_by(events.c.session).subquery())
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(newest.c.session, events.c.received_at)
                                .join(events, events.c.id == newest.c.last)).all()
        return {session: at for session, at in rows}

    def newest_ids(self, job_id: int) -> set[int]:
        """Per agent session of the job, the ids of its newest event and of its newest with
        a seq: the events that stay rows (see dashboard.storage.schema)."""
        in_job = events.c.session.in_(sa.select(sessions.c.id)
                                      .where(sessions.c.job_id == job_id))
        with self.engine.connect() as conn:
            newest = conn.execute(sa.select(sa.func.max(events.c.id)).where(in_job)
                                  .group_by(events.c.session)).scalars().all()
            with_seq = conn.execute(sa.select(sa.func.max(events.c.id))
                                    .where(in_job, events.c.seq.is_not(None))
                                    .group_by(events.c.session)).scalars().all()
        return set(newest) | set(with_seq)
