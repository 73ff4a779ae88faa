"""The timeline grid of a job: the rank x second heat map of time inside collectives, and the
latency and bytes series per op, from a JobState's newest latency summaries (and, for
collectives only the Flight Recorder saw, its samples). A pure function: no clock, no Flask,
no SQL."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dashboard.state import JobState, LatencyStats, group_order
from dashboard.state.recent import Columns


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
    newest = state.recent.newest_ends()  # (group, rank) -> its newest summary's end
    ends = [max(newest.values())] if newest else []
    ends += [max(series) for series in state.op_seconds.values() if series]
    ends += [tallies[-1][0] for tallies in state.fr_tallies.values() if tallies]
    if not ends:
        return {"end": None, "step": 1, "bins": bins, "families": [], "ops": []}
    last = int(max(ends))
    first = last - bins + 1
    sampled: set[str] = set()  # families with rows from the Flight Recorder's samples
    busy_of = _busy_of(state, families, first, bins)  # family -> rank -> percent per bin
    for (g, rank), tallies in state.fr_tallies.items():
        # C++-issued collectives are timed to the agent's poll gap, not to the collective:
        # their busy share comes from how many of its samples found the rank inside one.
        if newest.get((g, rank), -math.inf) >= first:
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


def _busy_of(state: JobState, families: dict[str, str], first: int,
             bins: int) -> dict[str, dict[int, list]]:
    """Per family, each rank's busy percent per second of the grid starting at ``first``
    (None: no summary ended in that second), its groups' together (0 to 100)."""
    cols = state.recent.columns()
    busy = busy_cells(cols, first, bins)
    if busy is None:
        return {}
    # The rows of each (family, rank): its groups' windows, added up.
    found = ~np.isnan(busy)
    shown = np.flatnonzero(found.any(axis=1)).tolist()
    cell: dict[tuple[str, int], int] = {}
    which = [cell.setdefault((families.get(g, g), rank), len(cell))
             for g, rank in (cols.ranks[i] for i in shown)]
    index = (np.array(which)[:, None] * bins + np.arange(bins)).ravel()
    size = len(cell) * bins
    total = np.bincount(index, np.nan_to_num(busy[shown]).ravel(), size).reshape(-1, bins)
    seen = np.bincount(index, found[shown].ravel(), size).reshape(-1, bins) > 0
    # Percents as Python ints from 0 (a broken agent's negative times) to 100, None where no
    # summary ended.
    rows = np.clip(total, 0.0, 100.0).astype(np.int64).astype(object)
    rows[~seen] = None
    out: dict[str, dict[int, list]] = {}
    for (family, rank), row in zip(cell, rows.tolist()):
        out.setdefault(family, {})[rank] = row
    return out


def busy_cells(cols: Columns, first: int, bins: int) -> np.ndarray | None:
    """Each rank's percent of each second of the grid starting at ``first`` spent inside the
    group's collectives, as (ranks, bins) (NaN: no summary ended in that second; None: no
    rank has any). A summary counts over its interval since the one before it (the oldest
    kept over one second), spread over its seconds when longer than one (up to 10); those of
    under a second (PGDASH_STATS_INTERVAL_S) share a second, their percents added. The
    summaries on the grid are each rank's newest that end in it (one agent's end in the order
    it sent them; after a clock that stepped back, those since)."""
    width = cols.width
    if not len(cols.ranks) or not width:
        return None
    held = cols.newest_cells(cols.sizes)
    on = held & (cols.ends >= first)
    on = np.logical_and.accumulate(on[:, ::-1], axis=1)[:, ::-1]  # the newest run of them
    rows, col = np.nonzero(on)
    if not len(rows):
        return None
    after = np.zeros_like(held)
    after[:, 1:] = held[:, :-1]  # a summary with one before it in the window
    dt = np.ones_like(cols.ends)
    dt[:, 1:] = cols.ends[:, 1:] - cols.ends[:, :-1]
    dt = np.where(after & (dt > 1.0) & (dt < 10), dt, 1.0)
    pct = np.rint(cols.sums / 1e4 / dt)[rows, col]
    second = np.trunc(cols.ends[rows, col]).astype(np.int64) - first
    inside = second < bins  # an earlier summary ending after a later one (the clock stepped)
    cell = rows[inside] * bins + second[inside]
    total = np.bincount(cell, weights=pct[inside], minlength=len(cols.ranks) * bins)
    seen = np.bincount(cell, minlength=len(cols.ranks) * bins) > 0
    return np.where(seen, total, np.nan).reshape(len(cols.ranks), bins)
