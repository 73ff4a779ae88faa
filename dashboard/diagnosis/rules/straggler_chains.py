"""Whom a straggler itself waits for: a rank late in one group only because it waited for
another rank elsewhere is a victim, and the chain of such waits leads to the rank to blame.

Two kinds of hop, both followed group to group (``_walk``): a group where the rank is one of
those kept waiting by another straggler (``late_chain``, from the wrappers' windows), and a
group of C++ collectives (DDP's gradient all-reduce) where the Flight Recorder's samples find
it in flight much more often than a peer (``hidden_chain``). Its own room because following
waits is a separate question from naming the straggler of one window (rules.straggler_verdict).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from dashboard.diagnosis.core import Settings
from dashboard.diagnosis.rules.straggler_verdict import StragglerVerdict, straggler_in
from dashboard.diagnosis.rules.windows import Windows, typical_but, windows_of
from dashboard.state import JobState


MAX_HOPS = 4  # a chain of waits followed this far at most (groups rarely nest deeper)
LATENESS_SAMPLE = 32  # others whose waits say how late a straggler made them (_lateness)
_UNKNOWN = object()  # a hop that cannot be told yet


def _walk(group: str, rank: int, next_hop: Callable[[int, set[str]], Any]) -> list | None:
    """Follow waits from ``rank`` in ``group``, group to group: ``next_hop(rank, seen
    groups)`` gives the hop (``{"waits", "rank", "group", ...}``) that rank waits on, None
    when it waits for nobody, or _UNKNOWN while that cannot be told (then None here)."""
    chain: list[dict[str, Any]] = []
    seen = {group}
    while len(chain) < MAX_HOPS:
        hop = next_hop(rank, seen)
        if hop is _UNKNOWN:
            return None
        if hop is None:
            break
        chain.append(hop)
        seen.add(hop["group"])
        rank = hop["rank"]
    return chain


def late_chain(state: JobState, group: str, slow: int, verdicts: dict[str, StragglerVerdict],
               now: float, s: Settings) -> list[dict[str, Any]] | None:
    """Hops from ``slow``, the straggler of ``group``, through groups where it is itself one
    of the ranks kept waiting by another straggler (``[{"waits", "rank", "group",
    "source"}]``; empty when it waits for nobody; None while a group where it waits long
    cannot name whom it waits for yet: DDP's all-reduce, seen by the wrappers through the
    agent's comm hook, is such a group for a rank late in a tensor-parallel group). Where
    that group names nobody yet, the long waits of the same window may (_waited_for)."""
    late = _lateness(verdicts[group])

    def next_hop(rank: int, seen: set[str]) -> Any:
        for other in sorted(state.groups, key=str):
            members = (state.groups.get(other) or {}).get("ranks") or ()
            if other in seen or rank not in members:
                continue
            verdict = verdicts.get(other)
            windows = windows_of(state, other, now)
            if verdict is None:  # not conclusive there yet: what its newest window says
                verdict = straggler_in(windows, 0, s) if len(windows) >= 2 else None
            if verdict is not None and verdict.rank != rank:
                means, typical = verdict.medians, verdict.typical
                if rank in means and means[rank] >= typical * 0.5:  # it is one who waits there
                    return {"waits": rank, "rank": verdict.rank, "group": other,
                            "source": "python", "wait_us": round(means[rank], 1)}
            waited = _waited_for(windows, rank, late)
            if waited is not None:
                return {"waits": rank, "rank": waited[0], "group": other, "source": "python",
                        "long_waits": waited[1]}
            if verdict is None and windows and _waits_long(windows, rank, s):
                return _UNKNOWN
        return None

    return _walk(group, slow, next_hop)


def _lateness(verdict: StragglerVerdict) -> tuple[float, float, float]:
    """How late a group's straggler made the others: ``(since, wait, count)``, the start of
    its window, the others' typical long wait (the median of their waits at the verdict's
    late share) and how many of their collectives waited half that or more. Typical over
    LATENESS_SAMPLE of the others at most, evenly spread (a median: at 1,024 ranks, pooling
    every other rank's window made a judgement with a straggler a quarter slower)."""
    recent = verdict.recent
    others = sorted((r, i) for i, r in enumerate(recent.ranks) if r != verdict.rank)
    others = others[::max(1, len(others) // LATENESS_SAMPLE)]
    sample = recent.cut(recent.cols.rows([i for _, i in others]))
    pooled = sample.pooled_cells(sample.held())
    wait = float(typical_but(pooled.quantiles(1.0 - verdict.share / 2, 0.0)[None, :], None)[0])
    count = float(typical_but(pooled.counts_above(wait / 2)[None, :], None)[0])
    return recent.oldest_end(), wait, count


def _waited_for(windows: Windows, rank: int, late: tuple[float, float, float]
                ) -> tuple[int, float] | None:
    """The peer ``rank`` waited for in a group, judged by the collectives it was late at
    (``late``: see _lateness): in the same time, it waited half as long as the others
    waited for it, at a third as many collectives or more (and three at least), and the
    peer that waited least (mean) waited so at a quarter as many at most. ``(peer, how many)``,
    or None.

    A verdict of that group does not tell this while the slowness is young: a rank late at
    every step from a moment on is first seen late at a share of a window's collectives
    (the sparse case), while the medians of those who wait for it are still short."""
    since, wait, count = late
    if len(windows) < 2 or rank not in windows:
        return None
    recent = windows.since(since)
    long_waits = windows.pooled_cells(recent).counts_above(wait / 2).astype(int).tolist()
    me = windows.ranks.index(rank)
    mine = long_waits[me]
    if mine < max(3, count / 3):
        return None
    # The peer it waited for is the one that waited least (by mean: a world group is large)
    means = windows.means(cells=recent)
    peer = min((i for i in range(len(means)) if i != me), key=means.__getitem__)
    return (windows.ranks[peer], mine) if long_waits[peer] <= mine / 4 else None


def _waits_long(windows: Windows, rank: int, s: Settings, intervals: int = 4) -> bool:
    """Whether ``rank`` waits clearly longer than a peer in a group's newest summaries."""
    if rank not in windows:
        return False
    medians = windows.pooled(intervals).quantiles(0.5, 0.0).tolist()
    held = (windows.cols.sizes > 0).tolist()
    me = windows.ranks.index(rank)
    least = min((v for i, v in enumerate(medians) if held[i] and i != me), default=None)
    mine = medians[me] if held[me] else None
    return (least is not None and mine is not None and mine >= s.straggler_ratio * least
            and mine - least >= s.straggler_min_wait_us)


def hidden_chain(state: JobState, rank: int, group: str, now: float, s: Settings,
                 checked: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Who ``rank``, the straggler of ``group``, itself waits for inside C++ collectives.

    A rank that arrives last in one group may only be late because it sat in DDP's gradient
    all-reduce (C++, unseen by the wrappers) waiting for a peer there; the Flight Recorder's
    samples then find it in flight there much more often than that peer. Followed from group
    to group. Returns the hops (``[{"waits", "rank", "group", "busy_share"}]``; empty when
    ``rank`` waits for nobody), or None while the samples cannot tell yet. Appends to
    ``checked`` each group where the last rank of the chain was found not to wait.
    """
    def next_hop(rank: int, seen: set[str]) -> Any:
        for other in sorted(state.groups, key=str):
            if other in seen or rank not in state.groups[other]["ranks"] or \
                    not state.flight_only(other):
                continue
            # Agents that sample send the tally even when it is 0; older ones never do.
            sampled = any("fr_samples" in row for row in state.progress_of(other).values())
            verdict = _waits_for(state.fr_tallies_of(other), rank, now, s, sampled)
            if verdict is None:
                return _UNKNOWN
            peer, shares = verdict
            if peer is not None:
                return {"waits": rank, "rank": peer, "group": other, "busy_share": shares}
            if shares:
                checked.append({"rank": rank, "group": other, "busy_share": shares})
        return None

    return _walk(group, rank, next_hop)


def _waits_for(tallies: dict[int, Any], rank: int, now: float, s: Settings, sampled: bool):
    """Whether ``rank`` waits for a peer inside a group's C++ collectives, from the latest
    heartbeats' Flight Recorder tallies: ``(peer, shares)`` if it is found in flight more
    often than the peer found least, ``(None, shares)`` if not (shares {}: agents that take
    no samples, ``sampled`` False), None while the samples are too few.

    The window grows from the newest heartbeat, back at most ``hidden_horizon`` seconds. Once
    it holds ``hidden_min_samples`` per rank, a difference clear either way (two standard
    errors, counted with one sample more in and out of flight, so that no samples in flight
    is no certainty) decides; at the horizon, the shares as they are decide. Before the
    tallies reach back that far, an unclear difference waits."""
    if rank not in tallies or len(tallies) < 2:
        return None if sampled else (None, {})
    recent = {m: [x for x in reversed(t) if now - s.hidden_horizon <= x[0] <= now]
              for m, t in tallies.items()}
    depth = min(len(t) for t in recent.values())
    # Whether the window can reach the horizon (or all that is kept): else a young group
    # that cannot tell yet must wait, not guess.
    spans = all(len(recent[m]) < len(t) or len(t) == t.maxlen for m, t in tallies.items())
    sums = {m: [0, 0] for m in tallies}
    for k in range(depth):
        for m, t in recent.items():
            sums[m][0] += t[k][1]
            sums[m][1] += t[k][2]
        if min(n for _, n in sums.values()) < s.hidden_min_samples:
            continue
        share = {m: b / n for m, (b, n) in sums.items()}
        peer = min((m for m in share if m != rank), key=share.get)
        shown = {str(m): round(v, 2) for m, v in sorted(share.items())}
        if share[rank] < share[peer]:
            return None, shown  # it waits least here: nobody it waits for
        (b1, n1), (b2, n2) = sums[rank], sums[peer]
        pooled = (b1 + b2 + 1) / (n1 + n2 + 2)
        error = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))  # of the difference
        gap = share[rank] - share[peer]
        waits = gap >= s.hidden_wait_gap and b1 >= s.hidden_min_busy
        if (spans and k == depth - 1) or (waits and gap >= 2 * error) or \
                gap + 2 * error < s.hidden_wait_gap:
            return (peer if waits else None), shown
    return None
