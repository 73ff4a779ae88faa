"""Views of a job: what the API and the page show of a JobState, as pure functions.

JobState (dashboard.state) is the fold: its data, one handler per event kind and a small read
surface. The presenters here turn it into rows (ranks, groups, progress, collectives, GPUs,
errors, rendezvous, the timeline grid) and judge display states at a moment.

Display states are pure functions of (JobState, at, findings active at ``at``): no clock, no
Flask, no SQL. The live feed judges at ``Ingest.judged_at()`` (the server's time less its
ingest lag); replay (``GET /api/jobs/<id>/state?at=``) judges at the moment asked for. The
page only renders what these return, so a replayed moment looks the same every time it is
opened.

Thresholds live in diagnosis ``Settings``: ``stall_after`` (a wait
this long turns a group's laggards from amber to red, as the ``stall`` rule would warn) and
``behind_after`` (how long the others wait before a rank shows "behind").
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

from dashboard.diagnosis import Settings
from dashboard.diagnosis.text import group_label, ranks_label
from dashboard.state import FLIGHT_OP, JobState, LatencyStats, family_of, group_order, rank_row


def _source(source: str, stats: LatencyStats) -> dict[str, Any]:
    """A row's source fields: where its figures come from and how exact its latency is."""
    if source == "wrapper":
        return {"source": source}
    timing = "host_poll" if stats.resolution_us is not None else "device"
    return {"source": source, "timing": timing,
            "resolution_us": round(stats.resolution_us, 3) if timing == "host_poll" else None}


# -- rows of the state, as the API and the page show them ------------------------------------

def detail(state: JobState) -> dict[str, Any]:
    """The job as /api/jobs/<id> returns it."""
    return {**state.summary(), "ranks": rank_rows(state), "groups": group_rows(state),
            "attempts": state.attempt_rows()}


def rank_rows(state: JobState) -> list[dict[str, Any]]:
    return [rank_row(r) for r in state.ranks()]


def group_rows(state: JobState) -> list[dict[str, Any]]:
    # The family travels with the group so that the page need not know the rule.
    return [{"id": g["name"], **g, "family": family_of(g)} for g in
            sorted(state.groups.values(), key=lambda g: group_order(g["name"]))]


def collective_rows(state: JobState, group: str | None = None, op: str | None = None,
                    rank: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for (g, o, rk, src), s in sorted(state.collectives.items(), key=lambda kv: (
            group_order(kv[0][0]), kv[0][1], kv[0][2], kv[0][3])):
        if (group is not None and g != group) or (op is not None and o != op) or (
                rank is not None and rk != rank):
            continue
        rows.append({"group": g, "op": o, "rank": rk, "count": s.count,
                     "p50_us": s.percentile(0.5), "p99_us": s.percentile(0.99),
                     "max_us": round(s.max_us, 3), "bytes": s.bytes, **_source(src, s)})
    return rows


def rank_stat_rows(state: JobState) -> list[dict[str, Any]]:
    """Per rank: collectives over the whole job, and the (group, op) it ran most with
    that row's median latency (one row per rank where collective_rows has one per
    group and op)."""
    totals: dict[int, int] = {}
    top: dict[int, tuple[str, str, LatencyStats]] = {}
    for (g, o, rk, _src), s in state.collectives.items():
        totals[rk] = totals.get(rk, 0) + s.count
        best = top.get(rk)
        if best is None or s.count > best[2].count:
            top[rk] = (g, o, s)
    return [{"rank": rk, "count": totals[rk], "group": g, "op": o,
             "p50_us": s.percentile(0.5)} for rk, (g, o, s) in sorted(top.items())]


def progress_rows(state: JobState) -> list[dict[str, Any]]:
    """Per group (in group order) and rank: sequence numbers reached, op in flight.

    A group whose collectives Python never saw (DDP's gradient all-reduce runs in C++)
    shows the Flight Recorder's counters instead, with ``"source": "flight_recorder"``
    and ``"C++ collective"`` in flight; otherwise ``"source": "python"``. Built once per
    state version (the feed and the display states all read it): do not change the rows.
    """
    return state.memo(("view", "progress_rows"), lambda: _progress_rows(state))


def _progress_rows(state: JobState) -> list[dict[str, Any]]:
    grouped = state.grouped("progress")
    rows = []
    for g in sorted(grouped, key=group_order):
        flight = state.flight_only(g)
        for rk, row in sorted(grouped[g].items()):
            if flight:
                since = row.get("fr_inflight_since")
                rows.append({"group": g, "rank": rk, "entered": row.get("fr_enqueued", 0),
                             "completed": row.get("fr_completed", 0),
                             "inflight_op": FLIGHT_OP if since is not None else None,
                             "inflight_since": since, "source": "flight_recorder"})
            else:
                rows.append({"group": g, "rank": rk, "entered": row["entered"],
                             "completed": row["completed"],
                             "inflight_op": row.get("inflight_op"),
                             "inflight_since": row.get("inflight_since"),
                             "source": "python"})
    return rows


def gpu_rows(state: JobState, history: bool = True) -> list[dict[str, Any]]:
    """Latest GPU reading per rank and its faults; with ``history``, its recent readings
    (``[t, util, mem, temp, W]``: the API's; the page draws none, and at 1,024 ranks they
    were 7 MB of JSON a snapshot)."""
    hosts = {r.rank: r.host for r in state.ranks()}
    rows = []
    for rank, reading in sorted(state.gpus.items()):
        row = {"rank": rank, "host": hosts.get(rank), **reading,
               "faults": dict(state.gpu_faults.get(rank, {}))}
        if history:
            row["history"] = [list(p) for p in state.gpu_history.get(rank, ())]
        rows.append(row)
    return rows


def error_rows(state: JobState) -> list[dict[str, Any]]:
    """Verbatim error texts with rank and time, newest first."""
    return [dict(e) for e in reversed(state.errors)]


def rendezvous_rows(state: JobState) -> list[dict[str, Any]]:
    """When each rank arrived at init_process_group and when it finished (or failed)."""
    rows = []
    for session, entry in state.current_init().items():
        r = state.sessions[session]
        error = entry.get("error")
        rows.append({"rank": r.rank, "host": r.host, "arrived_at": entry.get("arrived_at"),
                     "done_at": entry.get("done_at"),
                     "error": error.get("error") if error else None})
    return sorted(rows, key=lambda row: (row["rank"] is None, row["rank"] or 0))


def op_rows(state: JobState) -> list[dict[str, Any]]:
    """Per group family and op, merged over its ranks: counts, bytes and latency.

    A family is the groups that share a description (``mesh_tp`` is every tensor-parallel
    group of a mesh), so a 1,024-rank job gives a handful of rows. Percentiles come from
    the merged histograms, so they are exact to the bucket width like the per-rank rows.
    """
    families = state.families()
    merged = state.op_stats(families)
    order = {f: i for i, f in enumerate(dict.fromkeys(
        families[name] for name in sorted(state.groups, key=group_order)))}
    rows = []
    for (family, op, src), (s, groups, ranks) in sorted(
            merged.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        rows.append({"family": family, "groups": sorted(groups, key=group_order),
                     "op": op, "ranks": len(ranks), "count": s.count, "bytes": s.bytes,
                     "mean_us": round(s.sum_us / s.count, 3) if s.count else None,
                     "p50_us": s.percentile(0.5), "p99_us": s.percentile(0.99),
                     "max_us": round(s.max_us, 3), **_source(src, s)})
    return rows


def timeline_grid(state: JobState, bins: int = 30) -> dict[str, Any]:
    """Recent collectives on a common one-second grid, per group family.

    ``families``: per family, a heat map rank x time in ``busy`` (percent of each second
    a rank spent inside the family's collectives; None where it reported nothing).
    ``ops``: per family and op, per second, the collectives of all its ranks: ``count``,
    ``bytes`` and latency ``p50_us``/``p99_us`` from their merged histograms (None where
    none ran). Compact on purpose: 1,024 ranks in four families are about 120,000 small
    integers. Bins are whole seconds of the agents' own clocks (``end`` of a summary).

    Collectives issued from C++ (DDP's gradient all-reduces, seen by the Flight Recorder)
    count too: their summaries are in ``ops``, and where a rank's group has no timed
    summaries its busy cells are the share of the agent's Flight Recorder samples that found
    it inside one (a family drawn so, in part or whole, carries ``"sampled": true``).
    """
    families = state.families()
    ends = [w[-1][0] for w in state.recent.values() if w]
    ends += [max(series) for series in state.op_seconds.values() if series]
    ends += [tallies[-1][0] for tallies in state.fr_tallies.values() if tallies]
    if not ends:
        return {"end": None, "step": 1, "bins": bins, "families": [], "ops": []}
    last = int(max(ends))
    first = last - bins + 1
    busy_of: dict[str, dict[int, list]] = {}  # family -> rank -> busy percent per bin
    sampled: set[str] = set()  # families with rows from the Flight Recorder's samples
    for (g, rank), window in state.recent.items():
        # The summaries on the grid are the window's newest (one agent's summaries end in
        # the order it sent them): back to the first before the grid, whose end starts the
        # interval of the first on it, then forward. At 256 ranks this is most of a moment's
        # views, and about half a window lies before the grid.
        start = len(window)
        while start and window[start - 1][0] >= first:
            start -= 1
        if start == len(window):
            continue
        rows = busy_of.setdefault(families.get(g, g), {})
        row = rows.get(rank)
        if row is None:
            row = rows[rank] = [None] * bins
        prev_end = window[start - 1][0] if start else None
        for end, _count, sum_us, _hist in itertools.islice(window, start, None):
            b = int(end) - first
            dt = end - prev_end if prev_end is not None else 1.0
            prev_end = end
            # Summaries of under a second (PGDASH_STATS_INTERVAL_S) share a bin: their busy
            # times add up; a longer one is spread over its seconds.
            pct = round(sum_us / 1e4 / (dt if 1.0 < dt < 10 else 1.0))
            row[b] = min(100, pct if row[b] is None else row[b] + pct)
    for (g, rank), tallies in state.fr_tallies.items():
        # C++-issued collectives are timed to the agent's poll gap, not to the collective:
        # their busy share comes from how many of its samples found the rank inside one.
        if (g, rank) in state.recent and state.recent[(g, rank)] and \
                state.recent[(g, rank)][-1][0] >= first:
            continue
        cells = [(int(t) - first, busy, n) for t, busy, n in tallies
                 if n and int(t) >= first]
        if not cells:
            continue
        family = families.get(g, g)
        rows = busy_of.setdefault(family, {})
        row = rows.get(rank)
        if row is None:
            row = rows[rank] = [None] * bins
        for b, busy, n in cells:
            pct = round(100 * busy / n)
            row[b] = pct if row[b] is None else max(row[b], pct)
        sampled.add(family)
    order = list(dict.fromkeys(families[name] for name in sorted(state.groups,
                                                                 key=group_order)))
    order += sorted(f for f in busy_of if f not in order)
    out = []
    for family in order:
        rows = busy_of.get(family)
        if not rows:
            continue
        ranks = sorted(rows)
        fam = {"family": family, "groups": sorted(
            (g for g, f in families.items() if f == family), key=group_order),
            "ranks": ranks, "busy": [rows[r] for r in ranks]}
        if family in sampled:
            fam["sampled"] = True
        out.append(fam)
    return {"end": last, "step": 1, "bins": bins, "families": out,
            "ops": _op_series(state, families, order, first, bins)}


def _op_series(state: JobState, families: dict[str, str], order: list[str], first: int,
               bins: int) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str, str], list[LatencyStats | None]] = {}
    seconds = range(first, first + bins)
    for (g, op, src), series in state.op_seconds.items():
        cells = merged.setdefault((families.get(g, g), op, src), [None] * bins)
        for b, second in enumerate(seconds):
            stats = series.get(second)
            if stats is not None:
                cell = cells[b]
                if cell is None:
                    cell = cells[b] = LatencyStats()
                cell.merge(stats)
    rank_of = {f: i for i, f in enumerate(order)}
    out = []
    for (family, op, src), cells in sorted(merged.items(), key=lambda kv: (
            rank_of.get(kv[0][0], len(rank_of)), kv[0])):
        if all(c is None for c in cells):
            continue
        out.append({"family": family, "op": op, "source": src,
                    "count": [c.count if c else 0 for c in cells],
                    "bytes": [c.bytes if c else 0 for c in cells],
                    "p50_us": [c.percentile(0.5) if c else None for c in cells],
                    "p99_us": [c.percentile(0.99) if c else None for c in cells]})
    return out


# -- display states at a moment ---------------------------------------------------------------

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

