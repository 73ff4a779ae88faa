"""Rules for collectives and point-to-point ops that do not complete: the `stall` warning and
the `hang`, with the chain of waits followed across groups and along pipelines to the rank at
fault; and a job stopped while it hangs, which keeps that verdict.

Where ranks wait is read three ways (``_View``): the agent's wrappers (Python-issued
collectives), the Flight Recorder (collectives issued from C++: DDP, FSDP's reducer), and
point-to-point ops (``send``/``recv``/``isend``/``irecv``, as pipelines use them), which have
no group-wide sequence number: a rank's n-th receive from a peer with a tag is matched with
that peer's n-th send to it with that tag (``p2p_posted``, counted by the agent).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import (agree, backend_of, group_label, have, ranks_label,
                                      stack_commands, them, what_ends_the_wait)
from dashboard.state import JobState

STOPPED = (RankStatus.LOST, RankStatus.FAILED)  # how the ranks of a stopped job end


@dataclasses.dataclass(frozen=True)
class _View:
    """One way of reading progress rows: the agent's wrappers, or the Flight Recorder."""

    seq: str  # the row's sequence-number field
    since: str  # its in-flight-since field
    source: str
    done: str = ""  # its completed-sequence-number field

    def busy(self, row: dict[str, Any]) -> bool:
        if row.get(self.since) is None:
            return False
        if self.source == "python":
            return bool(row.get("inflight_op"))
        if self.source == "flight_recorder":
            # The recorder numbers Python-issued collectives too: one the wrappers saw (in
            # flight, or ended by a call that raised) is the Python view's, whose history
            # and op name are better.
            seq = row.get(self.seq, 0)
            return not (row.get("inflight_fr") == seq or seq <= (row.get("fr_wrapped") or -1))
        return True

    def op(self, row: dict[str, Any]) -> str:
        return row.get("inflight_op") if self.source == "python" else "a C++ collective (DDP)"


PYTHON = _View("entered", "inflight_since", "python", "completed")
FLIGHT = _View("fr_enqueued", "fr_inflight_since", "flight_recorder", "fr_completed")
P2P = _View("p2p_n", "p2p_since", "p2p")


class Stop(NamedTuple):
    """The end of a job that hung: its ranks stopped together after the verdict stood."""

    at: float  # when the first of them ended
    ranks: list[int]  # the ranks that ended from then on
    findings: list[Finding]  # the hang or stall verdict as it stood then


class Frame(NamedTuple):
    """The moment a rule judges, and whether it judges a job as it was when it was stopped."""

    now: float
    stop: Stop | None = None


def _rows(state: JobState, group: str, frame: Frame) -> dict[int, dict[str, Any]]:
    rows = state.progress_of(group)
    if frame.stop is None:
        return rows
    # A rank that exited shows nothing in flight any more: read where it was then.
    return {rank: state.exit_rows.get((group, rank), row) for rank, row in rows.items()}


def _running(state: JobState, rank: int, frame: Frame) -> bool:
    r = state.rank_index().get(rank)
    if r is None or r.status == RankStatus.RUNNING:
        return True
    return frame.stop is not None and r.rank in frame.stop.ranks


def _behind(state: JobState, group: str, seq: int, waiting: set[int],
            view: _View = PYTHON, rows: dict[int, dict[str, Any]] | None = None) -> list[int]:
    rows = state.progress_of(group) if rows is None else rows
    members = (state.groups.get(group) or {}).get("ranks") or sorted(rows)
    # Where the waiting ranks' Python-issued collective stands among every collective of the
    # group (the Flight Recorder also counts C++-issued ones): a peer that got that far is
    # not behind, it is inside another collective at the same point (rules.desync).
    point = None
    if view is PYTHON:
        marks = [(rows.get(w) or {}).get("inflight_fr") for w in waiting]
        if marks and None not in marks:
            point = min(marks)
    return [m for m in members
            if m not in waiting and (rows.get(m) or {}).get(view.seq, 0) < seq
            and not (point is not None and (rows.get(m) or {}).get("fr_enqueued", 0) >= point)]


def _p2p_peer_behind(rank: int, row: dict[str, Any],
                     rows: dict[int, dict[str, Any]]) -> int | None:
    """The peer a rank's oldest point-to-point op waits for, if that peer has not posted the
    matching op (its n-th opposite op with this rank and tag); else None."""
    peer, n, op = row.get("p2p_peer"), row.get("p2p_n"), row.get("p2p_op")
    if peer is None or peer < 0 or not n or not op:
        return None
    opposite = "recv" if op in ("send", "isend") else "send"
    posted = ((rows.get(peer) or {}).get("p2p_posted") or {}).get(
        f"{opposite}:{rank}:{row.get('p2p_tag') or 0}", 0)
    return peer if posted < n else None


def _p2p_label(row: dict[str, Any]) -> str:
    op = row.get("p2p_op")
    way = "to" if op in ("send", "isend") else "from"
    return f"{op} {way} rank {row.get('p2p_peer')} (tag {row.get('p2p_tag') or 0}, #{row.get('p2p_n')})"


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


def _stuck(state: JobState, group: str, frame: Frame, s: Settings,
           view: _View) -> Stuck | None:
    """The collective of ``group`` stuck past hang_after, or None."""
    rows = _rows(state, group, frame)
    stuck = {rank: row for rank, row in rows.items()
             if view.busy(row) and frame.now - row[view.since] >= s.hang_after
             and _running(state, rank, frame)}
    if not stuck:
        return None
    seq = max(row[view.seq] for row in stuck.values())
    return Stuck(seq, {rank for rank, row in stuck.items() if row[view.seq] == seq}, rows)


def _p2p_waits(state: JobState, group: str, frame: Frame, rows: dict[int, dict[str, Any]],
               longer_than: float) -> dict[int, int]:
    """Ranks of ``group`` waiting in a point-to-point op longer than ``longer_than`` for a
    peer that has not posted its side: rank -> that peer."""
    out = {}
    for rank, row in rows.items():
        if (P2P.busy(row) and row.get("p2p_op") and frame.now - row["p2p_since"] >= longer_than
                and _running(state, rank, frame)):
            peer = _p2p_peer_behind(rank, row, rows)
            if peer is not None:
                out[rank] = peer
    return out


def _stopped(state: JobState, frame: Frame) -> str:
    stop = frame.stop
    if stop is None:
        return ""
    return (f" The job was then stopped ({ranks_label(stop.ranks)} ended from "
            f"{stop.at:.0f} s, Unix time, on): this stays its verdict.")


def _stop_evidence(frame: Frame) -> dict[str, Any]:
    return {} if frame.stop is None else {"stopped": {"at": frame.stop.at,
                                                      "ranks": frame.stop.ranks}}


def _hangs(state: JobState, frame: Frame, s: Settings) -> list[Finding]:
    out = []
    now = frame.now
    for group in sorted(state.groups, key=str):
        # The wrappers' view names the op; the Flight Recorder's also sees C++ collectives.
        view, found = PYTHON, _stuck(state, group, frame, s, PYTHON)
        if found is None:
            view, found = FLIGHT, _stuck(state, group, frame, s, FLIGHT)
        if found is None:
            p2p = _p2p_finding(state, group, frame, s, s.hang_after, "hang")
            if p2p is not None:
                out.append(p2p)
            continue
        seq, waiting, rows = found
        op = view.op(rows[min(waiting)])
        since = min(rows[r][view.since] for r in waiting)
        behind = _behind(state, group, seq, waiting, view, rows)
        chain, roots = _follow(state, group, behind, frame, view)
        all_inside = not roots  # every member is inside the collective: nobody to wait for
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
                       f"{them(roots)}{_chain_text(state, chain)}.")
            hint = (f"{ranks_label(roots).capitalize()} never reached that collective: look "
                    "for data loading, a rank-dependent branch that skips a collective, or "
                    f"compute that never ends. {_stacks_text(state, roots, stacks)} "
                    f"{what_ends_the_wait(state, group)}")
        out.append(finding(
            "hang", Severity.CRITICAL, roots, group, summary + _stopped(state, frame), hint,
            {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
             "since": since,
             "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                 (view.seq, "completed", "inflight_op")} for b in behind},
             "chain": chain, "stacks": stacks, **_stop_evidence(frame)},
            since + s.hang_after, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
    return out


def _ending(rows: dict[int, dict[str, Any]], seq: int, waiting: set[int], view: _View) -> bool:
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
             f"{agree(missing, 'stack needs a snapshot', 'stacks need snapshots')}: "
             f"{stack_commands(state, missing)}.").replace("culprit' ", "culprit's ")
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


def _chain_text(state: JobState, chain: list[dict[str, Any]]) -> str:
    """'; rank 1 waits for rank 3 in ...' for each hop of a chain of waits."""
    text = ""
    for hop in chain:
        if hop.get("for"):
            where = (hop["op"] if hop.get("source") == "p2p"
                     else f"{hop['op']} #{hop['seq']}")
            text += (f"; rank {hop['rank']} itself waits in {where} on "
                     f"{group_label(state, hop['waits_in'])} for "
                     f"{ranks_label(hop['for'])}")
    return text


def _p2p_finding(state: JobState, group: str, frame: Frame, s: Settings, after: float,
                 kind: str) -> Finding | None:
    """A `stall` or `hang` of point-to-point ops in ``group``: ranks waiting longer than
    ``after`` for peers that never posted their side, followed along the pipeline."""
    rows = _rows(state, group, frame)
    waits = _p2p_waits(state, group, frame, rows, after)
    if kind == "stall":  # the hang speaks for waits past hang_after
        waits = {r: p for r, p in waits.items()
                 if frame.now - rows[r]["p2p_since"] < s.hang_after}
    if not waits:
        return None
    chain, roots = _follow(state, group, [], frame, P2P, starts=sorted(waits))
    cycle = not roots  # they wait for each other: a deadlock of point-to-point ops
    if cycle:
        roots = sorted(waits)
    waiting = sorted(set(waits) - set(roots))
    since = min(rows[r]["p2p_since"] for r in waits)
    direct = sorted({r for r, p in waits.items() if p in roots})
    lead = direct[0] if direct else (waiting or roots)[0]
    lead_wait = (f"rank {lead} has waited {frame.now - rows[lead]['p2p_since']:.0f} s in "
                 f"{_p2p_label(rows[lead])}")
    if cycle:
        summary = (f"{ranks_label(roots).capitalize()} wait for each other on "
                   f"{group_label(state, group)}, each in a point-to-point op whose peer "
                   f"never posted the matching one: {lead_wait}"
                   f"{_chain_text(state, [c for c in chain if c['rank'] != lead])}")
        hint = ("A deadlock of point-to-point ops: each rank waits for a peer that waits for "
                "it (both receive first, or blocking sends larger than the transport buffers "
                "in a ring). Order them so that one side sends first (even ranks send, odd "
                "ranks receive, then the reverse), or post both with `dist.batch_isend_irecv`.")
    else:
        summary = (f"{ranks_label(roots).capitalize()} {have(roots)} not sent or received "
                   f"what {ranks_label(waiting or sorted(waits))} "
                   f"{agree(waiting or waits, 'waits', 'wait')} for on "
                   f"{group_label(state, group)}: {lead_wait}"
                   f"{_chain_text(state, [c for c in chain if c['rank'] != lead])}")
        hint = (f"{ranks_label(roots).capitalize()} never posted the matching send or "
                f"receive: see where {agree(roots, 'it is', 'they are')} with "
                f"{stack_commands(state, roots)}. In a pipeline "
                f"{agree(roots, 'this is the stage', 'these are the stages')} that stopped "
                "(compute that never ends, data loading, a stage that skipped a micro-batch "
                f"or ran a different schedule); {agree(roots, 'its', 'their')} neighbours only "
                f"wait for {them(roots)}.")
    if kind == "stall":
        summary += (", far longer than this group's operations take (stall after "
                    f"{after:.0f} s)")
    if kind == "stall":
        hint += (f" If {agree(roots, 'it does', 'they do')} not move, this becomes a hang "
                 f"after {s.hang_after:g} s.")
    return finding(
        kind, Severity.CRITICAL if kind == "hang" else Severity.WARNING, roots, group,
        summary + "." + _stopped(state, frame), hint,
        {"seq": rows[lead].get("p2p_n"), "op": rows[lead].get("p2p_op"), "source": "p2p",
         "waiting": sorted(waits), "since": since, "threshold_s": round(after, 3),
         "waits": {str(r): {"op": rows[r].get("p2p_op"), "peer": rows[r].get("p2p_peer"),
                            "tag": rows[r].get("p2p_tag"), "n": rows[r].get("p2p_n"),
                            "since": rows[r].get("p2p_since")} for r in sorted(waits)},
         "chain": chain, **_stop_evidence(frame)},
        since + after, key="p2p")


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


BARRIERS = ("barrier", "monitored_barrier")


def _stall_threshold(state: JobState, group: str, view: _View, rows: dict[int, dict],
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


def _stalls(state: JobState, frame: Frame, s: Settings) -> list[Finding]:
    """A collective some ranks have waited in, for a peer that has not entered it, far longer
    than the group's own history: named long before --hang-after. Becomes the `hang` at
    --hang-after (this rule then stays quiet), or resolves by itself when the peer arrives.

    Unlike `hang`, a collective every member entered is not a stall: nobody to name yet.
    """
    out = []
    now = frame.now
    for group in sorted(state.groups, key=str):
        if any(_stuck(state, group, frame, s, v) is not None for v in (PYTHON, FLIGHT)):
            continue  # the hang rule speaks for this group now
        rows = _rows(state, group, frame)
        for view in (PYTHON, FLIGHT):
            busy = {rank: row for rank, row in rows.items()
                    if view.busy(row) and now - row[view.since] < s.hang_after
                    and _running(state, rank, frame)}
            if not busy:
                continue
            seq = max(row[view.seq] for row in busy.values())
            waiting = {rank for rank, row in busy.items() if row[view.seq] == seq}
            behind = _behind(state, group, seq, waiting, view, rows)
            if not behind:
                continue
            since = min(rows[r][view.since] for r in waiting)
            op = view.op(rows[min(waiting)])
            threshold, basis = _stall_threshold(state, group, view, rows, s, op)
            if now - since < threshold:
                continue
            chain, roots = _follow(state, group, behind, frame, view)
            out.append(finding(
                "stall", Severity.WARNING, roots, group,
                f"{ranks_label(roots).capitalize()} {have(roots)} not reached {op} #{seq} on "
                f"{group_label(state, group)}: {ranks_label(waiting)} {have(waiting)} "
                f"waited {now - since:.0f} s for {them(roots)}"
                f"{_chain_text(state, chain)}, far longer than this group's collectives take "
                f"(stall after {threshold:.0f} s)." + _stopped(state, frame),
                f"{ranks_label(roots).capitalize()} {have(roots)} not reached that "
                f"collective yet. See what {agree(roots, 'it does', 'they do')}: "
                f"{stack_commands(state, roots)}. A checkpoint or an "
                "evaluation that runs on one rank only looks like this too; if it is not one, "
                f"this becomes a hang after {s.hang_after:g} s (--hang-after).",
                {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
                 "since": since, "threshold_s": round(threshold, 3), **basis,
                 "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                     (view.seq, "completed", "inflight_op")} for b in behind},
                 "chain": chain, **_stop_evidence(frame)},
                since + threshold, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
            break
        else:
            threshold, _ = _stall_threshold(state, group, PYTHON, rows, s)
            p2p = _p2p_finding(state, group, frame, s, threshold, "stall")
            if p2p is not None:
                out.append(p2p)
    return out


def _follow(state: JobState, group: str, behind: list[int], frame: Frame,
            view: _View = PYTHON, starts: list[int] = ()) -> tuple[list[dict], list[int]]:
    """Follow ranks that are behind to where they wait themselves, across groups and along
    point-to-point ops; the ranks at the ends that wait for nobody are the roots.

    ``starts``: ranks whose own point-to-point waits in ``group`` start the walk (a pipeline
    has no collective everybody waits in)."""
    chain: list[dict[str, Any]] = []
    roots: list[int] = []
    seen: set[tuple[str, int]] = set()
    todo: list[tuple[str, int]] = [(group, b) for b in behind]
    todo += [("", r) for r in starts]  # "": look at every group, the start's own included
    while todo:
        g, rank = todo.pop(0)
        if (g, rank) in seen or ("", rank) in seen:
            continue
        seen.add((g, rank))
        wait = _waits_elsewhere(state, rank, g, frame)
        if wait is None:
            roots.append(rank)
            continue
        og, seq, op, source, next_behind = wait
        chain.append({"rank": rank, "waits_in": og, "seq": seq, "op": op, "source": source,
                      "for": next_behind})
        if not next_behind:
            roots.append(rank)
        todo.extend(("" if source == "p2p" else og, b) for b in next_behind)
    return chain, sorted(set(roots))


def _waits_elsewhere(state: JobState, rank: int, group: str,
                     frame: Frame) -> tuple[str, int, str, str, list[int]] | None:
    """Where ``rank`` waits itself, other than inside ``group``'s collective it is behind in:
    a collective Python saw, else one only the Flight Recorder saw (a rank stuck in DDP's C++
    all-reduce), else a point-to-point op: (group, seq, op, source, ranks it waits for)."""
    progress = sorted((og, row) for (og, r), row in state.progress.items() if r == rank)
    if frame.stop is not None:
        progress = [(og, state.exit_rows.get((og, rank), row)) for og, row in progress]
    for v in (PYTHON, FLIGHT):
        for og, row in progress:
            if og != group and v.busy(row):
                rows = _rows(state, og, frame)
                return og, row[v.seq], v.op(row), v.source, _behind(
                    state, og, row[v.seq], {rank}, v, rows)
    for og, row in progress:
        if P2P.busy(row) and row.get("p2p_op"):
            peer = _p2p_peer_behind(rank, row, _rows(state, og, frame))
            if peer is not None:
                return og, row.get("p2p_n") or 0, _p2p_label(row), "p2p", [peer]
    return None


# -- a job stopped while it hangs -------------------------------------------------------------

def job_stop(state: JobState, s: Settings) -> Stop | None:
    """The end of a job that hung, if it ended so: ranks ended (killed by the launcher on
    Ctrl-C, a scheduler, a collective timeout, the NCCL watchdog) after a `hang` or `stall`
    verdict stood. That verdict, as it stood when the first of them ended, stays the job's;
    the departures are its last evidence, not findings of their own (see rules.crash)."""
    def build() -> Stop | None:
        # Stopped ranks were killed or failed: one that exited cleanly was waiting no more.
        stopped = [r for r in state.ranks()
                   if r.status in STOPPED and r.exit_at is not None]
        if not stopped:
            return None
        # The verdict must stand when the first rank ends: a hang that forms only after a
        # rank crashed or was killed is that death's consequence (rules.crash names it).
        at = min(r.exit_at for r in stopped)
        probe = Stop(at, sorted(r.rank for r in stopped), [])
        frame = Frame(at, probe)
        found = [f for f in _hangs(state, frame, s) + _stalls(state, frame, s)
                 if f["first_seen"] <= at]
        return probe._replace(findings=found) if found else None
    return state.memo(("job_stop",), build)


def hang(state: JobState, now: float, s: Settings) -> list[Finding]:
    return _with_stop(state, now, s, "hang", _hangs)


def stall(state: JobState, now: float, s: Settings) -> list[Finding]:
    return _with_stop(state, now, s, "stall", _stalls)


def _with_stop(state: JobState, now: float, s: Settings, kind: str, rule) -> list[Finding]:
    found = rule(state, Frame(now), s)
    stop = job_stop(state, s)
    if stop is None or stop.at > now:
        return found
    kept = [dict(f) for f in stop.findings if f["kind"] == kind]  # diagnose() stamps them
    ids = {f["id"] for f in kept}
    return kept + [f for f in found if f["id"] not in ids]
