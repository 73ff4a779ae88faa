"""Rule for a rank that left training early: it returned from its loop, destroyed its process
group or exited cleanly while its peers still issue collectives with it. Their waits and
errors that follow (gloo's "Connection closed by peer", NCCL's "remote process exited") are its
evidence, not findings of their own (see rules.crash).

A rank whose collective failed because a peer crashed leaves too: ``finally:
destroy_process_group()`` runs before its exception reaches the agent. So a leave is the
rank's own only when no rank of the job had crashed (``ends``) before it, and it is named only
once it settled: the rank exited cleanly, or was heard from, alive, after it left. Until then
it still excuses its peers' errors (rules.crash), so nobody is blamed while it settles: the
crash demo's rank 0, a victim, was named critical for the moment between its leave and its
error on a loaded machine."""

from __future__ import annotations

from typing import Any, NamedTuple

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import agree, group_label, process_label, ranks_label
from dashboard.diagnosis.errors import classify_error
from dashboard.state import JobState, RankState

# How far a peer's error may precede the departure it follows (clocks of two hosts, and an
# exit reported after the sockets it closed).
ERROR_SLACK_S = 2.0
# A rank that destroyed its group is known to have left by itself once a report of its own
# comes this long after the leave (its heartbeat, a second apart): a rank leaving on its way
# out of an exception reports the exception within milliseconds of the leave.
SETTLED_AFTER_S = 0.5


class Departure(NamedTuple):
    rank: int
    at: float  # when it left (destroyed its default group, or exited cleanly)
    how: str
    ahead: dict[str, list[int]]  # group -> peers that issued collectives it never joined
    victims: dict[int, dict[str, Any]]  # peers failed after it left -> their error
    settled: bool  # exited cleanly, or heard from alive after it left: named (rank_exited_early)


def is_init_failure(state: JobState, r: RankState) -> bool:
    return bool((state.init.get(r.session) or {}).get("error"))


# Ctrl-C in torchrun's terminal reaches every rank at once, and torchrun forwards another
# SIGINT: a rank can end (or its agent be cut off before its report, or a second SIGINT cut
# its excepthook short so that it reports a clean exit) a little before another rank's
# KeyboardInterrupt is stamped.
INTERRUPT_BEFORE_S = 1.0


def interrupted_at(state: JobState) -> float | None:
    """When the first rank of this attempt was interrupted (KeyboardInterrupt: Ctrl-C or a
    launcher's SIGINT), or ran its own handler of a signal jobs are stopped with (SIGTERM,
    SIGHUP, SLURM's SIGUSR1/SIGUSR2 notice: an ``error`` with ``where: signal``, a preemption
    handler that saves a checkpoint and exits 0), if one was: what ends after it, someone
    stopped."""
    return state.memo(("interrupted_at",), lambda: min(
        (e["t"] for e in state.errors if e.get("attempt", 0) == state.attempt
         and (e.get("error_type") == "KeyboardInterrupt" or e.get("where") == "signal")),
        default=None))


def ends(state: JobState) -> list[tuple[float, int]]:
    """(time, rank) of each rank that crashed with an error of its own (not one that waited
    on a peer) or was lost, earliest first: what can end other ranks. A crashed rank ended
    when it destroyed its group on its way out, if it did, else at its error."""
    def build() -> list[tuple[float, int]]:
        out = []
        for r in state.ranks():
            if r.status == RankStatus.LOST and r.exit_at is not None:
                out.append((r.exit_at, r.rank))
            elif r.status == RankStatus.FAILED and not is_init_failure(state, r):
                err = state.last_error(r.rank)
                cause = classify_error(err) if err else None
                if err and cause is not None and not cause.victim:
                    out.append((min(err["t"], r.left_at or err["t"]), r.rank))
        return sorted(out)
    return state.memo(("ends",), build)


def _left_at(r: RankState) -> tuple[float, str] | None:
    """When and how a rank left, if it did so by itself: a rank that destroyed its group on
    its way out of an exception (a ``finally:``) and then failed crashed (rules.crash)."""
    if r.status in (RankStatus.FAILED, RankStatus.LOST):
        return None
    if r.left_at is not None:
        return r.left_at, "destroyed its process group"
    if r.status == RankStatus.EXITED and r.exit_at is not None:
        return r.exit_at, "exited cleanly (status 0)"
    return None


def _ahead(mine: dict[str, Any], theirs: dict[str, Any], rank: int, peer: int) -> bool:
    """Whether a peer's progress row shows an op the departed rank never joined."""
    if theirs.get("entered", 0) > mine.get("entered", 0):
        return True
    if theirs.get("fr_enqueued", 0) > mine.get("fr_enqueued", 0):
        return True
    if theirs.get("p2p_peer") == rank and theirs.get("p2p_op") and theirs.get("p2p_n"):
        opposite = "recv" if theirs["p2p_op"] in ("send", "isend") else "send"
        key = f"{opposite}:{peer}:{theirs.get('p2p_tag') or 0}"
        return (mine.get("p2p_posted") or {}).get(key, 0) < theirs["p2p_n"]
    return False


def departures(state: JobState) -> list[Departure]:
    """Ranks that left while their peers went on: every peer still running issued at least
    one collective (or point-to-point op) with it that it never joined, or failed after it
    left with an error that names a lost peer. Built once per state version."""
    def build() -> list[Departure]:
        ranks = state.rank_index()
        crashed = ends(state)
        out = []
        for r in ranks.values():
            left = _left_at(r)
            if left is None:
                continue
            at, how = left
            if crashed and crashed[0][0] < at:
                continue  # it left after a crash: that crash's consequence (rules.crash)
            ahead: dict[str, list[int]] = {}
            for name, group in state.groups.items():
                members = group.get("ranks") or []
                if r.rank not in members:
                    continue
                mine = state.exit_rows.get((name, r.rank)) or \
                    state.progress.get((name, r.rank)) or {}
                late = []
                for peer in members:
                    p = ranks.get(peer)
                    if peer == r.rank or p is None or _left_at(p) is not None:
                        continue
                    theirs = state.exit_rows.get((name, peer)) or \
                        state.progress.get((name, peer)) or {}
                    if _ahead(mine, theirs, r.rank, peer):
                        late.append(peer)
                if late:
                    ahead[name] = late
            victims = {}
            for e in state.errors:
                if (e.get("rank") is not None and e["rank"] != r.rank
                        and e.get("attempt", 0) == state.attempt
                        and e["t"] >= at - ERROR_SLACK_S):
                    cause = classify_error(e)
                    if cause is not None and cause.victim:
                        victims.setdefault(e["rank"], e)
            if ahead or victims:
                settled = r.status == RankStatus.EXITED or r.last_seen >= at + SETTLED_AFTER_S
                out.append(Departure(r.rank, at, how, ahead, victims, settled))
        return _first_of_each(out)
    return state.memo(("departures",), build)


def _first_of_each(found: list[Departure]) -> list[Departure]:
    """The departures that are not another's consequence: a rank that left after a peer did,
    having waited for that peer or failed waiting for it, left because its collectives could
    no longer complete (``try: ... except Exception: continue`` around a step: its last
    collective raises, the loop ends, it destroys its group), not by a decision of its own."""
    out: list[Departure] = []
    for d in sorted(found, key=lambda d: d.at):
        if not any(d.rank in first.victims
                   or any(d.rank in late for late in first.ahead.values())
                   for first in out if first.at < d.at):
            out.append(d)
    return out


class Outvoted(NamedTuple):
    group: str
    left: list[int]  # most of the group's ranks: they left cleanly, all at the same collective
    went_on: list[int]  # the others: past that collective, in ones nobody else will call
    seq: int  # the last collective the ranks that left issued
    at: float  # when the last of them left


def outvoted(state: JobState, found: list[Departure]) -> list[Outvoted]:
    """Groups of a departure whose ranks mostly finished together (each left cleanly, all
    after the same collective) while the few others went on to a collective none of them
    issued: an ``atexit`` barrier on rank 0 alone, a last all_reduce in a branch only some
    ranks take. Those few are the odd ones, not the many that left (a rank that leaves early
    leaves alone, or with fewer than stay)."""
    ranks = state.rank_index()
    gone = {d.rank for d in found}
    out = []
    for g, group in state.groups.items():
        members = group.get("ranks") or []
        if not gone.intersection(members):
            continue
        marks = {}
        for m in members:
            row = state.exit_rows.get((g, m)) or state.progress.get((g, m)) or {}
            marks[m] = (row.get("entered", 0), row.get("fr_enqueued", 0))
        last = min(marks.values())
        left = [m for m in members if marks[m] == last and m in ranks
                and _left_at(ranks[m]) is not None]
        went_on = [m for m in members if marks[m][0] > last[0] or marks[m][1] > last[1]]
        if len(left) >= 2 and len(left) > len(went_on) >= 1 and \
                len(left) + len(went_on) == len(members):
            out.append(Outvoted(g, left, went_on, last[0],
                                max(_left_at(ranks[m])[0] for m in left)))
    return out


def rank_exited_early(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    stopped = interrupted_at(state)
    found = departures(state)
    odd = outvoted(state, found)
    excused = {r for o in odd for r in o.left}
    for o in odd:
        if all(d.settled for d in found if d.rank in o.left) and (
                stopped is None or o.at < stopped - INTERRUPT_BEFORE_S):
            out.append(_went_on(state, o, found))
    for d in found:
        if not d.settled or (stopped is not None and d.at >= stopped - INTERRUPT_BEFORE_S):
            continue  # (someone stopped the job: leaving then is no fault)
        if d.rank in excused:
            continue  # it left with most of its group: the ranks that went on are odd
        r = ranks.get(d.rank)
        peers = sorted({p for late in d.ahead.values() for p in late} | set(d.victims))
        groups = sorted(d.ahead, key=str)
        where = (f" on {', '.join(group_label(state, g) for g in groups[:3])}"
                 f"{' and more' if len(groups) > 3 else ''}" if groups else "")
        summary = (f"Rank {d.rank} left the job early{process_label(r)}: it {d.how} while "
                   f"{ranks_label(peers)} still issued collectives with it{where}")
        if d.victims:
            summary += (f"; {ranks_label(d.victims)} then failed waiting for it "
                        "(their errors are consequences)")
        out.append(finding(
            "rank_exited_early", Severity.CRITICAL, [d.rank], groups[0] if groups else None,
            summary + ".",
            "Every rank must leave the training loop at the same step. If one rank decides to "
            "stop (early stopping, a step or time budget, running out of data), share the "
            "decision first: all-reduce a stop flag every step and break on it everywhere. For "
            "uneven inputs with DDP wrap the loop in `torch.distributed.algorithms.Join` "
            "(`with Join([model]):`), or give every rank the same number of batches "
            "(`DistributedSampler(..., drop_last=True)` or `drop_last=True` in the "
            "DataLoader).",
            {"left_at": d.at, "how": d.how, "ahead": {g: d.ahead[g] for g in groups},
             "victims": {str(k): v.get("error") for k, v in sorted(d.victims.items())}},
            d.at, key=f"r{d.rank}"))
    return out


def _went_on(state: JobState, o: Outvoted, found: list[Departure]) -> Finding:
    """The `desync` of ranks that went on to a collective the rest of their group, which had
    finished and left, will never call."""
    ops = sorted({row["inflight_op"] for r in o.went_on
                  for row in [state.exit_rows.get((o.group, r))
                              or state.progress.get((o.group, r)) or {}]
                  if row.get("inflight_op")}
                 | {e["op"] for e in state.errors if e.get("rank") in o.went_on
                    and e.get("op") and e.get("group") == o.group and e.get("seq", 0) > o.seq})
    what = f" ({', '.join(ops)})" if ops else ""
    return finding(
        "desync", Severity.CRITICAL, o.went_on, o.group,
        f"{ranks_label(o.went_on).capitalize()} called collective #{o.seq + 1}{what} on "
        f"{group_label(state, o.group)} after {ranks_label(o.left)} had finished: they "
        f"completed #{o.seq} and left cleanly, so no rank will ever join "
        f"{agree(o.went_on, 'it', 'them')} there.",
        "A collective that only some ranks call waits forever, or fails when the others "
        "close their connections: look for one after the training loop that not every rank "
        "reaches (an `atexit` hook, a `finally:`, an `if rank == 0:` around a barrier or a "
        "last all_reduce, an extra step on a rank with more data). Call it on every rank, or "
        "not at all.",
        {"seq": o.seq + 1, "left": o.left, "went_on": o.went_on, "ops": ops,
         "errors": {str(r): e.get("error") for d in found if d.rank in o.left
                    for r, e in sorted(d.victims.items()) if r in o.went_on}},
        o.at, key=f"went_on:{o.group}")
