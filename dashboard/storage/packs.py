"""Packs: a job's older events, one compaction cell to a row of ``event_packs`` (or several
rows, of at most dashboard.storage.compaction.PACK_EVENTS events each), stored
column by column and compressed together (dashboard.storage.packformat). The
compactor (dashboard.storage.compaction) writes them; the event log (dashboard.storage.log)
reads them merged with its rows."""

from __future__ import annotations

import collections
import threading
import time
import zlib
from typing import Any, Callable, Iterable

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


# Packs opened lately are kept for the reads that follow: scrubbing a stored job reads the
# same cell moment after moment, and a 1,024-rank cell (~160,000 events) takes about a
# second to open (bench/storage.py). Kept while read, within this many bytes, and let go
# after IDLE_S unread.
OPEN_PACKS_BYTES = 256 * 2**20
OPEN_PACKS_IDLE_S = 60.0


class OpenPacks:
    """Packs opened for reading, kept: :meth:`open` opens a stored pack's row, or gives the
    Pack opened for the same bytes before. Thread-safe; packs are immutable once stored
    (compaction replaces a pack by another row, whose bytes differ).

    Args:
        max_bytes: the memory the packs kept may hold (Pack.nbytes, an estimate).
        idle_s: a pack not read for this long is let go (a timer thread runs only while
            packs are kept).
    """

    def __init__(self, max_bytes: int = OPEN_PACKS_BYTES, idle_s: float = OPEN_PACKS_IDLE_S,
                 monotonic: Callable[[], float] = time.monotonic):
        self.max_bytes, self.idle_s, self.monotonic = max_bytes, idle_s, monotonic
        self._kept: collections.OrderedDict[tuple, tuple[float, Pack]] = \
            collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.opened = self.reused = 0  # for tests and benches

    def open(self, row: Any) -> Pack:
        """The :class:`Pack` of an ``event_packs`` row (job_id, first_id, last_id, data).

        Raises:
            UnreadablePack: as :func:`open_stored`.
        """
        data = row.data
        key = (row.job_id, row.first_id, row.last_id, len(data), zlib.crc32(data))
        now = self.monotonic()
        with self._lock:
            found = self._kept.pop(key, None)
            if found is not None:
                self._kept[key] = (now, found[1])
                self.reused += 1
                return found[1]
        pack = open_stored(row)
        with self._lock:
            self.opened += 1
            if pack.nbytes > self.max_bytes or key in self._kept:
                return pack
            self._kept[key] = (now, pack)
            self._bytes += pack.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._kept.popitem(last=False)[1][1].nbytes
            self._arm()
        return pack

    def kept_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def sweep(self) -> None:
        """Let go of the packs not read for ``idle_s``."""
        with self._lock:
            self._timer = None
            cutoff = self.monotonic() - self.idle_s
            while self._kept:
                key, (used, pack) = next(iter(self._kept.items()))
                if used > cutoff:
                    break
                del self._kept[key]
                self._bytes -= pack.nbytes
            self._arm()

    def _arm(self) -> None:
        """Have :meth:`sweep` run when the least recently read pack turns idle."""
        if self._kept and self._timer is None:
            oldest = next(iter(self._kept.values()))[0]
            due = max(0.0, oldest + self.idle_s - self.monotonic())
            self._timer = threading.Timer(due + 0.01, self.sweep)
            self._timer.daemon = True
            self._timer.start()


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
    def write(conn: sa.Connection, job_id: int, packs: list[dict[str, Any]],
              replaces: list[int], rows: tuple[int, int] | None,
              keep: Iterable[int] = ()) -> None:
        """Writer thread: store ``packs`` (each a :meth:`row`) in place of the job's packs
        starting at ids ``replaces`` and of its rows with ids in ``rows`` (first, last; None:
        none) but those in ``keep``, in the caller's transaction: a crash leaves either the
        old form or the new, never neither. The rows go by id range, not id by id (a
        1,024-rank cell is ~370,000 ids, most of them packed already)."""
        if replaces:
            conn.execute(sa.delete(event_packs).where(event_packs.c.job_id == job_id,
                                                      event_packs.c.first_id.in_(replaces)))
        if rows is not None:
            first, last = rows
            for kept in sorted(i for i in keep if first <= i <= last):
                delete_range(conn, job_id, first, kept - 1)
                first = kept + 1
            delete_range(conn, job_id, first, last)
        for pack in packs:
            conn.execute(sa.insert(event_packs).values(**pack))


def delete_range(conn: sa.Connection, job_id: int, first: int, last: int) -> None:
    """Writer thread: delete the job's rows with ids from ``first`` to ``last``."""
    if first <= last:
        conn.execute(sa.delete(events).where(events.c.job_id == job_id,
                                             events.c.id.between(first, last)))
