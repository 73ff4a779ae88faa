"""The straggler and slow rules' windows: the newest RECENT_INTERVALS latency summaries of
every (group, rank) of a job, kept as columns (numpy arrays), not as a tuple per summary.

A summary is ``(end, count, sum_us, histogram)``: when its interval ended (the agent's clock),
the group's collectives in it (all ops together, point-to-point and host-polled rows left
out: dashboard.state.summaries), the time spent inside them, and their latency
histogram (flat: bucket, count, bucket, count, ...; see pgdash_agent.wire).

Why columns: a 1,024-rank job holds ~245,000 summaries (60 per rank and group). As tuples
they were 19 of a checkpoint's 24 MB and 274 ms of its load, ~80 KB of memory per rank, and
reading them scattered over the heap was most of a judgement (the rules read them across
ranks, interval by interval: rules.windows). Here each (group, rank) is one row, the newest
summary in the last column (rows are right-aligned; an empty cell has count 0), all of a
job's in the same arrays: a job has hundreds of groups, and an array operation per group
cost more than the arithmetic itself.

The fold appends summaries a batch at a time, as columns (``extend``:
dashboard.state.summaries), vectorised: writing single cells of arrays one summary at a time
cost more than the arithmetic. The histograms are most of the bytes (up to K buckets per
summary, K the most any summary had), so they never move: they sit in a ring per row, and
what reads a summary's histogram goes through its slot (``Columns.slots``); moving,
selecting or reordering summaries moves only their slots.

Counts are kept as 64-bit integers clipped at COUNT_CAP, a histogram's counts clipped at
HIST_CAP (an interval of half a second holds at most ~10^6 collectives: the caps only bound
what a broken agent can make the arithmetic do). A histogram's counts are stored as 16-bit
integers, the rare one of SATURATED or more (65,535 collectives of one bucket in one
interval) as SATURATED with its value beside (``_over``): what is read is exact, and the
histograms, most of the bytes, take two thirds of what 32-bit counts took.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import numpy as np

from pgdash_agent.wire import HIST_MAX_BUCKET as HIST_MAX

RECENT_INTERVALS = 60  # latency summaries kept per (group, rank) for the straggler rule
COUNT_CAP = 2**56  # a summary's count of collectives, at most (60 of them fit in an int64)
HIST_CAP = 2**32 - 1  # a histogram bucket's count, at most (uint32)
SATURATED = 2**16 - 1  # a stored count this high: its value is in RecentWindows._over

Point = tuple  # (end, count, sum_us, flat histogram)


class Columns:
    """Windows at one moment: ``ranks`` (what each row is the window of: in RecentWindows its
    (group, rank), in the rules' windows of a group its rank), and per row, right-aligned
    (the newest summary last; an empty cell has count 0), ``ends``, ``counts``, ``sums``
    and ``slots`` (rows, width) and ``sizes`` (the summaries each holds). A summary's
    histogram is read through ``histograms`` (``store``'s ring, row ``store_rows``, slot
    ``slots``; the empty slot holds none).

    RecentWindows.columns returns its own arrays, which its next append changes in place
    (moving 60 summaries of every row to new arrays each second was most of the cost of
    keeping them): read them before the fold appends again (the rules read under the
    state's lock; reading a histogram after the store moved on raises). What ``select``,
    ``rows`` and ``cut`` make are copies or views of their own."""

    __slots__ = ("ranks", "ends", "counts", "sums", "sizes", "slots", "store_rows", "store",
                 "generation", "span")

    def __init__(self, ranks: list, ends: np.ndarray, counts: np.ndarray, sums: np.ndarray,
                 sizes: np.ndarray, slots: np.ndarray, store_rows: np.ndarray,
                 store: "RecentWindows", generation: int, span: tuple[int, int]):
        self.ranks = ranks
        self.ends, self.counts, self.sums, self.sizes = ends, counts, sums, sizes
        self.slots, self.store_rows = slots, store_rows
        self.store, self.generation = store, generation
        self.span = span  # lowest and highest bucket any histogram may hold collectives in

    def _like(self, ranks: list, ends: np.ndarray, counts: np.ndarray, sums: np.ndarray,
              sizes: np.ndarray, slots: np.ndarray, store_rows: np.ndarray) -> "Columns":
        return Columns(ranks, ends, counts, sums, sizes, slots, store_rows, self.store,
                       self.generation, self.span)

    @property
    def width(self) -> int:
        return self.ends.shape[1]

    def newest_cells(self, n: np.ndarray) -> np.ndarray:
        """(rows, width): the cells of each row's newest ``n`` (per row) columns; with
        ``sizes``, the cells that hold a summary."""
        return np.arange(self.width)[None, :] >= self.width - n[:, None]

    def histograms(self, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The buckets and counts (rows, width - start, K) of the histograms of each row's
        summaries from column ``start`` on."""
        store = self.store
        if store.generation != self.generation:
            raise RuntimeError("latency windows read after the fold appended to them: read "
                               "RecentWindows.columns() again")
        rows = self.store_rows[:, None]
        slots = self.slots[:, start:]
        hist = store.hist[rows, slots].astype(np.uint32)
        if store._over:  # the counts too big for 16 bits
            for i, j, k in zip(*np.nonzero(hist == SATURATED)):
                hist[i, j, k] = store._over.get(
                    (int(self.store_rows[i]), int(slots[i, j]), int(k)), SATURATED)
        return store.buckets[rows, slots], hist

    def points(self, row: int) -> list[Point]:
        """Row ``row``'s summaries, oldest first, as (end, count, sum_us, flat histogram)."""
        start = self.width - int(self.sizes[row])
        one = self.rows([row])
        buckets, hist = one.histograms(start)
        return [(e, c, s, _flat_of(b, h)) for e, c, s, b, h in zip(
            one.ends[0, start:].tolist(), one.counts[0, start:].tolist(),
            one.sums[0, start:].tolist(), buckets[0].tolist(), hist[0].tolist())]

    def cut(self, start: int, stop: int | None = None) -> "Columns":
        """Each row's cells from column ``start`` to ``stop`` (views), sizes counted anew."""
        stop = self.width if stop is None else stop
        held = np.clip(stop - (self.width - self.sizes), 0, stop - start)
        return self._like(self.ranks, self.ends[:, start:stop], self.counts[:, start:stop],
                          self.sums[:, start:stop], held, self.slots[:, start:stop],
                          self.store_rows)

    def select(self, keep: np.ndarray) -> "Columns":
        """The summaries where ``keep`` (rows, width) is true, right-aligned again (each row's
        kept summaries in their order, empty cells emptied)."""
        # A stable sort of each row's cells by kept-ness puts the kept last, in order.
        order = np.argsort(keep, axis=1, kind="stable")
        kept = np.take_along_axis(keep, order, axis=1)

        def move(a: np.ndarray, empty: Any = 0) -> np.ndarray:
            out = np.take_along_axis(a, order, axis=1)
            out[~kept] = empty
            return out

        return self._like(self.ranks, move(self.ends), move(self.counts), move(self.sums),
                          keep.sum(axis=1), move(self.slots, self.store.empty_slot),
                          self.store_rows)

    def rows(self, which: np.ndarray | list[int] | range) -> "Columns":
        """Only the rows ``which`` (indices), in that order."""
        which = np.asarray(which, dtype=np.int64)
        return self._like([self.ranks[i] for i in which.tolist()], self.ends[which],
                          self.counts[which], self.sums[which], self.sizes[which],
                          self.slots[which], self.store_rows[which])


def _flat_of(buckets: list[int], counts: list[int]) -> tuple:
    return tuple(itertools.chain.from_iterable((b, c) for b, c in zip(buckets, counts) if c))


class RecentWindows:
    """The newest RECENT_INTERVALS summaries of each (group, rank) of a job (see the module).

    ``extend`` is the fold's (summaries as columns), ``append`` one summary of one rank in
    one group; ``columns`` the rules' (all rows, as arrays); ``window`` one row's as tuples.
    Pickled as plain bytes and numbers, so that a checkpoint names no numpy class
    (dashboard.storage.codec allows only pgdash's own)."""

    def __init__(self, width: int = RECENT_INTERVALS) -> None:
        self.width = width
        self.generation = 0  # appends and clears so far: Columns read after one raise
        self._reset()

    def _reset(self) -> None:
        width = self.width
        self._row_of: dict[Any, int] = {}
        self._keys: list = []
        self.ends, self.counts, self.sums = (np.zeros((0, width)), np.zeros((0, width), np.int64),
                                             np.zeros((0, width)))
        self.sizes = np.zeros(0, np.int64)
        # The histograms' ring: per row, width slots and an empty one (``empty_slot``);
        # ``head``: the slot of each row's first column.
        self.buckets = np.zeros((0, width + 1, 1), np.uint16)
        self.hist = np.zeros((0, width + 1, 1), np.uint16)  # SATURATED: see _over
        # (row, slot, pair) -> a histogram's count of SATURATED or more
        self._over: dict[tuple[int, int, int], int] = {}
        self.head = np.zeros(0, np.int64)
        self.span = (HIST_MAX, 0)  # no bucket yet
        self._cols: Columns | None = None

    @property
    def empty_slot(self) -> int:
        return self.width

    def append(self, key: tuple[str, int], end: float, count: int, sum_us: float,
               flat: tuple) -> None:
        """One summary (``extend`` with one)."""
        self._extend_points([(key, (end, count, sum_us, flat))])

    def clear(self) -> None:
        self._reset()
        self.generation += 1

    def __len__(self) -> int:
        """(group, rank)s with summaries."""
        return len(self._row_of)

    def __bool__(self) -> bool:
        return bool(self._row_of)

    def columns(self) -> Columns:
        """Every row's summaries as arrays (the store's own: see Columns)."""
        cols = self._cols
        if cols is None:
            width = self.width
            column = np.arange(width)[None, :]
            slots = (self.head[:, None] + column) % width
            slots[column < width - self.sizes[:, None]] = self.empty_slot
            cols = self._cols = Columns(self._keys, self.ends, self.counts, self.sums,
                                        self.sizes, slots, np.arange(len(self._keys)), self,
                                        self.generation, self.span)
        return cols

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
    def of(cls, windows: dict[Any, Iterable[Point]],
           width: int = RECENT_INTERVALS) -> "RecentWindows":
        """Windows holding these summaries (oldest first; only the newest ``width`` kept)."""
        out = cls(width)
        out._extend_points([(key, point) for key, points in windows.items()
                            for point in points])
        return out

    # -- appends into the arrays ---------------------------------------------------------------

    def _extend_points(self, points: list[tuple[Any, Point]]) -> None:
        """``extend`` with (key, summary) pairs, in order."""
        if not points:
            return
        keys, summaries = zip(*points)
        ends, counts, sums, flats = zip(*summaries)
        flat = _ints(list(itertools.chain.from_iterable(flats)))
        self.extend(list(keys), np.array(ends, float), _ints(counts), np.array(sums, float),
                    np.fromiter(map(len, flats), np.int64, len(flats)) // 2, flat[0::2],
                    flat[1::2])

    def extend(self, keys: list[tuple[str, int]], ends: np.ndarray, counts: np.ndarray,
               sums: np.ndarray, pairs: np.ndarray, buckets: np.ndarray,
               pair_counts: np.ndarray) -> None:
        """Append summaries given as columns (what ``append`` takes, one per key, in order):
        summary i's histogram is the next ``pairs[i]`` of ``buckets`` and ``pair_counts``.
        Vectorised: one pass per array for the whole batch, whatever the rows it touches."""
        if not keys:
            return
        width = self.width
        row_of = self._row_of
        n = len(keys)
        added = [key for key in dict.fromkeys(keys) if key not in row_of]
        if added:
            row_of.update(zip(added, range(len(row_of), len(row_of) + len(added))))
            self._keys = self._keys + added  # a new list: Columns hold the old one
        rows = np.fromiter(map(row_of.__getitem__, keys), np.int64, n)
        total = len(self._keys)
        # Each summary's place among its row's new ones, and how many each row gets.
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
        run = np.diff(np.r_[starts, n])
        place = np.empty(n, np.int64)
        place[order] = np.arange(n) - np.repeat(starts, run)
        got = np.bincount(rows, minlength=total)
        keep = place >= got[rows] - width  # more than a window's worth: only the newest
        if not keep.all():
            kept_pairs = np.repeat(keep, pairs)
            buckets, pair_counts = buckets[kept_pairs], pair_counts[kept_pairs]
            rows, place, ends, counts, sums, pairs = (
                a[keep] for a in (rows, place, ends, counts, sums, pairs))
        self._grow(total, int(pairs.max(initial=1)))
        # Each row's old summaries move left by as many as it gets (in place: rows that get
        # the same number together, mostly all of them), the cells they leave emptied; their
        # histograms stay in their ring, whose head moves on as far.
        shift = np.minimum(got, width)
        for by in np.unique(shift[shift > 0]).tolist():
            moved = np.flatnonzero(shift == by)
            every = len(moved) == total
            for a in (self.ends, self.counts, self.sums):
                if every:
                    a[:, :width - by] = a[:, by:]
                    a[:, width - by:] = 0
                else:
                    a[moved, :width - by] = a[moved, by:]
                    a[moved, width - by:] = 0
        self.head = (self.head + shift) % width
        self.sizes = np.minimum(self.sizes + got, width)
        column = width - got[rows] + place
        self.ends[rows, column] = ends
        self.counts[rows, column] = np.minimum(counts, COUNT_CAP)
        self.sums[rows, column] = sums
        # The new summaries' slots: where the summaries that left were.
        slot = (self.head[rows] + column) % width
        self.buckets[rows, slot] = 0
        self.hist[rows, slot] = 0
        if self._over:  # the big counts of the summaries that left
            gone = set(zip(rows.tolist(), slot.tolist()))
            self._over = {key: n for key, n in self._over.items() if key[:2] not in gone}
        if len(buckets):
            which = np.repeat(np.arange(len(pairs)), pairs)
            pair = np.arange(len(which)) - np.repeat(np.cumsum(pairs) - pairs, pairs)
            self.buckets[rows[which], slot[which], pair] = buckets
            self._put_counts(rows[which], slot[which], pair, np.minimum(pair_counts, HIST_CAP))
            self.span = (min(self.span[0], int(buckets.min())),
                         max(self.span[1], int(buckets.max())))
        self.generation += 1
        self._cols = None

    def _put_counts(self, rows: np.ndarray, slots: np.ndarray, pairs: np.ndarray,
                    counts: np.ndarray) -> None:
        """Histogram counts into their cells: 16 bits, the big ones beside (``_over``)."""
        self.hist[rows, slots, pairs] = np.minimum(counts, SATURATED)
        for i in np.flatnonzero(counts >= SATURATED).tolist():
            self._over[(int(rows[i]), int(slots[i]), int(pairs[i]))] = int(counts[i])

    def _grow(self, rows: int, k: int) -> None:
        """Room for ``rows`` rows and histograms of ``k`` buckets."""
        old, have = len(self.ends), self.buckets.shape[2]
        if rows == old and k <= have:
            return
        k = max(k, have)

        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros((rows,) + a.shape[1:2] + ((k,) if a.ndim == 3 else ()), a.dtype)
            if a.ndim == 3:
                out[:old, :, :have] = a
            else:
                out[:old] = a
            return out

        self.ends, self.counts, self.sums = grown(self.ends), grown(self.counts), grown(self.sums)
        self.buckets, self.hist = grown(self.buckets), grown(self.hist)
        self.sizes, self.head = grown(self.sizes), grown(self.head)

    # -- checkpoints ---------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # The ring unrolled (oldest first, a row's empty cells first), the histogram counts
        # as stored, 16-bit, with those of SATURATED or more beside: a 1,024-rank job's
        # windows are most of its checkpoint (~30 MB pickled), and 32-bit counts made them
        # a third larger (and its burst of memory while taken and loaded).
        cols = self.columns()
        rows = cols.store_rows[:, None]
        over = [(row, (slot - int(self.head[row])) % self.width, k, n)
                for (row, slot, k), n in self._over.items()]
        return {"width": self.width, "ranks": list(cols.ranks), "k": self.buckets.shape[2],
                "ends": cols.ends.tobytes(), "counts": cols.counts.tobytes(),
                "sums": cols.sums.tobytes(), "sizes": cols.sizes.tobytes(),
                "buckets": self.buckets[rows, cols.slots].tobytes(),
                "hist16": self.hist[rows, cols.slots].tobytes(), "over": over}

    def __setstate__(self, data: dict[str, Any]) -> None:
        width, keys, k = data["width"], data["ranks"], data["k"]
        n = len(keys)

        def view(name: str, dtype: Any, shape: tuple) -> np.ndarray:
            """The stored bytes as an array (read-only: copy it to keep it)."""
            return np.frombuffer(data[name], dtype).reshape(shape)

        def read(name: str, dtype: Any, shape: tuple) -> np.ndarray:
            return view(name, dtype, shape).copy()

        self.width = width
        self.generation = 0
        self._reset()
        self._keys = list(keys)
        self._row_of = {key: i for i, key in enumerate(keys)}
        self.ends = read("ends", np.float64, (n, width))
        self.counts = read("counts", np.int64, (n, width))
        self.sums = read("sums", np.float64, (n, width))
        self.sizes = read("sizes", np.int64, (n,))
        # Stored in columns' order (a row's empty cells first): each column in its own slot.
        self.buckets = np.zeros((n, width + 1, k), np.uint16)
        self.hist = np.zeros((n, width + 1, k), np.uint16)
        self.buckets[:, :width] = view("buckets", np.uint16, (n, width, k))
        if "hist16" in data:
            self.hist[:, :width] = view("hist16", np.uint16, (n, width, k))
            self._over = {(row, column, pair): count
                          for row, column, pair, count in data["over"]}
        else:  # a checkpoint of an earlier pgdash: 32-bit counts
            counts = view("hist", np.uint32, (n, width, k))
            self.hist[:, :width] = np.minimum(counts, SATURATED)
            big = np.nonzero(counts >= SATURATED)  # (their cells only: rare)
            self._put_counts(*big, counts[big])
        self.head = np.zeros(n, np.int64)
        used = self.buckets[self.hist > 0]
        self.span = (int(used.min()), int(used.max())) if len(used) else (HIST_MAX, 0)


def _ints(values: Iterable[int]) -> np.ndarray:
    """Counts as int64 (one past its range, from a broken agent, is clipped)."""
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array([min(v, 2**63 - 1) for v in values], np.int64)
