"""Stored keyframes: a job's ``state?at=`` answer at moments on a grid, zlib-compressed
(dashboard.history.keyframes makes and reads them; dashboard.storage.compaction thins them
beyond its window)."""

from __future__ import annotations

from typing import Callable

import sqlalchemy as sa

from dashboard.storage.database import delete_in
from dashboard.storage.schema import keyframes


class StoredKeyframes:
    """The ``keyframes`` table: (job, moment) -> the answer's compressed JSON."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        # (job id, moment) -> whether a keyframe there is kept, where the compactor thins
        # them (dashboard.storage.compaction); None: every one is.
        self.kept: Callable[[int, float], bool] | None = None

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

    def between(self, job_id: int, start: float, end: float) -> list[float]:
        """The moments of the job's keyframes in [start, end), oldest first."""
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(
                sa.select(keyframes.c.at).where(keyframes.c.job_id == job_id,
                                                keyframes.c.at >= start, keyframes.c.at < end)
                .order_by(keyframes.c.at))]

    def wanted(self, job_id: int, at: float) -> bool:
        """Whether a keyframe at ``at`` would be kept (not where the compactor thinned)."""
        return self.kept is None or self.kept(job_id, at)

    def save(self, conn: sa.Connection, job_id: int, at: float, answer: bytes) -> None:
        """Writer thread: store the keyframe at ``at`` unless the job has one there, or the
        compactor thinned that stretch to fewer."""
        if self.wanted(job_id, at) and not conn.execute(sa.select(keyframes.c.at).where(
                keyframes.c.job_id == job_id, keyframes.c.at == at)).first():
            conn.execute(sa.insert(keyframes).values(job_id=job_id, at=at, answer=answer))

    @staticmethod
    def delete(conn: sa.Connection, job_id: int, moments: list[float]) -> None:
        """Writer thread: delete the job's keyframes at these moments."""
        delete_in(conn, keyframes.c.at, moments, keyframes.c.job_id == job_id)
