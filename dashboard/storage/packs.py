"""Packs: a job's older events, one compaction cell to a row of ``event_packs``, stored
column by column and compressed together (dashboard.storage.packformat). The
compactor (dashboard.storage.compaction) writes them; the event log (dashboard.storage.log)
reads them merged with its rows."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dashboard.storage.packformat import Pack, encode_pack, open_pack
from dashboard.storage.schema import event_packs, events


class UnreadablePack(ValueError):
    """A stored pack this pgdash cannot read; the message names the row and what to do."""


def open_stored(row: Any) -> Pack:
    """The pack of an ``event_packs`` row (job_id, first_id, last_id, data).

    Raises:
        UnreadablePack: its bytes are in a format this pgdash does not know, or damaged.
    """
    try:
        return open_pack(row.data)
    except ValueError as exc:
        raise UnreadablePack(
            f"table event_packs, job {row.job_id}, the pack of events {row.first_id} to "
            f"{row.last_id}: {exc}. If a newer pgdash wrote this database, upgrade "
            f"pgdash; otherwise delete that row (DELETE FROM event_packs WHERE job_id = "
            f"{row.job_id} AND first_id = {row.first_id}): its events are lost, the rest "
            f"of the job reads on") from None


class Packs:
    """The ``event_packs`` table."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    def of_job(self, job_id: int) -> list[dict[str, Any]]:
        """The job's packs without their bytes (first_id, last_id, first_at, last_at, n,
        thinned), in log order."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(
                event_packs.c.first_id, event_packs.c.last_id, event_packs.c.first_at,
                event_packs.c.last_at, event_packs.c.n, event_packs.c.thinned)
                .where(event_packs.c.job_id == job_id)
                .order_by(event_packs.c.first_id)).mappings().all()
        return [dict(r) for r in rows]

    @staticmethod
    def row(job_id: int, events_in: list[dict[str, Any]], thinned: bool) -> dict[str, Any]:
        """The ``event_packs`` row of StoredEvent dicts (id order), encoded here: on the
        caller's thread, not the writer's."""
        return {"job_id": job_id, "first_id": events_in[0]["id"],
                "last_id": events_in[-1]["id"],
                "first_at": min(ev["received_at"] for ev in events_in),
                "last_at": max(ev["received_at"] for ev in events_in), "n": len(events_in),
                "thinned": thinned, "data": encode_pack(events_in)}

    @staticmethod
    def write(conn: sa.Connection, job_id: int, pack: dict[str, Any] | None,
              replaces: list[int], row_ids: list[int]) -> None:
        """Writer thread: store ``pack`` (a :meth:`row`) in place of the job's packs
        starting at ids ``replaces`` and of the rows ``row_ids`` (those still rows; the
        others were packed already), in the caller's transaction: a crash leaves either the
        old form or the new, never neither."""
        if replaces:
            conn.execute(sa.delete(event_packs).where(event_packs.c.job_id == job_id,
                                                      event_packs.c.first_id.in_(replaces)))
        for i in range(0, len(row_ids), 500):
            conn.execute(sa.delete(events).where(events.c.id.in_(row_ids[i:i + 500])))
        if pack is not None:
            conn.execute(sa.insert(event_packs).values(**pack))
