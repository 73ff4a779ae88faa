"""Rules for collectives and point-to-point ops that do not complete: the `stall` warning and
the `hang`, with the chain of waits followed across groups and along pipelines to the rank at
fault; and a job stopped while it hangs, which keeps that verdict.

The entry points of both rules live here (``hang``, ``stall``, ``job_stop``), with the hang of
a collective itself. What they stand on has its own modules, each imported from here and
never importing back: rules.waits (who waits where), rules.p2p (point-to-point ops) and
rules.stalls (the stall judged against the group's history).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dashboard.diagnosis.errors import classify_error
from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.rules.idle import idle
from dashboard.diagnosis.rules.p2p import p2p_finding
from dashboard.diagnosis.rules.stalls import find_stalls
from dashboard.diagnosis.rules.waits import (FLIGHT, PYTHON, Frame, Stop, View, blamed,
                                             chain_text, cycle_text, follow_waits, one_cycle,
                                             stop_evidence, stopped_text, stuck_collective,
                                             WORKING_HANG_FACTOR)
from dashboard.diagnosis.text import (agree, backend_of, group_label, have, ranks_label,
                                      stack_commands, them, what_ends_the_wait)
from dashboard.state import JobState, RankState

STOPPED = (RankStatus.LOST, RankStatus.FAILED)  # how the ranks of a stopped job end
# Causes (dashboard.diagnosis.known_errors) of a rank that gave up waiting in a collective.
COLLECTIVE_TIMEOUTS = frozenset({"gloo_timeout", "nccl_watchdog_timeout",
                                 "monitored_barrier_timeout", "work_wait_timeout"})


def _hangs(state: JobState, frame: Frame, s: Settings) -> list[Finding]:
    out = []
    now = frame.now
    for group in sorted(state.groups, key=str):
        # The wrappers' view names the op; the Flight Recorder's also sees C++ collectives.
        view, found = PYTHON, stuck_collective(state, group, frame, s, PYTHON)
        if found is None:
            view, found = FLIGHT, stuck_collective(state, group, frame, s, FLIGHT)
        if found is None:
            p2p = p2p_finding(state, group, frame, s, s.hang_after, "hang")
            if p2p is not None:
                out.append(p2p)
            continue
        seq, waiting, rows, after, behind = found
        op = view.op(rows[min(waiting)])
        since = min(rows[r][view.since] for r in waiting)
        chain, roots = follow_waits(state, group, behind, frame, view)
        all_inside = not behind  # every member is inside the collective: nobody to wait for
        cycle = bool(behind) and not roots
        if behind:
            roots = blamed(roots, behind, waiting)
            if roots is None:
                continue
        if all_inside and _ending(rows, seq, waiting, view):
            continue
        if all_inside:
            roots = sorted(waiting)
        involved = set(waiting) | set(roots) | {c["rank"] for c in chain}
        stacks = {str(rank): state.stacks[(g, rank)]["stack"]
                  for (g, rank) in state.stacks if rank in involved
                  and (g != group or state.stacks[(g, rank)]["seq"] == seq
                       or view is FLIGHT)}
        if all_inside:
            summary = (f"{ranks_label(waiting).capitalize()} {have(waiting)} been inside "
                       f"{op} #{seq} on "
                       f"{group_label(state, group)} for {now - since:.0f} s, and no rank is "
                       "missing from it.")
            debug = ("NCCL_DEBUG=INFO" if backend_of(state, group) == "nccl" else
                     "TORCH_DISTRIBUTED_DEBUG=DETAIL (it checks that every rank calls the same "
                     "collective)")
            hint = ("All ranks entered the same collective and none completes: suspect the "
                    "transport (the network, the backend), a mismatched collective, or a GIL "
                    f"deadlock. Rerun with {debug}. {_compare_text(state, roots, stacks)}")
        else:
            summary = (f"{ranks_label(roots).capitalize()} never reached {op} #{seq} on "
                       f"{group_label(state, group)}: {ranks_label(waiting)} "
                       f"{have(waiting)} waited {now - since:.0f} s for "
                       f"{them(roots)}{chain_text(state, chain)}.")
            worked = (f" {ranks_label(behind).capitalize()} {have(behind)} worked all along "
                      f"(the hang waited {after:g} s, {WORKING_HANG_FACTOR:g} x --hang-after, "
                      "for it): a loop that never ends, or work far longer than its "
                      "evaluations and checkpoints take." if after > s.hang_after else "")
            hint = (f"{ranks_label(roots).capitalize()} never reached that collective: look "
                    "for data loading, a rank-dependent branch that skips a collective, or "
                    f"compute that never ends.{worked}{cycle_text(chain, roots)} "
                    f"{_stacks_text(state, roots, stacks)} {what_ends_the_wait(state, group)}")
        out.append(finding(
            "hang", Severity.CRITICAL, roots, group, summary + stopped_text(state, frame), hint,
            {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
             "since": since,
             "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                 (view.seq, "completed", "inflight_op")} for b in behind},
             "chain": chain, "stacks": stacks, **stop_evidence(frame),
             **({"cycle": True} if cycle else {})},
            since + after, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
    return one_cycle(state, out)


def _ending(rows: dict[int, dict[str, Any]], seq: int, waiting: set[int], view: View) -> bool:
    """Whether a peer reported the collective completed after the waiting ranks last reported
    (heartbeats are a second apart): their wait is ending, and their rows have not said so yet."""
    latest = max(rows[r].get("t", 0.0) for r in waiting)
    return any(row.get(view.done, 0) >= seq and row.get("t", 0.0) >= latest
               for rank, row in rows.items() if rank not in waiting)


def _stacks_text(state: JobState, culprits: list[int], stacks: dict[str, str]) -> str:
    """What the evidence holds of the ranks' stacks, and how to get the culprits' own."""
    culprits = sorted(culprits)
    shown = sorted(int(r) for r in stacks)
    missing = [r for r in culprits if str(r) not in stacks]
    others = [r for r in shown if r not in culprits]
    if not missing:
        return (f"The stack of {agree(culprits, 'the culprit', 'each culprit')} is in the "
                "evidence.")
    needs = (f"the {agree(missing, 'culprit', 'culprits')}' own "
             f"{agree(missing, 'stack comes', 'stacks come')} with the incident, asked of "
             f"{agree(missing, 'its agent', 'their agents')} when it opens; if none answers "
             f"(a thread blocked in C with the GIL held): {stack_commands(state, missing)}."
             ).replace("culprit' ", "culprit's ")
    if others:
        return (f"The {agree(others, 'stack', 'stacks')} of the waiting "
                f"{agree(others, 'rank', 'ranks')} ({ranks_label(others)}) "
                f"{agree(others, 'is', 'are')} in the evidence; {needs}")
    return f"No stack is in the evidence yet; {needs}"


def _compare_text(state: JobState, ranks: list[int], stacks: dict[str, str]) -> str:
    """Where ranks that are all inside one collective wait: their stacks in the evidence, and
    how to get the ones that are not."""
    shown = sorted(int(r) for r in stacks)
    missing = [r for r in sorted(ranks) if str(r) not in stacks]
    text = (f"Compare the {agree(shown, 'stack', 'stacks')} of {ranks_label(shown)} in the "
            "evidence" if shown else "No stack is in the evidence yet")
    if missing:
        text += (f"; {agree(missing, 'a snapshot', 'snapshots')} of {ranks_label(missing)}: "
                 f"{stack_commands(state, missing)}")
    return text + "."


# -- a job stopped while it hangs -------------------------------------------------------------

def job_stop(state: JobState, s: Settings) -> Stop | None:
    """The end of a job that hung, if it ended so: ranks ended (killed by the launcher on
    Ctrl-C, a scheduler, a collective timeout, the NCCL watchdog) after a `hang` or `stall`
    verdict stood. That verdict, as it stood when the first of them ended, stays the job's;
    the departures are its last evidence, not findings of their own (see rules.crash).

    A rank that gave up waiting with a collective timeout of torch's own (gloo's, the NCCL
    watchdog's, ``monitored_barrier``'s, often set to seconds) says the wait was too long
    before any threshold of pgdash's: the collective it waited in is then a hang at once, if
    a peer never entered it (a `monitored_barrier(timeout=5 s)` ended a job before its stall
    could form, and the victims' errors, then the launcher's kill of the stuck rank, were
    all pgdash named)."""
    def build() -> Stop | None:
        # Stopped ranks were killed or failed: one that exited cleanly was waiting no more.
        stopped = [r for r in state.ranks()
                   if r.status in STOPPED and r.exit_at is not None]
        if not stopped:
            return None
        # The verdict must stand when the first rank ends: a hang that forms only after a
        # rank crashed or was killed is that death's consequence (rules.crash names it).
        at = min(r.exit_at for r in stopped)
        timed_out = _timed_out(state, stopped)
        probe = Stop(at, sorted(r.rank for r in stopped), [], timed_out)
        frame = Frame(at, probe)
        found = [f for f in _hangs(state, frame, s) + find_stalls(state, frame, s)
                 + idle(state, at, s, stopping=True) if f["first_seen"] <= at]
        if not found and timed_out:
            found = [f for f in _hangs(state, frame, replace(s, hang_after=0.0))
                     if set(f["evidence"].get("waiting", ())) & set(timed_out)]
        return probe._replace(findings=found) if found else None
    return state.memo(("job_stop",), build)


def _timed_out(state: JobState, stopped: list[RankState]) -> dict[int, str]:
    """rank -> its error's title, for the stopped ranks whose collective timed out."""
    out = {}
    for r in stopped:
        err = state.last_error(r.rank) if r.status == RankStatus.FAILED else None
        cause = classify_error(err) if err else None
        if cause is not None and cause.cause in COLLECTIVE_TIMEOUTS:
            out[r.rank] = cause.title
    return out


def hang(state: JobState, now: float, s: Settings) -> list[Finding]:
    return _with_stop(state, now, s, "hang", _hangs)


def stall(state: JobState, now: float, s: Settings) -> list[Finding]:
    return _with_stop(state, now, s, "stall", find_stalls)


def _with_stop(state: JobState, now: float, s: Settings, kind: str, rule) -> list[Finding]:
    found = rule(state, Frame(now), s)
    stop = job_stop(state, s)
    if stop is None or stop.at > now:
        return found
    kept = [dict(f) for f in stop.findings if f["kind"] == kind]  # diagnose() stamps them
    ids = {f["id"] for f in kept}
    return kept + [f for f in found if f["id"] not in ids]
