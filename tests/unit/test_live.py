"""The live feed's deltas, on plain data: what changes is sent, and applying it rebuilds
exactly the new sections."""

from __future__ import annotations

import copy

from dashboard.web.live import Feed, apply, delta


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
    from dashboard.web.live import BUSY_DIGITS, compact_grid

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
    from dashboard.web.live import progress_columns

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


# -- one state per rank: what every section of the page shows of a rank ---------------------

import itertools  # noqa: E402

from dashboard.diagnosis import Settings, diagnose  # noqa: E402
from dashboard.web.live import sections as page_sections  # noqa: E402
from dashboard.state import JobState  # noqa: E402

_ids = itertools.count(1)


def ev(session, kind, body, t):
    return {"id": next(_ids), "session": session, "seq": None, "t": t, "received_at": t,
            "kind": kind, "body": body}


def job(ranks: int = 3) -> JobState:
    s = JobState(1, "j")
    for r in range(ranks):
        s.apply(ev(f"s{r}", "hello", {"job": "j", "rank": r, "world_size": ranks, "host": "h",
                                      "pid": 10 + r, "backend": "gloo"}, 100.0))
    s.apply(ev("s0", "group", {"name": "0", "desc": "default_pg",
                               "ranks": list(range(ranks))}, 100.0))
    return s


def page_at(s: JobState, at: float, settings: Settings = Settings()) -> dict:
    """The page's sections at ``at`` with the findings the rules find then (as live does)."""
    return page_sections(s, at=at, findings=diagnose(s, at, settings), settings=settings)


def one_state_per_rank(shown: dict) -> dict[int, dict]:
    """Every rank the page lists has exactly one display state row, and no other rank."""
    rows = shown["rank_states"]
    assert sorted(r["rank"] for r in rows) == sorted(r["rank"] for r in shown["ranks"])
    assert len({r["rank"] for r in rows}) == len(rows)
    return {r["rank"]: r for r in rows}


def test_a_hung_rank_is_hung_with_the_findings_reason_and_its_peers_wait_for_it():
    s = job(3)
    for r in range(3):  # ranks 0 and 1 wait in all_reduce #5 since t=200; rank 2 sleeps at #4
        s.apply(ev(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 5 if r < 2 else 4, "completed": 4,
             "inflight_op": "all_reduce" if r < 2 else None,
             "inflight_since": 200.0 if r < 2 else None}]}, 201.0 + 0.1 * r))
    settings = Settings(hang_after=5.0)
    shown = page_at(s, 208.0, settings)
    hang = next(f for f in shown["findings"] if f["kind"] == "hang")
    states = one_state_per_rank(shown)
    # The rank that never arrived is "hung", never "running" (its agent's own status).
    assert states[2]["state"] == "hung" and states[2]["reason"] == hang["summary"]
    assert states[2]["findings"] == [hang["id"]]
    for r in (0, 1):
        assert states[r]["state"] == "stuck"
        assert states[r]["reason"] == "in all_reduce on group 0 (default_pg), waiting for rank 2"
        assert states[r]["since"] == 200.0
    # Before the wait is anything, the same rank is plainly running, with nothing to explain.
    early = one_state_per_rank(page_at(s, 200.5, settings))
    assert early[2] == {"rank": 2, "state": "running"}
    assert early[0]["state"] == "waiting" and "reason" not in early[0]


def test_a_crashed_rank_says_its_error_and_an_exited_one_says_it_finished():
    s = job(3)
    for r in range(3):
        s.apply(ev(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 9, "completed": 9}]}, 150.0))
    s.apply(ev("s1", "error", {"where": "uncaught", "error_type": "RuntimeError",
                               "error": "Traceback (most recent call last):\n  ...\n"
                                        "RuntimeError: CUDA out of memory"}, 160.0))
    s.apply(ev("s1", "exit", {"clean": False, "reason": "uncaught exception",
                              "exitcode": 1}, 160.5))
    s.apply(ev("s2", "exit", {"clean": True, "reason": "exit"}, 161.0))
    s.apply(ev("s0", "heartbeat", {"groups": [
        {"group": "0", "entered": 9, "completed": 9}]}, 169.0))
    shown = page_at(s, 170.0)
    states = one_state_per_rank(shown)
    assert states[1]["state"] == "failed"
    failed = next(f for f in shown["findings"] if f["kind"] == "rank_failed")
    assert states[1]["reason"] == failed["summary"]  # "Rank 1 failed (...): ... GPU memory."
    assert states[1]["since"] == 160.0  # its error came then
    assert states[2]["state"] == "exited"
    assert states[2]["since"] == 161.0
    assert states[0]["state"] == "running"


def test_a_lost_rank_is_lost_and_a_clean_exit_of_the_whole_job_reads_exited():
    s = job(2)
    s.apply(ev("s0", "exit", {"clean": True, "reason": "exit"}, 150.0))
    s.apply(ev("s1", "disconnect", {"reason": "transport close"}, 151.0))
    settings = Settings()
    states = one_state_per_rank(page_at(s, 151.0 + settings.reconnect_grace + 5, settings))
    assert states[0] == {"rank": 0, "state": "exited", "reason": "exited cleanly",
                         "since": 150.0}
    assert states[1]["state"] == "lost" and states[1]["since"] == 151.0
    assert states[1]["reason"]  # the rank_lost finding's summary, or what a loss is

    done = job(2)
    for r in range(2):
        done.apply(ev(f"s{r}", "exit", {"clean": True, "reason": "exit"}, 150.0 + r))
    states = one_state_per_rank(page_at(done, 160.0))
    assert [states[r]["state"] for r in range(2)] == ["exited", "exited"]
    assert all(states[r]["reason"] == "exited cleanly" for r in range(2))


def test_collectives_only_the_flight_recorder_saw_are_on_the_charts_and_the_heat_map():
    """A DDP-only job: every collective is C++-issued (host-poll timed) and no summary of a
    Python wrapper exists; the charts draw them all the same."""
    s = job(2)
    for i in range(5):
        t = 200.0 + i
        for r in range(2):
            s.apply(ev(f"s{r}", "coll_stats", {"start": t - 1, "end": t, "rows": [
                {"group": "0", "op": "all_reduce", "count": 8, "bytes": 8 * 4096,
                 "sum_us": 8 * 9000.0, "max_us": 20000.0, "hist": [[100, 8]],
                 "source": "flight_recorder", "timing": "host_poll",
                 "resolution_us": 25000.0}]}, t))
            s.apply(ev(f"s{r}", "heartbeat", {"groups": [
                {"group": "0", "entered": 0, "completed": 0, "fr_enqueued": 8 * (i + 1),
                 "fr_completed": 8 * (i + 1), "fr_busy": 10 * (r + 1), "fr_samples": 20}]},
                t + 0.1))
    grid = page_sections(s, at=205.0, findings=[])["timeline_grid"]
    assert grid["end"] == 204
    (op,) = grid["ops"]
    assert (op["family"], op["op"], op["source"]) == ("default_pg", "all_reduce",
                                                       "flight_recorder")
    assert op["count"][-5:] == [16] * 5
    (fam,) = grid["families"]
    assert fam["family"] == "default_pg" and fam["ranks"] == [0, 1] and fam["sampled"]
    digits = grid["busy_digits"]
    # Rank 0 was inside one in half of its samples, rank 1 in all of them.
    assert fam["busy"][0][-5:] == digits[25] * 5 and fam["busy"][1][-5:] == digits[50] * 5
