"""Stored findings: each job's current findings, and its findings book's log (what the book
concluded, moment by moment: dashboard.diagnosis.timeline's BookLog), so that ``state?at=`` and a
restarted server read the book as of a moment instead of judging every moment again."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from dashboard.storage.codec import decode_body, encode_body
from dashboard.storage.schema import book_log, book_spans, findings


class StoredFindings:
    """The ``findings``, ``book_log`` and ``book_spans`` tables."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    @staticmethod
    def save(conn: sa.Connection, job_id: int, rows: list[dict[str, Any]]) -> None:
        """Insert or replace findings (portable: delete then insert, in one transaction)."""
        if not rows:
            return
        conn.execute(sa.delete(findings).where(findings.c.job_id == job_id,
                                               findings.c.id.in_([f["id"] for f in rows])))
        conn.execute(sa.insert(findings), [
            {"job_id": job_id, "id": f["id"], "kind": f["kind"], "severity": f["severity"],
             "active": f["active"], "first_seen": f["first_seen"], "last_seen": f["last_seen"],
             "body": json.dumps(f)} for f in rows])

    def of_job(self, job_id: int) -> list[dict[str, Any]]:
        """The job's stored findings, as their bodies."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(findings.c.body).where(findings.c.job_id == job_id))
            return [json.loads(body) for (body,) in rows]

    @staticmethod
    def save_log(conn: sa.Connection, job_id: int, since: float | None,
                 rows: list[tuple[float, str, dict[str, Any] | None]], through: float) -> None:
        """Writer thread: add what a live book recorded, which covers its moments through
        ``through``. ``since`` (first call of a book only): where its record begins; one
        that does not continue the stored span starts the job's log afresh (the moments
        between were judged by nobody)."""
        span = conn.execute(sa.select(book_spans.c.start_at, book_spans.c.through_at)
                            .where(book_spans.c.job_id == job_id)).first()
        if since is not None and (span is None or not span[0] <= since <= span[1]):
            conn.execute(sa.delete(book_log).where(book_log.c.job_id == job_id))
            conn.execute(sa.delete(book_spans).where(book_spans.c.job_id == job_id))
            conn.execute(sa.insert(book_spans).values(job_id=job_id, start_at=since,
                                                      through_at=max(since, through)))
        elif span is None:
            return  # its span was started afresh by another record: these rows are not it
        elif through > span[1]:
            conn.execute(sa.update(book_spans).where(book_spans.c.job_id == job_id)
                         .values(through_at=through))
        if not rows:
            return
        values = [{"job_id": job_id, "at": at, "id": fid,
                   "body": None if f is None else encode_body(f)} for at, fid, f in rows]
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        conn.execute(insert(book_log).on_conflict_do_nothing(), values)

    def log_span(self, job_id: int) -> tuple[float, float] | None:
        """The moments the job's book log covers (start, through), if it has one."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(book_spans.c.start_at, book_spans.c.through_at)
                               .where(book_spans.c.job_id == job_id)).first()
        return (row[0], row[1]) if row else None

    def log_rows(self, job_id: int, until: float
                 ) -> tuple[list[tuple[float, str, dict[str, Any]]], float | None]:
        """The job's book log up to ``until``: its finding rows in order, and the last
        moment marked judged (None if none)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(book_log.c.at, book_log.c.id, book_log.c.body)
                                .where(book_log.c.job_id == job_id, book_log.c.at <= until,
                                       book_log.c.id != "")
                                .order_by(book_log.c.at, book_log.c.id)).all()
            judged = conn.execute(sa.select(sa.func.max(book_log.c.at))
                                  .where(book_log.c.job_id == job_id, book_log.c.at <= until,
                                         book_log.c.id == "")).scalar()
        return [(at, fid, decode_body(body)) for at, fid, body in rows], judged
