"""Thinning: what compaction keeps of a cell of one job's log, as a pure function of its events
(:func:`plan`; dashboard.storage.compaction says which cells, when, and why this is all the
fold needs).

Within a cell, each agent session keeps its last ``heartbeat``, one ``coll_stats`` (the sum
of the cell's, in place of its last one) and the ``gpu`` readings that matter (its last, each
with a fault, each where throttling started or stopped); a cell holding any other kind of
event is kept whole, as is a range the caller keeps at full resolution.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Iterable

from dashboard.state import THROTTLE_REASONS
from dashboard.storage.codec import body_of

# The kinds thinning may rewrite or delete; any other event keeps its whole cell.
COMPACTABLE = frozenset({"heartbeat", "coll_stats", "gpu"})


def _merge_coll_stats(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One latency summary for several consecutive ones of a session (same shape)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for body in bodies:
        for row in body["rows"]:
            key = (row["group"], row["op"], row.get("source"), row.get("timing"))
            into = rows.get(key)
            if into is None:
                rows[key] = dict(row, hist=[list(b) for b in row["hist"]])
                continue
            into["count"] += row["count"]
            into["bytes"] += row["bytes"]
            into["sum_us"] += row["sum_us"]
            into["max_us"] = max(into["max_us"], row["max_us"])
            if "resolution_us" in row:
                into["resolution_us"] = max(into.get("resolution_us", 0.0),
                                            row["resolution_us"])
            hist = dict((b, n) for b, n in into["hist"])
            for b, n in row["hist"]:
                hist[b] = hist.get(b, 0) + n
            into["hist"] = [[b, hist[b]] for b in sorted(hist)]
    return {**bodies[-1], "start": bodies[0]["start"], "end": bodies[-1]["end"],
            "rows": list(rows.values())}


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
         session_floor: dict[str, float] | None = None) -> tuple[dict[int, dict], list[int]]:
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
        (event id -> new body, ids to delete).
    """
    throttled = {} if throttled is None else throttled
    cells: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for ev in events:
        cells[math.floor(ev["received_at"] / cell_s)].append(ev)
    updates: dict[int, dict] = {}
    deletes: list[int] = []
    for cell, evs in cells.items():
        start, end = cell * cell_s, (cell + 1) * cell_s
        whole = any(ev["kind"] not in COMPACTABLE for ev in evs) or \
            any(a < end and b >= start for a, b in keep)
        by_key: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
        for ev in evs:
            if ev["kind"] == "gpu":
                # Throttle transitions are tracked across kept cells too, so the first
                # reading after one is known.
                body = body_of(ev["body"])
                now, before = gpu_throttled(body), throttled.get(ev["session"])
                throttled[ev["session"]] = now
                ev = dict(ev, _keep=before is None or before != now or _gpu_notable(body))
            by_key[(ev["session"], ev["kind"])].append(ev)
        if whole:
            continue
        for (session, kind), group in by_key.items():
            floor = (session_floor or {}).get(session)
            if floor is not None:
                group = [ev for ev in group if ev["received_at"] < floor]
            if len(group) < 2:
                continue
            last = group[-1]
            if kind == "coll_stats":
                updates[last["id"]] = _merge_coll_stats([body_of(ev["body"]) for ev in group])
                deletes.extend(ev["id"] for ev in group[:-1])
            elif kind == "heartbeat":
                deletes.extend(ev["id"] for ev in group[:-1])
            else:
                deletes.extend(ev["id"] for ev in group[:-1] if not ev["_keep"])
    return updates, deletes
