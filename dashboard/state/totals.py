"""A job's latency totals: per (group, op, rank, source), every summary row so far merged, as
columns (numpy arrays), not as a LatencyStats object per key.

Why columns: the totals are what the fold does most (every row of every rank's summary), and
a 1,024-rank job holds ~12,000 of them. Merged one row at a time into a dict per key, a
9-row summary cost ~50 us of Python; merged as a batch of rows into arrays
(dashboard.state.summaries) it costs what reading the rows costs.

Per key (a row of the table, in the order the keys first came): ``count`` and ``bytes``
(int64), ``sum_us`` and ``max_us`` (float64, the same sums in the same order as adding the
rows one by one), ``resolution_us`` (float64; NaN: exact timing, LatencyStats' None) and a
histogram (int64 per bucket, only the buckets from the lowest to the highest any row held:
``lo``). Counts and bytes saturate at latency.SATURATED (a broken agent's, never a real job's).
The histograms are dense over the buckets of all keys together: keys x that span x 8 bytes
(bench.state_size at 1,024 ranks: 4 KB per rank; a job whose collectives range from 30 us
to 200 ms spans ~100 buckets, ~10 KB per rank at 12 keys a rank).

Read it as a mapping of key -> LatencyStats (made on demand: the API, tests), or through the
vectorised reads the live page and diagnosis use (``merged``, ``percentiles``).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

import numpy as np

from pgdash_agent.wire import HIST_MAX_BUCKET, hist_bucket_value

from dashboard.state.latency import LatencyStats, add_capped

Key = tuple  # (group, op, rank, source)
BUCKET_VALUES = np.array([hist_bucket_value(b) for b in range(HIST_MAX_BUCKET + 1)])


class LatencyTable(Mapping):
    """(group, op, rank, source) -> its rows merged (see the module)."""

    def __init__(self) -> None:
        self._index: dict[Key, int] = {}
        self._keys: list[Key] = []
        self.count = np.zeros(0, np.int64)
        self.bytes = np.zeros(0, np.int64)
        self.sum_us = np.zeros(0)
        self.max_us = np.zeros(0)
        self.resolution_us = np.zeros(0)
        self.hist = np.zeros((0, 0), np.int64)
        self.lo = 0  # the bucket of the histograms' first column

    @classmethod
    def of(cls, stats: Mapping[Key, LatencyStats]) -> "LatencyTable":
        """A table holding these totals (checkpoints of earlier versions: a dict)."""
        out = cls()
        rows = out.rows_of(list(stats))
        values = list(stats.values())
        pairs = [(i, b, n) for i, s in zip(rows.tolist(), values) for b, n in s.hist.items()]
        out.add(rows, np.array([s.count for s in values], np.int64),
                np.array([s.bytes for s in values], np.int64),
                np.array([s.sum_us for s in values], float),
                np.array([s.max_us for s in values], float),
                *(np.array(column, np.int64) for column in (zip(*pairs) if pairs else
                                                            ((), (), ()))))
        for i, s in zip(rows.tolist(), values):
            if s.resolution_us is not None:
                out.resolution_us[i] = s.resolution_us
        return out

    # -- writes ----------------------------------------------------------------------------------

    def rows_of(self, keys: list[Key]) -> np.ndarray:
        """Each key's row (new keys get rows in the order they come)."""
        index = self._index
        found = list(map(index.get, keys))
        if None in found:
            for i, key in enumerate(keys):
                if found[i] is None:
                    row = index.get(key)
                    if row is None:
                        row = index[key] = len(self._keys)
                        self._keys.append(key)
                    found[i] = row
            self._grow(len(self._keys), None, None)
        return np.array(found, np.int64)

    def add(self, rows: np.ndarray, count: np.ndarray, nbytes: np.ndarray, sum_us: np.ndarray,
            max_us: np.ndarray, pair_rows: np.ndarray, buckets: np.ndarray,
            pair_counts: np.ndarray) -> None:
        """Add summary rows (in order): row ``i`` to table row ``rows[i]``; histogram pairs
        (bucket, count) to table rows ``pair_rows``."""
        if not len(rows):
            return
        add_capped(self.count, rows, count)
        add_capped(self.bytes, rows, nbytes)
        np.add.at(self.sum_us, rows, sum_us)  # in order: the sums of adding one by one
        np.maximum.at(self.max_us, rows, max_us)
        if len(buckets):
            self._grow(len(self._keys), int(buckets.min()), int(buckets.max()))
            width = self.hist.shape[1]
            flat = self.hist.reshape(-1)
            add_capped(flat, pair_rows * width + (buckets - self.lo), pair_counts)

    def widen_resolution(self, row: int, resolution_us: float) -> None:
        """A host-polled row's poll gap: the key's resolution is the widest."""
        held = self.resolution_us[row]
        self.resolution_us[row] = max(0.0 if math.isnan(held) else held, resolution_us)

    def _grow(self, n: int, low: int | None, high: int | None) -> None:
        """Room for ``n`` keys and histograms from bucket ``low`` to ``high``."""
        old_n, width = self.hist.shape
        lo, hi = self.lo, self.lo + width - 1
        if width == 0 and low is not None:
            lo, hi = low, high
        elif low is not None:
            lo, hi = min(lo, low), max(hi, high)
        if n == old_n and (lo, hi - lo + 1) == (self.lo, width):
            return
        for name, fill in (("count", 0), ("bytes", 0), ("sum_us", 0.0), ("max_us", 0.0),
                           ("resolution_us", math.nan)):
            old = getattr(self, name)
            if len(old) != n:
                new = np.full(n, fill, old.dtype)
                new[:len(old)] = old
                setattr(self, name, new)
        new_width = hi - lo + 1 if width or low is not None else 0
        hist = np.zeros((n, new_width), np.int64)
        if width:
            hist[:old_n, self.lo - lo:self.lo - lo + width] = self.hist
        self.hist, self.lo = hist, lo

    # -- reads -----------------------------------------------------------------------------------

    def __getitem__(self, key: Key) -> LatencyStats:
        return self._stats(self._index[key])

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def items(self) -> Any:  # the keys in order, each with its LatencyStats
        return list(zip(self._keys, self._all_stats()))

    def values(self) -> Any:
        return self._all_stats()

    def keys(self) -> Any:
        return list(self._keys)

    def _stats(self, i: int) -> LatencyStats:
        nonzero = np.flatnonzero(self.hist[i]) if self.hist.shape[1] else np.zeros(0, int)
        return self._make(i, dict(zip((nonzero + self.lo).tolist(),
                                      self.hist[i, nonzero].tolist())))

    def _all_stats(self) -> list[LatencyStats]:
        rows, columns = np.nonzero(self.hist)
        cuts = np.searchsorted(rows, np.arange(len(self._keys) + 1)).tolist()
        buckets, counts = (columns + self.lo).tolist(), self.hist[rows, columns].tolist()
        return [self._make(i, dict(zip(buckets[cuts[i]:cuts[i + 1]],
                                       counts[cuts[i]:cuts[i + 1]])))
                for i in range(len(self._keys))]

    def _make(self, i: int, hist: dict[int, int]) -> LatencyStats:
        resolution = float(self.resolution_us[i])
        return LatencyStats(int(self.count[i]), int(self.bytes[i]), float(self.sum_us[i]),
                            float(self.max_us[i]), hist,
                            None if math.isnan(resolution) else resolution)

    def key_column(self, field: int) -> list:
        """One field of every key, in row order (0: group, 1: op, 2: rank, 3: source)."""
        return [key[field] for key in self._keys]

    def merged(self, labels: list[Any], where: np.ndarray | None = None
               ) -> dict[Any, LatencyStats]:
        """The keys' totals merged per label (``labels[i]`` is row i's; rows where ``where``
        is false left out), as LatencyStats.merge would merge them in row order: labels in
        the order they first come."""
        order = {label: None for j, label in enumerate(labels)
                 if where is None or where[j]}
        index = {label: i for i, label in enumerate(order)}
        rows = np.arange(len(labels)) if where is None else np.flatnonzero(where)
        of = np.array([index[labels[j]] for j in rows.tolist()], np.int64)
        n = len(index)
        count = np.zeros(n, np.int64)
        nbytes = np.zeros(n, np.int64)
        sums, maxes = np.zeros(n), np.zeros(n)
        add_capped(count, of, self.count[rows])
        add_capped(nbytes, of, self.bytes[rows])
        np.add.at(sums, of, self.sum_us[rows])
        np.maximum.at(maxes, of, self.max_us[rows])
        resolution = np.full(n, -math.inf)
        np.maximum.at(resolution, of, np.nan_to_num(self.resolution_us[rows], nan=-math.inf))
        hist = np.zeros((n, self.hist.shape[1]), np.int64)
        if self.hist.shape[1]:
            add_capped(hist.reshape(-1), (of[:, None] * hist.shape[1]
                                               + np.arange(hist.shape[1])).reshape(-1),
                            self.hist[rows].reshape(-1))
        out = {}
        for label, i in index.items():
            nonzero = np.flatnonzero(hist[i])
            res = float(resolution[i])
            out[label] = LatencyStats(int(count[i]), int(nbytes[i]), float(sums[i]),
                                      float(maxes[i]),
                                      dict(zip((nonzero + self.lo).tolist(),
                                               hist[i, nonzero].tolist())),
                                      None if res == -math.inf else res)
        return out

    def percentiles(self, q: float, rows: np.ndarray) -> list[float | None]:
        """LatencyStats.percentile(q) of each of these rows (exactly, below 2**53 collectives
        a key): the middle of the
        bucket where ``q`` of the row's collectives are reached, never above its maximum
        (rounded to the nanosecond); None for a row without any."""
        if not len(rows) or not self.hist.shape[1]:
            return [None] * len(rows)
        hist = self.hist[rows]
        # In floats, which cannot wrap around (exact below 2**53 collectives)
        cumulative = np.cumsum(hist, axis=1, dtype=float)
        total = cumulative[:, -1]
        # (the first bucket holding any: one with none is no answer, even at q = 0)
        reached = np.argmax((cumulative >= (q * total)[:, None]) & (hist > 0), axis=1)
        values = BUCKET_VALUES[reached + self.lo].tolist()
        return [round(min(v, m), 3) if t else None
                for v, m, t in zip(values, self.max_us[rows].tolist(), total.tolist())]

    # -- checkpoints -----------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # Plain bytes and numbers: a checkpoint names no numpy class (dashboard.storage.codec).
        return {"keys": list(self._keys), "lo": self.lo, "width": self.hist.shape[1],
                **{name: getattr(self, name).tobytes() for name in
                   ("count", "bytes", "sum_us", "max_us", "resolution_us", "hist")}}

    def __setstate__(self, data: dict[str, Any]) -> None:
        self.__init__()
        self._keys = list(data["keys"])
        self._index = {key: i for i, key in enumerate(self._keys)}
        n = len(self._keys)
        for name, dtype in (("count", np.int64), ("bytes", np.int64), ("sum_us", np.float64),
                            ("max_us", np.float64), ("resolution_us", np.float64)):
            setattr(self, name, np.frombuffer(data[name], dtype).copy())
        self.hist = np.frombuffer(data["hist"], np.int64).reshape(n, data["width"]).copy()
        self.lo = data["lo"]
