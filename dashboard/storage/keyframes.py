"""Stored keyframes: a job's ``state?at=`` answer at moments on a grid, as zlib of its JSON
(dashboard.history.keyframes makes and reads them)."""

from __future__ import annotations

import sqlalchemy as sa

from dashboard.storage.schema import keyframes


class StoredKeyframes:
    """The ``keyframes`` table: (job, moment) -> the answer's compressed JSON."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    def moments(self, job_id: int) -> set[float]:
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(keyframes.c.at)
                                               .where(keyframes.c.job_id == job_id))}

    def newest(self, job_id: int, start: float, end: float) -> tuple[float, bytes] | None:
        """The job's newest keyframe at a moment in [start, end]: (moment, bytes), or None."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(keyframes.c.at, keyframes.c.answer)
                               .where(keyframes.c.job_id == job_id, keyframes.c.at >= start,
                                      keyframes.c.at <= end)
                               .order_by(keyframes.c.at.desc()).limit(1)).first()
        return (row[0], bytes(row[1])) if row else None

    @staticmethod
    def save(conn: sa.Connection, job_id: int, at: float, answer: bytes) -> None:
        """Writer thread: store the keyframe at ``at`` unless the job has one there."""
        if not conn.execute(sa.select(keyframes.c.at).where(
                keyframes.c.job_id == job_id, keyframes.c.at == at)).first():
            conn.execute(sa.insert(keyframes).values(job_id=job_id, at=at, answer=answer))
