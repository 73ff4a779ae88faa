"""The straggler and slow rules' windows: the newest RECENT_INTERVALS latency summaries of
every (group, rank) of a job, kept as columns (numpy arrays), not as a tuple per summary.

A summary is ``(end, count, sum_us, histogram)``: when its interval ended (the agent's clock),
the group's collectives in it (all ops together, point-to-point and host-polled rows left
out: dashboard.state.latency.add_summary), the time spent inside them, and their latency
histogram (flat: bucket, count, bucket, count, ...; see pgdash_agent.wire).

Why columns: a 1,024-rank job holds ~245,000 summaries (60 per rank and group). As tuples
they were 19 of a checkpoint's 24 MB and 274 ms of its load, ~80 KB of memory per rank, and
reading them scattered over the heap was most of a judgement (the rules read them across
ranks, interval by interval: rules.windows). Here each (group, rank) is one row, the newest
summary in the last column (rows are right-aligned; an empty cell has count 0), all of a
job's in the same arrays: a job has hundreds of groups, and an array operation per group
cost more than the arithmetic itself.

The fold appends one summary at a time, and writing single cells of arrays costs more than
making a tuple: appends wait in a list and go into the arrays together (vectorised) when the
windows are read, pickled, or FLUSH_AT of them wait.

Counts are kept as 64-bit integers clipped at COUNT_CAP, a histogram's counts as 32-bit ones
clipped at HIST_CAP (an interval of half a second holds at most ~10^6 collectives: the caps
only bound what a broken agent can make the arithmetic do).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Iterable

import numpy as np

RECENT_INTERVALS = 60  # latency summaries kept per (group, rank) for the straggler rule
FLUSH_AT = 65536  # appends waiting at most before they go into the arrays
COUNT_CAP = 2**56  # a summary's count of collectives, at most (60 of them fit in an int64)
HIST_CAP = 2**32 - 1  # a histogram bucket's count, at most (uint32)

Point = tuple  # (end, count, sum_us, flat histogram)


class Columns:
    """Windows at one moment (what RecentWindows.columns returns; never changed).

    ``ranks``: what each row is the window of (in RecentWindows, its (group, rank); in the
    rules' windows of a group, its rank), in the order they first reported; ``ends``, ``counts``,
    ``sums``: (rows, width) arrays, right-aligned; ``sizes``: the summaries each row holds;
    ``buckets``, ``hist``: (rows, width, K) arrays of each summary's histogram (K its most
    buckets; a cell past a summary's own has count 0)."""

    __slots__ = ("ranks", "ends", "counts", "sums", "sizes", "buckets", "hist")

    def __init__(self, ranks: list[int], ends: np.ndarray, counts: np.ndarray,
                 sums: np.ndarray, sizes: np.ndarray, buckets: np.ndarray, hist: np.ndarray):
        self.ranks = ranks
        self.ends, self.counts, self.sums, self.sizes = ends, counts, sums, sizes
        self.buckets, self.hist = buckets, hist

    @classmethod
    def empty(cls, width: int = RECENT_INTERVALS) -> "Columns":
        return cls([], np.zeros((0, width)), np.zeros((0, width), np.int64),
                   np.zeros((0, width)), np.zeros(0, np.int64),
                   np.zeros((0, width, 1), np.uint16), np.zeros((0, width, 1), np.uint32))

    @property
    def width(self) -> int:
        return self.ends.shape[1]

    def points(self, row: int) -> list[Point]:
        """Row ``row``'s summaries, oldest first, as (end, count, sum_us, flat histogram)."""
        start = self.width - int(self.sizes[row])
        ends = self.ends[row, start:].tolist()
        counts = self.counts[row, start:].tolist()
        sums = self.sums[row, start:].tolist()
        buckets = self.buckets[row, start:].tolist()
        hist = self.hist[row, start:].tolist()
        return [(e, c, s, _flat_of(b, h)) for e, c, s, b, h in zip(ends, counts, sums, buckets,
                                                                     hist)]

    def select(self, keep: np.ndarray) -> "Columns":
        """The summaries where ``keep`` (rows, width) is true, right-aligned again (each row's
        kept summaries in their order, empty cells zeroed)."""
        # A stable sort of each row's cells by kept-ness puts the kept last, in order.
        order = np.argsort(keep, axis=1, kind="stable")
        kept = np.take_along_axis(keep, order, axis=1)

        def move(a: np.ndarray) -> np.ndarray:
            out = np.take_along_axis(a, order if a.ndim == 2 else order[:, :, None], axis=1)
            out[~kept] = 0
            return out

        return Columns(self.ranks, move(self.ends), move(self.counts), move(self.sums),
                       keep.sum(axis=1), move(self.buckets), move(self.hist))

    def rows(self, which: np.ndarray | list[int]) -> "Columns":
        """Only the rows ``which`` (indices), in that order."""
        which = np.asarray(which, dtype=np.int64)
        return Columns([self.ranks[i] for i in which.tolist()], self.ends[which],
                       self.counts[which], self.sums[which], self.sizes[which],
                       self.buckets[which], self.hist[which])


def _flat_of(buckets: list[int], counts: list[int]) -> tuple:
    return tuple(itertools.chain.from_iterable((b, c) for b, c in zip(buckets, counts) if c))


class RecentWindows:
    """The newest RECENT_INTERVALS summaries of each (group, rank) of a job (see the module).

    ``append`` is the fold's (one summary of one rank in one group); ``columns`` the rules'
    (all rows, as arrays); ``window`` one row's as tuples. Pickled as plain bytes and
    numbers, so that a checkpoint names no numpy class (dashboard.storage.codec allows only
    pgdash's own)."""

    def __init__(self, width: int = RECENT_INTERVALS) -> None:
        self.width = width
        self._row_of: dict[Any, int] = {}
        self._cols = Columns.empty(width)
        self._pending: list[tuple] = []  # (key, end, count, sum_us, flat histogram)
        self._lock = threading.Lock()  # readers flush; the fold only appends

    def append(self, key: tuple[str, int], end: float, count: int, sum_us: float,
               flat: tuple) -> None:
        pending = self._pending
        pending.append((key, end, count, sum_us, flat))
        if len(pending) >= FLUSH_AT:
            self._flush()

    def clear(self) -> None:
        with self._lock:
            self._row_of, self._cols, self._pending = {}, Columns.empty(self.width), []

    def __len__(self) -> int:
        """(group, rank)s with summaries."""
        return len(self._row_of.keys() | {p[0] for p in self._pending})

    def __bool__(self) -> bool:
        return bool(self._row_of) or bool(self._pending)

    def columns(self) -> Columns:
        """Every row's summaries as arrays (a snapshot: later appends make new arrays)."""
        if self._pending:
            self._flush()
        return self._cols

    def window(self, key: tuple[str, int]) -> list[Point]:
        """One (group, rank)'s summaries, oldest first ([] if it sent none)."""
        cols = self.columns()
        row = self._row_of.get(key)
        return [] if row is None else cols.points(row)

    def windows(self) -> dict[tuple[str, int], list[Point]]:
        """Every (group, rank)'s summaries, oldest first."""
        cols = self.columns()
        return {key: cols.points(row) for row, key in enumerate(cols.ranks)}

    def newest_ends(self) -> dict[tuple[str, int], float]:
        """Each (group, rank)'s newest summary's end."""
        cols = self.columns()
        return dict(zip(cols.ranks, cols.ends[:, -1].tolist()))

    @classmethod
    def of(cls, windows: dict[tuple[str, int], Iterable[Point]],
           width: int = RECENT_INTERVALS) -> "RecentWindows":
        """Windows holding these summaries (oldest first; only the newest ``width`` kept)."""
        out = cls(width)
        for key, points in windows.items():
            for end, count, sum_us, flat in points:
                out._pending.append((key, end, count, sum_us, tuple(flat)))
        out._flush()
        return out

    # -- appends into the arrays ---------------------------------------------------------------

    def _flush(self) -> None:
        with self._lock:
            n = len(self._pending)
            if not n:
                return
            batch = self._pending[:n]
            del self._pending[:n]  # appended meanwhile: kept for the next flush
            self._cols = self._merged(self._cols, batch)

    def _merged(self, cols: Columns, batch: list[tuple]) -> Columns:
        """``cols`` with the summaries of ``batch`` appended (vectorised: one pass per array
        for the whole batch, whatever the rows it touches)."""
        width = self.width
        row_of = self._row_of
        added = [key for key in dict.fromkeys(p[0] for p in batch) if key not in row_of]
        for key in added:
            row_of[key] = len(row_of)
        keys = cols.ranks + added
        rows = np.fromiter((row_of[p[0]] for p in batch), np.int64, len(batch))
        total = len(keys)
        # Each summary's place among its row's new ones, and how many each row gets.
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
        run = np.diff(np.r_[starts, len(batch)])
        place = np.empty(len(batch), np.int64)
        place[order] = np.arange(len(batch)) - np.repeat(starts, run)
        got = np.bincount(rows, minlength=total)
        keep = place >= got[rows] - width  # more than a window's worth: only the newest
        column = width - got[rows] + place
        rows, column = rows[keep], column[keep]
        kept = [p for p, k in zip(batch, keep.tolist()) if k]

        pairs = [len(p[4]) // 2 for p in kept]
        k = max(cols.buckets.shape[2], max(pairs, default=1), 1)
        # The old rows shifted left by what each gets (new rows start empty).
        shift = np.minimum(got, width)
        old = cols.ends.shape[0]

        def grown(a: np.ndarray, dtype: Any) -> np.ndarray:
            shape = (total,) + a.shape[1:2] + ((k,) if a.ndim == 3 else ())
            out = np.zeros(shape, dtype)
            if a.ndim == 3:
                out[:old, :, :a.shape[2]] = a
            else:
                out[:old] = a
            index = np.minimum(np.arange(width)[None, :] + shift[:, None], width - 1)
            out = np.take_along_axis(out, index if a.ndim == 2 else index[:, :, None], axis=1)
            # Cells that came from beyond the row's end are the new summaries' (written below).
            out[np.arange(width)[None, :] >= width - shift[:, None]] = 0
            return out

        ends, counts, sums = grown(cols.ends, np.float64), grown(cols.counts, np.int64), \
            grown(cols.sums, np.float64)
        buckets, hist = grown(cols.buckets, np.uint16), grown(cols.hist, np.uint32)
        sizes = np.zeros(total, np.int64)
        sizes[:old] = cols.sizes
        sizes = np.minimum(sizes + got, width)
        ends[rows, column] = [p[1] for p in kept]
        counts[rows, column] = [min(p[2], COUNT_CAP) for p in kept]
        sums[rows, column] = [p[3] for p in kept]
        if any(pairs):
            flat = _ints(list(itertools.chain.from_iterable(p[4] for p in kept)))
            which = np.repeat(np.arange(len(kept)), pairs)
            slot = np.arange(len(which)) - np.repeat(np.cumsum(pairs) - pairs, pairs)
            buckets[rows[which], column[which], slot] = flat[0::2]
            hist[rows[which], column[which], slot] = np.minimum(flat[1::2], HIST_CAP)
        return Columns(keys, ends, counts, sums, sizes, buckets, hist)

    # -- checkpoints ---------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        cols = self.columns()
        return {"width": self.width, "ranks": list(cols.ranks), "k": cols.buckets.shape[2],
                "ends": cols.ends.tobytes(), "counts": cols.counts.tobytes(),
                "sums": cols.sums.tobytes(), "sizes": cols.sizes.tobytes(),
                "buckets": cols.buckets.tobytes(), "hist": cols.hist.tobytes()}

    def __setstate__(self, data: dict[str, Any]) -> None:
        width, ranks, k = data["width"], data["ranks"], data["k"]
        n = len(ranks)

        def read(name: str, dtype: Any, shape: tuple) -> np.ndarray:
            return np.frombuffer(data[name], dtype).reshape(shape).copy()

        self.width = width
        self._row_of = {rank: i for i, rank in enumerate(ranks)}
        self._cols = Columns(list(ranks), read("ends", np.float64, (n, width)),
                             read("counts", np.int64, (n, width)),
                             read("sums", np.float64, (n, width)),
                             read("sizes", np.int64, (n,)),
                             read("buckets", np.uint16, (n, width, k)),
                             read("hist", np.uint32, (n, width, k)))
        self._pending = []
        self._lock = threading.Lock()


def _ints(values: list[int]) -> np.ndarray:
    """Histogram numbers as int64 (one past its range, from a broken agent, is clipped)."""
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array([min(v, 2**63 - 1) for v in values], np.int64)
