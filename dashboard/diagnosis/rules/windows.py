"""The recent latency summaries of each rank of a group, and the arithmetic on them that the
slowness rules share: pooled histograms, means, shares above a latency, how many summaries a
window needs.

Each summary is a tuple ``(end, count, sum_us, histogram)`` (the histogram flattened as
bucket, count, bucket, count, ...; see pgdash_agent.wire). Its own room because `straggler`,
its verdict and its chains, and `slow_collective` all read windows the same way; this module
judges nothing.
"""

from __future__ import annotations

import math
import operator

from pgdash_agent.wire import HIST_BUCKETS_PER_OCTAVE, HIST_MAX_BUCKET, hist_bucket_value

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Settings
from dashboard.state import JobState


def windows_of(state: JobState, group: str, now: float) -> dict[int, list[tuple]]:
    """Recent (end, count, sum_us, histogram) summaries with calls, per running rank of a
    group, up to ``now``. Straggler and slow_collective both ask, per group: built once per
    state version and time for all groups."""
    return state.memo(("windows", now), lambda: _all_windows(state, now)).get(group, {})


def _all_windows(state: JobState, now: float) -> dict[str, dict[int, list[tuple]]]:
    running = {r.rank for r in state.ranks() if r.status == RankStatus.RUNNING}
    out: dict[str, dict[int, list[tuple]]] = {}
    for group in state.groups:
        windows = {}
        for rank, window in state.recent_of(group).items():
            if rank not in running:
                continue
            if window and window[-1][0] <= now:  # live: only empty summaries to leave out
                windows[rank] = list(filter(_calls, window))
            else:
                windows[rank] = [p for p in window if p[0] <= now and p[1] > 0]
        out[group] = windows
    return out


_calls = operator.itemgetter(1)  # a summary's count of collectives (0: an empty one)


def mean_us(points: list[tuple]) -> float:
    return sum(p[2] for p in points) / max(1, sum(p[1] for p in points))


def aligned(windows: dict[int, list[tuple]], slack_s: float) -> dict[int, list[tuple]]:
    """Each rank's summaries up to where every rank has reported: those ending after the
    earliest newest end (plus ``slack_s``: the agents' summaries end at different phases of
    their interval) are left out (see rules.straggler_verdict.straggler_in)."""
    if not windows:
        return windows
    horizon = min(pts[-1][0] if pts else math.inf for pts in windows.values()) + slack_s
    out = {}
    for rank, pts in windows.items():
        k = len(pts)
        while k and pts[k - 1][0] > horizon:
            k -= 1
        out[rank] = pts if k == len(pts) else pts[:k]
    return out


def intervals_holding(windows: dict[int, list[tuple]], depth: int, calls: int,
                      s: Settings) -> int | None:
    """How many of the newest summaries hold ``calls`` collectives on every rank (at least
    ``straggler_min_intervals``); None if all ``depth`` of them do not."""
    n = s.straggler_min_intervals
    while n <= depth and any(sum(p[1] for p in pts[-n:]) < calls for pts in windows.values()):
        n += 1
    return n if n <= depth else None


def count_above(hist: dict[int, int], us: float) -> int:
    """How many of a histogram's collectives took longer than ``us`` (whose bucket's value
    is above it)."""
    first = first_bucket_above(us)
    return sum(c for b, c in hist.items() if b >= first)


def first_bucket_above(us: float) -> int:
    """The lowest histogram bucket whose value is above ``us``: the buckets' values grow
    with their index, so a bucket is above ``us`` exactly when its index is at least this
    (one comparison per bucket instead of a power; a judgement of 1,024 ranks made 150,000)."""
    if not us >= 0.0:  # negative (every bucket is above) or NaN (none is)
        return 0 if us < 0.0 else HIST_MAX_BUCKET + 1
    if us == math.inf:
        return HIST_MAX_BUCKET + 1
    b = min(max(0, math.ceil(math.log2(us) * HIST_BUCKETS_PER_OCTAVE - 0.5)),
            HIST_MAX_BUCKET + 1) if us > 0.0 else 0
    while b > 0 and hist_bucket_value(b - 1) > us:
        b -= 1
    while b <= HIST_MAX_BUCKET and hist_bucket_value(b) <= us:
        b += 1
    return b


def share_above(hist: dict[int, int], us: float) -> float:
    """The share of a histogram's collectives that took longer than ``us``."""
    total = sum(hist.values())
    return count_above(hist, us) / total if total else 0.0


def pooled_histogram(points: list[tuple], into: dict[int, int] | None = None) -> dict[int, int]:
    """The latency histogram of all the collectives of some intervals together (added to
    ``into`` when given)."""
    out: dict[int, int] = {} if into is None else into
    get = out.get
    for p in points:
        flat = p[3]  # (bucket, count, bucket, count, ...)
        for i in range(0, len(flat), 2):
            bucket = flat[i]
            out[bucket] = get(bucket, 0) + flat[i + 1]
    return out


class Pools:
    """Each rank's pooled histogram of its newest ``n`` summaries, for a verdict that tries
    longer and longer windows of the same summaries: each pools only what the shorter one
    did not (at 1,024 ranks, pooling anew for each window was a third of a judgement).
    A histogram returned is extended by the next, longer :meth:`upto`; read it first."""

    def __init__(self, windows: dict[int, list[tuple]]):
        self.windows = windows
        self._n = 0
        self._pooled: dict[int, dict[int, int]] = {rank: {} for rank in windows}

    def upto(self, n: int) -> dict[int, dict[int, int]]:
        if n < self._n:  # a shorter window than the last: pooled anew
            self._n, self._pooled = 0, {rank: {} for rank in self.windows}
        if n > self._n:
            for rank, pts in self.windows.items():
                pooled_histogram(pts[len(pts) - n:len(pts) - self._n], self._pooled[rank])
            self._n = n
        return self._pooled


def typical_of_others(means: dict[int, float], slow: int) -> float:
    others = sorted(v for r, v in means.items() if r != slow)
    return others[len(others) // 2]
