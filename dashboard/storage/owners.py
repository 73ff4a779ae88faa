"""Job owners: which server process owns each live job (several share one database, see
dashboard.cluster.node), by leases that the owner renews and another takes over once they
run out."""

from __future__ import annotations

import sqlalchemy as sa

from dashboard.storage.schema import job_owners, jobs


class JobOwners:
    """The ``job_owners`` table: one lease per owned job. Each call is its own transaction."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    def claim(self, job_id: int, owner: str, now: float,
              expires_at: float) -> tuple[bool, bool]:
        """Take or renew the job's lease unless another owner's is still running.

        Returns (owned now, taken over from an expired owner)."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(job_owners.c.owner, job_owners.c.expires_at)
                               .where(job_owners.c.job_id == job_id)).first()
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(sa.insert(job_owners).values(
                            job_id=job_id, owner=owner, expires_at=expires_at))
                    return True, False
                except sa.exc.IntegrityError:  # another process inserted it first
                    return False, False
            if row.owner != owner and row.expires_at >= now:
                return False, False
            # The guard repeats the check, so of two processes racing for an expired lease
            # only one updates the row.
            done = conn.execute(sa.update(job_owners).where(
                job_owners.c.job_id == job_id, job_owners.c.owner == row.owner,
                job_owners.c.expires_at == row.expires_at).values(
                owner=owner, expires_at=expires_at)).rowcount
            return done == 1, done == 1 and row.owner != owner

    def renew(self, job_ids: set[int], owner: str, expires_at: float) -> set[int]:
        """Extend the owner's leases; returns the jobs it still holds."""
        with self.engine.begin() as conn:
            conn.execute(sa.update(job_owners).where(job_owners.c.owner == owner,
                                                     job_owners.c.job_id.in_(job_ids))
                         .values(expires_at=expires_at))
            rows = conn.execute(sa.select(job_owners.c.job_id).where(
                job_owners.c.owner == owner, job_owners.c.job_id.in_(job_ids)))
            return {r[0] for r in rows}

    def release(self, job_ids: set[int], owner: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(job_owners).where(job_owners.c.owner == owner,
                                                     job_owners.c.job_id.in_(job_ids)))

    def orphans(self, now: float, limit: int = 1000) -> list[int]:
        """Jobs still going whose lease ran out, or that nobody ever claimed."""
        query = (sa.select(jobs.c.id)
                 .select_from(jobs.outerjoin(job_owners, job_owners.c.job_id == jobs.c.id))
                 .where(jobs.c.status.not_in(("finished", "failed")),
                        sa.or_(job_owners.c.job_id.is_(None), job_owners.c.expires_at < now))
                 .order_by(jobs.c.id).limit(limit))
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)]

    def owner(self, job_id: int, now: float) -> str | None:
        """The process holding a live lease on the job, if any."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(job_owners.c.owner).where(
                job_owners.c.job_id == job_id, job_owners.c.expires_at >= now)).scalar()
