"""Display states of a job at a moment: what each rank and group looks like, judged on the server.

Pure functions of (JobState, at, findings active at ``at``): no clock, no Flask, no SQL. The
live feed judges at ``Ingest.judged_at()`` (the server's time less its ingest lag); replay
(``GET /api/jobs/<id>/state?at=``) judges at the moment asked for. The page only renders
what these return, so a replayed moment looks the same every time it is opened.

Thresholds live here and in diagnosis ``Settings`` (one place each): ``stall_after`` (a wait
this long turns a group's laggards from amber to red, as the ``stall`` rule would warn) and
:data:`BEHIND_AFTER_S`.
"""

from __future__ import annotations

from typing import Any, Iterable

from dashboard.diagnosis import Settings
from dashboard.state import JobState, family_of

# Ranks of a moving job are routinely a few collectives apart (heartbeats are snapshots taken
# at different moments): a rank is "behind" only once the others have waited in a collective
# this long (the page's STALL_S before the server judged it).
BEHIND_AFTER_S = 2.0

# Display states of a rank, most serious first (the page's legend follows this order).
RANK_STATES = ("failed", "lost", "hung", "stalled", "mismatch", "stuck", "straggling",
               "waiting", "running", "initializing", "exited", "unknown")

# Display states of a group: laggards overdue, laggards behind, waiting in a collective
# (nobody behind yet), moving.
GROUP_STATES = ("overdue", "behind", "waiting", "moving", "idle")


def rank_states(state: JobState, at: float, findings: Iterable[dict[str, Any]],
                settings: Settings = Settings()) -> list[dict[str, Any]]:
    """One display state per rank (in rank order) as judged at ``at``.

    Each row: ``{"rank", "state", "findings": [ids of active findings blaming it or naming
    it as waiting], "overdue": bool}`` and, for a rank inside a collective, ``"waiting":
    {"group", "op", "since", "on": [ranks it waits for]}`` (its oldest in-flight one).
    ``overdue``: it has sat in a collective ``settings.stall_after`` seconds or more.
    """
    blamed: dict[int, list[str]] = {}  # rank -> ids of findings that explain its state
    role: dict[int, str] = {}  # rank -> the most serious finding-derived state
    order = {s: i for i, s in enumerate(RANK_STATES)}

    def mark(rank: int, fid: str, display: str | None) -> None:
        ids = blamed.setdefault(rank, [])
        if fid not in ids:
            ids.append(fid)
        if display and order[display] < order[role.get(rank, "unknown")]:
            role[rank] = display

    for f in findings:
        if not f.get("active"):
            continue
        kind, fid = f.get("kind"), f.get("id")
        own = {"hang": "hung", "stall": "stalled", "desync": "mismatch",
               "straggler": "straggling"}.get(kind)
        for r in f.get("ranks") or []:
            mark(r, fid, own)
        if kind in ("hang", "stall"):
            for r in (f.get("evidence") or {}).get("waiting") or []:
                mark(r, fid, "stuck")

    groups = group_states(state, at, settings)
    waits_on: dict[tuple[str, int], list[int]] = {}
    for g in groups:
        for rank in g["waiting"]:
            waits_on[(g["group"], rank)] = [b[0] for b in g["behind"]]
    inflight: dict[int, dict[str, Any]] = {}
    for row in state.progress_rows():
        since = row["inflight_since"]
        if row["inflight_op"] is None:
            continue
        best = inflight.get(row["rank"])
        if best is None or (since is not None and (best["since"] is None or
                                                   since < best["since"])):
            inflight[row["rank"]] = {"group": row["group"], "op": row["inflight_op"],
                                     "since": since,
                                     "on": waits_on.get((row["group"], row["rank"]), [])}

    out = []
    for r in state.ranks():
        if r.status in ("failed", "lost"):
            display = r.status
        elif r.rank in role and role[r.rank] != "stuck":
            display = role[r.rank]
        elif r.rank in role:
            display = "stuck"
        elif r.status == "exited":
            display = "exited"
        elif r.rank in inflight:
            display = "waiting"
        elif r.status in ("initializing", "running"):
            display = r.status
        else:
            display = "unknown"
        row: dict[str, Any] = {"rank": r.rank, "state": display,
                               "findings": blamed.get(r.rank, [])}
        wait = inflight.get(r.rank)
        overdue = False
        if wait is not None and r.status not in ("exited", "failed", "lost"):
            row["waiting"] = wait
            overdue = wait["since"] is not None and at - wait["since"] >= settings.stall_after
        row["overdue"] = overdue
        out.append(row)
    return out


def group_states(state: JobState, at: float,
                 settings: Settings = Settings()) -> list[dict[str, Any]]:
    """Per group (in group order, including groups seen only in progress): its progress and
    display state judged at ``at``.

    Each row: ``{"group", "family", "ranks" (members), "max_seq", "oldest_wait" (when the
    oldest collective that members not behind are waiting in began, or None), "behind":
    [[rank, collectives behind], ...] (only once the others waited BEHIND_AFTER_S),
    "waiting": [ranks inside a collective], "state"}`` (see GROUP_STATES).

    "Behind" compares entered first (a rank that never entered the collective the others
    wait in is the classic hang), then completed.
    """
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in state.progress_rows():
        by_group.setdefault(row["group"], []).append(row)
    names = [g["name"] for g in state.group_rows()]
    names += sorted((g for g in by_group if g not in state.groups), key=_group_order)
    out = []
    for name in names:
        rows = by_group.get(name, [])
        group = state.groups.get(name) or {}
        members = sorted(set(group.get("ranks") or []) | {r["rank"] for r in rows})
        entered = [r["entered"] for r in rows]
        behind: dict[int, int] = {}
        max_seq = max(entered) if entered else None
        if len(rows) > 1:
            max_c = max(r["completed"] for r in rows)
            min_e = min(entered)
            min_c = min(r["completed"] for r in rows if r["entered"] == min_e)
            if min_e < max_seq or min_c < max_c:
                for r in rows:
                    if r["entered"] == min_e and r["completed"] == min_c:
                        behind[r["rank"]] = max_seq - min_e if min_e < max_seq else max_c - min_c
        waits = [r["inflight_since"] for r in rows if r["inflight_op"] is not None
                 and r["inflight_since"] is not None and r["rank"] not in behind]
        oldest = min(waits) if waits else None
        waited = None if oldest is None else at - oldest
        notable = waited is not None and waited >= BEHIND_AFTER_S and bool(behind)
        if notable and waited >= settings.stall_after:
            display = "overdue"
        elif notable:
            display = "behind"
        elif oldest is not None:
            display = "waiting"
        elif rows:
            display = "moving"
        else:
            display = "idle"
        out.append({"group": name, "family": family_of(group) if group else name,
                    "ranks": members, "max_seq": max_seq, "oldest_wait": oldest,
                    "behind": sorted([[r, n] for r, n in behind.items()]) if notable else [],
                    "waiting": sorted(r["rank"] for r in rows if r["inflight_op"] is not None),
                    "state": display})
    return out


def _group_order(name: str) -> tuple[int, Any]:
    return (0, int(name)) if name.isdigit() else (1, name)
