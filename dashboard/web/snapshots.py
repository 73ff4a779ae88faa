"""Snapshots as the API and the page show them: each rank's answer, and stacks grouped.

A snapshot request (dashboard.ingest.asks) is answered by each rank's agent with its threads'
frames and its groups' progress (``JobState.snapshots``). Read against the request, every rank
is ``answered``, ``waiting`` (asked less than ANSWER_WAIT_S ago), ``no answer`` (asked, silent:
its interpreter may be blocked with the GIL held, or its agent's thread stuck) or ``not
connected`` (no connection here: exited, lost, or connected to another server process), the
last two with the rank's own status (``rank_status``: exited, failed, lost, running: a rank in
teardown or dead says so) and the last stack the rank sent when it sat in a collective, if
any. Identical
training-thread stacks collapse into one group with its ranks, the smallest groups (the odd
ones out: the rank at fault is usually alone in what it does) first.
"""

from __future__ import annotations

from typing import Any

from pgdash_agent.native import gil_holder

from dashboard.ingest.asks import (ANSWER_WAIT_S, PEER_AFTER_S, Busy, Request, TooSoon,
                                   UnknownRanks)
from dashboard.diagnosis.text import stack_text, user_frame
from dashboard.state import JobState
from dashboard.statuses import RankStatus

__all__ = ["Busy", "TooSoon", "UnknownRanks", "answered_request", "group_stacks", "latest",
           "listing", "request_view", "wavefront", "with_snapshots"]

TOP_FRAMES = 12  # frames of a group's stack shown in the grouping's key and text


def request_view(state: JobState, request: Request, now: float,
                 detail: set[int] | None = frozenset(),
                 early: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One request: per rank its status, the stacks grouped, where each rank stands in each
    of its groups (the wavefront), and who is missing. Each rank's whole answer (every
    thread, every group) only for the ranks in ``detail`` (None: all): at 1,024 ranks the
    whole answers are megabytes, the grouped view a few kilobytes. ``early``: answers
    received and not folded yet (dashboard.ingest.asks.Asks.early); the folded win."""
    answers = state.snapshots.get(request.id, {})
    if early:
        answers = {**early, **answers}
    groups = group_stacks(answers)
    group_of = {rank: i for i, g in enumerate(groups) for rank in g["ranks"]}
    ranks: dict[str, dict[str, Any]] = {}
    for rank in request.asked + request.not_connected:
        answer = answers.get(rank)
        if answer is not None:
            row = {"status": "answered", "t": answer["t"], "took_ms": answer.get("took_ms"),
                   "stack_group": group_of[rank]}
            if detail is None or rank in detail:
                row.update(_answer(answer), **_health(state, rank))
            ranks[str(rank)] = row
            continue
        if rank in request.asked:
            status = "waiting" if now - request.asked_at < ANSWER_WAIT_S else "no answer"
        else:
            status = "not connected"
        row = {"status": status}
        known = state.rank_index().get(rank)
        if status != "waiting" and known is not None:
            # Why it may not answer: exited, failed or lost (teardown, dead), or running
            row["rank_status"] = str(known.status)
            if known.exit_at is not None:
                row["exit_at"] = known.exit_at
        last = _last_stack(state, rank) if status != "waiting" else None
        if last is not None:
            row["last_stack"] = last
        outside = _read_from_outside(state, request, rank, now, known)
        if outside is not None:
            row["read_from_outside"] = outside
        ranks[str(rank)] = row
    missing = [int(r) for r, row in ranks.items() if row["status"] in ("no answer",
                                                                        "not connected")]
    return {**request.row(), "ranks": ranks, "groups": groups,
            "wavefront": wavefront(answers),
            "complete": all(row["status"] != "waiting" for row in ranks.values()),
            "missing": sorted(missing)}


def wavefront(answers: dict[int, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per process group, where its ranks stand: each distinct (collectives entered,
    completed, the op in flight) with its ranks, the positions of fewest ranks first (the
    rank that is elsewhere is usually alone)."""
    positions: dict[str, dict[tuple, list[int]]] = {}
    for rank, answer in sorted(answers.items()):
        for row in answer.get("groups") or []:
            key = (row.get("entered"), row.get("completed"), row.get("inflight_op"))
            positions.setdefault(row["group"], {}).setdefault(key, []).append(rank)
    return {group: sorted(({"entered": e, "completed": c, "inflight_op": op, "ranks": members}
                           for (e, c, op), members in found.items()),
                          key=lambda p: (len(p["ranks"]), p["ranks"][0]))
            for group, found in positions.items()}


def listing(state: JobState, job_id: int, remembered: list[Request]) -> list[dict[str, Any]]:
    """Every request of the job, newest first: those this process remembers and those known
    only by their answers in the log (another process's, a restart's, a dead job's), each
    with how many ranks answered."""
    known = {r.id: r for r in remembered}
    for request_id in state.snapshots:
        if request_id not in known:
            known[request_id] = answered_request(state, job_id, request_id)
    return [{**r.row(), "answered": len(state.snapshots.get(r.id, {}))}
            for r in sorted(known.values(), key=lambda r: -r.asked_at)]


def answered_request(state: JobState, job_id: int, request_id: str) -> Request:
    """A request known only by its answers in the log (asked by another server process, or
    before a restart): the ranks that answered, at the time they say they were asked."""
    answers = state.snapshots[request_id]
    first = min(answers.values(), key=lambda a: a.get("asked_at") or a["t"])
    return Request(request_id, job_id, first.get("asked_at") or first["t"],
                   first.get("reason") or "", sorted(answers), [])


def group_stacks(answers: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks whose training threads stand in the same frames, as one group each, the groups
    of fewest ranks first (then by their lowest rank)."""
    groups: dict[tuple, dict[str, Any]] = {}
    for rank, answer in sorted(answers.items()):
        thread = training_thread(answer)
        frames = thread["frames"][-TOP_FRAMES:] if thread else []
        key = tuple((f["file"], f["line"], f["function"]) for f in frames)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"ranks": [], "thread": thread["name"] if thread else None,
                                   "frames": frames, "where": user_frame(frames),
                                   "stack": stack_text(frames)}
        group["ranks"].append(rank)
    return sorted(groups.values(), key=lambda g: (len(g["ranks"]), g["ranks"][0]))


def training_thread(answer: dict[str, Any]) -> dict[str, Any] | None:
    threads = answer.get("threads") or []
    return next((t for t in threads if t.get("training")), threads[0] if threads else None)


def with_snapshots(state: JobState, incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Incidents, each with ``snapshot``: its blamed ranks' newest answer since it began (the
    one asked when it opened, or one asked since), when there is one."""
    if not state.snapshots:
        return incidents
    out = []
    for incident in incidents:
        shown = latest(state, incident["ranks"], since=incident["first_seen"])
        out.append(dict(incident, snapshot=shown) if shown is not None else incident)
    return out


def latest(state: JobState, ranks: list[int], since: float = 0.0) -> dict[str, Any] | None:
    """The newest answer among ``ranks`` (by time) sent at ``since`` or later, with its rank:
    what an incident shows."""
    best = None
    for answers in state.snapshots.values():
        for rank in ranks:
            answer = answers.get(rank)
            if answer is not None and answer["t"] >= since and (
                    best is None or answer["t"] > best[1]["t"]):
                best = (rank, answer)
    if best is None:
        return None
    thread = training_thread(best[1])
    frames = thread["frames"] if thread else []
    return {"rank": best[0], "t": best[1]["t"], "ask": best[1]["ask"],
            "reason": best[1].get("reason"), "thread": thread["name"] if thread else None,
            "where": user_frame(frames), "stack": stack_text(frames)}


def _answer(answer: dict[str, Any]) -> dict[str, Any]:
    threads = [{**t, "stack": stack_text(t.get("frames") or [])}
               for t in answer.get("threads") or []]
    recent = [{"group": row[0], "op": row[1], "bytes": row[2], "start": row[3], "end": row[4],
               "seq": row[5] if len(row) > 5 else None,
               "source": (row[6] if len(row) > 6 else None) or "wrapper"}
              for row in answer.get("recent") or []]
    return {"t": answer["t"], "took_ms": answer.get("took_ms"), "threads": threads,
            "groups": answer.get("groups") or [], "recent": recent,
            **({"native_error": answer["native_error"]} if answer.get("native_error") else {})}


MAX_ERROR_CHARS = 2000  # of the rank's last error shown beside its answer


def _read_from_outside(state: JobState, request: Request, rank: int, now: float,
                       known: Any = None) -> dict[str, Any] | None:
    """A silent rank as another rank of its host read it with py-spy (Asks.ask_peers):
    ``{"by", "t", "dump", "gil_held_by"}`` (the thread holding the GIL: a rank blocked in C
    with it cannot run its agent), or ``{"by", "t", "error"}``; ``{"by"}`` while asked,
    ``{"by", "error"}`` when that agent did not answer in time either, ``{"error"}`` when
    nobody was asked (why: alone on its host, the server behind, ...). Read by the host's
    reader process (pgdash_agent.reader) instead of an agent: ``host_reader`` true, ``by``
    the rank that started it, and ``reader_pid`` once read."""
    reading = state.snapshot_peers.get(request.id, {}).get(rank)
    if reading is None:
        by = request.peers.get(rank)
        host = {"host_reader": True} if rank in request.host_read else {}
        if by is None and not host:
            may_live = known is not None and known.status in (RankStatus.RUNNING,
                                                              RankStatus.LOST)
            why = request.unread.get(rank) or (request.unread.get("*") if may_live else None)
            return {"error": why} if why else None
        if now - request.asked_at < PEER_AFTER_S + ANSWER_WAIT_S:
            return {"by": by, **host}  # asked
        return {"by": by, **host, "error": ("the host reader" if host else "its agent") +
                " did not answer that question either"}
    out = {"by": reading["by"], "t": reading["t"]}
    if reading.get("reader_pid"):
        out.update(host_reader=True, reader_pid=reading["reader_pid"])
    if reading.get("peer_dump") is not None:
        out.update(dump=reading["peer_dump"], gil_held_by=gil_holder(reading["peer_dump"]))
    else:
        out["error"] = reading.get("native_error") or "no reading"
    return out


def _health(state: JobState, rank: int) -> dict[str, Any]:
    """What else the server knows of the rank, beside what it answered: its last GPU
    reading and its last error (this attempt's), when it has them."""
    out: dict[str, Any] = {}
    gpu = state.gpus.get(rank)
    if gpu is not None:
        out["gpu"] = gpu
    error = state.last_error(rank)
    if error is not None:
        out["error"] = {"t": error.get("t"), "where": error.get("where"),
                        "error_type": error.get("error_type"),
                        "error": str(error.get("error") or "")[:MAX_ERROR_CHARS]}
    return out


def _last_stack(state: JobState, rank: int) -> dict[str, Any] | None:
    """The newest stack the rank sent while it sat in a collective (JobState.stacks)."""
    found = [row for (_g, r), row in state.stacks.items() if r == rank]
    return max(found, key=lambda row: row["t"]) if found else None
