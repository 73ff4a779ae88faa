"""The recent latency summaries of each rank of a group, and the arithmetic on them that the
slowness rules share: pooled histograms and their quantiles, means, shares above a latency,
how many summaries a window needs.

A group's summaries are columns (dashboard.state.recent.Columns: one row per rank, the newest
summary last), so that what a rule asks of every rank is one array operation, not a pass over
a tuple per summary (at 1,024 ranks, ~245,000 of them). Its own room because `straggler`, its verdict and its chains, and
`slow_collective` all read windows the same way; this module judges nothing.
"""

from __future__ import annotations

import math
import numpy as np

from pgdash_agent.wire import HIST_BUCKETS_PER_OCTAVE, HIST_MAX_BUCKET, hist_bucket_value

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Settings
from dashboard.state import JobState
from dashboard.state.recent import Columns, RecentWindows

BUCKETS = HIST_MAX_BUCKET + 1
# Each bucket's value (hist_bucket_value), computed by Python once: the same floats as the
# quantiles of dashboard.state.quantile_us.
_VALUES = np.array([hist_bucket_value(b) for b in range(BUCKETS)])


class Windows:
    """The summaries with collectives of the running ranks of ``groups`` groups of as many
    ranks each, up to a moment: group g's ranks are rows g * R to (g + 1) * R of ``cols``.
    The rules judge all the groups of one size together (a 1,024-rank job has hundreds of
    8-rank groups; judged one by one, the arrays' fixed cost per operation was most of a
    judgement), so what they ask per group comes back as an array, one value per group.

    ``len`` is its ranks, ``in`` asks whether a rank is one of them."""

    def __init__(self, cols: Columns, groups: int = 1):
        self.cols = cols
        self.groups = groups
        self.size = len(cols.ranks) // groups if groups else 0  # ranks per group
        self._pooled: dict[bytes, Pooled] = {}
        self._row: dict[int, int] | None = None
        self._calls: np.ndarray | None = None  # see calls_of_newest

    def cut(self, cols: Columns) -> "Windows":
        """Windows of some of these summaries, of the same groups."""
        return Windows(cols, self.groups)

    def group(self, g: int) -> "Windows":
        """Group ``g``'s windows alone."""
        if self.groups == 1:
            return self
        return Windows(self.cols.rows(range(g * self.size, (g + 1) * self.size)), 1)

    def per_group(self, values: np.ndarray) -> np.ndarray:
        """One value per rank (row) as (groups, ranks per group)."""
        return values.reshape(self.groups, self.size)

    def per_rank(self, values: np.ndarray | int) -> np.ndarray:
        """One value per group as one per rank (row)."""
        return np.repeat(np.broadcast_to(values, (self.groups,)), self.size)

    def __len__(self) -> int:
        return len(self.cols.ranks)

    def __contains__(self, rank: object) -> bool:
        return rank in self._rows()

    def _rows(self) -> dict[int, int]:
        if self._row is None:
            self._row = {rank: i for i, rank in enumerate(self.cols.ranks)}
        return self._row

    @property
    def ranks(self) -> list[int]:
        return self.cols.ranks

    # -- as columns ----------------------------------------------------------------------------

    def depths(self) -> np.ndarray:
        """Per group, the fewest summaries one of its ranks holds."""
        if not self.size:
            return np.zeros(self.groups, np.int64)
        return self.per_group(self.cols.sizes).min(axis=1)

    def older(self, back: int) -> "Windows":
        """Each rank's summaries without its newest ``back``."""
        if not back:
            return self
        return self.cut(self.cols.cut(0, max(0, self.cols.width - back)))

    def newest(self, n: int) -> "Windows":
        """Each rank's newest ``n`` summaries (all it holds, if fewer)."""
        if n >= self.cols.width:
            return self
        return self.cut(self.cols.cut(self.cols.width - n))

    def since(self, t: float) -> np.ndarray:
        """(rows, width): the cells of each rank's summaries that end at ``t`` or later."""
        return self.held() & (self.cols.ends >= t)

    def held(self) -> np.ndarray:
        """(rows, width): the cells that hold a summary."""
        return self.cols.newest_cells(self.cols.sizes)

    def _newest_mask(self, n: np.ndarray | int) -> np.ndarray:
        """(rows, width): the cells of each rank's newest ``n`` (per group) summaries."""
        return self.cols.newest_cells(self.per_rank(n))

    def newest_ends(self) -> np.ndarray:
        """Each rank's newest summary's end (ranks holding some)."""
        return self.cols.ends[:, -1]

    def oldest_end(self) -> float:
        """The end of the oldest summary any rank holds."""
        c = self.cols
        held = c.sizes > 0
        return float(c.ends[held, c.width - c.sizes[held]].min())

    def calls(self, rank: int) -> int:
        """A rank's collectives in all it holds."""
        return int(self.cols.counts[self._rows()[rank]].sum())

    def calls_of_newest(self) -> np.ndarray:
        """(rows, width): [r, n - 1] the collectives of row r's newest n summaries."""
        if self._calls is None:
            self._calls = np.cumsum(self.cols.counts[:, ::-1], axis=1)
        return self._calls

    def means(self, n: np.ndarray | int | None = None,
              cells: np.ndarray | None = None) -> list[float]:
        """Each rank's mean time inside a collective over its newest ``n`` summaries (per
        group), or over ``cells`` (rows, width), or over all it holds; us, 0.0 without
        collectives. Added oldest first, as Python's sum would (np.sum adds pairwise)."""
        c = self.cols
        if not c.width:
            return [0.0] * len(self)
        sums, counts = c.sums, c.counts
        if n is not None:
            cells = self._newest_mask(n)
        if cells is not None:
            sums, counts = np.where(cells, sums, 0.0), np.where(cells, counts, 0)
        total = np.cumsum(sums, axis=1)[:, -1]
        return (total / np.maximum(counts.sum(axis=1), 1)).tolist()

    def pooled(self, n: np.ndarray | int) -> "Pooled":
        """Each rank's histogram of its newest ``n`` summaries (per group) together."""
        key = np.asarray(n, np.int64).tobytes()
        pooled = self._pooled.get(key)
        if pooled is None:
            pooled = self._pooled[key] = self.pooled_cells(self._newest_mask(n))
        return pooled

    def pooled_cells(self, cells: np.ndarray) -> "Pooled":
        """Each rank's histogram of the summaries in ``cells`` (rows, width) together."""
        # Only the columns some rank pools (the newest few, mostly) are read.
        used = np.flatnonzero(cells.any(axis=0))
        start = int(used[0]) if len(used) else cells.shape[1]
        buckets, hist = self.cols.histograms(start)
        lo, hi = self.cols.span
        return Pooled(buckets, hist, cells[:, start:], lo, max(lo, hi))


class Pooled:
    """Each rank's histogram of some of its summaries (``cells``) together, as cumulative
    counts per bucket from ``lo`` to ``hi`` (a range holding every bucket that holds any: a
    job's collectives span a few dozen of the 321)."""

    def __init__(self, buckets: np.ndarray, hist: np.ndarray, cells: np.ndarray, lo: int,
                 hi: int):
        rows, width = len(buckets), hi - lo + 1
        self.lo = lo
        # Empty cells (count 0) may name any bucket: clipped into range, they add nothing.
        offset = np.clip(buckets.astype(np.int64) - lo, 0, width - 1)
        index = (np.arange(rows)[:, None, None] * width + offset).ravel()
        weights = np.where(cells[:, :, None], hist, 0).ravel()
        counts = np.bincount(index, weights=weights, minlength=rows * width)
        self.cum = np.cumsum(counts.reshape(rows, width), axis=1)
        self.total = self.cum[:, -1] if rows else np.zeros(0)

    def quantiles(self, q: float | np.ndarray, default: float) -> np.ndarray:
        """Each rank's quantile_us(histogram, q, default) (``q`` one, or one per rank): the
        value of the first bucket that holds collectives and brings the count to q of them."""
        target = q * self.total
        reached = (self.cum >= target[:, None]) & (self.cum > 0)
        first = reached.argmax(axis=1)
        return np.where(reached.any(axis=1), _VALUES[self.lo + first], default)

    def counts_above(self, us: float | np.ndarray) -> np.ndarray:
        """Each rank's count of collectives longer than ``us`` (one, or one per rank)."""
        values, which = np.unique(np.atleast_1d(us), return_inverse=True)
        above = np.array([first_bucket_above(v) for v in values.tolist()], np.int64)
        first = np.broadcast_to(above[which.ravel()] - self.lo, self.total.shape)
        width = self.cum.shape[1]
        below = np.where(first > 0, self.cum[np.arange(len(first)),
                                             np.clip(first - 1, 0, width - 1)], 0.0)
        return np.where(first >= width, 0.0, self.total - below)

    def shares_above(self, us: float | np.ndarray) -> np.ndarray:
        """Each rank's share of collectives longer than ``us`` (0.0 without collectives)."""
        counts = self.counts_above(us)
        return np.where(self.total > 0, counts / np.maximum(self.total, 1), 0.0)


_EMPTY = Windows(RecentWindows().columns())


def windows_of(state: JobState, group: str, now: float) -> Windows:
    """Recent summaries with calls, per running rank of a group, up to ``now`` (a group
    without any: no ranks)."""
    stacks, where = _stacks(state, now)
    if group not in where:
        return _EMPTY
    stack, g = where[group]
    return stacks[stack][1].group(g)


def stacked_windows(state: JobState, now: float) -> list[tuple[list[str], Windows]]:
    """windows_of every group that has any, those of groups of one size together: (the
    groups' names, their Windows), each's groups in the order of ``sorted(state.groups,
    key=str)``. Built once per state version and time (straggler and slow_collective ask)."""
    return _stacks(state, now)[0]


def _stacks(state: JobState, now: float) -> tuple[list[tuple[list[str], Windows]],
                                                   dict[str, tuple[int, int]]]:
    return state.memo(("windows",), lambda: _stacks_at(state, now), at=now)


def _stacks_at(state: JobState, now: float) -> tuple[list[tuple[list[str], Windows]],
                                                      dict[str, tuple[int, int]]]:
    running = {r.rank for r in state.ranks() if r.status == RankStatus.RUNNING}
    cols = state.recent.columns()
    rows: dict[str, list[tuple[int, int]]] = {}  # group -> (row, rank) of its running ranks
    for i, (group, rank) in enumerate(cols.ranks):
        if rank in running:
            rows.setdefault(group, []).append((i, rank))
    by_size: dict[int, list[str]] = {}
    for group in sorted(state.groups, key=str):
        if group in rows:
            by_size.setdefault(len(rows[group]), []).append(group)
    stacks, where = [], {}
    for size, groups in sorted(by_size.items()):
        pairs = [pair for group in groups for pair in rows[group]]
        some = cols.rows([i for i, _ in pairs])
        some.ranks = [rank for _, rank in pairs]
        # A rank whose newest summary is not after ``now`` (live) keeps all; else those
        # ending by then.
        live = some.ends[:, -1] <= now
        keep = (some.counts > 0) & (live[:, None] | (some.ends <= now))
        if not np.array_equal(keep.sum(axis=1), some.sizes):  # else all of them: as they are
            some = some.select(keep)
        where.update((group, (len(stacks), g)) for g, group in enumerate(groups))
        stacks.append((groups, Windows(some, len(groups))))
    return stacks, where


def aligned(windows: Windows, slack_s: float) -> Windows:
    """Each rank's summaries up to where every rank of its group has reported: those ending
    after the group's earliest newest end (plus ``slack_s``: the agents' summaries end at
    different phases of their interval) are left out (see
    rules.straggler_verdict.straggler_in)."""
    if not len(windows):
        return windows
    c = windows.cols
    newest = np.where(c.sizes > 0, c.ends[:, -1], math.inf)
    horizon = windows.per_rank(windows.per_group(newest).min(axis=1) + slack_s)
    # Each rank's summaries up to the newest that ends by the horizon (the ones before it
    # stay even if they end later: an agent's clock that stepped back).
    held = windows.held()
    later = (c.ends > horizon[:, None]) & held
    trailing = np.logical_and.accumulate(later[:, ::-1], axis=1)[:, ::-1]
    if not trailing.any():
        return windows
    return windows.cut(c.select(held & ~trailing))


def intervals_holding(windows: Windows, depths: np.ndarray, calls: np.ndarray | int,
                      s: Settings) -> np.ndarray:
    """Per group, how many of the newest summaries hold ``calls`` (per group) collectives on
    every rank (at least ``straggler_min_intervals``); 0 if all its depth of them do not."""
    c = windows.cols
    enough = windows.calls_of_newest() >= windows.per_rank(calls)[:, None]
    enough = enough.reshape(windows.groups, windows.size, c.width).all(axis=1)
    n = np.arange(1, c.width + 1)[None, :]
    enough &= (n >= s.straggler_min_intervals) & (n <= depths[:, None])
    return np.where(enough.any(axis=1), enough.argmax(axis=1) + 1, 0)


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


def typical_but(values: np.ndarray, skip: np.ndarray | None) -> np.ndarray:
    """Per group (``values``: groups x ranks), the typical value (the upper median) of all
    ranks but the one at ``skip`` (per group; the straggler's: the others' typical wait)."""
    if skip is not None:
        values = values.astype(np.float64)  # a copy
        values[np.arange(len(values)), skip] = math.inf  # sorted last, past the median
    others = values.shape[1] - (skip is not None)
    return np.sort(values, axis=1)[:, others // 2]
