"""The event log: events appended on the writer thread, and read back in id order as one
log, whether they are still rows of ``events`` or packed (dashboard.storage.packs).

Readers get StoredEvent dicts (id, session, seq, t, received_at, kind, body). A read of a
job's log goes in rounds: the next rows after an id, and the packs that start before the
next unread pack, merged (``heapq.merge``; a pack is decoded lazily).
"""

from __future__ import annotations

import heapq
import logging
from sys import intern
from typing import Any, Callable, Iterator

import msgspec
import sqlalchemy as sa

from dashboard.storage.codec import decode_body, encode_body, raw_body
from dashboard.storage.database import delete_in
from dashboard.storage.packformat import Pack
from dashboard.storage.packs import OpenPacks, UnreadablePack, open_stored
from dashboard.storage.schema import event_packs, events, jobs

log = logging.getLogger("pgdash.storage")

PACKS_AHEAD = 1  # packs a job's read decodes per round trip (one is a cell, or part of one)

_SQLITE_INSERT_EVENT = ("INSERT INTO events (id, job_id, session, seq, t, received_at, kind, "
                        "body, body_z) VALUES (?, ?, ?, ?, ?, ?, ?, '', ?)")
_decode_json = msgspec.json.decode  # ~10x faster than the json module


def load_body(row: Any) -> dict[str, Any]:
    """The body of a stored event row, whichever form it was stored in (a dict already for
    an event read from a pack)."""
    if isinstance(row["body"], dict):
        return row["body"]
    packed = row["body_z"]
    return decode_body(packed) if packed is not None else _decode_json(row["body"])


class EventLog:
    """The ``events`` table with the packs, read as one log; appended on the writer thread.

    On SQLite the one writer numbers event rows itself and inserts a transaction's rows
    together just before it commits (:meth:`flush`, which the writer calls)."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        # False: rows store their bodies plain (codec format 02), when the compactor packs
        # them within minutes (Compactor sets it; zlib of each body was a fifth of the CPU of
        # a 1,024-rank server); True: compact, for rows that stay.
        self.compress = True
        self.unreadable_packs = 0  # passed over by events_after / events_by_id (logged)
        self.open_packs = OpenPacks()  # packs replays read lately, kept for their next reads
        self._next_id: int | None = None  # see _allocate_ids
        self._deferred: list[tuple] = []  # event rows of this transaction, see insert
        self._deferred_rows: list[dict[str, Any]] = []  # the same, other databases

    # -- writing (writer thread) -------------------------------------------------------------

    def insert(self, conn: sa.Connection, job_id: int, session: str,
               rows: list[dict[str, Any]], now: float, want_ids: bool = True) -> list[int]:
        """Insert events; returns their ids in order (``[]`` off SQLite with ``want_ids``
        false).

        On SQLite, the one writer numbers the rows itself (from MAX(id), read once) and
        inserts all of a transaction's rows with one executemany of the
        driver just before it commits: a few microseconds a row, where a RETURNING insert
        through SQLAlchemy cost ~0.15 ms a batch, the largest share of the writer's time per
        rank. Other databases, which several server processes may write at once, number
        rows themselves (RETURNING). A caller that needs no ids (several processes: the
        log's tail folds what was stored) has its rows inserted with the whole transaction's,
        in one executemany before the commit: on PostgreSQL a RETURNING insert per batch is
        one round trip each, which kept the one writer waiting on the network most of its
        time at a few hundred ranks (``bench/capacity.py --processes``).
        """
        if not rows:
            return []
        compress = self.compress
        if self.engine.dialect.name == "sqlite":
            first = self._allocate_ids(conn, len(rows))
            self._deferred.extend(
                (first + i, job_id, session, row.get("seq"), row["t"], now, row["kind"],
                 encode_body(row["body"], compress)) for i, row in enumerate(rows))
            return list(range(first, first + len(rows)))
        params = [{"job_id": job_id, "session": session, "seq": row.get("seq"), "t": row["t"],
                   "received_at": now, "kind": row["kind"], "body": "",
                   "body_z": encode_body(row["body"], compress)}
                  for row in rows]
        if not want_ids:
            self._deferred_rows.extend(params)
            return []
        result = conn.execute(
            sa.insert(events).returning(events.c.id, sort_by_parameter_order=True), params)
        return [r[0] for r in result]

    def insert_archived(self, conn: sa.Connection, job_id: int,
                        rows: list[dict[str, Any]]) -> None:
        """Insert events that carry their own arrival time (an imported session file)."""
        if rows:
            first = self._allocate_ids(conn, len(rows)) \
                if self.engine.dialect.name == "sqlite" else None
            conn.execute(sa.insert(events), [
                {**({"id": first + i} if first is not None else {}),
                 "job_id": job_id, "session": r["session"], "seq": r["seq"], "t": r["t"],
                 "received_at": r["received_at"], "kind": r["kind"], "body": "",
                 "body_z": encode_body(r["body"], self.compress)} for i, r in enumerate(rows)])

    def _allocate_ids(self, conn: sa.Connection, n: int) -> int:
        """Writer thread, SQLite: the first of ``n`` fresh event ids. The one writer is the
        only one to insert events, so MAX(id) is read once (and again after a rollback).
        Packs never hide the newest id: the compactor leaves each session's newest event a
        row (dashboard.storage.compaction), and a deleted job's ids are nobody's."""
        if self._next_id is None:
            self._next_id = (conn.exec_driver_sql("SELECT MAX(id) FROM events").scalar()
                             or 0) + 1
        first = self._next_id
        self._next_id += n
        return first

    def flush(self, conn: sa.Connection) -> None:
        """Writer thread, at the end of a transaction: insert the rows :meth:`insert`
        deferred to it."""
        deferred, self._deferred = self._deferred, []
        deferred_rows, self._deferred_rows = self._deferred_rows, []
        if deferred:
            conn.exec_driver_sql(_SQLITE_INSERT_EVENT, deferred)
        if deferred_rows:
            conn.execute(sa.insert(events), deferred_rows)

    def rolled_back(self) -> None:
        """Writer thread, after a failed transaction: its rows are gone, and the next ids
        are numbered from what is really stored."""
        self._next_id = None
        self._deferred, self._deferred_rows = [], []

    @staticmethod
    def compact(conn: sa.Connection, updates: dict[int, dict[str, Any]],
                deletes: list[int]) -> None:
        """Writer thread: rewrite summaries and delete the events they replace, atomically."""
        if updates:
            conn.execute(sa.update(events).where(events.c.id == sa.bindparam("event_id"))
                         .values(body="", body_z=sa.bindparam("packed")),
                         [{"event_id": i, "packed": encode_body(b)} for i, b in updates.items()])
        delete_in(conn, events.c.id, deletes)

    # -- reading -----------------------------------------------------------------------------

    def events(self, job_id: int, chunk: int = 5000, after: int = 0,
               upto: int | None = None, raw: bool = False,
               keep: bool = False) -> Iterator[dict[str, Any]]:
        """The job's events in log order (those with an id above ``after``, and at most
        ``upto`` when given), as StoredEvent dicts: rows and packs merged (``raw``: bodies
        as dashboard.storage.codec.RawBody where they are MessagePack, for moving them unread;
        ``keep``: the packs read are kept open for the reads that follow, see
        :class:`OpenPacks`: a replay's, not a single pass's such as an export or compaction).

        Raises:
            UnreadablePack: a pack of this job that this pgdash cannot read (the message
                names it and what to do); other jobs read on.
        """
        while True:
            with self.engine.connect() as conn:
                rows, packs, cutoff = _read_log(conn, job_id, after, upto, chunk, PACKS_AHEAD)
            last = after
            opener = self.open_packs.open if keep else open_stored
            for ev in _merge(rows, packs, after, cutoff, opener, raw):
                if ev["id"] != last:  # a row packed between the two reads comes twice
                    last = ev["id"]
                    yield ev
            if cutoff is None or (upto is not None and cutoff >= upto):
                return
            after = cutoff

    def any_after(self, job_id: int, after: int) -> bool:
        """Whether the job's log holds an event with an id above ``after`` (a row or a pack)."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(events.c.id).where(
                events.c.job_id == job_id, events.c.id > after).limit(1)).first() is not None \
                or conn.execute(sa.select(event_packs.c.first_id).where(
                    event_packs.c.job_id == job_id, event_packs.c.last_id > after)
                    .limit(1)).first() is not None

    def events_until(self, job_id: int, after: int, end: float,
                     raw: bool = False) -> Iterator[dict[str, Any]]:
        """The job's events after id ``after`` that arrived before ``end``, in log order."""
        for ev in self.events(job_id, chunk=2000, after=after, raw=raw):
            if ev["received_at"] >= end:
                return
            yield ev

    def events_after(self, after: int, limit: int) -> list[dict[str, Any]]:
        """Events of every job with an id above ``after``, in id order (bodies as stored:
        the caller parses, with :func:`load_body`, only those of the jobs it holds). Those
        read from packs carry their body parsed already; a pack this pgdash cannot read is
        logged and passed over (its ids then look missing), so one job's damage never stops
        the others' tail."""
        with self.engine.connect() as conn:
            rows, packs, cutoff = _read_log(conn, None, after, None, limit, 4)
        out = {r["id"]: _row_dict(r) for r in rows}
        for p in packs:
            for ev in self._pack_events(p, after, cutoff):
                out.setdefault(ev["id"], ev)
        return [out[i] for i in sorted(out)]

    def events_by_id(self, ids: list[int]) -> list[dict[str, Any]]:
        """The events of these ids that are stored, in id order (as :meth:`events_after`)."""
        if not ids:
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(events).where(events.c.id.in_(ids))
                                .order_by(events.c.id)).mappings().all()
            found = {r["id"]: _row_dict(r) for r in rows}
            missing = set(ids) - set(found)
            packs = conn.execute(sa.select(
                event_packs.c.job_id, event_packs.c.first_id, event_packs.c.last_id,
                event_packs.c.data).where(event_packs.c.first_id <= max(missing),
                                          event_packs.c.last_id >= min(missing))).all() \
                if missing else []
        for p in packs:
            for ev in self._pack_events(p, only=missing):
                found.setdefault(ev["id"], ev)
        return [found[i] for i in sorted(found)]

    def _pack_events(self, pack_row: Any, after: int = 0, upto: int | None = None,
                     only: set[int] | None = None) -> list[dict[str, Any]]:
        """Events of a pack as ``events_after`` rows (with ``job_id``), [] if unreadable."""
        try:
            pack = open_stored(pack_row)
        except UnreadablePack as exc:
            self.unreadable_packs += 1
            log.error("pgdash: %s", exc)
            return []
        found = pack.events(after, upto) if only is None else \
            (ev for i in sorted(only) for ev in pack.events(i - 1, i))  # no other body built
        return [dict(ev, job_id=pack_row.job_id, body_z=None) for ev in found]

    def max_id(self) -> int:
        """The highest event id stored (0 if none)."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.max(events.c.id))).scalar() or 0

    def spans(self) -> list[tuple[int, float, float]]:
        """(job id, first and last arrival time) of every job with events (index lookups:
        arrival order is id order; a job's newest events are rows, its oldest maybe packed)."""
        with self.engine.connect() as conn:
            out = []
            for (job_id,) in conn.execute(sa.select(jobs.c.id).order_by(jobs.c.id)).all():
                lo, hi = conn.execute(sa.select(sa.func.min(events.c.id)).where(
                    events.c.job_id == job_id)).scalar(), conn.execute(sa.select(
                        sa.func.max(events.c.id)).where(events.c.job_id == job_id)).scalar()
                packed = conn.execute(sa.select(sa.func.min(event_packs.c.first_at),
                                                sa.func.max(event_packs.c.last_at))
                                      .where(event_packs.c.job_id == job_id)).first()
                if lo is None and packed[0] is None:
                    continue
                at = dict(conn.execute(sa.select(events.c.id, events.c.received_at)
                                       .where(events.c.id.in_((lo, hi)))).all()) \
                    if lo is not None else {}
                firsts = [x for x in (at.get(lo), packed[0]) if x is not None]
                lasts = [x for x in (at.get(hi), packed[1]) if x is not None]
                out.append((job_id, min(firsts), max(lasts)))
            return out


def _read_log(conn: sa.Connection, job_id: int | None, after: int, upto: int | None,
              limit: int, packs_ahead: int) -> tuple[list[Any], list[Any], int | None]:
    """Rows and packs holding the log's next events after id ``after`` (one job's, or
    every job's): (rows, pack rows, cutoff), complete up to id ``cutoff`` (None: to the
    end). Rows are read first: a cell packed between the two statements (PostgreSQL
    reads each in its own snapshot) then shows up twice, never not at all."""
    pwhere = [] if job_id is None else [event_packs.c.job_id == job_id]
    ahead = [*pwhere, event_packs.c.first_id > after]
    if upto is not None:
        ahead.append(event_packs.c.first_id <= upto)
    firsts = conn.execute(sa.select(event_packs.c.first_id).where(*ahead)
                          .order_by(event_packs.c.first_id)
                          .limit(packs_ahead + 1)).scalars().all()
    cutoff = upto
    if len(firsts) > packs_ahead:
        # Every pack not read starts above this: the log is complete below it.
        cutoff = firsts[-1] - 1 if cutoff is None else min(cutoff, firsts[-1] - 1)
    where = [events.c.id > after]
    if job_id is not None:
        where.append(events.c.job_id == job_id)
    if cutoff is not None:
        where.append(events.c.id <= cutoff)
    rows = conn.execute(sa.select(events).where(*where).order_by(events.c.id)
                        .limit(limit)).mappings().all()
    if len(rows) == limit:
        cutoff = rows[-1]["id"] if cutoff is None else min(cutoff, rows[-1]["id"])
    # The packs' bytes after the rows, by range: one committed since the first statement
    # is read too (its rows were then gone already).
    cols = (event_packs.c.job_id, event_packs.c.first_id, event_packs.c.last_id,
            event_packs.c.data)
    packs = conn.execute(sa.select(*cols).where(
        *pwhere, event_packs.c.first_id <= after, event_packs.c.last_id > after)).all()
    if cutoff is not None:
        ahead.append(event_packs.c.first_id <= cutoff)
    packs += conn.execute(sa.select(*cols).where(*ahead)
                          .order_by(event_packs.c.first_id)).all()
    return rows, packs, cutoff


def _merge(rows: list[Any], packs: list[Any], after: int, cutoff: int | None,
           open_pack: Callable[[Any], Pack], raw: bool = False) -> Iterator[dict[str, Any]]:
    """StoredEvent dicts of rows and packs in id order (a pack opened when the read reaches
    it, where the packs do not overlap: one job's cells)."""
    body = (lambda r: raw_body(r["body_z"]) if r["body_z"] is not None else load_body(r)) \
        if raw else load_body
    # The session and kind strings shared, not one pair per row (a compaction cell of a
    # 1,024-rank job holds ~370,000 events at once).
    row_events = ({"id": r["id"], "session": intern(r["session"]), "seq": r["seq"],
                   "t": r["t"], "received_at": r["received_at"], "kind": intern(r["kind"]),
                   "body": body(r)} for r in rows)
    if not packs:
        return row_events
    packs = sorted(packs, key=lambda p: p.first_id)
    if all(a.last_id < b.first_id for a, b in zip(packs, packs[1:])):
        in_order = (ev for p in packs for ev in open_pack(p).events(after, cutoff, raw))
        return heapq.merge(row_events, in_order, key=_event_id)
    return heapq.merge(row_events, *(open_pack(p).events(after, cutoff, raw) for p in packs),
                       key=_event_id)


def _event_id(ev: dict[str, Any]) -> int:
    return ev["id"]


def _row_dict(r) -> dict[str, Any]:
    """An ``events`` row as ``events_after`` returns it (body as stored, with job_id)."""
    return {"id": r["id"], "job_id": r["job_id"], "session": r["session"], "seq": r["seq"],
            "t": r["t"], "received_at": r["received_at"], "kind": r["kind"],
            "body": r["body"], "body_z": r["body_z"]}
