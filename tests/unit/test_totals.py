"""The latency totals as columns (dashboard.state.totals): what their vectorised reads give
equals what LatencyStats gives one key at a time."""

import math
import random

import numpy as np

from dashboard.state import LatencyStats
from dashboard.state.latency import SATURATED
from dashboard.state.totals import LatencyTable


def _random_stats(rng: random.Random) -> dict[tuple, LatencyStats]:
    out = {}
    for rank in range(12):
        for group, op in (("0", "all_reduce"), ("1", "broadcast"), ("0", "barrier")):
            if rng.random() < 0.2:
                continue  # not every rank runs every op
            stats = LatencyStats()
            for _ in range(rng.randrange(1, 6)):
                hist = {}
                for _ in range(rng.randrange(1, 9)):
                    bucket = rng.randrange(40, 200)
                    hist[bucket] = hist.get(bucket, 0) + rng.randrange(1, 50)
                stats.add({"count": sum(hist.values()), "bytes": rng.randrange(1 << 30),
                           "sum_us": rng.random() * 1e6, "max_us": rng.random() * 3e5,
                           "hist": list(hist.items())})
            if rng.random() < 0.2:
                stats.resolution_us = rng.random() * 500
            out[(group, op, rank, "wrapper" if rank % 5 else "flight_recorder")] = stats
    return out


def test_a_table_reads_as_the_latency_stats_it_was_made_of():
    stats = _random_stats(random.Random(7))
    table = LatencyTable.of(stats)
    assert list(table) == list(stats) and len(table) == len(stats)
    for key, expected in stats.items():
        assert table[key] == expected
    assert dict(table.items()) == stats
    rows = np.arange(len(table))
    for q in (0.0, 0.5, 0.99, 1.0):
        assert table.percentiles(q, rows) == [s.percentile(q) for s in stats.values()]


def test_merged_rows_equal_latency_stats_merged_in_row_order():
    stats = _random_stats(random.Random(11))
    table = LatencyTable.of(stats)
    labels = [(group, source) for group, _op, _rank, source in stats]
    where = np.array([s.resolution_us is None for s in stats.values()])
    for mask in (None, where):
        expected: dict = {}
        for i, (label, s) in enumerate(zip(labels, stats.values())):
            if mask is None or mask[i]:
                expected.setdefault(label, LatencyStats()).merge(s)
        got = table.merged(labels, mask)
        assert list(got) == list(expected)
        for label in expected:  # the float sums too, to the last bit
            assert got[label] == expected[label], label


def test_counts_from_a_broken_agent_stop_at_the_cap_instead_of_wrapping_around():
    table = LatencyTable()
    rows = table.rows_of([("0", "all_reduce", 0, "wrapper")] * 3)
    huge = np.array([2**63 - 1] * 3, np.int64)
    table.add(rows, huge, huge, np.ones(3), np.ones(3), rows, np.array([5, 5, 6]), huge)
    stats = table[("0", "all_reduce", 0, "wrapper")]
    assert stats.count == stats.bytes == SATURATED
    assert stats.hist == {5: SATURATED, 6: SATURATED} and stats.sum_us == 3.0
    assert math.isclose(stats.percentile(0.5), table.percentiles(0.5, rows[:1])[0])


def test_capped_adds_are_exact_below_the_cap_and_stop_at_it_beside_a_saturated_total():
    from dashboard.state.latency import add_capped

    total = np.array([SATURATED - 5, 7, 0], np.int64)
    at = np.array([0, 1, 0, 2, 1])
    add_capped(total, at, np.array([3, 2**40, 3, 9, 1], np.int64))
    assert total.tolist() == [SATURATED, 7 + 2**40 + 1, 9]
    big = LatencyTable.of({("0", "x", 0, "wrapper"): LatencyStats(
        3, 0, 1.0, 99.0, {10: 2**62, 20: 2**62, 30: 1})})
    assert big.percentiles(0.99, np.arange(1)) == [big["0", "x", 0, "wrapper"].percentile(0.99)]


def test_a_summary_row_without_a_histogram_folds_like_any_other():
    """A row of no collectives (count 0, no histogram: the wire allows it) is a point of
    no bucket in the windows, as it was folded one row at a time."""
    from dashboard.state import JobState
    from tests.helpers.events import running

    log = running(1)
    log.add("s0", "coll_stats", {"start": 100.5, "end": 101.0, "rows": [
        {"group": "0", "op": "all_reduce", "count": 0, "bytes": 0, "sum_us": 0.0,
         "max_us": 0.0, "hist": []}]}, t=101.0)
    state = JobState(1, "job").apply_all(log.events)
    assert state.recent.windows() == {("0", 0): [(101.0, 0, 0.0, ())]}
    assert state.collectives["0", "all_reduce", 0, "wrapper"] == LatencyStats()


def test_a_body_missing_a_field_raises_and_leaves_the_summaries_around_it_whole():
    """Validation keeps such bodies out of the log; a stored log from elsewhere may hold one.
    Its event raises, as it always did, and the summaries waiting with it fold as they are."""
    import pytest

    from dashboard.state import JobState
    from tests.helpers.events import running

    def row(**fields):
        return {"group": "0", "op": "all_reduce", "count": 3, "bytes": 0, "sum_us": 1.0,
                "max_us": 1.0, "hist": [[10, 3]], **fields}

    log = running(2)
    log.add("s0", "coll_stats", {"start": 99.5, "end": 100.0, "rows": [row()]}, t=100.0)
    bad = row()
    del bad["max_us"]
    log.add("s0", "coll_stats", {"start": 100.0, "end": 101.0, "rows": [row(), bad]}, t=101)
    log.add("s1", "coll_stats", {"start": 100.0, "end": 101.0, "rows": [row(count=5)]}, t=101)
    state = JobState(1, "job")
    for ev in log.events[:-2]:
        state.apply(ev)
    with pytest.raises(KeyError):
        state.apply(log.events[-2])
    state.apply(log.events[-1])
    assert {key: s.count for key, s in state.collectives.items()} == {
        ("0", "all_reduce", 0, "wrapper"): 3, ("0", "all_reduce", 1, "wrapper"): 5}
    assert [p[:3] for p in state.recent.window(("0", 0))] == [(100.0, 3, 1.0)]
