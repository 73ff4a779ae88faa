"""Latency summaries as the fold keeps them: every rank's per-interval rows merged into
totals, per-second series and the straggler rule's windows.

An agent sends a summary of each group's collectives every ``PGDASH_STATS_INTERVAL_S``: per
(group, op) a count, bytes, the sum and maximum of the times and a histogram (the buckets of
pgdash_agent.wire). ``add_summary`` is the hottest code of ingest, so it is plain dict
arithmetic; ``upgraded_point`` reads the windows that earlier checkpoints stored.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from pgdash_agent.wire import hist_bucket, hist_bucket_value

from dashboard.state.recent import RecentWindows

P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})  # the agent's point-to-point ops (collective_wrappers)
# Seconds of merged summaries kept per (family, op, source) for the latency chart: its 30
# (dashboard.web.live.TIMELINE_BINS) and two for the summaries of a second still arriving.
OP_SECONDS = 32


@dataclasses.dataclass
class LatencyStats:
    """Collectives merged: of one (group, op, rank, source) over the job, of one second of
    every rank's, or of a whole family (see JobState.op_stats)."""

    count: int = 0
    bytes: int = 0
    sum_us: float = 0.0
    max_us: float = 0.0
    # bucket -> count. A plain dict, not a Counter: a 256-rank state holds ~36,000 of them,
    # and unpickling a Counter runs its __init__ (a third of a checkpoint's load time).
    hist: dict[int, int] = dataclasses.field(default_factory=dict)
    # Flight Recorder rows timed by host polls: their widest poll gap (None: exact timing)
    resolution_us: float | None = None

    def add(self, row: dict[str, Any]) -> None:
        # The hottest line of ingest (every row of every rank's summary, twice): plain dict
        # arithmetic.
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


def add_summary(collectives: dict[tuple[str, str, int, str], LatencyStats],
                op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]],
                recent: RecentWindows,
                rank: int, body: dict[str, Any], families: dict[str, str]) -> None:
    """Fold one rank's latency summary (a ``coll_stats`` body) into the job's totals per
    (group, op, rank, source), the per-second series per (family, op, source) and the recent
    windows per (group, rank) (dashboard.state.recent).

    The per-second series are what the latency chart draws, per family of groups (all the
    data-parallel groups of a mesh together): kept per family (``families``: group name ->
    family, a group not in it counts as its own), there are as many as the mesh has
    dimensions, not as many as it has groups (at 64 ranks of a 4x4x4 mesh, 163 series of 60
    seconds were half of the job's state).

    The hottest code of the fold (every row of every rank's summary, three times): one pass
    per row with LatencyStats.add inlined, what it reads of the row read once (the same
    arithmetic, in the same order, as ``LatencyStats.add``; see bench/fold.py).
    """
    per_group: dict[str, list] = {}  # one point per group and interval, all ops together
    end = body["end"]
    second = int(end)
    for row in body["rows"]:
        group = row["group"]
        op = row["op"]
        source = row.get("source", "wrapper")
        count = row["count"]
        nbytes = row["bytes"]
        sum_us = row["sum_us"]
        max_us = row["max_us"]
        pairs = row["hist"]
        key = (group, op, rank, source)
        stats = collectives.get(key)
        if stats is None:
            stats = collectives[key] = LatencyStats()
        stats.count += count
        stats.bytes += nbytes
        stats.sum_us += sum_us
        if max_us > stats.max_us:
            stats.max_us = max_us
        timing = row.get("timing")
        if timing == "host_poll":
            stats.resolution_us = max(stats.resolution_us or 0.0, row.get("resolution_us", 0.0))
        series_key = (families.get(group, group), op, source)
        series = op_seconds.get(series_key)
        if series is None:
            series = op_seconds[series_key] = {}
        merged = series.get(second)
        if merged is None:
            merged = series[second] = LatencyStats()
            if len(series) > OP_SECONDS:
                del series[min(series)]
        merged.count += count
        merged.bytes += nbytes
        merged.sum_us += sum_us
        if max_us > merged.max_us:
            merged.max_us = max_us
        total = stats.hist
        total_get = total.get
        second_hist = merged.hist
        second_get = second_hist.get
        if timing == "host_poll" or op in P2P_OPS:
            # Timed to a poll gap, not the collective: kept out of the time-inside-
            # collectives windows (heat map, straggler), which would read the gaps as waits.
            # A pipeline's receives wait for the stage before it to compute: no straggler
            # there either (its bubble makes the first stage wait least, always).
            for bucket, n in pairs:
                total[bucket] = total_get(bucket, 0) + n
                second_hist[bucket] = second_get(bucket, 0) + n
            continue
        point = per_group.get(group)
        if point is None:
            point = per_group[group] = [end, 0, 0.0, {}]
        point[1] += count
        point[2] += sum_us
        window_hist = point[3]
        window_get = window_hist.get
        # The three histograms in one pass over the row's pairs (a third less than three).
        for bucket, n in pairs:
            total[bucket] = total_get(bucket, 0) + n
            second_hist[bucket] = second_get(bucket, 0) + n
            window_hist[bucket] = window_get(bucket, 0) + n
    for group, (end, count, sum_us, hist) in per_group.items():
        # The histogram stays so that the straggler rule can pool intervals.
        recent.append((group, rank), end, count, sum_us, tuple(_flat(sorted(hist.items()))))


_flat = itertools.chain.from_iterable
