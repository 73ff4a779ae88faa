"""The `stall` warning: a collective some ranks have waited in, for a peer that has not
entered it, far longer than the group's own history, named long before --hang-after.

Its own room because the stall judges against history (each group's latency percentiles,
or the Flight Recorder's count of calls, and the warm-up and barrier allowances), which the
hang does not need; the rule's entry point, with a stopped job's verdict, is rules.hangs.stall.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.rules.p2p import in_p2p, p2p_finding
from dashboard.diagnosis.rules.waits import (FLIGHT, PYTHON, Frame, View, blamed, chain_text,
                                             cycle_text, follow_waits, is_running, one_cycle,
                                             ranks_behind, rows_at, stop_evidence, stopped_text,
                                             stuck_collective, WORKING_HANG_FACTOR)
from dashboard.diagnosis.rules.idle import work_text, works
from dashboard.diagnosis.text import agree, group_label, have, ranks_label, stack_commands, them
from dashboard.state import JobState


class GroupHistory(NamedTuple):
    """What a group's completed collectives took so far, all ops and ranks together."""

    p99_us: float | None
    longest_us: float
    calls: int  # collectives per member


def _group_history(state: JobState) -> dict[str, GroupHistory]:
    """Per group: (p99 us, longest us, collectives per member) of every collective seen
    complete with a real latency (the wrappers', or NCCL's device timing), all ops and ranks
    together. Built once per state version."""
    def build() -> dict[str, GroupHistory]:
        table = state.collectives
        # Not the rows timed to the agent's poll gap (gloo's Flight Recorder): too coarse.
        merged = table.merged(table.key_column(0), np.isnan(table.resolution_us))
        out = {}
        for group, m in merged.items():
            members = len((state.groups.get(group) or {}).get("ranks") or ()) or 1
            out[group] = GroupHistory(m.percentile(0.99), m.max_us, m.count // members)
        return out
    return state.memo(("group_history",), build)


BARRIERS = ("barrier", "monitored_barrier")


def stall_threshold(state: JobState, group: str, view: View, rows: dict[int, dict],
                    s: Settings, op: str | None = None) -> tuple[float, dict[str, Any]]:
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
    basis = {"history_calls": calls, "p99_us": p99_us, "longest_us": longest_us}
    if op in BARRIERS and threshold < s.stall_barrier_after:
        return s.stall_barrier_after, {**basis, "barrier": True}
    return threshold, basis


def find_stalls(state: JobState, frame: Frame, s: Settings) -> list[Finding]:
    """A collective some ranks have waited in, for a peer that has not entered it, far longer
    than the group's own history: named long before --hang-after. Becomes the `hang` at
    --hang-after (this rule then stays quiet), or resolves by itself when the peer arrives.

    Unlike `hang`, a collective every member entered is not a stall: nobody to name yet.
    """
    out = []
    now = frame.now
    # (past --hang-after only where the ranks wait for work: stuck_collective)
    longest = WORKING_HANG_FACTOR * s.hang_after
    for group in sorted(state.groups, key=str):
        if any(stuck_collective(state, group, frame, s, v) is not None for v in (PYTHON, FLIGHT)):
            continue  # the hang rule speaks for this group now
        rows = rows_at(state, group, frame)
        for view in (PYTHON, FLIGHT):
            busy = {rank: row for rank, row in rows.items()
                    if view.busy(row) and now - row[view.since] < longest
                    and is_running(state, rank, frame)}
            if not busy:
                continue
            seq = max(row.get(view.seq, 0) for row in busy.values())
            waiting = {rank for rank, row in busy.items() if row.get(view.seq, 0) == seq}
            behind = ranks_behind(state, group, seq, waiting, view, rows)
            if not behind:
                continue
            since = min(rows[r][view.since] for r in waiting)
            op = view.op(rows[min(waiting)])
            threshold, basis = stall_threshold(state, group, view, rows, s)
            if now - since < threshold:
                continue
            chain, roots = follow_waits(state, group, behind, frame, view)
            cycle = not roots
            # A barrier's allowance is for a rank busy outside collectives (rank 0's
            # checkpoint); in a cycle the awaited rank waits itself, for a waiter: a deadlock.
            if op in BARRIERS and not cycle:
                threshold, basis = stall_threshold(state, group, view, rows, s, op)
                if now - since < threshold:
                    continue
            roots = blamed(roots, behind, waiting)
            if roots is None:
                continue
            use = [works(state, rank) for rank in behind]
            hang_after = s.hang_after * (WORKING_HANG_FACTOR if all(use) else 1.0)
            working = (f" {ranks_label(behind).capitalize()} {have(behind)} used "
                       f"{work_text(use)} since {agree(behind, 'its', 'their')} "
                       "collectives last moved: working, not blocked." if all(use) else "")
            out.append(finding(
                "stall", Severity.WARNING, roots, group,
                f"{ranks_label(roots).capitalize()} {have(roots)} not reached {op} #{seq} on "
                f"{group_label(state, group)}: {ranks_label(waiting)} {have(waiting)} "
                f"waited {now - since:.0f} s for {them(roots)}"
                f"{chain_text(state, chain)}, far longer than this group's collectives take "
                f"(stall after {threshold:.0f} s)." + stopped_text(state, frame),
                f"{ranks_label(roots).capitalize()} {have(roots)} not reached that "
                f"collective yet. See what {agree(roots, 'it does', 'they do')}: "
                f"{stack_commands(state, roots)}.{working} A checkpoint or an "
                "evaluation that runs on one rank only looks like this too; if it is not one, "
                f"this becomes a hang after {hang_after:g} s"
                + (f" ({WORKING_HANG_FACTOR:g} x --hang-after while "
                   f"{agree(behind, 'it works', 'they work')}: a loop that never ends looks "
                   "like work too)" if all(use) else " (--hang-after)") + "."
                + cycle_text(chain, roots),
                {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
                 "since": since, "threshold_s": round(threshold, 3), **basis,
                 "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                     (view.seq, "completed", "inflight_op")} for b in behind},
                 "chain": chain, **stop_evidence(frame),
                 **({"working": {str(b): round(u[0], 3) for b, u in zip(behind, use)}}
                    if all(use) else {}),
                 **({"cycle": True} if cycle else {})},
                since + threshold, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
            break
        else:
            if not any(map(in_p2p, rows.values())):
                continue  # no point-to-point wait: its threshold (the group's history) unread
            threshold, _ = stall_threshold(state, group, PYTHON, rows, s)
            p2p = p2p_finding(state, group, frame, s, threshold, "stall")
            if p2p is not None:
                out.append(p2p)
    return one_cycle(state, out)
