"""Views of a job: what the API and the page show of a JobState, as pure functions.

JobState (dashboard.state) is the fold: its data, one handler per event kind and a small read
surface. The presenters here turn it into rows: ranks, groups, progress, collectives, GPUs,
errors, rendezvous. The timeline grid (heat map and charts) is in dashboard.web.timeline, the
display states judged at a moment in dashboard.web.display.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dashboard.state import FLIGHT_OP, JobState, LatencyStats, family_of, group_order, rank_row
from dashboard.state.latency import add_capped


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
    table = state.collectives
    rows = []
    for g, o, rk, src in sorted((key for key in table.keys() if (
            (group is None or key[0] == group) and (op is None or key[1] == op)
            and (rank is None or key[2] == rank))),
            key=lambda key: (group_order(key[0]), key[1], key[2], key[3])):
        s = table[(g, o, rk, src)]
        rows.append({"group": g, "op": o, "rank": rk, "count": s.count,
                     "p50_us": s.percentile(0.5), "p99_us": s.percentile(0.99),
                     "max_us": round(s.max_us, 3), "bytes": s.bytes, **_source(src, s)})
    return rows


def rank_stat_rows(state: JobState) -> list[dict[str, Any]]:
    """Per rank: collectives over the whole job, and the (group, op) it ran most with
    that row's median latency (one row per rank where collective_rows has one per
    group and op; of a rank's (group, op)s run as often, the first seen)."""
    table = state.collectives
    if not len(table):
        return []
    ranks, inverse = np.unique(np.array(table.key_column(2), np.int64), return_inverse=True)
    totals = np.zeros(len(ranks), np.int64)
    add_capped(totals, inverse, table.count)
    # Each rank's rows, most collectives first, the first seen first among equals.
    order = np.lexsort((np.arange(len(inverse)), -table.count, inverse))
    top = order[np.r_[True, inverse[order][1:] != inverse[order][:-1]]]
    keys = table.keys()
    return [{"rank": rk, "count": total, "group": keys[i][0], "op": keys[i][1], "p50_us": p50}
            for rk, total, i, p50 in zip(ranks.tolist(), totals.tolist(), top.tolist(),
                                         table.percentiles(0.5, top))]


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
