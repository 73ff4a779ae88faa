"""JobState as a pure fold over hand-made events: no server, no database, no clock."""

import pytest

from dashboard.state import JobState
from dashboard.state.totals import LatencyTable
from dashboard.web import timeline, views
from tests.helpers.events import Log, hello


def stats(group, op, count, us, nbytes=4):
    from pgdash_agent.wire import hist_bucket

    return {"start": 0, "end": 1, "rows": [{"group": group, "op": op, "count": count,
                                            "bytes": nbytes * count, "sum_us": us * count,
                                            "max_us": us, "hist": [[hist_bucket(us), count]]}]}


def two_running_ranks():
    log = Log()
    for r in (0, 1):
        log.add(f"s{r}", "hello", hello(r), t=10)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 2}, t=10)
        log.add(f"s{r}", "init_done", {"rank": r, "world_size": 2, "backend": "gloo",
                                       "duration_s": 0.5}, t=10.5)
        log.add(f"s{r}", "group", {"name": "0", "desc": "default_pg", "ranks": [0, 1]}, t=10.5)
    return log


def test_job_moves_from_initializing_to_running_to_finished():
    log = Log().add("s0", "hello", hello(0), t=1).add("s0", "init_start", {}, t=1)
    assert log.state().status == "initializing"
    log = two_running_ranks()
    state = log.state()
    assert state.status == "running" and state.world_size == 2 and state.backend == "gloo"
    log.add("s0", "exit", {"clean": True}, t=20)
    assert log.state().status == "running"  # rank 1 still works
    log.add("s1", "exit", {"clean": True}, t=21)
    state = log.state()
    assert state.status == "finished" and state.ended_at == 21
    assert [r.status for r in state.ranks()] == ["exited", "exited"]


def test_missing_rank_means_not_finished():
    log = Log().add("s0", "hello", hello(0, world=3), t=1)
    log.add("s0", "init_done", {"rank": 0, "world_size": 3, "duration_s": 0}, t=2)
    log.add("s0", "exit", {"clean": True}, t=3)
    assert log.state().status == "failed"  # 1 of 3 ranks ever ran


def test_disconnect_without_exit_is_lost_and_reconnect_revives():
    log = two_running_ranks().add("s1", "disconnect", {}, t=30)
    state = log.state()
    assert {r.rank: r.status for r in state.ranks()} == {0: "running", 1: "lost"}
    log.add("s1", "connect", {}, t=31)
    assert log.state().ranks()[1].status == "running"
    log.add("s0", "exit", {"clean": True}, t=40).add("s1", "disconnect", {}, t=41)
    assert log.state().status == "failed"


def test_uncaught_error_fails_the_rank_and_keeps_the_text():
    log = two_running_ranks().add("s1", "error", {
        "where": "uncaught", "error_type": "RuntimeError", "error": "<b>boom</b>"}, t=12)
    state = log.state()
    assert state.ranks()[1].status == "failed"
    assert state.errors[-1] == {"rank": 1, "attempt": 0, "t": 12, "where": "uncaught",
                                "error_type": "RuntimeError", "error": "<b>boom</b>"}


def test_init_failure_is_recorded_on_the_rendezvous_timeline():
    log = Log().add("s0", "hello", hello(0), t=1).add("s0", "init_start", {"rank": 0}, t=1)
    log.add("s0", "init_failed", {"error_type": "DistStoreError", "duration_s": 5,
                                  "error": "Timed out after 5 seconds waiting for clients. "
                                           "1/2 clients joined."}, t=6)
    state = log.state()
    assert state.ranks()[0].status == "failed"
    assert state.init["s0"]["arrived_at"] == 1
    assert "1/2 clients joined" in state.init["s0"]["error"]["error"]


def test_collective_summaries_add_up_per_group_op_rank():
    log = two_running_ranks()
    log.add("s0", "coll_stats", stats("0", "all_reduce", 10, 100.0), t=11, seq=5)
    log.add("s0", "coll_stats", stats("0", "all_reduce", 5, 1000.0), t=12, seq=6)
    log.add("s1", "coll_stats", stats("0", "all_reduce", 15, 100.0), t=12, seq=5)
    rows = {(r["group"], r["op"], r["rank"]): r for r in views.collective_rows(log.state())}
    r0 = rows[("0", "all_reduce", 0)]
    assert r0["count"] == 15 and r0["bytes"] == 60 and r0["max_us"] == 1000.0
    assert 90 <= r0["p50_us"] <= 110  # 10 of 15 calls took ~100 us
    assert 950 <= r0["p99_us"] <= 1000.0  # the slow calls' bucket, never above the max
    assert rows[("0", "all_reduce", 1)]["count"] == 15
    assert views.collective_rows(log.state(), rank=1) == [rows[("0", "all_reduce", 1)]]


def test_stats_before_the_rank_is_known_are_not_misattributed():
    log = Log().add("s0", "hello", {"job": "j", "host": "h", "pid": 1}, t=1)
    log.add("s0", "coll_stats", stats("0", "all_reduce", 3, 10.0), t=2)
    assert views.collective_rows(log.state()) == []


def test_heartbeat_progress_and_exit_clears_in_flight():
    log = two_running_ranks()
    log.add("s0", "heartbeat", {"groups": [{"group": "0", "entered": 7, "completed": 6,
                                            "inflight_op": "all_reduce",
                                            "inflight_since": 11.0}]}, t=12)
    row = views.progress_rows(log.state())[0]
    assert row == {"group": "0", "rank": 0, "entered": 7, "completed": 6,
                   "inflight_op": "all_reduce", "inflight_since": 11.0, "source": "python"}
    log.add("s0", "exit", {"clean": False}, t=13)
    row = views.progress_rows(log.state())[0]
    assert row["inflight_op"] is None and log.state().ranks()[0].status == "failed"


def test_a_rank_claimed_by_another_session_is_a_new_launch():
    state = two_running_ranks().state()
    assert state.claims(0, "someone-else") and not state.claims(0, "s0")
    assert not state.claims(None, "x") and not state.claims(5, "x")


def test_fold_is_deterministic_replay_equals_live():
    log = two_running_ranks()
    log.add("s0", "coll_stats", stats("0", "broadcast", 3, 50.0), t=11, seq=5)
    log.add("s1", "disconnect", {}, t=15)
    a, b = log.state(), log.state()
    assert views.detail(a) == views.detail(b)
    assert views.collective_rows(a) == views.collective_rows(b)


def test_summary_asked_after_every_event_matches_a_fresh_fold():
    """Ingest asks for the summary around every batch, and it is remembered across routine
    events; it must still equal what a fresh fold of the same log says, at every step."""
    log = two_running_ranks()
    log.add("s0", "heartbeat", {"groups": []}, t=11).add("s1", "disconnect", {}, t=12)
    log.add("s1", "heartbeat", {"groups": []}, t=13)  # the lost rank is back
    log.add("s0", "coll_stats", stats("0", "all_reduce", 3, 100.0), t=14)
    log.add("s0", "error", {"where": "uncaught", "error_type": "E", "error": "x"}, t=15)
    log.add("s1", "error", {"where": "uncaught", "error_type": "E", "error": "y"}, t=16)
    log.add("s1", "heartbeat", {"groups": []}, t=17)  # after the end: moves ended_at
    log.add("s0", "group", {"name": "1", "desc": "x", "ranks": [0, 1]}, t=5)  # earlier start
    live = JobState(1, "job")
    for i, ev in enumerate(log.events):
        live.apply(ev)
        fresh = JobState(1, "job").apply_all(log.events[:i + 1])
        assert live.summary() == fresh.summary(), f"after event {i}: {ev['kind']}"
    final = live.summary()
    assert final["status"] == "failed" and final["ended_at"] == 17 and final["started_at"] == 5


def test_half_second_summaries_share_a_heat_map_second():
    # PGDASH_STATS_INTERVAL_S 0.5: two summaries per second, 300 ms inside collectives each,
    # are 60 % of that second (not twice 60 %); a 2 s summary is spread over its seconds.
    from pgdash_agent.wire import hist_bucket

    def summary(start, end, busy_us):
        return {"start": start, "end": end, "rows": [
            {"group": "0", "op": "all_reduce", "count": 10, "bytes": 40, "sum_us": busy_us,
             "max_us": busy_us / 10, "hist": [[hist_bucket(busy_us / 10), 10]]}]}

    log = two_running_ranks()
    for end in (19.9, 20.4, 20.9, 21.4, 21.9):
        log.add("s0", "coll_stats", summary(end - 0.5, end, 3e5), t=end)
    log.add("s0", "coll_stats", summary(21.9, 23.9, 8e5), t=23.9)
    grid = timeline.timeline_grid(log.state(), bins=4)
    assert grid["end"] == 23
    assert grid["families"][0]["busy"][0] == [60, 60, None, 40]


def test_latency_summaries_are_kept_with_their_histogram_and_old_checkpoints_upgrade():
    import collections

    from pgdash_agent.wire import hist_bucket
    from dashboard.storage.codec import decode_state, encode_state

    log = two_running_ranks()
    log.add("s0", "coll_stats", stats("0", "all_reduce", 4, 100.0), t=20)
    state = log.state()
    point = (1, 4, 400.0, (hist_bucket(100.0), 4))
    assert state.recent.window(("0", 0)) == [point]
    assert decode_state(encode_state(state)).recent.window(("0", 0)) == [point]
    # What earlier pgdash versions stored: a deque per (group, rank); its summaries with two
    # quantiles before the histogram, and before that no histogram at all (its collectives
    # then count at its lower quartile).
    state.recent = {("0", 0): collections.deque([point, (2, 4, 400.0, 90.0, 80.0, point[3]),
                                                 (3, 2, 300.0, 160.0, 150.0)], maxlen=60),
                    ("0", 1): collections.deque([(3, 2, 300.0, 160.0, 150.0)], maxlen=60),
                    ("1", 1): collections.deque(maxlen=60)}
    loaded = decode_state(encode_state(state))
    assert loaded.recent.windows() == {
        ("0", 0): [point, (2, 4, 400.0, point[3]), (3, 2, 300.0, (hist_bucket(150.0), 2))],
        ("0", 1): [(3, 2, 300.0, (hist_bucket(150.0), 2))]}


def _extend(windows, batch):
    """``RecentWindows.extend`` with (key, (end, count, sum_us, flat histogram)) pairs, in
    order, as columns (through the windows' own ``_extend_points``); the batch emptied."""
    windows._extend_points(batch)
    batch.clear()


def test_the_windows_keep_each_ranks_newest_summaries_in_order_whatever_the_batches():
    """RecentWindows against a deque per rank: appends one at a time and in batches of any
    size (``extend``, as the fold appends: one summary, or hundreds of a rank in one), ranks
    joining late, histograms of any width, counts of any size (those that do not fit the
    stored 16 bits, SATURATED, kept beside)."""
    import collections
    import pickle
    import random

    from dashboard.state.recent import HIST_CAP, SATURATED, RecentWindows

    rng = random.Random(3)
    for trial in range(40):
        width = rng.choice((1, 3, 60))
        windows, want, batch = RecentWindows(width), {}, []
        for step in range(rng.randint(1, 300)):
            rank = rng.randrange(rng.choice((1, 4, 20)))
            flat = tuple(x for b in sorted(rng.sample(range(321), rng.randint(0, 12)))
                         for x in (b, rng.choice((rng.randint(1, 10), rng.randint(1, 10**6),
                                                  SATURATED - 1, SATURATED, HIST_CAP))))
            point = (rng.uniform(0, 1e9), rng.randint(0, 10**6), rng.uniform(0, 1e7), flat)
            if rng.random() < 0.3:
                _extend(windows, batch)  # (the summaries before it first)
                windows.append(rank, *point)
            else:
                batch.append((rank, point))
            want.setdefault(rank, collections.deque(maxlen=width)).append(point)
            if rng.random() < 0.05:
                _extend(windows, batch)
                assert windows.windows() == {r: list(d) for r, d in want.items()}, trial
        _extend(windows, batch)
        assert windows.windows() == {r: list(d) for r, d in want.items()}, trial
        assert windows.newest_ends() == {r: d[-1][0] for r, d in want.items()}
        copy = pickle.loads(pickle.dumps(windows))
        assert copy.windows() == windows.windows()
        # A checkpoint of an earlier pgdash (32-bit counts, none beside) loads the same.
        old = copy.__getstate__()
        buckets, hist = windows.columns().histograms()
        del old["hist16"], old["over"]
        old.update(buckets=buckets.tobytes(), hist=hist.tobytes())
        earlier = RecentWindows.__new__(RecentWindows)
        earlier.__setstate__(old)
        assert earlier.windows() == windows.windows()
        # What is loaded goes on as the original (its ring starts anew, its big counts
        # beside it moved with it).
        for rank, point in [(rng.randrange(4), (1e9 + i, 5, 1.0, (7, SATURATED + i)))
                            for i in range(width + 2)]:
            for w in (copy, earlier):
                w.append(rank, *point)
            want.setdefault(rank, collections.deque(maxlen=width)).append(point)
        assert copy.windows() == earlier.windows() == {r: list(d) for r, d in want.items()}
    # Columns read after the fold appended (or the attempt's restart cleared) are refused,
    # not read as another summary's histogram.
    for change in (lambda: windows.append((0, 0), 1.0, 1, 1.0, (3, 1)), windows.clear):
        cols = windows.columns()
        change()
        windows.columns()
        with pytest.raises(RuntimeError, match="read after the fold appended"):
            cols.histograms()


@pytest.mark.parametrize("old_home", [b"agent.wire", b"pgdash_agent.wire"])
def test_checkpoints_that_pickled_the_statuses_in_the_agents_wire_module_still_load(old_home):
    """Rank and job statuses were pickled as members of the agent's wire module (``agent.wire``,
    then ``pgdash_agent.wire``) until the server took them (dashboard.statuses); such
    checkpoints load, and other modules stay refused."""
    import os
    import pickle

    from dashboard.statuses import RankStatus
    from dashboard.storage.codec import compress_state, decode_state

    raw = pickle.dumps({"status": RankStatus.RUNNING}, protocol=2)  # unframed: editable
    old = raw.replace(b"cdashboard.statuses\n", b"c" + old_home + b"\n")
    assert old != raw and b"dashboard.statuses" not in old
    assert decode_state(compress_state(old)) == {"status": RankStatus.RUNNING}
    with pytest.raises(ValueError, match="refers to posix.system"):
        decode_state(compress_state(pickle.dumps(os.system)))


def test_a_checkpoint_stored_before_the_state_package_split_loads_and_reads_the_same():
    """tests/unit/data/checkpoint_flat_jobstate.bin is a checkpoint pgdash stored when JobState
    lived in the module dashboard/state.py (commit 2149d92), of the simulated job below (a
    throttled GPU, an XID, a hang and an early exit). It must load and read as the same events
    folded today."""
    import hashlib
    import json
    import pathlib

    from dashboard.storage.codec import decode_state
    from tests.helpers.simjob import T0, _fold, _job_events, _views

    events = _job_events(480, hang=(T0 + 470, T0 + 479), exit_rank_at=T0 + 475, seed=3)
    digest = hashlib.sha256(json.dumps(events, sort_keys=True).encode()).hexdigest()
    assert digest == "d7b6af3ab307b95671cda405d32f94275e3610d1c7ea6c2d82bbd2c2661fe29c", (
        "tests/helpers/simjob.py makes other events than when the checkpoint was stored: "
        "compare against those events, not regenerate the checkpoint")
    blob = (pathlib.Path(__file__).parent / "data" / "checkpoint_flat_jobstate.bin").read_bytes()
    loaded = decode_state(blob)
    assert type(loaded).__module__ == "dashboard.state.job"
    assert _views(loaded) == _views(_fold(events))
    assert loaded.gpu_faults and loaded.exit_rows  # the job's XID and exit made it in


def _naive_summaries(events):
    """The latency tables as the fold defines them, one row at a time through
    LatencyStats.add (what dashboard.state.summaries must equal exactly, batch by batch:
    values, float sums, and the order of keys and seconds)."""
    import collections

    from dashboard.state import LatencyStats
    from dashboard.state.latency import OP_SECONDS, P2P_OPS
    from dashboard.state.recent import RECENT_INTERVALS

    collectives, op_seconds, recent = {}, {}, {}
    ranks, families = {}, {}
    for ev in events:
        if ev["kind"] == "group":  # the per-second series are per family of groups
            desc = ev["body"].get("desc")
            families.setdefault(ev["body"]["name"],
                                desc if desc and desc != "undefined" else ev["body"]["name"])
        if ev["kind"] in ("hello", "connect", "init_done") and "rank" in ev["body"]:
            ranks[ev["session"]] = ev["body"]["rank"]
        if ev["kind"] != "coll_stats" or ev["session"] not in ranks:
            continue
        rank, body = ranks[ev["session"]], ev["body"]
        points = {}
        for row in body["rows"]:
            source = row.get("source", "wrapper")
            stats = collectives.setdefault((row["group"], row["op"], rank, source),
                                           LatencyStats())
            stats.add(row)
            if row.get("timing") == "host_poll":
                stats.resolution_us = max(stats.resolution_us or 0.0, row["resolution_us"])
            series = op_seconds.setdefault((families.get(row["group"], row["group"]),
                                            row["op"], source), {})
            if int(body["end"]) not in series:
                series[int(body["end"])] = LatencyStats()
                if len(series) > OP_SECONDS:
                    del series[min(series)]
            series.get(int(body["end"]), LatencyStats()).add(row)
            if row.get("timing") == "host_poll" or row["op"] in P2P_OPS:
                continue
            point = points.setdefault(row["group"], [body["end"], 0, 0.0, {}])
            point[1] += row["count"]
            point[2] += row["sum_us"]
            for bucket, n in row["hist"]:
                point[3][bucket] = point[3].get(bucket, 0) + n
        for group, (end, count, sum_us, hist) in points.items():
            recent.setdefault((group, rank), collections.deque(maxlen=RECENT_INTERVALS)).append(
                (end, count, sum_us, tuple(x for pair in sorted(hist.items()) for x in pair)))
    return collectives, op_seconds, recent


def _ordered(table):
    """A table with its keys' order made visible (dicts compare regardless of order); a
    histogram by bucket (what reads one sorts it: the fold keeps no order of buckets)."""
    if isinstance(table, (dict, LatencyTable)):
        return [(k, _ordered(v)) for k, v in table.items()]
    if hasattr(table, "hist"):
        return (table.count, table.bytes, table.sum_us, table.max_us,
                sorted(table.hist.items()), table.resolution_us)
    return table


def _generated_events():
    """bench/fold.py's job (16 ranks of a 2x8 mesh, 70 s) with the rows a real job rarely
    sends (see the test below)."""
    from bench.fold import T0, build_log

    events = build_log(ranks=16, seconds=70, hang_at=None, slow_rank=5, seed=4)
    session = events[-1]["session"]
    extra = [
        {"group": "0", "op": "all_reduce", "count": 3, "bytes": 12, "sum_us": 0.1 + 0.2,
         "max_us": 0.3, "hist": [[90, 2], [80, 1]], "source": "flight_recorder",
         "timing": "host_poll", "resolution_us": 250.0},
        {"group": "0", "op": "recv", "count": 2, "bytes": 8, "sum_us": 7.5, "max_us": 5.0,
         "hist": [[30, 2]]},
        {"group": "0", "op": "all_reduce", "count": 1, "bytes": 4, "sum_us": 9e9,
         "max_us": 9e9, "hist": [[250, 1]]},
    ]
    late = {"start": T0 + 2.0, "end": T0 + 2.5, "rows": [dict(r) for r in extra]}
    events[-20:-20] = [{"id": 0, "session": session, "seq": None, "t": T0 + 70.2,
                        "received_at": T0 + 70.2, "kind": "coll_stats", "body": late}]
    for i, ev in enumerate(events, start=1):
        ev["id"] = i
    return events


def test_a_generated_job_folds_its_latency_summaries_row_by_row_exactly():
    """bench/fold.py's job (16 ranks of a 2x8 mesh, 70 s: past the 60 s the per-second
    series and the straggler windows keep), plus the rows a real job rarely sends: a
    Flight Recorder row timed by host polls, a summary arriving late for a second the
    series already dropped, a pipeline's receive. Its tables equal the row-at-a-time
    definition, down to the order of keys and seconds and the last bit of the sums; its
    straggler (rank 5 waits least, as the one the others wait for) is found."""
    from bench.fold import T0
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.rules import diagnose

    events = _generated_events()
    state = JobState(1, "generated").apply_all(events)
    collectives, op_seconds, recent = _naive_summaries(events)
    assert _ordered(state.collectives) == _ordered(collectives)
    assert _ordered(state.op_seconds) == _ordered(op_seconds)
    assert state.recent.windows() == {key: list(points) for key, points in recent.items()}
    from dashboard.state.latency import OP_SECONDS

    world = state.family_of["0"]  # the series are per family: the world group's is its own
    assert world == "default_pg" and len(state.op_seconds) < len(state.groups) * 2
    assert len(state.op_seconds[(world, "all_reduce", "wrapper")]) == OP_SECONDS
    # the late second went (older than the OP_SECONDS kept); its row counts in the totals
    assert int(T0 + 2.5) not in state.op_seconds[(world, "all_reduce", "wrapper")]
    assert state.op_seconds[(world, "all_reduce", "flight_recorder")][int(T0 + 2.5)].count == 3
    assert max(s.max_us for s in state.collectives.values()) == 9e9
    polled = [s for (g, op, rank, src), s in state.collectives.items()
              if src == "flight_recorder"]
    assert [s.resolution_us for s in polled] == [250.0]
    # 16 ranks x 70 s x 2 summaries x 3 ops of the world group (all_reduce, barrier, gather)
    assert sum(s.count for (g, op, _r, src), s in state.collectives.items()
               if g == "0" and src == "wrapper" and op != "recv") == 16 * 70 * 2 * 3 * 10 + 1
    running = JobState(1, "generated").apply_all(events[:-40])  # before the late row, exits
    findings = diagnose(running, events[-41]["t"] + 0.5, Settings())
    assert {(f["kind"], tuple(f["ranks"])) for f in findings} == {("straggler", (5,))}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_latency_tables_are_the_same_whatever_batches_the_fold_folds_them_in(seed):
    """The fold keeps latency summaries aside and folds them together when a table is read
    (dashboard.state.fold, ``_pending``). Read at random moments, and stored and loaded as
    a checkpoint between, the tables equal the row-at-a-time definition at every moment
    checked and at the end."""
    import random

    from dashboard.storage.codec import decode_state, encode_state

    events = _generated_events()
    rng = random.Random(seed)
    checks = set(rng.sample(range(len(events)), 3))
    state = JobState(1, "generated")
    for i, ev in enumerate(events):
        state.apply(ev)
        roll = rng.random()
        if roll < 0.05:
            assert isinstance(state.op_seconds, dict)  # reading a table folds what waits
        elif roll < 0.052:
            state = decode_state(encode_state(state))
        if i in checks:
            collectives, op_seconds, recent = _naive_summaries(events[:i + 1])
            assert _ordered(state.collectives) == _ordered(collectives)
            assert _ordered(state.op_seconds) == _ordered(op_seconds)
            assert state.recent.windows() == {k: list(p) for k, p in recent.items()}
    collectives, op_seconds, recent = _naive_summaries(events)
    assert _ordered(state.collectives) == _ordered(collectives)
    assert _ordered(state.op_seconds) == _ordered(op_seconds)
    assert state.recent.windows() == {k: list(p) for k, p in recent.items()}


def test_a_group_redefined_and_a_new_attempt_find_the_summaries_folded_as_one_at_a_time():
    """Summaries waiting when a group gets another family, or when the job restarts (a new
    attempt clears the windows; the old attempt's sessions count no more), are folded as
    if each had been folded when it came: the same tables as reading them after every
    event (a batch of one summary each)."""
    from bench.fold import T0

    events = _generated_events()
    cut, later = len(events) // 3, 2 * len(events) // 3
    session = events[-1]["session"]
    extra = [(cut, {"id": 0, "session": session, "seq": None, "t": T0 + 20, "received_at":
                    T0 + 20, "kind": "group", "body": {"name": "0", "desc": "renamed",
                                                       "backend": "gloo",
                                                       "ranks": list(range(15))}}),
             (later, {"id": 0, "session": session, "seq": None, "t": T0 + 45,
                      "received_at": T0 + 45, "kind": "hello",
                      "body": {**hello(15, world=16), "attempt": 1}})]
    for at, ev in reversed(extra):
        events.insert(at, ev)
    for i, ev in enumerate(events, start=1):
        ev["id"] = i
    batched = JobState(1, "generated").apply_all(events)
    one_by_one = JobState(1, "generated")
    for ev in events:
        one_by_one.apply(ev)
        assert isinstance(one_by_one.op_seconds, dict)  # every summary folded as it comes
    assert batched.attempt == 1 and batched.family_of["0"] == "renamed"
    assert _ordered(batched.collectives) == _ordered(one_by_one.collectives)
    assert _ordered(batched.op_seconds) == _ordered(one_by_one.op_seconds)
    assert batched.recent.windows() == one_by_one.recent.windows()
    assert batched.recent.windows()  # the new attempt's rank kept summarising
    assert {f for f, _op, _src in batched.op_seconds} >= {"default_pg", "renamed"}


def test_a_gpu_reading_folds_faults_and_throttling_as_the_reading_says():
    log = two_running_ranks()
    values = {"util_gpu": 90.0, "mem_used": 1.0, "temp_c": 60.0, "power_w": 300.0}

    def gpu(t, xids=(), reasons=(), lost=False, **more):
        log.add("s0", "gpu", {"uuid": "GPU-0", "lost": lost, "reasons": list(reasons),
                              "xids": list(xids), "values": dict(values, **more)}, t=t)

    gpu(11)
    assert log.state().gpu_faults == {0: {}} and log.state().throttled_since == {}
    gpu(12, reasons=["gpu_idle"])
    gpu(13, reasons=["sw_power_cap", "hw_thermal_slowdown"], xids=[79], remap_pending=1.0)
    gpu(14, reasons=["hw_slowdown"], ecc_uncorrected=2.0)
    state = log.state()
    assert state.gpu_faults == {0: {"xid:79": 13, "remap_pending": 13, "ecc": 14}}
    assert state.throttled_since == {0: 13}
    gpu(15, lost=True)
    state = log.state()
    assert state.throttled_since == {} and state.gpu_faults[0]["lost"] == 15


def test_gpu_readings_keep_the_newest_in_order_and_old_checkpoints_upgrade():
    """The readings sit in one ring of floats (dashboard.state.readings): what they read back
    is what a deque of the newest GPU_HISTORY lists gave, unknown values None, through a
    checkpoint too; a checkpoint of an earlier version (that deque) loads as the ring."""
    import collections

    from dashboard.state.fold import GPU_HISTORY
    from dashboard.state.readings import GpuHistory
    from dashboard.storage.codec import decode_state, encode_state

    log = two_running_ranks()
    expected = collections.deque(maxlen=GPU_HISTORY)
    for i in range(GPU_HISTORY + 7):  # past the ring's size: the oldest go
        values = {"util_gpu": float(i % 100), "mem_used": 8e10 + i, "power_w": 250.5}
        if i % 3:
            values["temp_c"] = 60.0 + i  # absent: NVML could not tell
        log.add("s0", "gpu", {"uuid": "GPU-0", "lost": False, "reasons": [], "xids": [],
                              "values": values}, t=100.0 + i)
        expected.append([100.0 + i, values["util_gpu"], values["mem_used"],
                         values.get("temp_c"), values["power_w"]])
    state = log.state()
    assert isinstance(state.gpu_history[0], GpuHistory)
    assert list(state.gpu_history[0]) == list(expected) and len(expected) == GPU_HISTORY
    assert list(decode_state(encode_state(state)).gpu_history[0]) == list(expected)
    state.gpu_history = {0: collections.deque(list(expected)[:5], maxlen=GPU_HISTORY)}
    loaded = decode_state(encode_state(state))
    assert isinstance(loaded.gpu_history[0], GpuHistory)
    assert list(loaded.gpu_history[0]) == list(expected)[:5]


def _busy_row(window: list, first: int, bins: int, into: list | None = None) -> list | None:
    """The heat map's row of one (group, rank) window, one summary at a time: each counts
    its busy percent over its interval since the one before it (the oldest over a second),
    spread over its seconds when 1-10 s long, in the second it ends; the newest summaries
    that end on the grid count; percents add up, to 100 at most."""
    start = len(window)
    while start and window[start - 1][0] >= first:
        start -= 1
    if start == len(window):
        return into
    row = [None] * bins if into is None else into
    prev = window[start - 1][0] if start else None
    for end, _count, sum_us, _hist in window[start:]:
        dt = end - prev if prev is not None else 1.0
        prev = end
        b = int(end) - first
        if b < bins:
            pct = round(sum_us / 1e4 / (dt if 1.0 < dt < 10 else 1.0))
            row[b] = min(100, pct if row[b] is None else row[b] + pct)
    return row


def test_the_heat_maps_rows_are_each_summarys_busy_share_added_up():
    # timeline._busy_of reads the windows' columns at once; whatever the windows hold
    # (clocks that stepped back, summaries longer than a second or much longer, two groups of
    # a family), a row is _busy_row()'s.
    import random

    from dashboard.state.recent import RecentWindows

    rng = random.Random(7)
    for trial in range(300):
        width = rng.choice((1, 2, 5, 60))
        points: dict[str, list] = {"0": [], "1": [(95.0, 1, 3e5, ()), (96.5, 1, 9e5, ())]}
        end = 100.0
        for _ in range(rng.choice((0, 1, 2, 3, 70))):
            back = rng.random() < 0.02  # a clock stepped back
            end += rng.choice((0.0, 0.25, 0.5, 1.0, 1.5, 4.0, 12.0)) * (-1 if back else 1)
            points["0"].append((end, 1, rng.uniform(0, 2e6), ()))
        points = {g: pts[-width:] for g, pts in points.items()}
        state = JobState(1, "j")
        state.recent = RecentWindows.of({(g, 0): pts for g, pts in points.items()}, width)
        merged = rng.random() < 0.5
        families = {"0": "f", "1": "f" if merged else "g"}
        bins = rng.choice((1, 4, 30, 100))
        last = int(max(e[0] for pts in points.values() for e in pts)) + rng.choice((0, 0, 1, 3))
        first = last - bins + 1
        want: dict[str, dict] = {}
        for g in ("1", "0"):
            row = _busy_row(points[g], first, bins, want.get(families[g], {}).get(0))
            if row is not None:
                want.setdefault(families[g], {})[0] = row
        assert timeline._busy_of(state, families, first, bins) == want, (trial, points, first)


def test_what_a_state_keeps_beside_its_fold_is_not_stored():
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.rules import diagnose
    from dashboard.storage.codec import decode_state, encode_state

    log = two_running_ranks()
    log.add("s0", "coll_stats", stats("0", "all_reduce", 4, 100.0), t=20)
    state = log.state()
    before = timeline.timeline_grid(state, bins=4)
    judged = diagnose(state, 21.0, Settings())
    assert state._memo  # the windows the rules read, indexed for this moment
    loaded = decode_state(encode_state(state))
    assert loaded._memo == {} and state._memo
    assert timeline.timeline_grid(loaded, bins=4) == before
    assert diagnose(loaded, 21.0, Settings()) == judged


def test_what_the_rules_remember_is_freed_by_the_next_event_and_held_for_one_moment():
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.rules import diagnose

    log = two_running_ranks()
    log.add("s0", "coll_stats", stats("0", "all_reduce", 4, 100.0), t=20)
    state = log.state()
    diagnose(state, 21.0, Settings())
    assert ("windows",) in state._memo
    # A quiet job judged at one moment after another holds one copy of its windows, not one
    # per moment (a 1,024-rank job's are ~10 MB).
    for now in (22.0, 23.0, 24.0):
        judged = diagnose(state, now, Settings())
        assert [k for k in state._memo if k[0] == "windows"] == [("windows",)]
        assert state._memo[("windows",)][0] == now
    assert diagnose(state, 24.0, Settings()) == judged  # the same moment: what it remembered
    state.apply({"id": 99, "session": "s1", "kind": "init_start", "t": 25.0,
                 "body": {"rank": 1, "world_size": 2}, "seq": 99, "received_at": 25.0})
    assert state._memo == {}  # freed as the state changes, not at the next judgement
