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

import numpy as np

from dashboard.diagnosis.core import Settings
from dashboard.diagnosis.rules.windows import Windows, aligned, intervals_holding, typical_but


class StragglerVerdict(NamedTuple):
    """The straggler of one group's window, and what it was judged on."""

    rank: int  # the rank that waits least
    medians: dict[int, float]  # median wait per rank, us
    typical: float  # the others' typical wait at their straggler_late_share least-waited, us
    intervals: int  # summaries (PGDASH_STATS_INTERVAL_S each) the window spans
    recent: Windows  # those summaries (rules.windows)
    share: float  # at this share of their collectives the others waited ``typical`` or more
    ranks: frozenset = frozenset()  # ``rank`` and the ranks late with it (straggler_together)


def straggler_in(windows: Windows, back: int, s: Settings) -> StragglerVerdict | None:
    """The straggler of one group's window ending ``back`` intervals ago, or None (see
    stragglers_in)."""
    return stragglers_in(windows, back, s)[0]


def stragglers_in(windows: Windows, back: int, s: Settings) -> list[StragglerVerdict | None]:
    """Per group of ``windows``, the straggler of the window ending ``back`` intervals ago,
    or None.

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
    windows = windows.older(back)
    verdicts = _stragglers_of(windows, s)
    behind = [g for g, v in enumerate(verdicts)
              if v is not None and _behind(windows.group(g), v.rank, s.straggler_align_s)]
    for g in behind:
        one = windows.group(g)
        verdicts[g] = _stragglers_of(aligned(one, s.straggler_align_s), s)[0]
    return verdicts


def cost_share(v: StragglerVerdict) -> float:
    """The share of the window's time the other ranks spent waiting inside collectives beyond
    what the stragglers did (their mean, against the most any straggler waited): what the
    slowness costs the job. Infinite where a rank's window is one summary (no span to tell)."""
    c = v.recent.cols
    held = v.recent.held()
    waited = np.where(held, c.sums, 0.0).sum(axis=1)
    sizes = held.sum(axis=1)
    if sizes.min() < 2:
        return math.inf
    first = np.where(held, c.ends, np.inf).min(axis=1)
    last = c.ends[:, -1]
    span_us = float(np.median((last - first) * sizes / (sizes - 1))) * 1e6
    late = np.array([r in v.ranks for r in v.recent.ranks])
    if late.all() or span_us <= 0:
        return math.inf
    return max(0.0, float(waited[~late].mean() - waited[late].max())) / span_us


def _behind(windows: Windows, rank: int, slack_s: float) -> bool:
    """Whether ``rank``'s newest summary ends more than ``slack_s`` before another's."""
    newest = windows.newest_ends()
    return newest[windows.ranks.index(rank)] + slack_s < newest.max()


def _stragglers_of(windows: Windows, s: Settings) -> list[StragglerVerdict | None]:
    verdicts: list[StragglerVerdict | None] = [None] * windows.groups
    depths = windows.depths()
    open_ = depths > 0  # groups not judged yet
    rows = np.arange(windows.groups)
    # A window of straggler_min_calls where the others' waits are also steady (a rank slower
    # by about the same time at every step); else twice as many collectives (waits spread).
    for calls, steady in ((s.straggler_min_calls, True), (2 * s.straggler_min_calls, False)):
        n = np.where(open_, intervals_holding(windows, depths, calls, s), 0)
        open_ &= n > 0  # too few collectives: nobody
        if not open_.any():
            return verdicts
        pooled = windows.pooled(n)
        medians = windows.per_group(pooled.quantiles(0.5, 0.0))
        slow = medians.argmin(axis=1)
        own = medians[rows, slow]
        typical = typical_but(windows.per_group(
            pooled.quantiles(1.0 - s.straggler_late_share, 0.0)), slow)
        found = open_ & ~((typical < s.straggler_ratio * own) |
                          (typical - own < s.straggler_min_wait_us))
        if steady and found.any():
            highs = windows.per_group(pooled.quantiles(s.straggler_late_share, 0.0))
            found &= ~(typical < s.straggler_steady * typical_but(highs, slow))
        for g in np.flatnonzero(found).tolist():
            verdicts[g] = _verdict(windows, g, int(slow[g]), medians[g], float(typical[g]),
                                   int(n[g]), s.straggler_late_share, s.straggler_together)
        open_ &= ~found
    if open_.any():
        _sparse_stragglers(windows, depths, open_, verdicts, s)
    return verdicts


def _verdict(windows: Windows, g: int, slow: int, medians: np.ndarray, typical: float, n: int,
             share: float, together: float = 0.0) -> StragglerVerdict:
    """The verdict naming ``slow``, and the ranks whose median wait is within ``together``
    of the way from its median to ``typical`` (0: none), if they are half the ranks at most."""
    one = windows.group(g)
    late = [slow]
    if together:
        near = medians[slow] + together * (typical - medians[slow])
        late = np.flatnonzero(medians <= near).tolist()
        if 2 * len(late) > len(one.ranks):
            late = [slow]
    return StragglerVerdict(one.ranks[slow], dict(zip(one.ranks, medians.tolist())), typical, n,
                            one.newest(n), share, frozenset(one.ranks[i] for i in late))


def _sparse_stragglers(windows: Windows, depths: np.ndarray, open_: np.ndarray,
                       verdicts: list[StragglerVerdict | None], s: Settings) -> None:
    """The straggler of each ``open_`` group that runs several collectives a step (FSDP's
    all-gathers and reduce-scatters per layer, DDP's buckets): the others wait for it once a
    step, at the step's first collective, so at one in k of theirs, never nine in ten.

    On a window of ``straggler_sparse_calls`` collectives per rank (pooled histograms): the
    rank with the least mean wait is the candidate; a wait is long above ``straggler_ratio``
    times its p90 (and ``straggler_min_wait_us`` more); the others must have long waits at
    ``straggler_sparse_share`` or more of their collectives (a pause of one rank, however long,
    is one long wait among those; random jitter makes the candidate's own p90 long too), and
    the candidate at a quarter of that share at most. Few long waits are weak evidence: a
    crowded host's scheduler makes one rank of a pair late a few more times than the other.
    So the counts must also pass a sign test (``straggler_sparse_p``); where they do not,
    the window doubles, twice, while the summaries kept reach."""
    calls = np.full(windows.groups, s.straggler_sparse_calls)
    rows = np.arange(windows.groups)
    for _ in range(3):
        n = np.where(open_, intervals_holding(windows, depths, calls, s), 0)
        open_ = open_ & (n > 0)
        if not open_.any():
            return
        means = np.array(windows.means(n)).reshape(windows.groups, windows.size)
        slow = means.argmin(axis=1)
        pooled = windows.pooled(n)
        p90 = windows.per_group(pooled.quantiles(0.9, 0.0))[rows, slow]
        long_us = np.maximum(s.straggler_ratio * p90, p90 + s.straggler_min_wait_us)
        shares = windows.per_group(pooled.shares_above(windows.per_rank(long_us)))
        share = typical_but(shares, slow)
        open_ &= ~((share < s.straggler_sparse_share) | (shares[rows, slow] > share / 4))
        counts = windows.per_group(pooled.counts_above(windows.per_rank(long_us)))
        theirs = typical_but(counts, slow)
        more = np.zeros(windows.groups, bool)  # too few to tell: a longer window may
        for g in np.flatnonzero(open_).tolist():
            mine = int(counts[g, slow[g]])
            if sign_test(mine, int(theirs[g]) + mine) > s.straggler_sparse_p:
                more[g] = True
        found = open_ & ~more
        if found.any():
            typical = typical_but(windows.per_group(pooled.quantiles(
                windows.per_rank(1.0 - share), 0.0)), slow)
            medians = windows.per_group(pooled.quantiles(0.5, 0.0))
            for g in np.flatnonzero(found).tolist():
                verdicts[g] = _verdict(windows, g, int(slow[g]), medians[g], float(typical[g]),
                                       int(n[g]), round(float(share[g]), 2))
        open_ = more
        calls = calls * 2


def sign_test(fewer: int, total: int) -> float:
    """The chance of ``fewer`` or fewer of ``total`` coin flips landing one way: how likely
    the candidate's long waits are this few against the others' if nobody were late more.
    Exact up to 400 flips, the normal approximation above (a busy group's long window)."""
    if total > 400:
        z = (fewer + 0.5 - total / 2) / math.sqrt(total / 4)
        return 0.5 * math.erfc(-z / math.sqrt(2))
    return sum(math.comb(total, k) for k in range(fewer + 1)) / 2 ** total
