"""Latency statistics: LatencyStats (collectives merged: one key's totals, a second of the
latency chart, a family's), their quantiles, and the readings of what earlier checkpoints
stored (``upgraded_point``, ``per_family``).

An agent sends a summary of each group's collectives every ``PGDASH_STATS_INTERVAL_S``: per
(group, op) a count, bytes, the sum and maximum of the times and a histogram (the buckets of
pgdash_agent.wire). dashboard.state.summaries folds them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pgdash_agent.wire import hist_bucket, hist_bucket_value

from dashboard.state.recent import RecentWindows

P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})  # the agent's point-to-point ops (collective_wrappers)
# Seconds of merged summaries kept per (family, op, source) for the latency chart: its 30
# (dashboard.web.live.TIMELINE_BINS) and two for the summaries of a second still arriving.
OP_SECONDS = 32
SATURATED = 2**62  # a sum of counts or bytes, at most (never a real job's)


@dataclasses.dataclass
class LatencyStats:
    """Collectives merged: of one (group, op, rank, source) over the job, of one second of
    every rank's, or of a whole family (see JobState.op_stats)."""

    count: int = 0
    bytes: int = 0
    sum_us: float = 0.0
    max_us: float = 0.0
    # bucket -> count. A plain dict, not a Counter: checkpoints of earlier versions hold tens
    # of thousands (the totals are columns now: dashboard.state.totals), and unpickling a
    # Counter runs its __init__.
    hist: dict[int, int] = dataclasses.field(default_factory=dict)
    # Flight Recorder rows timed by host polls: their widest poll gap (None: exact timing)
    resolution_us: float | None = None

    def add(self, row: dict[str, Any]) -> None:
        """One summary row added (the definition dashboard.state.summaries folds batches
        by: tests/unit/test_state.py)."""
        self.count += row["count"]
        self.bytes += row["bytes"]
        self.sum_us += row["sum_us"]
        if row["max_us"] > self.max_us:
            self.max_us = row["max_us"]
        hist = self.hist
        get = hist.get
        for bucket, n in row["hist"]:
            hist[bucket] = get(bucket, 0) + n

    def merge(self, other: "LatencyStats") -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)
        hist = self.hist
        for bucket, n in other.hist.items():
            hist[bucket] = hist.get(bucket, 0) + n
        if other.resolution_us is not None:
            self.resolution_us = max(self.resolution_us or 0.0, other.resolution_us)

    def percentile(self, q: float) -> float | None:
        """Latency (us) at quantile q from the histogram, never above the true maximum."""
        if not sum(self.hist.values()):
            return None
        return round(min(quantile_us(self.hist, q, self.max_us), self.max_us), 3)


def quantile_us(hist: dict[int, int], q: float, default: float) -> float:
    """Quantile ``q`` of a latency histogram (bucket -> count): at least ``q`` of the
    collectives took at most this long (the bucket's middle); ``default`` when it is empty."""
    target = q * sum(hist.values())
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= target:
            return hist_bucket_value(bucket)
    return default


def upgraded_windows(recent: dict[tuple[str, int], Any]) -> RecentWindows:
    """The straggler windows as checkpoints before dashboard.state.recent stored them (a
    deque of summary tuples per (group, rank), in any layout upgraded_point reads), as
    today's."""
    return RecentWindows.of({key: [upgraded_point(p) for p in window]
                             for key, window in recent.items() if window})


def current_point(point: tuple) -> bool:
    return len(point) == 4 and isinstance(point[3], tuple)


def upgraded_point(point: tuple) -> tuple:
    """A latency summary point as older checkpoints stored it, in today's layout: (end, count,
    sum_us, p50_us, p25_us, histogram) drops its two quantiles (nothing read them); (end,
    count, sum_us, p50_us, p25_us), kept before histograms were, puts all its collectives in
    the bucket of its lower quartile (of its mean, before quartiles were kept)."""
    if current_point(point):
        return point
    if len(point) >= 6:
        return tuple(point[:3]) + (point[5],)
    end, count, sum_us = point[:3]
    typical = point[4] if len(point) > 4 else sum_us / max(1, count)
    return end, count, sum_us, (hist_bucket(typical), count) if count > 0 else ()




def per_family(op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]],
               families: dict[str, str]) -> dict[tuple[str, str, str], dict[int, LatencyStats]]:
    """Per-second series kept per group (checkpoints of earlier versions) merged per family,
    the newest OP_SECONDS seconds of each."""
    out: dict[tuple[str, str, str], dict[int, LatencyStats]] = {}
    for (group, op, source), series in op_seconds.items():
        merged = out.setdefault((families.get(group, group), op, source), {})
        for second, stats in series.items():
            into = merged.get(second)
            if into is None:
                into = merged[second] = LatencyStats()
            into.merge(stats)
    return {key: dict(sorted(series.items())[-OP_SECONDS:]) for key, series in out.items()}


def add_capped(total: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """``total[at] += values`` (int64, in order), where a total would pass SATURATED it stops
    there (a broken agent's counts; a real job's are far below)."""
    if not len(at):
        return
    values = np.minimum(values, SATURATED)
    # Whether any total could pass the cap (in floats, which cannot wrap around): not if
    # the largest plus all that is added stays below it.
    if float(total.max(initial=0)) + float(values.sum(dtype=float)) < SATURATED:
        np.add.at(total, at, values)
        return
    # Else only the totals that could (with room for the floats' rounding) are added one by
    # one, exactly; the others as arrays, as fast as ever.
    added = np.bincount(at, weights=values.astype(float), minlength=len(total))
    near = (added + total) >= SATURATED / 2
    risky = near[at]
    np.add.at(total, at[~risky], values[~risky])
    for i, v in zip(at[risky].tolist(), values[risky].tolist()):
        total[i] = min(int(total[i]) + v, SATURATED)
