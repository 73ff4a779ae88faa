"""Thinning: what compaction keeps of a cell of one job's log, as a pure function of its events
(:func:`plan`; dashboard.storage.compaction says which cells, when, and why this is all the
fold needs).

Within a cell, each agent session keeps its last ``heartbeat``, one ``coll_stats`` (the sum
of the cell's, in place of its last one) and the ``gpu`` readings that matter (its last, each
with a fault, each where throttling started or stopped); a cell holding any other kind of
event is kept whole, as is a range the caller keeps at full resolution.
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Any, Iterable, Iterator

import numpy as np

from dashboard.state import THROTTLE_REASONS
from dashboard.storage.codec import body_of

# The kinds thinning may rewrite or delete; any other event keeps its whole cell.
COMPACTABLE = frozenset({"heartbeat", "coll_stats", "gpu"})


class _MergedSummary:
    """Consecutive latency summaries of a session (same shape) merged into one, a body at a
    time (what compaction stores in place of a cell's summaries). Each row's histogram is
    summed in a dict while merging and written out as pairs once, by :meth:`body`: rebuilt
    as pairs at every body, a 1,024-rank cell's plan held 166,000 two-item lists at a time
    and spent most of its time making them (bench/memory.py, ``+at``)."""

    __slots__ = ("start", "last", "rows")

    def __init__(self) -> None:
        self.start: Any = None
        self.last: dict[str, Any] = {}  # the newest body without its rows (not kept whole)
        self.rows: dict[tuple, tuple[dict[str, Any], dict[int, int]]] = {}  # row, histogram

    def add(self, body: dict[str, Any]) -> None:
        if not self.last:
            self.start = body["start"]
        self.last = {**body, "rows": None}  # its keys in their order
        rows = self.rows
        for row in body["rows"]:
            key = (row["group"], row["op"], row.get("source"), row.get("timing"))
            merged = rows.get(key)
            if merged is None:
                rows[key] = (dict(row, hist=None), dict(row["hist"]))
                continue
            into, hist = merged
            into["count"] += row["count"]
            into["bytes"] += row["bytes"]
            into["sum_us"] += row["sum_us"]
            into["max_us"] = max(into["max_us"], row["max_us"])
            if "resolution_us" in row:
                into["resolution_us"] = max(into.get("resolution_us", 0.0),
                                            row["resolution_us"])
            for b, n in row["hist"]:
                hist[b] = hist.get(b, 0) + n

    def body(self) -> dict[str, Any]:
        return {**self.last, "start": self.start,
                "rows": [dict(into, hist=[[b, hist[b]] for b in sorted(hist)])
                         for into, hist in self.rows.values()]}


class SortedIds:
    """Event ids in ascending order, 8 bytes each (a plan's deletions: a 1,024-rank cell
    deletes ~240,000 events, as a set of ints ~16 MB of small objects and table). Membership
    is asked in ascending order as the compactor reads the cell again: a step forward each,
    a binary search where asked out of order."""

    __slots__ = ("_ids", "_at")

    def __init__(self, ids: array) -> None:
        self._ids = ids
        self._at = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __contains__(self, i: object) -> bool:
        ids, at = self._ids, self._at
        if at and ids[at - 1] >= i:  # type: ignore[operator]
            at = bisect.bisect_left(ids, i)
        end = len(ids)
        while at < end and ids[at] < i:  # type: ignore[operator]
            at += 1
        self._at = at
        return at < end and ids[at] == i


def _gpu_notable(body: dict[str, Any]) -> bool:
    v = body.get("values") or {}
    return bool(body.get("xids") or body.get("lost")
                or (v.get("ecc_uncorrected") or 0) > 0 or (v.get("remap_failure") or 0) > 0
                or (v.get("remap_pending") or 0) > 0)


def gpu_throttled(body: dict[str, Any]) -> bool:
    return any(reason in THROTTLE_REASONS for reason in body.get("reasons") or ())


def plan(events: Iterable[dict[str, Any]], cell_s: float,
         keep: list[tuple[float, float]] = (),
         throttled: dict[str, bool] | None = None,
         session_floor: dict[str, float] | None = None) -> tuple[dict[int, dict], SortedIds]:
    """What to rewrite and delete to compact whole cells of one job's log (a pure function).

    Args:
        events: every event of the cells in log order (StoredEvent dicts; a body may be
            a dashboard.storage.codec.RawBody, read only where the plan needs it).
        cell_s: cell length in seconds of arrival time.
        keep: (start, end) arrival-time ranges kept at full resolution.
        throttled: per session, whether its last GPU reading before these events was
            throttled (updated in place; unknown sessions keep their first reading).
        session_floor: per session, the arrival time from which its events are all kept.

    Returns:
        (event id -> new body, ids to delete in ascending order).
    """
    planned = Plan(cell_s, keep, throttled, session_floor)
    for ev in events:
        planned.add(ev)
    return planned.result()


class Plan:
    """:func:`plan` an event at a time (its arguments, then :meth:`add` each event in log
    order, then :meth:`result`): what it holds is a few numbers per event and one merged
    summary per session and cell, not the events, so that a cell of any size is planned in
    bounded memory (the compactor reads the cell again to write what it keeps)."""

    def __init__(self, cell_s: float, keep: list[tuple[float, float]] = (),
                 throttled: dict[str, bool] | None = None,
                 session_floor: dict[str, float] | None = None):
        self.cell_s, self.keep = cell_s, keep
        self.throttled = {} if throttled is None else throttled
        self.floor = session_floor or {}
        # cell -> whether it holds a kind thinning never touches, and per (session, kind)
        # its events before the session's floor: ids (an array: 8 bytes each, not an int
        # object each), and the merged summary of its coll_stats (gpu: whether each is kept)
        self._cells: dict[int, list] = {}

    def add(self, ev: dict[str, Any]) -> None:
        received_at = ev["received_at"]
        cell = self._cells.get(index := math.floor(received_at / self.cell_s))
        if cell is None:
            cell = self._cells[index] = [False, {}]
        kind, session = ev["kind"], ev["session"]
        if kind not in COMPACTABLE:
            cell[0] = True
            return
        if kind == "gpu":
            # Throttle transitions are tracked across kept cells too, so the first reading
            # after one is known.
            body = body_of(ev["body"])
            now, before = gpu_throttled(body), self.throttled.get(session)
            self.throttled[session] = now
            kept = before is None or before != now or _gpu_notable(body)
        floor = self.floor.get(session)
        if floor is not None and received_at >= floor:
            return
        group = cell[1].get((session, kind))
        if group is None:
            group = cell[1][(session, kind)] = [
                array("q"), _MergedSummary() if kind == "coll_stats"
                else bytearray() if kind == "gpu" else None]
        group[0].append(ev["id"])
        if kind == "coll_stats":
            group[1].add(body_of(ev["body"]))
        elif kind == "gpu":
            group[1].append(kept)

    def result(self) -> tuple[dict[int, dict], SortedIds]:
        updates: dict[int, dict] = {}
        deletes = array("q")
        for index, (whole, groups) in self._cells.items():
            start, end = index * self.cell_s, (index + 1) * self.cell_s
            if whole or any(a < end and b >= start for a, b in self.keep):
                continue
            # (coll_stats: with their merged summary; gpu: with whether each is kept)
            for (_, kind), (ids, beside) in groups.items():
                if len(ids) < 2:
                    continue
                if kind == "coll_stats":
                    updates[ids[-1]] = beside.body()
                    deletes.extend(ids[:-1])
                elif kind == "heartbeat":
                    deletes.extend(ids[:-1])
                else:
                    deletes.extend(i for i, kept in zip(ids[:-1], beside) if not kept)
        ordered = array("q")
        ordered.frombytes(np.sort(np.frombuffer(deletes, np.int64)).tobytes())
        return updates, SortedIds(ordered)
