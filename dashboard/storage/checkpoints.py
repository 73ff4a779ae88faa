"""Stored checkpoints: folded JobStates at moments of a job's log (dashboard.history.rewind
makes and reads them; dashboard.storage.compaction thins them beyond its window)."""

from __future__ import annotations

import logging
from typing import Any, Callable

import sqlalchemy as sa

from dashboard.storage.codec import decode_state
from dashboard.storage.database import delete_in
from dashboard.storage.schema import checkpoints

log = logging.getLogger("pgdash.checkpoints")


class Checkpoints:
    """The ``checkpoints`` table: (job, last event id) -> the state's bytes at that moment."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        # (job id, moment) -> the [start, end) of arrival time that keeps one checkpoint, where
        # the compactor thins them (dashboard.storage.compaction), else None.
        self.span: Callable[[int, float], tuple[float, float] | None] | None = None

    def of_job(self, job_id: int) -> list[tuple[int, float]]:
        """(last id, moment) of the job's stored checkpoints, oldest first."""
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(
                sa.select(checkpoints.c.last_id, checkpoints.c.at)
                .where(checkpoints.c.job_id == job_id).order_by(checkpoints.c.last_id))]

    def moments(self, job_id: int) -> set[float]:
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(checkpoints.c.at)
                                               .where(checkpoints.c.job_id == job_id))}

    def before(self, job_id: int, at: float, above: int = 0,
               upto: int | None = None) -> tuple[int, float, bytes] | None:
        """The newest stored checkpoint usable at moment ``at`` (last id, its moment, state
        bytes), if one holds more of the log than id ``above`` (and no more than id ``upto``,
        when given)."""
        where = [checkpoints.c.job_id == job_id, checkpoints.c.at <= at,
                 checkpoints.c.last_id > above]
        if upto is not None:
            where.append(checkpoints.c.last_id <= upto)
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(checkpoints.c.last_id, checkpoints.c.at,
                                         checkpoints.c.state)
                               .where(*where)
                               .order_by(checkpoints.c.last_id.desc()).limit(1)).first()
        return (row[0], row[1], bytes(row[2])) if row else None

    def load(self, job_id: int, at: float, above: int = 0,
             upto: int | None = None) -> tuple[int, float, Any] | None:
        """:meth:`before`, its state decoded (None where there is none or it cannot be read:
        the caller folds without it, and the log says which)."""
        found = self.before(job_id, at, above, upto)
        if found is None:
            return None
        try:
            return found[0], found[1], decode_state(found[2])
        except ValueError:
            log.exception("pgdash: checkpoint %s of job %s is unreadable; folding without it",
                          found[0], job_id)
            return None

    def wanted(self, job_id: int, last_id: int, at: float) -> bool:
        """Whether a checkpoint of the job's log up to ``last_id`` at moment ``at`` would be
        stored: not if the job has one at that moment or place, or if the compactor thinned
        that stretch of the log to fewer (:attr:`span`; a scrub would store again what
        thinning removed, each time). Asked before the state is encoded."""
        with self.engine.connect() as conn:
            return self._wanted(conn, job_id, last_id, at)

    def save(self, conn: sa.Connection, job_id: int, last_id: int, at: float,
             state: bytes) -> None:
        """Writer thread: store a checkpoint unless :meth:`wanted` says no."""
        if self._wanted(conn, job_id, last_id, at):
            conn.execute(sa.insert(checkpoints).values(job_id=job_id, last_id=last_id, at=at,
                                                       state=state))

    @staticmethod
    def delete(conn: sa.Connection, job_id: int, last_ids: list[int]) -> None:
        """Writer thread: delete the job's checkpoints of these last ids."""
        delete_in(conn, checkpoints.c.last_id, last_ids, checkpoints.c.job_id == job_id)

    def _wanted(self, conn: sa.Connection, job_id: int, last_id: int, at: float) -> bool:
        if conn.execute(sa.select(checkpoints.c.last_id).where(
                checkpoints.c.job_id == job_id,
                sa.or_(checkpoints.c.last_id == last_id, checkpoints.c.at == at))).first():
            return False
        span = self.span(job_id, at) if self.span else None
        return span is None or not conn.execute(sa.select(checkpoints.c.last_id).where(
            checkpoints.c.job_id == job_id, checkpoints.c.at >= span[0],
            checkpoints.c.at < at)).first()
