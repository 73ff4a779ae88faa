"""The live feed's deltas, on plain data: what changes is sent, and applying it rebuilds
exactly the new sections."""

from __future__ import annotations

import copy

from dashboard.live import Feed, apply, delta


def sections(ranks=4, seq=7, status="running"):
    return {
        "job": {"id": 1, "status": status},
        "ranks": [{"rank": r, "status": "running"} for r in range(ranks)],
        "progress": [{"group": "0", "rank": r, "entered": seq, "completed": seq}
                     for r in range(ranks)],
        "errors": [],
    }


def test_one_rank_moving_sends_only_its_row():
    old = sections()
    new = copy.deepcopy(old)
    new["progress"][2]["entered"] = 8
    d = delta(old, new)
    assert d == {"sections": {}, "rows": {"progress": [[2, new["progress"][2]]]}}
    assert apply(old, d) == new


def test_nothing_changed_is_no_delta():
    assert delta(sections(), sections()) is None


def test_rows_that_come_go_or_mostly_change_are_sent_whole():
    old = sections()
    grown = sections(ranks=5)
    assert delta(old, grown)["sections"].keys() == {"ranks", "progress"}
    assert apply(old, delta(old, grown)) == grown
    moved = sections(seq=8)  # every rank moved: the whole list is smaller than patches
    assert delta(old, moved) == {"sections": {"progress": moved["progress"]}, "rows": {}}
    swapped = copy.deepcopy(old)
    swapped["ranks"].reverse()  # same rows, another order: keys moved, so whole
    assert delta(old, swapped)["sections"] == {"ranks": swapped["ranks"]}


def test_sections_added_and_removed():
    old = sections()
    new = dict(sections(), gpus=[{"rank": 0}])
    del new["errors"]
    d = delta(old, new)
    assert d["sections"] == {"gpus": [{"rank": 0}], "errors": None}
    assert apply(old, d) == new


def test_feed_versions_chain_and_rebuild_the_latest_state():
    feed = Feed(sections())
    held = feed.snapshot(1)
    assert held["v"] == 1
    states = [sections(seq=8), sections(seq=8, status="failed"), sections(seq=8, status="failed"),
              sections(ranks=6, seq=9)]
    have, version = held["sections"], held["v"]
    for new in states:
        message = feed.advance(1, copy.deepcopy(new))
        if message is None:  # nothing changed since the last one
            continue
        assert message["base"] == version and message["v"] == version + 1
        have, version = apply(have, message), message["v"]
        assert have == new
    assert version == 4 and feed.snapshot(1)["sections"] == states[-1]


def test_heat_map_rows_travel_as_one_character_per_second():
    from dashboard.live import BUSY_DIGITS, compact_grid

    grid = {"end": 10, "step": 1, "bins": 4, "ops": [], "families": [
        {"family": "tp", "ranks": [0, 1], "busy": [[0, 1, 50, 100], [None, 99, None, 2]]}]}
    small = compact_grid(grid)
    assert small["families"][0]["busy"] == ["01pO", "-O-1"]
    # What the page reads back: percent to the nearest 2, "-" for no report.
    back = [[None if c == "-" else 2 * small["busy_digits"].index(c) for c in row]
            for row in small["families"][0]["busy"]]
    assert back == [[0, 2, 50, 100], [None, 100, None, 2]]
    assert len(BUSY_DIGITS) == 51 and '"' not in BUSY_DIGITS and "\\" not in BUSY_DIGITS
    assert grid["families"][0]["busy"][0] == [0, 1, 50, 100]  # the view itself is untouched


def test_progress_travels_as_a_row_per_group_with_columns():
    from dashboard.live import progress_columns

    rows = [{"group": "0", "rank": r, "entered": 5 + r, "completed": 5,
             "inflight_op": "all_reduce" if r else None, "inflight_since": 9.5 if r else None,
             "source": "python"} for r in range(2)]
    rows.append({"group": "1", "rank": 1, "entered": 40, "completed": 40,
                 "inflight_op": None, "inflight_since": None, "source": "flight_recorder"})
    assert progress_columns(rows) == [
        {"group": "0", "source": "python", "ranks": [0, 1], "entered": [5, 6],
         "completed": [5, 5], "inflight": [[1, "all_reduce", 9.5]]},
        {"group": "1", "source": "flight_recorder", "ranks": [1], "entered": [40],
         "completed": [40], "inflight": []}]
