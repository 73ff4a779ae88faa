"""The timeline grid of a job: the rank x second heat map of time inside collectives, and the
latency and bytes series per op, from a JobState's newest latency summaries (and, for
collectives only the Flight Recorder saw, its samples). A pure function: no clock, no Flask,
no SQL."""

from __future__ import annotations

import itertools
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
    for (g, rank), window in state.recent.items():
        # The summaries on the grid are the window's newest (one agent's summaries end in
        # the order it sent them): back to the first before the grid, whose end starts the
        # interval of the first on it, then forward. At 256 ranks this is most of a moment's
        # views, and about half a window lies before the grid.
        start = len(window)
        while start and window[start - 1][0] >= first:
            start -= 1
        if start == len(window):
            continue
        rows = busy_of.setdefault(families.get(g, g), {})
        row = rows.get(rank)
        if row is None:
            row = rows[rank] = [None] * bins
        prev_end = window[start - 1][0] if start else None
        for end, _count, sum_us, _hist in itertools.islice(window, start, None):
            b = int(end) - first
            dt = end - prev_end if prev_end is not None else 1.0
            prev_end = end
            # Summaries of under a second (PGDASH_STATS_INTERVAL_S) share a bin: their busy
            # times add up; a longer one is spread over its seconds.
            pct = round(sum_us / 1e4 / (dt if 1.0 < dt < 10 else 1.0))
            row[b] = min(100, pct if row[b] is None else row[b] + pct)
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
