"""The views of JobState (dashboard.web.views), on plain data: per-family op rows, the compact
timeline grid, the one-pass job summary, the push's view cache, and the rank and group display
states judged at a moment."""

from __future__ import annotations

import itertools

from dashboard.diagnosis import Settings
from dashboard.web.live import ViewCache
from dashboard.state import JobState
from dashboard.web import display, timeline, views

_ids = itertools.count(1)


def ev(session, kind, body, t):
    return {"id": next(_ids), "session": session, "seq": None, "t": t, "received_at": t,
            "kind": kind, "body": body}


def mesh_job(seconds: int = 5) -> JobState:
    """4 ranks, a 2x2 mesh (mesh_dp, mesh_tp) plus the world group, ``seconds`` of 1 Hz data."""
    s = JobState(1, "mesh")
    groups = [("0", "default_pg", [0, 1, 2, 3]), ("1", "mesh_dp", [0, 2]),
              ("2", "mesh_dp", [1, 3]), ("3", "mesh_tp", [0, 1]), ("4", "mesh_tp", [2, 3])]
    for r in range(4):
        s.apply(ev(f"s{r}", "hello", {"job": "mesh", "rank": r, "world_size": 4, "host": "h",
                                      "pid": r, "backend": "gloo"}, 100.0))
    for name, desc, ranks in groups:
        s.apply(ev("s0", "group", {"name": name, "desc": desc, "ranks": ranks}, 100.0))
    for i in range(seconds):
        t = 101.0 + i
        for r in range(4):
            rows = [{"group": g, "op": "all_reduce", "count": 10, "bytes": 40,
                     "sum_us": 1000.0 * (r + 1) * (10 if g == "3" else 1), "max_us": 400.0,
                     "hist": [[60 + r, 10]]}
                    for g, _d, ranks in groups if r in ranks]
            s.apply(ev(f"s{r}", "coll_stats", {"start": t - 1, "end": t + 0.25 * r,
                                               "rows": rows}, t))
    return s


def test_op_rows_merge_ranks_and_groups_of_a_family():
    rows = views.op_rows(mesh_job())
    assert [(r["family"], r["op"]) for r in rows] == [
        ("default_pg", "all_reduce"), ("mesh_dp", "all_reduce"), ("mesh_tp", "all_reduce")]
    tp = rows[2]
    assert tp["groups"] == ["3", "4"] and tp["ranks"] == 4
    assert tp["count"] == 4 * 5 * 10 and tp["bytes"] == 4 * 5 * 40
    assert tp["p50_us"] <= tp["p99_us"] <= tp["max_us"] == 400.0


def test_timeline_grid_is_one_row_per_rank_and_second_per_family():
    s = mesh_job(seconds=5)
    grid = timeline.timeline_grid(s, bins=4)
    assert grid["end"] == 105 and grid["bins"] == 4
    families = {f["family"]: f for f in grid["families"]}
    assert list(families) == ["default_pg", "mesh_dp", "mesh_tp"]
    tp = families["mesh_tp"]
    assert tp["ranks"] == [0, 1, 2, 3] and tp["groups"] == ["3", "4"]
    # Rank 1 spends 2 x 10 ms of each second in group 3's collectives: 2 %.
    assert tp["busy"][1] == [2, 2, 2, 2]
    assert families["default_pg"]["busy"][0] == [0, 0, 0, 0]  # 10 ms of a second rounds to 1 %
    empty = timeline.timeline_grid(JobState(2, "new"))
    assert empty == {"end": None, "step": 1, "bins": 30, "families": [], "ops": []}


def test_timeline_grid_has_latency_and_bytes_per_op_and_second():
    from pgdash_agent.wire import hist_bucket_value

    grid = timeline.timeline_grid(mesh_job(seconds=5), bins=4)
    ops = {(o["family"], o["op"]): o for o in grid["ops"]}
    assert list(ops) == [("default_pg", "all_reduce"), ("mesh_dp", "all_reduce"),
                         ("mesh_tp", "all_reduce")]
    tp = ops[("mesh_tp", "all_reduce")]
    # Each second, 4 ranks x 10 collectives of 40 bytes, ranks' histograms in buckets 60-63.
    assert tp["count"] == [40] * 4 and tp["bytes"] == [160] * 4
    assert tp["p50_us"] == [round(hist_bucket_value(61), 3)] * 4
    assert tp["p99_us"] == [round(min(hist_bucket_value(63), 400.0), 3)] * 4
    # A second nobody reported stays empty, not zero latency.
    s = mesh_job(seconds=2)
    s.apply(ev("s0", "coll_stats", {"start": 104, "end": 105.0, "rows": [
        {"group": "3", "op": "broadcast", "count": 1, "bytes": 8, "sum_us": 5.0,
         "max_us": 5.0, "hist": [[9, 1]]}]}, 105.0))
    bcast = next(o for o in timeline.timeline_grid(s, bins=4)["ops"] if o["op"] == "broadcast")
    assert bcast["count"] == [0, 0, 0, 1] and bcast["p50_us"][:3] == [None] * 3


def test_summary_is_what_the_properties_say_and_follows_every_event():
    s = mesh_job(seconds=1)

    def by_properties():
        return {"id": s.job_id, "name": s.name, "status": s.status, "world_size": s.world_size,
                "backend": s.backend, "started_at": s.started_at, "ended_at": s.ended_at,
                "attempt": s.attempt, "command": None, "launcher": None, "launcher_id": None}

    assert s.summary() == by_properties() and s.summary()["status"] == "running"
    for r in range(4):
        s.apply(ev(f"s{r}", "exit", {"clean": r != 2}, 110.0 + r))
        assert s.summary() == by_properties()
    assert s.summary()["status"] == "failed" and s.summary()["ended_at"] == 113.0
    s.summary()["status"] = "changed by a caller"
    assert s.summary()["status"] == "failed"


def test_view_cache_reuses_only_what_is_expensive_or_unchanged():
    cache = ViewCache(factor=10, max_age=1.0)
    built = []

    def build(value, cost_s=0.0):
        def run():
            built.append(value)
            if cost_s:
                import time
                time.sleep(cost_s)
            return value
        return run

    assert cache.get(("job", "cheap"), 1, build("a")) == "a"
    assert cache.get(("job", "cheap"), 1, build("b")) == "a"  # nothing applied since
    assert cache.get(("job", "cheap"), 2, build("c")) == "c"  # cheap: always rebuilt
    assert cache.get(("job", "slow"), 1, build("x", 0.02)) == "x"
    assert cache.get(("job", "slow"), 2, build("y")) == "x"  # 20 ms view: reused ~200 ms
    assert built == ["a", "c", "x"]


def test_progress_of_a_group_python_never_saw_comes_from_the_flight_recorder():
    s = mesh_job(seconds=1)
    t = 110.0
    for r, (enq, done, since) in enumerate([(40, 40, None), (41, 40, t - 3)]):
        s.apply(ev(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 7, "completed": 7, "inflight_op": None,
             "inflight_since": None, "fr_enqueued": 90, "fr_completed": 90,
             "fr_inflight_since": None},
            {"group": "1" if r == 0 else "2", "entered": 0, "completed": 0,
             "inflight_op": None, "inflight_since": None, "fr_enqueued": enq,
             "fr_completed": done, "fr_inflight_since": since}]}, t))
    rows = {(row["group"], row["rank"]): row for row in views.progress_rows(s)}
    # The world group had Python collectives: their counters, not the recorder's.
    assert rows[("0", 0)]["entered"] == 7 and rows[("0", 0)]["source"] == "python"
    # DDP's data-parallel groups: only the recorder saw them.
    assert rows[("1", 0)] == {"group": "1", "rank": 0, "entered": 40, "completed": 40,
                              "inflight_op": None, "inflight_since": None,
                              "source": "flight_recorder"}
    assert rows[("2", 1)]["entered"] == 41 and rows[("2", 1)]["completed"] == 40
    assert rows[("2", 1)]["inflight_op"] == "C++ collective"
    assert rows[("2", 1)]["inflight_since"] == t - 3


# -- display states judged at a moment (dashboard.web.display.rank_states / group_states) ----------

def waiting_job() -> JobState:
    """Three ranks of one group: ranks 0 and 1 wait in all_reduce #5 since t=200, rank 2 is
    still at #4 (the classic hang, before anyone calls it one)."""
    s = JobState(1, "wait")
    for r in range(3):
        s.apply(ev(f"s{r}", "hello", {"job": "wait", "rank": r, "world_size": 3, "host": "h",
                                      "pid": r, "backend": "gloo"}, 190.0))
    s.apply(ev("s0", "group", {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2]}, 190.0))
    for r in range(3):
        row = {"group": "0", "entered": 5 if r < 2 else 4, "completed": 4,
               "inflight_op": "all_reduce" if r < 2 else None,
               "inflight_since": 200.0 if r < 2 else None}
        s.apply(ev(f"s{r}", "heartbeat", {"groups": [row]}, 201.0))
    return s


def states_at(s: JobState, at: float, findings=()) -> dict[int, dict]:
    return {row["rank"]: row for row in display.rank_states(s, at, list(findings))}


def test_a_wait_is_judged_at_the_moment_asked_never_by_a_clock():
    s = waiting_job()
    settings = Settings()
    (early,) = display.group_states(s, 200.5, settings)
    # Half a second in: ranks are routinely a little apart, nobody is "behind" yet.
    assert early["state"] == "waiting" and early["behind"] == [] and early["max_seq"] == 5
    assert early["family"] == "default_pg"
    (behind,) = display.group_states(s, 200.0 + settings.behind_after, settings)
    assert behind["state"] == "behind" and behind["behind"] == [[2, 1]]
    assert behind["oldest_wait"] == 200.0
    (late,) = display.group_states(s, 200.0 + settings.stall_after, settings)
    assert late["state"] == "overdue" and late["behind"] == [[2, 1]]
    # The same moment gives the same answer, however often and whenever it is asked.
    assert display.group_states(s, 203.0) == display.group_states(s, 203.0) == [behind]

    ranks = states_at(s, 203.0)
    assert ranks[0]["state"] == "waiting" and ranks[2]["state"] == "running"
    assert ranks[0]["waiting"] == {"group": "0", "op": "all_reduce", "since": 200.0,
                                   "on": [2]}
    assert "overdue" not in ranks[0] and "waiting" not in ranks[2] and "findings" not in ranks[0]
    # Before anyone is behind, a rank in a collective says so in its state only.
    early_rank = states_at(s, 200.5)[0]
    assert early_rank["state"] == "waiting" and "waiting" not in early_rank
    assert states_at(s, 200.0 + settings.stall_after)[1]["overdue"] is True


def test_rank_states_follow_the_findings_active_at_that_moment():
    s = waiting_job()
    hang = {"id": "hang:0:5", "kind": "hang", "active": True, "ranks": [2],
            "evidence": {"waiting": [0, 1]}}
    ranks = states_at(s, 300.0, [hang])
    assert [ranks[r]["state"] for r in range(3)] == ["stuck", "stuck", "hung"]
    assert all(ranks[r]["findings"] == ["hang:0:5"] for r in range(3))
    # Resolved findings explain nothing; a straggler and a desync name their own states.
    assert states_at(s, 300.0, [dict(hang, active=False)])[2]["state"] == "running"
    straggler = {"id": "straggler:1", "kind": "straggler", "active": True, "ranks": [1]}
    desync = {"id": "desync:0:5", "kind": "desync", "active": True, "ranks": [0]}
    mixed = states_at(s, 300.0, [straggler, desync])
    assert (mixed[0]["state"], mixed[1]["state"]) == ("mismatch", "straggling")
    # A rank that failed is failed, whatever else is said about it.
    s.apply(ev("s2", "exit", {"clean": False, "exitcode": 1}, 301.0))
    assert states_at(s, 302.0, [hang])[2]["state"] == "failed"
    assert set(display.DISPLAY_STATES) >= {row["state"] for row in
                                       display.rank_states(s, 302.0, [hang])}


def test_groups_carry_their_family_so_the_page_need_not_know_the_rule():
    rows = {g["name"]: g["family"] for g in views.group_rows(mesh_job(seconds=1))}
    assert rows == {"0": "default_pg", "1": "mesh_dp", "2": "mesh_dp", "3": "mesh_tp",
                    "4": "mesh_tp"}
