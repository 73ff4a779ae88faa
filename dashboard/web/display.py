"""Display states judged at a moment: one state per rank and per group, with the reason, as
the whole page shows them (table, topology, progress, charts).

Display states are pure functions of (JobState, at, findings active at ``at``): no clock, no
Flask, no SQL. The live feed judges at ``Ingest.judged_at()`` (the server's time less its
ingest lag); replay (``GET /api/jobs/<id>/state?at=``) judges at the moment asked for. The
page only renders what these return, so a replayed moment looks the same every time it is
opened.

Thresholds live in diagnosis ``Settings``: ``stall_after`` (a wait this long turns a group's
laggards from amber to red, as the ``stall`` rule would warn) and ``behind_after`` (how long
the others wait before a rank shows "behind").
"""

from __future__ import annotations

from typing import Any, Iterable

from dashboard.diagnosis import Settings
from dashboard.diagnosis.text import group_label, ranks_label
from dashboard.state import JobState, family_of, group_order
from dashboard.web.views import group_rows, progress_rows


# Display states of a rank, most serious first (the page's legend follows this order).
DISPLAY_STATES = ("failed", "lost", "hung", "stalled", "mismatch", "stuck", "straggling",
               "waiting", "running", "initializing", "exited", "unknown")

# Display states of a group: laggards overdue, laggards behind, waiting in a collective
# (nobody behind yet), moving.
GROUP_STATES = ("overdue", "behind", "waiting", "moving", "idle")


def rank_states(state: JobState, at: float, findings: Iterable[dict[str, Any]],
                settings: Settings = Settings(),
                groups: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One display state per rank (in rank order) as judged at ``at``: the page's only one.

    The ranks table, the topology, progress and the charts all show this row's state, so a
    rank never reads "running" in one place and "hung" in another.

    Each row: ``{"rank", "state"}`` (see DISPLAY_STATES), with ``"reason"`` (one line: why it
    is in that state, e.g. the summary of the finding that blames it, the error it failed
    with, the collective it waits in) and ``"since"`` (Unix seconds: when that began) where
    there is something to say; ``"findings": [ids of active findings blaming it or naming it
    as waiting]`` when there are any, ``"overdue": true`` when it is, and, for a rank
    waiting in a collective on others or overdue in it, ``"waiting": {"group", "op",
    "since", "on": [ranks it waits for]}`` (its oldest in-flight one).
    ``overdue``: it has sat in a collective ``settings.stall_after`` seconds or more (or
    ``hang_after``, if that is shorter). ``groups``: ``group_states(state, at, settings)``
    if the caller has it already.

    A plain "running" or "waiting" row carries no reason (a moving 1,024-rank job sends
    these rows on every change: what each rank is in, progress says).
    """
    blamed: dict[int, list[str]] = {}  # rank -> ids of findings that explain its state
    role: dict[int, str] = {}  # rank -> the most serious finding-derived state
    because: dict[int, dict[str, Any]] = {}  # rank -> the finding that set that state
    blames: dict[int, dict[str, Any]] = {}  # rank -> the most severe finding blaming it
    order = {s: i for i, s in enumerate(DISPLAY_STATES)}
    severity = {"critical": 0, "warning": 1, "info": 2}

    def mark(rank: int, f: dict[str, Any], display: str | None) -> None:
        ids = blamed.setdefault(rank, [])
        if f.get("id") not in ids:
            ids.append(f.get("id"))
        if display and order[display] < order[role.get(rank, "unknown")]:
            role[rank] = display
            because[rank] = f

    for f in findings:
        if not f.get("active"):
            continue
        kind = f.get("kind")
        # A rank the rules call lost (silent past the threshold, its connection still open)
        # or failed is that on the whole page, whatever its agent last said.
        own = {"hang": "hung", "stall": "stalled", "desync": "mismatch",
               "straggler": "straggling", "rank_lost": "lost", "rank_failed": "failed",
               "init_failed": "failed"}.get(kind)
        for r in f.get("ranks") or []:
            mark(r, f, own)
            best = blames.get(r)
            if best is None or severity.get(f.get("severity"), 3) < severity.get(
                    best.get("severity"), 3):
                blames[r] = f
        if kind in ("hang", "stall"):
            for r in (f.get("evidence") or {}).get("waiting") or []:
                mark(r, f, "stuck")

    if groups is None:
        groups = group_states(state, at, settings)
    behind_in = {g["group"]: [b[0] for b in g["behind"]] for g in groups}
    inflight: dict[int, dict[str, Any]] = {}
    for row in progress_rows(state):
        since = row["inflight_since"]
        if row["inflight_op"] is None:
            continue
        best = inflight.get(row["rank"])
        if best is None or (since is not None and (best["since"] is None or
                                                   since < best["since"])):
            on = [b for b in behind_in.get(row["group"], ()) if b != row["rank"]]
            inflight[row["rank"]] = {"group": row["group"], "op": row["inflight_op"],
                                     "since": since, "on": on}
    last_error: dict[int, dict[str, Any]] = {}  # of the current attempt
    for e in state.errors:
        if e.get("rank") is not None and e.get("attempt", 0) == state.attempt:
            last_error[e["rank"]] = e

    out = []
    for r in state.ranks():
        if r.status in ("failed", "lost"):
            display = r.status
        elif r.rank in role:
            display = role[r.rank]
        elif r.status == "exited":
            display = "exited"
        elif r.rank in inflight:
            display = "waiting"
        elif r.status in ("initializing", "running"):
            display = r.status
        else:
            display = "unknown"
        # Fields at their default stay out: 1,024 rows travel on every change of a moving job.
        row: dict[str, Any] = {"rank": r.rank, "state": display}
        if r.rank in blamed:
            row["findings"] = blamed[r.rank]
        wait = inflight.get(r.rank)
        overdue = False
        if wait is not None and r.status not in ("exited", "failed", "lost"):
            overdue = wait["since"] is not None and \
                at - wait["since"] >= min(settings.stall_after, settings.hang_after)
            # Only a wait worth reading about travels: in a moving 1,024-rank job most ranks
            # are in some collective at any heartbeat (progress already says which).
            if wait["on"] or overdue:
                row["waiting"] = wait
        if overdue:
            row["overdue"] = True
        reason, since = _rank_reason(state, r, display, because.get(r.rank),
                                     blames.get(r.rank), wait, row.get("waiting"),
                                     last_error.get(r.rank))
        if reason is not None:
            row["reason"] = reason
        if since is not None:
            row["since"] = since
        out.append(row)
    return out


def _rank_reason(state: JobState, r: Any, display: str, cause: dict[str, Any] | None,
                 blame: dict[str, Any] | None, flight: dict[str, Any] | None,
                 wait: dict[str, Any] | None,
                 error: dict[str, Any] | None) -> tuple[str | None, float | None]:
    """Why a rank is in its display state, in one line, and since when (see rank_states).

    ``cause``: the active finding that gave it a finding-derived state; ``blame``: the most
    severe active finding that blames it; ``flight``: its oldest collective in flight, and
    ``wait`` the same when it is notable (rank_states' ``waiting``); ``error``: the last
    error it reported.
    """
    def waits_in(w: dict[str, Any], on: list[int]) -> str:
        text = f"in {w['op']} on {group_label(state, w['group'])}"
        return text + (f", waiting for {ranks_label(on)}" if on else "")

    if display == "stuck" and cause is not None:
        culprits = [x for x in cause.get("ranks") or [] if x != r.rank]
        if flight is not None:
            return waits_in(flight, culprits or flight["on"]), flight["since"]
        return (f"waiting for {ranks_label(culprits)}" if culprits else cause.get("summary"),
                cause.get("first_seen"))
    if cause is not None:
        return cause.get("summary"), cause.get("first_seen")
    if display == "failed":
        if blame is not None:
            return blame.get("summary"), r.exit_at or blame.get("first_seen")
        if error is not None:
            first = str(error.get("error") or "").strip().splitlines()
            return (f"{error.get('error_type')}: {first[-1] if first else ''}".rstrip(": "),
                    error.get("t"))
        return f"exited with an error: {r.exit_reason}" if r.exit_reason else \
            "exited with an error", r.exit_at
    if display == "lost":
        if blame is not None:
            return blame.get("summary"), r.exit_at
        return "its agent's connection dropped without a clean exit", r.exit_at
    if display == "exited":
        if blame is not None:
            return blame.get("summary"), r.exit_at
        return ("exited cleanly" + (f": {r.exit_reason}" if r.exit_reason not in (
            None, "", "exit") else "")), r.exit_at
    if display == "waiting" and wait is not None:
        return waits_in(wait, wait["on"]), wait["since"]
    if blame is not None:
        return blame.get("summary"), blame.get("first_seen")
    if display == "running" and r.left_at is not None:
        return "left distributed training (destroyed its process group)", r.left_at
    return None, None


def group_states(state: JobState, at: float,
                 settings: Settings = Settings()) -> list[dict[str, Any]]:
    """Per group (in group order, including groups seen only in progress): its progress and
    display state judged at ``at``.

    Each row: ``{"group", "family", "max_seq", "oldest_wait" (when the oldest collective
    that members not behind are waiting in began, or None), "behind": [[rank, collectives
    behind], ...] (only once the others waited ``settings.behind_after``, or ``hang_after`` if
    shorter), "state"}`` (see GROUP_STATES; "overdue" once the others waited
    ``stall_after``, or ``hang_after``). Members are in the ``groups`` rows, who is inside
    a collective in ``progress``: a 1,024-rank job does not send them twice.

    "Behind" compares entered first (a rank that never entered the collective the others
    wait in is the classic hang), then completed.
    """
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in progress_rows(state):
        by_group.setdefault(row["group"], []).append(row)
    names = [g["name"] for g in group_rows(state)]
    names += sorted((g for g in by_group if g not in state.groups), key=group_order)
    out = []
    for name in names:
        rows = by_group.get(name, [])
        group = state.groups.get(name) or {}
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
        # A wait long enough to be a hang is worth a colour whatever the usual thresholds.
        notable = waited is not None and bool(behind) and \
            waited >= min(settings.behind_after, settings.hang_after)
        if notable and waited >= min(settings.stall_after, settings.hang_after):
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
                    "max_seq": max_seq, "oldest_wait": oldest,
                    "behind": sorted([[r, n] for r, n in behind.items()]) if notable else [],
                    "state": display})
    return out

