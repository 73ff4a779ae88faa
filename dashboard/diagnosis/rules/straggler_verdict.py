"""Who the straggler of one group's window is, if anyone: the window grown until it holds
enough collectives, the ranks' pooled waits compared (nine in ten late, steady or spread),
and the sparse case of groups that run several collectives a step (FSDP, DDP's buckets).

Its own room because this is where the thresholds of the straggler rule act (measured with
bench/detect.py; see rules.stragglers.straggler): rules.stragglers asks it per window, and
rules.straggler_chains asks it of the other groups a straggler is itself late in.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from dashboard.diagnosis.core import Settings
from dashboard.diagnosis.rules.windows import (Pools, aligned, count_above,
                                               intervals_holding, mean_us, share_above,
                                               typical_of_others)
from dashboard.state import quantile_us


class StragglerVerdict(NamedTuple):
    """The straggler of one group's window, and what it was judged on."""

    rank: int
    medians: dict[int, float]  # median wait per rank, us
    typical: float  # the others' typical wait at their straggler_late_share least-waited, us
    intervals: int  # summaries (PGDASH_STATS_INTERVAL_S each) the window spans
    recent: dict[int, list[tuple]]  # those summaries, per rank
    share: float  # at this share of their collectives the others waited ``typical`` or more


def straggler_in(windows: dict[int, list[tuple]], back: int,
                 s: Settings) -> StragglerVerdict | None:
    """The straggler of the window ending ``back`` intervals ago, or None.

    Returns ``(rank, median wait per rank, the others' typical wait at their
    ``straggler_late_share`` least-waited collectives, intervals, points)``. The window is
    the newest intervals, grown back until every rank has ``straggler_min_calls``
    collectives in it, and judged on the histograms of all its collectives pooled: the
    straggler waits least (median), and the others waited clearly longer (ratio and floor)
    at ``straggler_late_share`` (nine in ten) of their collectives. A straggler is late at
    nearly every collective; one pause (a checkpoint, a CPU stall of a crowded host) is one
    long wait among many short ones, and random jitter makes each rank wait at about half of
    them: neither reaches nine in ten. Pooled rather than interval by interval, the window
    can be as short as one summary interval, so that a straggler is named about one interval
    after its first full interval of late collectives.

    A rank named whose newest summary is older than the others' (``straggler_align_s``) is
    judged again on the time all of them have reported (rules.windows.aligned): judged on an
    older stretch than the others, a victim of a straggler that had just slowed down, whose
    first late collectives were not in yet, waited least and was named. Only then, as
    aligning every window holds each verdict back until the slowest rank's summary is in.
    """
    windows = {rank: pts[:len(pts) - back] for rank, pts in windows.items()}
    verdict = _straggler_of(windows, s)
    if verdict is not None and _behind(windows, verdict.rank, s.straggler_align_s):
        verdict = _straggler_of(aligned(windows, s.straggler_align_s), s)
    return verdict


def _behind(windows: dict[int, list[tuple]], rank: int, slack_s: float) -> bool:
    """Whether ``rank``'s newest summary ends more than ``slack_s`` before another's."""
    return windows[rank][-1][0] + slack_s < max(pts[-1][0] for pts in windows.values())


def _straggler_of(windows: dict[int, list[tuple]], s: Settings) -> StragglerVerdict | None:
    if not all(windows.values()):
        return None
    depth = min(len(p) for p in windows.values())
    pools = Pools(windows)
    # A window of straggler_min_calls where the others' waits are also steady (a rank slower
    # by about the same time at every step); else twice as many collectives (waits spread).
    for calls, steady in ((s.straggler_min_calls, True), (2 * s.straggler_min_calls, False)):
        n = intervals_holding(windows, depth, calls, s)
        if n is None:
            return None
        pooled = pools.upto(n)
        medians = {rank: quantile_us(h, 0.5, 0.0) for rank, h in pooled.items()}
        slow = min(medians, key=medians.get)
        lows = {rank: quantile_us(h, 1.0 - s.straggler_late_share, 0.0)
                for rank, h in pooled.items() if rank != slow}
        typical = typical_of_others(lows, slow)
        if typical < s.straggler_ratio * medians[slow] or \
                typical - medians[slow] < s.straggler_min_wait_us:
            continue
        if steady:
            highs = {rank: quantile_us(h, s.straggler_late_share, 0.0)
                     for rank, h in pooled.items() if rank != slow}
            if typical < s.straggler_steady * typical_of_others(highs, slow):
                continue
        recent = {rank: pts[-n:] for rank, pts in windows.items()}
        return StragglerVerdict(slow, medians, typical, n, recent, s.straggler_late_share)
    return _sparse_straggler(windows, depth, s, pools)


def _sparse_straggler(windows: dict[int, list[tuple]], depth: int, s: Settings,
                      pools: Pools) -> StragglerVerdict | None:
    """A straggler of a group that runs several collectives a step (FSDP's all-gathers and
    reduce-scatters per layer, DDP's buckets): the others wait for it once a step, at the
    step's first collective, so at one in k of theirs, never nine in ten.

    On a window of ``straggler_sparse_calls`` collectives per rank (pooled histograms): the
    rank with the least mean wait is the candidate; a wait is long above ``straggler_ratio``
    times its p90 (and ``straggler_min_wait_us`` more); the others must have long waits at
    ``straggler_sparse_share`` or more of their collectives (a pause of one rank, however long,
    is one long wait among those; random jitter makes the candidate's own p90 long too), and
    the candidate at a quarter of that share at most. Few long waits are weak evidence: a
    crowded host's scheduler makes one rank of a pair late a few more times than the other.
    So the counts must also pass a sign test (``straggler_sparse_p``); where they do not,
    the window doubles, twice, while the summaries kept reach."""
    calls = s.straggler_sparse_calls
    for _ in range(3):
        n = intervals_holding(windows, depth, calls, s)
        if n is None:
            return None
        verdict = _sparse_verdict({rank: pts[-n:] for rank, pts in windows.items()},
                                  pools.upto(n), n, s)
        if verdict is not False:
            return verdict
        calls *= 2
    return None


def _sparse_verdict(recent: dict[int, list[tuple]], pooled: dict[int, dict[int, int]], n: int,
                    s: Settings) -> StragglerVerdict | None | bool:
    """The sparse straggler of one window (``pooled``: its histograms); None if there is
    none, False if the counts are too few to tell (a longer window may)."""
    means = {rank: mean_us(pts) for rank, pts in recent.items()}
    slow = min(means, key=means.get)
    p90 = quantile_us(pooled[slow], 0.9, 0.0)
    long_us = max(s.straggler_ratio * p90, p90 + s.straggler_min_wait_us)
    shares = {rank: share_above(h, long_us) for rank, h in pooled.items() if rank != slow}
    share = typical_of_others(shares, slow)
    own = share_above(pooled[slow], long_us)
    if share < s.straggler_sparse_share or own > share / 4:
        return None
    theirs = typical_of_others({rank: count_above(h, long_us) for rank, h in pooled.items()
                                if rank != slow}, slow)
    mine = count_above(pooled[slow], long_us)
    if sign_test(mine, int(theirs) + mine) > s.straggler_sparse_p:
        return False
    typical = typical_of_others({rank: quantile_us(h, 1.0 - share, 0.0)
                                 for rank, h in pooled.items() if rank != slow}, slow)
    medians = {rank: quantile_us(h, 0.5, 0.0) for rank, h in pooled.items()}
    return StragglerVerdict(slow, medians, typical, n, recent, round(share, 2))


def sign_test(fewer: int, total: int) -> float:
    """The chance of ``fewer`` or fewer of ``total`` coin flips landing one way: how likely
    the candidate's long waits are this few against the others' if nobody were late more.
    Exact up to 400 flips, the normal approximation above (a busy group's long window)."""
    if total > 400:
        z = (fewer + 0.5 - total / 2) / math.sqrt(total / 4)
        return 0.5 * math.erfc(-z / math.sqrt(2))
    return sum(math.comb(total, k) for k in range(fewer + 1)) / 2 ** total
