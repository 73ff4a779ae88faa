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
from dashboard.diagnosis.text import group_label, process_label, ranks_label
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
    launcher's SIGINT), if one was: what ends after it, someone stopped."""
    return state.memo(("interrupted_at",), lambda: min(
        (e["t"] for e in state.errors if e.get("attempt", 0) == state.attempt
         and e.get("error_type") == "KeyboardInterrupt"), default=None))


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


def rank_exited_early(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    stopped = interrupted_at(state)
    for d in departures(state):
        if not d.settled or (stopped is not None and d.at >= stopped - INTERRUPT_BEFORE_S):
            continue  # (someone stopped the job: leaving then is no fault)
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
