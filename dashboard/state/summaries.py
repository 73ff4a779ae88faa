"""Latency summaries folded, a batch at a time: a ``coll_stats`` body's rows into the job's
totals (dashboard.state.totals), per-second series and straggler windows
(dashboard.state.recent).

An agent sends a summary of each group's collectives every ``PGDASH_STATS_INTERVAL_S``: per
(group, op) a count, bytes, the sum and maximum of the times and a histogram (the buckets of
pgdash_agent.wire). They are what the fold does most (two a second from every rank), so
the fold (dashboard.state.fold) keeps them aside and folds them together when what they go
into is read: each row's fields read once into columns, the rest array arithmetic.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from pgdash_agent.wire import HIST_MAX_BUCKET

from dashboard.state.latency import OP_SECONDS, P2P_OPS, SATURATED, LatencyStats, add_capped
from dashboard.state.recent import RecentWindows, _ints
from dashboard.state.totals import LatencyTable

_flat = itertools.chain.from_iterable
_REQUIRED = 7  # a row's fields without the optional ones (pgdash_agent.wire.CollRow)
_GROUP, _OP, _COUNT, _BYTES, _SUM, _MAX, _HIST = map(operator.itemgetter, (
    "group", "op", "count", "bytes", "sum_us", "max_us", "hist"))


class PendingSummaries:
    """Latency summaries applied and not yet folded, as columns of plain lists: each body's
    rows are read into them when it is applied, so that the bodies themselves go at once
    (held until a batch is folded, thousands of decoded dicts made every garbage collection
    scan them: a replay's fold took twice as long)."""

    def __init__(self) -> None:
        self.summaries = 0
        self.ranks: list[int] = []  # per summary
        self.rows: list[int] = []  # per summary: how many rows
        self.ends: list[float] = []  # per summary
        self.groups: list[str] = []  # per row, and so on
        self.ops: list[str] = []
        self.counts: list[int] = []
        self.bytes: list[int] = []
        self.sums: list[float] = []
        self.maxes: list[float] = []
        self.pairs: list[int] = []  # per row: its histogram's (bucket, count) pairs
        self.hist: list[int] = []  # every row's pairs, flat: bucket, count, bucket, ...
        # (row, source, timing, resolution_us) of the rows with optional fields: the agent
        # leaves them out at their defaults
        self.optional: list[tuple[int, str, str | None, float]] = []

    def __len__(self) -> int:
        return self.summaries

    def add(self, rank: int, body: dict[str, Any]) -> None:
        rows = body["rows"]
        end = body["end"]
        columns = (self.groups, self.ops, self.counts, self.bytes, self.sums, self.maxes,
                   self.pairs, self.hist, self.optional)
        held = [len(column) for column in columns]
        try:
            first = held[0]
            self.groups += map(_GROUP, rows)
            self.ops += map(_OP, rows)
            self.counts += map(_COUNT, rows)
            self.bytes += map(_BYTES, rows)
            self.sums += map(_SUM, rows)
            self.maxes += map(_MAX, rows)
            hists = list(map(_HIST, rows))
            self.pairs += map(len, hists)
            self.hist += _flat(_flat(hists))
            sizes = list(map(len, rows))
            if sizes and max(sizes) > _REQUIRED:
                self.optional += [(first + i, rows[i].get("source", "wrapper"),
                                   rows[i].get("timing"), rows[i].get("resolution_us") or 0.0)
                                  for i, size in enumerate(sizes) if size > _REQUIRED]
        except Exception:
            # A body that lacks a field (validation keeps them out; a stored log may not)
            # leaves the columns as they were, the summaries before it whole.
            for column, size in zip(columns, held):
                del column[size:]
            raise
        self.summaries += 1
        self.ranks.append(rank)
        self.rows.append(len(rows))
        self.ends.append(end)


def fold_summaries(table: LatencyTable,
                   op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]],
                   recent: RecentWindows, batch: PendingSummaries,
                   families: dict[str, str]) -> None:
    """Fold ranks' latency summaries (``coll_stats`` bodies, read into ``batch`` in log order)
    into the job's totals per (group, op, rank, source) (``table``: dashboard.state.totals),
    the per-second series per (family, op, source) and the recent windows per (group, rank)
    (dashboard.state.recent), exactly as folding them one row at a time through
    LatencyStats.add would (tests/unit/test_state.py holds that definition).

    The per-second series are what the latency chart draws, per family of groups (all the
    data-parallel groups of a mesh together): kept per family (``families``: group name ->
    family, a group not in it counts as its own), there are as many as the mesh has
    dimensions, not as many as it has groups (at 64 ranks of a 4x4x4 mesh, 163 series of 60
    seconds were half of the job's state).

    The hottest code of the fold, so a batch at a time: each row's fields were read once
    into columns, and everything here is array arithmetic over the batch (bench/fold.py).
    """
    n = len(batch.groups)
    if not n:
        return
    of_summary = np.repeat(np.arange(batch.summaries), batch.rows)
    groups, ops = batch.groups, batch.ops
    sources = ["wrapper"] * n
    for i, source, _, _ in batch.optional:
        sources[i] = source
    count, nbytes = _ints(batch.counts), _ints(batch.bytes)
    sum_us, max_us = np.array(batch.sums, float), np.array(batch.maxes, float)
    pairs = np.array(batch.pairs, np.int64)
    flat = _ints(batch.hist)
    buckets, pair_counts = flat[0::2], flat[1::2]
    rank = np.array(batch.ranks, np.int64)[of_summary].tolist()
    key_rows = table.rows_of(list(zip(groups, ops, rank, sources)))
    table.add(key_rows, count, nbytes, sum_us, max_us, np.repeat(key_rows, pairs), buckets,
              pair_counts)
    polled = np.zeros(n, bool)
    for i, _, timing, resolution_us in batch.optional:
        if timing == "host_poll":
            polled[i] = True
            table.widen_resolution(int(key_rows[i]), resolution_us)
    group_code, group_names = _codes(groups)
    op_code, op_names = _codes(ops)
    source_code, source_names = _codes(sources)
    second_code, second_names = _codes([int(end) for end in batch.ends])
    _fold_seconds(op_seconds, families, group_names, op_names, source_names, second_names,
                  (group_code * len(op_names) + op_code) * len(source_names) + source_code,
                  second_code[of_summary], count, nbytes, sum_us, max_us, pairs, buckets,
                  pair_counts)
    # The straggler windows: per summary, a point per group of its timed collectives.
    # Host-polled rows are timed to a poll gap, not the collective: kept out of the
    # time-inside-collectives windows (heat map, straggler), which would read the gaps as
    # waits. A pipeline's receives wait for the stage before it to compute: no straggler
    # there either (its bubble makes the first stage wait least, always).
    p2p = np.array([name in P2P_OPS for name in op_names])
    timed = ~polled & ~p2p[op_code]
    if timed.any():
        ends = np.array(batch.ends, float)
        _append_points(recent, group_names, rank, of_summary, ends, timed,
                       of_summary * len(group_names) + group_code, count, sum_us, pairs,
                       buckets, pair_counts)


def _codes(values: list) -> tuple[np.ndarray, list]:
    """Each value's number (0, 1, ... in the order values first come) and the values."""
    names = list(dict.fromkeys(values))
    index = {name: i for i, name in enumerate(names)}
    return np.fromiter(map(index.__getitem__, values), np.int64, len(values)), names


def _present(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The codes present (ascending) and the first row each is at."""
    present = np.flatnonzero(np.bincount(codes))
    slot = np.zeros(present[-1] + 1, np.int64)
    slot[present] = np.arange(len(present))
    first_row = np.full(len(present), len(codes))
    np.minimum.at(first_row, slot[codes], np.arange(len(codes)))
    return present, first_row


def _fold_seconds(op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]],
                  families: dict[str, str], group_names: list[str], op_names: list[str],
                  source_names: list[str], second_names: list[int], combo: np.ndarray,
                  second: np.ndarray, count: np.ndarray, nbytes: np.ndarray,
                  sum_us: np.ndarray, max_us: np.ndarray, pairs: np.ndarray,
                  buckets: np.ndarray, pair_counts: np.ndarray) -> None:
    """Rows into the per-second series: each series (family, op, source) keeps its newest
    OP_SECONDS seconds, a second gets every row of it (a row for a second older than all
    those kept counts in the totals only), as adding them one by one does. ``combo``: each
    row's (group, op, source) as a number, ``second`` its second's."""
    ops, sources = len(op_names), len(source_names)
    # Each row's series: from its (group, op, source), in the order rows first name them.
    present, first_row = _present(combo)
    series_of: dict[tuple[str, str, str], int] = {}
    lookup = np.full(present[-1] + 1, -1, np.int64)
    for c in present[np.argsort(first_row, kind="stable")].tolist():
        g, rest = divmod(c, ops * sources)
        o, src = divmod(rest, sources)
        group = group_names[g]
        key = (families.get(group, group), op_names[o], source_names[src])
        lookup[c] = series_of.setdefault(key, len(series_of))
    series = lookup[combo]
    # Which cells (series, second) the rows go to: a second is kept if among the series'
    # newest OP_SECONDS, with those it held; new ones in the order rows first name them.
    n_seconds = len(second_names)
    cell_combo = series * n_seconds + second
    present, first_row = _present(cell_combo)  # by series, then second
    bounds = np.searchsorted(present, np.arange(len(series_of) + 1) * n_seconds).tolist()
    cell_of = np.full(len(series_of) * n_seconds, -1, np.int64)
    cells: list[LatencyStats] = []
    for key, s in series_of.items():
        held = op_seconds.get(key)
        if held is None:
            held = op_seconds[key] = {}
        mine = present[bounds[s]:bounds[s + 1]]
        codes = mine[np.argsort(first_row[bounds[s]:bounds[s + 1]], kind="stable")].tolist()
        new = [second_names[c - s * n_seconds] for c in codes]
        kept = set(sorted(set(held) | set(new))[-OP_SECONDS:])
        for second in [second for second in held if second not in kept]:
            del held[second]
        for c, second in zip(codes, new):
            if second in kept:
                stats = held.get(second)
                if stats is None:
                    stats = held[second] = LatencyStats()
                cell_of[c] = len(cells)
                cells.append(stats)
    cell = cell_of[cell_combo]
    rows = np.flatnonzero(cell >= 0)
    if not len(rows):
        return
    at = cell[rows]
    n = len(cells)
    added_count, added_bytes = np.zeros(n, np.int64), np.zeros(n, np.int64)
    add_capped(added_count, at, count[rows])
    add_capped(added_bytes, at, nbytes[rows])
    sums = np.array([c.sum_us for c in cells])
    np.add.at(sums, at, sum_us[rows])  # in order, from what the cell held
    maxes = np.array([c.max_us for c in cells])
    np.maximum.at(maxes, at, max_us[rows])
    pair_cell = np.repeat(cell, pairs)
    held_pairs = pair_cell >= 0
    width = HIST_MAX_BUCKET + 1
    added = np.zeros(n * width, np.int64)
    add_capped(added, pair_cell[held_pairs] * width + buckets[held_pairs],
               pair_counts[held_pairs])
    for stats, n_count, n_bytes, total_us, most_us in zip(
            cells, added_count.tolist(), added_bytes.tolist(), sums.tolist(), maxes.tolist()):
        stats.count = min(stats.count + n_count, SATURATED)  # as add_capped, batch or not
        stats.bytes = min(stats.bytes + n_bytes, SATURATED)
        stats.sum_us = total_us
        stats.max_us = most_us
    where = np.flatnonzero(added)
    for c, bucket, n_added in zip((where // width).tolist(), (where % width).tolist(),
                                  added[where].tolist()):
        hist = cells[c].hist
        hist[bucket] = min(hist.get(bucket, 0) + n_added, SATURATED)


def _append_points(recent: RecentWindows, group_names: list[str], rank: list[int],
                   of_summary: np.ndarray, ends: np.ndarray, timed: np.ndarray,
                   combo: np.ndarray, count: np.ndarray, sum_us: np.ndarray,
                   pairs: np.ndarray, buckets: np.ndarray, pair_counts: np.ndarray) -> None:
    """One point per (summary, group) of the timed rows into the windows, in the order the
    summaries came and, within one, the order its groups first came: (end, the rows' counts
    and times summed, their histograms merged, by bucket). ``combo``: each row's (summary,
    group) as a number."""
    rows = np.flatnonzero(timed)
    _, first, inverse = np.unique(combo[rows], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the points in the order rows first name them
    point_of = np.empty(len(order), np.int64)
    point_of[order] = np.arange(len(order))
    at = point_of[inverse]
    n = len(order)
    firsts = rows[first[order]].tolist()
    groups = len(group_names)
    keys = [(group_names[c % groups], rank[i]) for c, i in zip(combo[firsts].tolist(), firsts)]
    counts = np.zeros(n, np.int64)
    add_capped(counts, at, count[rows])
    sums = np.zeros(n)
    np.add.at(sums, at, sum_us[rows])  # in row order, from 0.0
    point_ends = ends[of_summary[firsts]]
    point = np.full(len(timed), -1, np.int64)
    point[rows] = at
    pair_point = np.repeat(point, pairs)
    held = pair_point >= 0
    if not held.any():  # rows without histograms: points of no bucket
        recent.extend(keys, point_ends, counts, sums, np.zeros(n, np.int64),
                      np.zeros(0, np.int64), np.zeros(0, np.int64))
        return
    low, high = int(buckets[held].min()), int(buckets[held].max())
    width = high - low + 1
    merged = np.zeros(n * width, np.int64)  # per point, its buckets from low to high
    add_capped(merged, pair_point[held] * width + (buckets[held] - low), pair_counts[held])
    where = np.flatnonzero(merged)  # by point, then bucket
    recent.extend(keys, point_ends, counts, sums, np.bincount(where // width, minlength=n),
                  where % width + low, merged[where])
