"""Rules for collectives that do not complete: the `stall` warning and the `hang`, with the
chain of waits followed across groups to the rank at fault."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from agent.wire import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import group_label, have, ranks_label
from dashboard.state import JobState


@dataclasses.dataclass(frozen=True)
class _View:
    """One way of reading progress rows: the agent's wrappers, or the Flight Recorder."""

    seq: str  # the row's sequence-number field
    since: str  # its in-flight-since field
    source: str

    def busy(self, row: dict[str, Any]) -> bool:
        return row.get(self.since) is not None and (
            self.source != "python" or bool(row.get("inflight_op")))

    def op(self, row: dict[str, Any]) -> str:
        return row.get("inflight_op") if self.source == "python" else "a C++ collective (DDP)"


PYTHON = _View("entered", "inflight_since", "python")
FLIGHT = _View("fr_enqueued", "fr_inflight_since", "flight_recorder")


def _behind(state: JobState, group: str, seq: int, waiting: set[int],
            view: _View = PYTHON) -> list[int]:
    rows = state.progress_of(group)
    members = (state.groups.get(group) or {}).get("ranks") or sorted(rows)
    return [m for m in members
            if m not in waiting and (rows.get(m) or {}).get(view.seq, 0) < seq]


class Stuck(NamedTuple):
    """A collective some ranks have been inside past ``hang_after``."""

    seq: int  # its sequence number in the group
    waiting: set[int]  # the ranks inside it
    rows: dict[int, dict[str, Any]]  # the group's progress rows, by rank


class GroupHistory(NamedTuple):
    """What a group's completed collectives took so far, all ops and ranks together."""

    p99_us: float | None
    longest_us: float
    calls: int  # collectives per member


def _stuck(state: JobState, group: str, now: float, s: Settings,
           view: _View) -> Stuck | None:
    """The collective of ``group`` stuck past hang_after, or None."""
    ranks = state.rank_index()
    rows = state.progress_of(group)
    stuck = {rank: row for rank, row in rows.items()
             if view.busy(row) and now - row[view.since] >= s.hang_after
             and (ranks.get(rank) is None or ranks[rank].status == RankStatus.RUNNING)}
    if not stuck:
        return None
    seq = max(row[view.seq] for row in stuck.values())
    return Stuck(seq, {rank for rank, row in stuck.items() if row[view.seq] == seq}, rows)


def hang(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    for group in sorted(state.groups, key=str):
        # The wrappers' view names the op; the Flight Recorder's also sees C++ collectives.
        view, found = PYTHON, _stuck(state, group, now, s, PYTHON)
        if found is None:
            view, found = FLIGHT, _stuck(state, group, now, s, FLIGHT)
        if found is None:
            continue
        seq, waiting, rows = found
        op = view.op(rows[min(waiting)])
        since = min(rows[r][view.since] for r in waiting)
        behind = _behind(state, group, seq, waiting, view)
        chain, roots = _follow(state, group, behind, view)
        if not roots:  # every member is inside the collective: nobody to wait for
            roots = sorted(waiting)
            summary = (f"{ranks_label(waiting).capitalize()} {have(waiting)} been inside "
                       f"{op} #{seq} on "
                       f"{group_label(state, group)} for {now - since:.0f} s, and no rank is "
                       "missing from it.")
            hint = ("All ranks entered the same collective and none completes: suspect the "
                    "transport (network, NCCL/gloo), a mismatched collective, or a GIL "
                    "deadlock. Rerun with NCCL_DEBUG=INFO (or TORCH_DISTRIBUTED_DEBUG=DETAIL "
                    "on gloo) and compare the stacks in the evidence.")
        else:
            first = ranks.get(roots[0])
            summary = (f"{ranks_label(waiting).capitalize()} {have(waiting)} waited "
                       f"{now - since:.0f} s in {op} #{seq} on {group_label(state, group)} "
                       f"for {ranks_label(roots)}.")
            hint = (f"{ranks_label(roots).capitalize()} never reached that collective. See "
                    f"where it is: `py-spy dump --pid {first.pid if first else '<pid>'}` on "
                    f"{first.host if first else 'its host'} (its last collectives and stack are "
                    "in the evidence): data loading, a rank-dependent branch that skips a "
                    "collective, or compute that never ends. Without pgdash the NCCL watchdog "
                    "would report this only after its timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                    "keeps a Flight Recorder dump).")
        involved = set(waiting) | set(roots) | {c["rank"] for c in chain}
        stacks = {str(rank): state.stacks[(g, rank)]["stack"]
                  for (g, rank) in state.stacks if rank in involved
                  and (g != group or state.stacks[(g, rank)]["seq"] == seq
                       or view is FLIGHT)}
        out.append(finding(
            "hang", Severity.CRITICAL, roots, group, summary, hint,
            {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
             "since": since,
             "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                 (view.seq, "completed", "inflight_op")} for b in behind},
             "chain": chain, "stacks": stacks},
            since + s.hang_after, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
    return out


def _group_history(state: JobState) -> dict[str, GroupHistory]:
    """Per group: (p99 us, longest us, collectives per member) of every collective seen
    complete with a real latency (the wrappers', or NCCL's device timing), all ops and ranks
    together. Built once per state version."""
    def build() -> dict[str, GroupHistory]:
        merged: dict[str, Any] = {}
        for (group, _op, _rank, _source), stats in state.collectives.items():
            if stats.resolution_us is not None:
                continue  # timed to the agent's poll gap (gloo's Flight Recorder): too coarse
            m = merged.get(group)
            if m is None:
                m = merged[group] = type(stats)()
            m.merge(stats)
        out = {}
        for group, m in merged.items():
            members = len((state.groups.get(group) or {}).get("ranks") or ()) or 1
            out[group] = GroupHistory(m.percentile(0.99), m.max_us, m.count // members)
        return out
    return state.memo(("group_history",), build)


def _stall_threshold(state: JobState, group: str, view: _View, rows: dict[int, dict],
                     s: Settings) -> tuple[float, dict[str, Any]]:
    """Seconds a wait in ``group`` must last to be a stall, and what that was derived from."""
    if view is FLIGHT:  # C++ collectives: no latency history, only how many ran
        calls = min((row.get("fr_completed") or 0) for row in rows.values())
        p99_us = longest_us = None
    else:
        p99_us, longest_us, calls = _group_history(state).get(group, GroupHistory(None, 0.0, 0))
    if calls < s.stall_min_calls:
        return s.stall_warmup_after, {"history_calls": calls, "warmup": True}
    threshold = max(s.stall_after, s.stall_p99_factor * (p99_us or 0) / 1e6,
                    s.stall_max_factor * (longest_us or 0) / 1e6)
    return threshold, {"history_calls": calls, "p99_us": p99_us, "longest_us": longest_us}


def stall(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A collective some ranks have waited in, for a peer that has not entered it, far longer
    than the group's own history: named long before --hang-after. Becomes the `hang` at
    --hang-after (this rule then stays quiet), or resolves by itself when the peer arrives.

    Unlike `hang`, a collective every member entered is not a stall: nobody to name yet.
    """
    out = []
    ranks = state.rank_index()
    for group in sorted(state.groups, key=str):
        if any(_stuck(state, group, now, s, v) is not None for v in (PYTHON, FLIGHT)):
            continue  # the hang rule speaks for this group now
        rows = state.progress_of(group)
        for view in (PYTHON, FLIGHT):
            busy = {rank: row for rank, row in rows.items()
                    if view.busy(row) and now - row[view.since] < s.hang_after
                    and (ranks.get(rank) is None or ranks[rank].status == RankStatus.RUNNING)}
            if not busy:
                continue
            seq = max(row[view.seq] for row in busy.values())
            waiting = {rank for rank, row in busy.items() if row[view.seq] == seq}
            behind = _behind(state, group, seq, waiting, view)
            if not behind:
                continue
            since = min(rows[r][view.since] for r in waiting)
            threshold, basis = _stall_threshold(state, group, view, rows, s)
            if now - since < threshold:
                continue
            chain, roots = _follow(state, group, behind, view)
            op = view.op(rows[min(waiting)])
            first = ranks.get(roots[0])
            out.append(finding(
                "stall", Severity.WARNING, roots, group,
                f"{ranks_label(waiting).capitalize()} {have(waiting)} waited "
                f"{now - since:.0f} s in {op} #{seq} on {group_label(state, group)} for "
                f"{ranks_label(roots)}, far longer than this group's collectives take "
                f"(stall after {threshold:.0f} s).",
                f"{ranks_label(roots).capitalize()} {have(roots)} not reached that "
                f"collective yet. See what it does: `py-spy dump --pid "
                f"{first.pid if first and first.pid else '<pid>'}` on "
                f"{first.host if first and first.host else 'its host'}. A checkpoint or an "
                "evaluation that runs on one rank only looks like this too; if it is not one, "
                f"this becomes a hang after {s.hang_after:g} s (--hang-after).",
                {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
                 "since": since, "threshold_s": round(threshold, 3), **basis,
                 "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                     (view.seq, "completed", "inflight_op")} for b in behind},
                 "chain": chain},
                since + threshold, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
            break
    return out


def _follow(state: JobState, group: str, behind: list[int],
            view: _View = PYTHON) -> tuple[list[dict], list[int]]:
    """Follow ranks that are behind to where they wait themselves, across groups."""
    chain: list[dict[str, Any]] = []
    roots: list[int] = []
    seen: set[tuple[str, int]] = set()
    todo = [(group, b) for b in behind]
    while todo:
        g, rank = todo.pop(0)
        if (g, rank) in seen:
            continue
        seen.add((g, rank))
        # Where it waits itself: a collective Python saw, else one only the Flight
        # Recorder saw (a rank stuck in DDP's C++ all-reduce).
        elsewhere = [(og, row, v) for v in (PYTHON, FLIGHT)
                     for (og, r), row in sorted(state.progress.items())
                     if r == rank and og != g and v.busy(row)]
        if not elsewhere:
            roots.append(rank)
            continue
        og, row, v = elsewhere[0]
        next_behind = _behind(state, og, row[v.seq], {rank}, v)
        chain.append({"rank": rank, "waits_in": og, "seq": row[v.seq],
                      "op": v.op(row), "for": next_behind})
        if not next_behind:
            roots.append(rank)
        todo.extend((og, b) for b in next_behind)
    return chain, sorted(set(roots))
