"""Where ranks wait, read from their progress rows: the shared ground of the `hang`, `stall`
and point-to-point rules, and of the chain of waits they follow to the rank at fault.

Where ranks wait is read three ways (``View``): the agent's wrappers (Python-issued
collectives), the Flight Recorder (collectives issued from C++: DDP, FSDP's reducer), and
point-to-point ops (``send``/``recv``/``isend``/``irecv``, as pipelines use them), which have
no group-wide sequence number: a rank's n-th receive from a peer with a tag is matched with
that peer's n-th send to it with that tag (``p2p_posted``, counted by the agent).

Its own room because every waiting rule reads the same rows the same way: this module judges
nothing, it only says who waits where and for whom (and how such a chain reads in a summary).
The rules import it; it imports no rule.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings
from dashboard.diagnosis.rules.idle import works
from dashboard.diagnosis.text import agree, group_label, ranks_label
from dashboard.state import JobState
from dashboard.state.fold import pair_differences


@dataclasses.dataclass(frozen=True)
class View:
    """One way of reading progress rows: the agent's wrappers, or the Flight Recorder."""

    seq: str  # the row's sequence-number field (absent reads 0: a default the wire omits)
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


PYTHON = View("entered", "inflight_since", "python", "completed")
FLIGHT = View("fr_enqueued", "fr_inflight_since", "flight_recorder", "fr_completed")
P2P = View("p2p_n", "p2p_since", "p2p")


class Stop(NamedTuple):
    """The end of a job that hung: its ranks stopped together after the verdict stood."""

    at: float  # when the first of them ended
    ranks: list[int]  # the ranks that ended from then on
    findings: list[Finding]  # the hang or stall verdict as it stood then
    # rank -> the title of its collective timeout, for ranks that gave up waiting (torch's own
    # timeout judged the wait: a hang however short; rules.hangs.job_stop)
    timed_out: dict[int, str] = {}


class Frame(NamedTuple):
    """The moment a rule judges, and whether it judges a job as it was when it was stopped."""

    now: float
    stop: Stop | None = None


def rows_at(state: JobState, group: str, frame: Frame) -> dict[int, dict[str, Any]]:
    rows = state.progress_of(group)
    if frame.stop is None:
        return rows
    # A rank that exited shows nothing in flight any more: read where it was then.
    return {rank: state.exit_rows.get((group, rank), row) for rank, row in rows.items()}


def is_running(state: JobState, rank: int, frame: Frame) -> bool:
    r = state.rank_index().get(rank)
    if r is None or r.status == RankStatus.RUNNING:
        return True
    return frame.stop is not None and r.rank in frame.stop.ranks


def ranks_behind(state: JobState, group: str, seq: int, waiting: set[int],
                 view: View = PYTHON, rows: dict[int, dict[str, Any]] | None = None) -> list[int]:
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


def p2p_peer_behind(rank: int, row: dict[str, Any],
                    rows: dict[int, dict[str, Any]]) -> int | None:
    """The peer a rank's oldest point-to-point op waits for, if that peer has not posted the
    matching op (its n-th opposite op with this rank and tag); else None."""
    peer, n, op = row.get("p2p_peer"), row.get("p2p_n"), row.get("p2p_op")
    if peer is None or peer < 0 or not n or not op:
        return None
    return peer if p2p_posted_by_peer(rank, row, rows) < n else None


def p2p_posted_by_peer(rank: int, row: dict[str, Any], rows: dict[int, dict[str, Any]]) -> int:
    """How many ops matching a rank's point-to-point op (the opposite direction, with this
    rank and tag) its peer has posted so far."""
    opposite = "recv" if row.get("p2p_op") in ("send", "isend") else "send"
    return ((rows.get(row.get("p2p_peer")) or {}).get("p2p_posted") or {}).get(
        f"{opposite}:{rank}:{row.get('p2p_tag') or 0}", 0)


def p2p_label(row: dict[str, Any]) -> str:
    op = row.get("p2p_op")
    way = "to" if op in ("send", "isend") else "from"
    return f"{op} {way} rank {row.get('p2p_peer')} (tag {row.get('p2p_tag') or 0}, #{row.get('p2p_n')})"


class Stuck(NamedTuple):
    """A collective some ranks have been inside past ``hang_after`` (``after``)."""

    seq: int  # its sequence number in the group
    waiting: set[int]  # the ranks inside it
    rows: dict[int, dict[str, Any]]  # the group's progress rows, by rank
    after: float  # the seconds it took to be a hang: hang_after, or WORKING_HANG_FACTOR x it
    behind: list[int]  # the members not inside it (ranks_behind)


# A collective whose every awaited rank works outside it (a quarter of a core or 1 MB/s of
# I/O since its collectives last moved: rules.idle.works) is a hang only after this many
# times --hang-after (a stall, warning, meanwhile): rank 0 evaluating or saving alone for
# minutes while the others wait at a barrier is what the code asks for (gloo's timeout is
# 30 minutes, NCCL's 10); a loop that never ends looks the same, and its stall names it.
WORKING_HANG_FACTOR = 5.0


def stuck_collective(state: JobState, group: str, frame: Frame, s: Settings,
                     view: View) -> Stuck | None:
    """The collective of ``group`` stuck past hang_after (WORKING_HANG_FACTOR x that where
    every rank it waits for works), or None."""
    rows = rows_at(state, group, frame)
    stuck = {rank: row for rank, row in rows.items()
             if view.busy(row) and frame.now - row[view.since] >= s.hang_after
             and is_running(state, rank, frame)}
    if not stuck:
        return None
    seq = max(row.get(view.seq, 0) for row in stuck.values())
    waiting = {rank for rank, row in stuck.items() if row.get(view.seq, 0) == seq}
    after = s.hang_after
    behind = ranks_behind(state, group, seq, waiting, view, rows)
    if behind and all(works(state, rank) for rank in behind):
        after = WORKING_HANG_FACTOR * s.hang_after
        if frame.now - min(rows[r][view.since] for r in waiting) < after:
            return None  # (the stall's, meanwhile: rules.stalls)
    return Stuck(seq, waiting, rows, after, behind)


def follow_waits(state: JobState, group: str, behind: list[int], frame: Frame,
                 view: View = PYTHON, starts: list[int] = ()) -> tuple[list[dict], list[int]]:
    """Follow ranks that are behind to where they wait themselves, across groups and along
    point-to-point ops; the ranks at the ends that wait for nobody are the roots (none where
    the waits close a cycle: the callers name the ranks the walk started from).

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
                rows = rows_at(state, og, frame)
                return og, row[v.seq], v.op(row), v.source, ranks_behind(
                    state, og, row[v.seq], {rank}, v, rows)
    for og, row in progress:
        if P2P.busy(row) and row.get("p2p_op"):
            peer = p2p_peer_behind(rank, row, rows_at(state, og, frame))
            if peer is not None:
                return og, row.get("p2p_n") or 0, p2p_label(row), "p2p", [peer]
    return None


# -- how waits read in a finding --------------------------------------------------------------

def stopped_text(state: JobState, frame: Frame) -> str:
    stop = frame.stop
    if stop is None:
        return ""
    gave_up = ""
    if stop.timed_out:
        rank, title = min(stop.timed_out.items())
        gave_up = f" Rank {rank}'s own timeout ended the wait ({title})."
    at = time.strftime("%H:%M:%S UTC", time.gmtime(stop.at))
    return (f"{gave_up} The job was then stopped ({ranks_label(stop.ranks)} ended from "
            f"{at} on): this stays its verdict.")


def stop_evidence(frame: Frame) -> dict[str, Any]:
    if frame.stop is None:
        return {}
    stopped: dict[str, Any] = {"at": frame.stop.at, "ranks": frame.stop.ranks}
    if frame.stop.timed_out:
        stopped["timed_out"] = {str(r): t for r, t in sorted(frame.stop.timed_out.items())}
    return {"stopped": stopped}


def blamed(roots: list[int], behind: list[int], waiting: set[int]) -> list[int] | None:
    """Whom a collective's wait blames: the roots follow_waits found; where the waits close a
    cycle (it found none), the ranks the collective waits for, or None where more ranks are
    behind than wait in it (the odd ones are those waiting here: the cycle's other group
    names them)."""
    if roots:
        return roots
    return None if len(behind) > len(waiting) else sorted(behind)


# A pair of groups whose collective counts differ, across every rank all along, by no more
# than this is run in step (a few collectives of each a step); wider, it tells nothing.
MAX_PAIR_SPREAD = 16


def out_of_step(state: JobState, ranks: list[int]) -> list[int]:
    """The ranks among ``ranks`` whose counts of collectives per pair of their groups lie
    outside the range every other rank of the job kept (``JobState.count_spread``): ranks
    that run one program keep those differences alike (a step's tensor-parallel all-reduce,
    then its data-parallel one), and a rank that called a collective on the wrong group
    left them. None unless some, not all, of ``ranks`` did."""
    spread, wanted = state.count_spread, set(ranks)
    rows: dict[int, list[dict[str, Any]]] = {r: [] for r in ranks}
    for (_, rank), row in state.progress.items():
        if rank in wanted:
            rows[rank].append(row)
    odd = []
    for rank in ranks:
        diffs = pair_differences(rows[rank])
        others = [kept for r, kept in spread.items() if r != rank and len(kept) == 2 * len(diffs)]
        if not diffs or len(others) < 2:  # (against one rank, either could be the odd one)
            continue
        for i, d in enumerate(diffs):
            lo, hi = min(kept[2 * i] for kept in others), max(kept[2 * i + 1] for kept in others)
            # (a pair whose difference grows as the job runs, a group used once an epoch
            # beside one used every step, tells nothing)
            if hi - lo <= MAX_PAIR_SPREAD and not lo <= d <= hi:
                odd.append(rank)
                break
    return odd if 0 < len(odd) < len(ranks) else []


def one_cycle(state: JobState, found: list[Finding]) -> list[Finding]:
    """Findings of groups whose waits close one cycle (each names the ranks its collective
    waits for, as no root ends the walk): where the cycle's ranks show which of them is out of
    step with the others (``out_of_step``: a collective called on the wrong group), or most
    of them wait in one collective and the rest elsewhere (``_outvoted``), only the findings
    that name those stay, saying so; else all of them."""
    cycle = [f for f in found if f["evidence"].get("cycle")]
    if len(cycle) < 2:
        return found
    ranks = sorted({r for f in cycle for r in f["ranks"]}
                   | {r for f in cycle for r in f["evidence"].get("waiting", ())})
    def naming(odd: list[int]) -> list[Finding]:  # the cycle's findings that name only odd
        return [f for f in cycle if odd and set(f["ranks"]) <= set(odd)]

    odd, why = out_of_step(state, ranks), "out_of_step"
    kept = naming(odd)
    if kept:
        text = (f" {ranks_label(odd).capitalize()} {agree(odd, 'is', 'are')} out of step: "
                f"{agree(odd, 'its', 'their')} counts of collectives per group no longer "
                "match what every other rank kept all along (one of them called a collective "
                "on another group than its peers did: a wrong mesh dimension or process group "
                "in a branch), and the others wait in the cycle it left.")
    else:
        odd, why = _outvoted(cycle, ranks), "outvoted"
        kept = naming(odd)
        if not kept:
            return found
        text = (f" Most of the cycle's ranks wait in one collective; {ranks_label(odd)} "
                f"{agree(odd, 'waits', 'wait')} in another group's instead (a collective "
                "called on another group than its peers did: a wrong process group or mesh "
                "dimension in a branch only it took).")
    for f in kept:
        f["hint"] += text
        f["evidence"][why] = odd
    return [f for f in found if f not in cycle] + kept


def _outvoted(cycle: list[Finding], ranks: list[int]) -> list[int]:
    """The ranks of a cycle outside the collective most of its ranks wait in, if one holds
    more than half of them: the ranks that went elsewhere (a barrier on a subgroup where
    the others call the job's)."""
    for f in cycle:
        waiting = set(f["evidence"].get("waiting", ()))
        if 2 * len(waiting) > len(ranks):
            return sorted(set(ranks) - waiting)
    return []


def cycle_text(chain: list[dict[str, Any]], roots: list[int]) -> str:
    """' The waits close a cycle: ...' where a culprit itself waits for a rank that waits for
    it (follow_waits found no root, and the caller named the ranks it started from); else ''."""
    hop = next((h for h in chain if h["rank"] in roots and h.get("for")), None)
    if hop is None:
        return ""
    return (f" The waits close a cycle: rank {hop['rank']} waits in {hop['op']} for "
            f"{ranks_label(hop['for'])}, who {agree(hop['for'], 'waits', 'wait')} for it in "
            "turn, so none can finish. A "
            "point-to-point op that only some ranks reach (a `send` or `recv` inside an `if "
            "rank == ...` branch) met a collective, or ranks took two collectives or groups in "
            "different orders: make every rank reach the same ops in the same order.")


def chain_text(state: JobState, chain: list[dict[str, Any]]) -> str:
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
