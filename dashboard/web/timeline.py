"""The timeline grid of a job: the rank x second heat map of time inside collectives, and the
latency and bytes series per op, from a JobState's newest latency summaries (and, for
collectives only the Flight Recorder saw, its samples). A pure function: no clock, no Flask,
no SQL."""

from __future__ import annotations

import array
import collections
import itertools
import threading
from typing import Any

from dashboard.state import JobState, LatencyStats, group_order


def timeline_grid(state: JobState, bins: int = 30) -> dict[str, Any]:
    """Recent collectives on a common one-second grid, per group family.

    ``families``: per family, a heat map rank x time in ``busy`` (percent of each second
    a rank spent inside the family's collectives; None where it reported nothing).
    ``ops``: per family and op, per second, the collectives of all its ranks: ``count``,
    ``bytes`` and latency ``p50_us``/``p99_us`` from their merged histograms (None where
    none ran). Compact on purpose: 1,024 ranks in four families are about 120,000 small
    integers. Bins are whole seconds of the agents' own clocks (``end`` of a summary).

    Collectives issued from C++ (DDP's gradient all-reduces, seen by the Flight Recorder)
    count too: their summaries are in ``ops``, and where a rank's group has no timed
    summaries its busy cells are the share of the agent's Flight Recorder samples that found
    it inside one (a family drawn so, in part or whole, carries ``"sampled": true``).
    """
    families = state.families()
    ends = [w[-1][0] for w in state.recent.values() if w]
    ends += [max(series) for series in state.op_seconds.values() if series]
    ends += [tallies[-1][0] for tallies in state.fr_tallies.values() if tallies]
    if not ends:
        return {"end": None, "step": 1, "bins": bins, "families": [], "ops": []}
    last = int(max(ends))
    first = last - bins + 1
    busy_of: dict[str, dict[int, list]] = {}  # family -> rank -> busy percent per bin
    sampled: set[str] = set()  # families with rows from the Flight Recorder's samples
    busy_rows = _busy_rows(state)
    for (g, rank), window in state.recent.items():
        rows = busy_of.setdefault(families.get(g, g), {})
        row = busy_rows.row(g, rank, window, first, bins, rows.get(rank))
        if row is not None:
            rows[rank] = row
    for (g, rank), tallies in state.fr_tallies.items():
        # C++-issued collectives are timed to the agent's poll gap, not to the collective:
        # their busy share comes from how many of its samples found the rank inside one.
        if (g, rank) in state.recent and state.recent[(g, rank)] and \
                state.recent[(g, rank)][-1][0] >= first:
            continue
        cells = [(int(t) - first, busy, n) for t, busy, n in tallies
                 if n and int(t) >= first]
        if not cells:
            continue
        family = families.get(g, g)
        rows = busy_of.setdefault(family, {})
        row = rows.get(rank)
        if row is None:
            row = rows[rank] = [None] * bins
        for b, busy, n in cells:
            pct = round(100 * busy / n)
            row[b] = pct if row[b] is None else max(row[b], pct)
        sampled.add(family)
    order = list(dict.fromkeys(families[name] for name in sorted(state.groups,
                                                                 key=group_order)))
    order += sorted(f for f in busy_of if f not in order)
    out = []
    for family in order:
        rows = busy_of.get(family)
        if not rows:
            continue
        ranks = sorted(rows)
        fam = {"family": family, "groups": sorted(
            (g for g, f in families.items() if f == family), key=group_order),
            "ranks": ranks, "busy": [rows[r] for r in ranks]}
        if family in sampled:
            fam["sampled"] = True
        out.append(fam)
    return {"end": last, "step": 1, "bins": bins, "families": out,
            "ops": _op_series(state, families, order, first, bins)}


def _op_series(state: JobState, families: dict[str, str], order: list[str], first: int,
               bins: int) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str, str], list[LatencyStats | None]] = {}
    seconds = range(first, first + bins)
    for (g, op, src), series in state.op_seconds.items():
        cells = merged.setdefault((families.get(g, g), op, src), [None] * bins)
        for b, second in enumerate(seconds):
            stats = series.get(second)
            if stats is not None:
                cell = cells[b]
                if cell is None:
                    cell = cells[b] = LatencyStats()
                cell.merge(stats)
    rank_of = {f: i for i, f in enumerate(order)}
    out = []
    for (family, op, src), cells in sorted(merged.items(), key=lambda kv: (
            rank_of.get(kv[0][0], len(rank_of)), kv[0])):
        if all(c is None for c in cells):
            continue
        out.append({"family": family, "op": op, "source": src,
                    "count": [c.count if c else 0 for c in cells],
                    "bytes": [c.bytes if c else 0 for c in cells],
                    "p50_us": [c.percentile(0.5) if c else None for c in cells],
                    "p99_us": [c.percentile(0.99) if c else None for c in cells]})
    return out


def busy_row(window: collections.deque, first: int, bins: int,
             into: list | None = None) -> list | None:
    """One (group, rank) window's busy percent per second of the grid starting at ``first``,
    added to ``into`` (the row of another group of the family) if given (None: no summary
    on the grid). The definition; _BusyRows keeps the same sums as the fold goes."""
    # The summaries on the grid are the window's newest (one agent's summaries end in the
    # order it sent them): back to the first before the grid, whose end starts the interval
    # of the first on it, then forward.
    start = len(window)
    while start and window[start - 1][0] >= first:
        start -= 1
    if start == len(window):
        return None
    row: list = [None] * bins if into is None else into
    prev_end = window[start - 1][0] if start else None
    for end, _count, sum_us, _hist in itertools.islice(window, start, None):
        b = int(end) - first
        dt = end - prev_end if prev_end is not None else 1.0
        prev_end = end
        pct = _pct(sum_us, dt)
        row[b] = min(100, pct if row[b] is None else row[b] + pct)
    return row


def _pct(sum_us: float, dt: float) -> int:
    # Summaries of under a second (PGDASH_STATS_INTERVAL_S) share a bin: their busy times
    # add up; a longer one is spread over its seconds.
    return round(sum_us / 1e4 / (dt if 1.0 < dt < 10 else 1.0))


def _busy_rows(state: JobState) -> "_BusyRows":
    return state.kept("busy_rows", _BusyRows)


class _BusyRows:
    """busy_row() of every window, kept in step with the fold: a moment later costs the
    summaries appended since (and those that fell off a window's far end), not every
    window again. At 1,024 ranks the windows hold ~300,000 summaries on a 30-second grid,
    and reading them all was half of a replayed moment; what is kept is ~1.7 KB a window.
    A window whose ends go back in time (an agent's clock stepped back) or that holds a
    negative or absurd time is read whole, as is a grid longer than RING seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # two readers of one state (the live push, the API)
        self._of: dict[tuple[str, int], _Window] = {}

    def row(self, group: str, rank: int, window: collections.deque, first: int, bins: int,
            into: list | None) -> list | None:
        """busy_row(window, first, bins, into)."""
        with self._lock:
            kept = self._of.get((group, rank))
            if kept is None or not kept.follow(window):
                kept = _Window(window)
            if not kept.exact:
                self._of.pop((group, rank), None)
            else:
                self._of[(group, rank)] = kept
                if kept.holds(first):
                    return kept.row(first, bins, into)
        return busy_row(window, first, bins, into)


RING = 64  # seconds of busy sums kept per window: the grid's 30 and then some
EMPTY = -1  # a second of the ring no summary ended in
MAX_PCT = 2**24  # a summary's busy percent kept in the ring (60 of them fit in an int32)


class _Window:
    """The sums busy_row() makes of one window whose ends only go forward, for each of its
    newest RING seconds: each summary counts its busy percent over its interval from the
    one before it, the window's oldest over one second (nothing before it is left).

    Of the summaries it has taken in it keeps only their ends and busy times, as numbers
    (and the newest itself, to find where to go on from): a follower read every 20 s or so
    (a big job's keyframes) held on to every summary that left its window meanwhile, tens of
    megabytes at 1,024 ranks."""

    __slots__ = ("window", "ends", "sums", "last", "ring", "newest", "exact")

    def __init__(self, window: collections.deque) -> None:
        self.window = window
        self.ends = array.array("d")  # the summaries' ends and busy times, oldest first:
        self.sums = array.array("d")  # at most the window's maxlen
        self.last: Any = None  # the newest summary taken in
        self.ring = array.array("i", [EMPTY]) * RING  # second % RING -> busy percent
        self.newest = -2**62  # the newest summary's second
        self.exact = True  # False: ends that go back, or a time out of bounds
        self._append(window)

    def follow(self, window: collections.deque) -> bool:
        """Take in what was appended to ``window`` since; False: it is not the window this
        follows any more (replaced, emptied, or more appended than it holds)."""
        if window is not self.window:
            return False
        if not window:
            return not self.ends
        if not self.ends:
            self._append(window)
            return True
        last = self.last
        for i in range(len(window) - 1, -1, -1):
            if window[i] is last:
                self._append(itertools.islice(window, i + 1, None))
                return True
        return False

    def _append(self, summaries: Any) -> None:
        ends, sums, ring, most = self.ends, self.sums, self.ring, self.window.maxlen
        for entry in summaries:
            if most is not None and len(ends) == most:  # its oldest falls off the window
                old_end, old_sum = ends.pop(0), sums.pop(0)
                second = int(old_end)
                self._add(second, -_pct(old_sum, 1.0))
                if ends:  # the next is the oldest now: over one second
                    self._add(int(ends[0]), _pct(sums[0], 1.0) - _pct(sums[0], ends[0] - old_end))
                if (not ends or int(ends[0]) != second) and second > self.newest - RING:
                    ring[second % RING] = EMPTY
            end, sum_us = entry[0], entry[2]
            alone = _pct(sum_us, 1.0)
            pct = alone if not ends else _pct(sum_us, end - ends[-1])
            if not (0 <= alone < MAX_PCT and 0 <= pct < MAX_PCT) or \
                    (ends and end < ends[-1]):
                self.exact = False  # read whole (BusyRows drops this one)
                return
            second = int(end)
            if second > self.newest:  # the seconds it moves past are empty
                for s in range(max(self.newest + 1, second - RING + 1), second + 1):
                    ring[s % RING] = EMPTY
                self.newest = second
            self._add(second, pct)
            ends.append(end)
            sums.append(sum_us)
            self.last = entry

    def _add(self, second: int, pct: int) -> None:
        if second > self.newest - RING:  # older seconds left the ring: no grid reads them
            i = second % RING
            self.ring[i] = pct if self.ring[i] == EMPTY else self.ring[i] + pct

    def holds(self, first: int) -> bool:
        return first > self.newest - RING

    def row(self, first: int, bins: int, into: list | None) -> list | None:
        if not self.ends or self.ends[-1] < first:
            return None
        row: list = [None] * bins if into is None else into
        ring = self.ring
        for b in range(min(bins, self.newest - first + 1)):
            pct = ring[(first + b) % RING]
            if pct != EMPTY:
                # Percentages of 0 or more: busy_row's running min(100, ...) is the sum's.
                row[b] = min(100, pct if row[b] is None else row[b] + pct)
        return row
