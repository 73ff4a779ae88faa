"""The live page's views of JobState, on plain data: per-family op rows, the compact timeline
grid, the bounded raw timeline, the one-pass job summary, and the push's view cache."""

from __future__ import annotations

import itertools

from dashboard import views
from dashboard.live import ViewCache
from dashboard.state import JobState

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
    grid = views.timeline_grid(s, bins=4)
    assert grid["end"] == 105 and grid["bins"] == 4
    families = {f["family"]: f for f in grid["families"]}
    assert list(families) == ["default_pg", "mesh_dp", "mesh_tp"]
    tp = families["mesh_tp"]
    assert tp["ranks"] == [0, 1, 2, 3] and tp["groups"] == ["3", "4"]
    # Rank 1 spends 2 x 10 ms of each second in group 3's collectives: 2 %.
    assert tp["busy"][1] == [2, 2, 2, 2]
    assert families["default_pg"]["busy"][0] == [0, 0, 0, 0]  # 10 ms of a second rounds to 1 %
    empty = views.timeline_grid(JobState(2, "new"))
    assert empty == {"end": None, "step": 1, "bins": 30, "families": [], "ops": []}


def test_timeline_grid_has_latency_and_bytes_per_op_and_second():
    from agent.wire import hist_bucket_value

    grid = views.timeline_grid(mesh_job(seconds=5), bins=4)
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
    bcast = next(o for o in views.timeline_grid(s, bins=4)["ops"] if o["op"] == "broadcast")
    assert bcast["count"] == [0, 0, 0, 1] and bcast["p50_us"][:3] == [None] * 3


def test_summary_is_what_the_properties_say_and_follows_every_event():
    s = mesh_job(seconds=1)

    def by_properties():
        return {"id": s.job_id, "name": s.name, "status": s.status, "world_size": s.world_size,
                "backend": s.backend, "started_at": s.started_at, "ended_at": s.ended_at}

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
