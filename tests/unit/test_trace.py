"""Trace export on plain events: processes, threads, waits, counters, caps and bad
parameters (a real job's trace: tests/integration/test_trace_job.py)."""

from __future__ import annotations

import json

import pytest

from dashboard.history.trace import (JOB_PID, TEXT_LIMIT, TraceError, build_trace, json_chunks,
                             trace_query)
from tests.helpers.trace import names, timeline


# -- the mapping on plain events ----------------------------------------------------------------

def plain_job() -> list[dict]:
    """Rank 1 waits in all_reduce #8 from t=104 until about 106.5; both exit at 110."""
    events: list[dict] = []

    def ev(session, t, kind, body):
        events.append({"id": len(events) + 1, "session": session, "seq": len(events) + 1,
                       "t": t, "received_at": t, "kind": kind, "body": body})

    for r in (0, 1):
        ev(f"s{r}", 100.0, "connect", {"rank": r, "host": f"h{r}"})
        ev(f"s{r}", 100.0, "hello", {"job": "j", "rank": r, "world_size": 2, "host": f"h{r}",
                                     "pid": 10 + r})
        ev(f"s{r}", 100.0, "init_start", {"rank": r})
        ev(f"s{r}", 100.5, "init_done", {"rank": r, "world_size": 2, "duration_s": 0.5})
        ev(f"s{r}", 100.5, "group", {"name": "0", "desc": "default_pg", "ranks": [0, 1]})
    row = {"group": "0", "op": "all_reduce", "bytes": 40, "hist": [[70, 10]]}
    ev("s1", 103.0, "coll_stats", {"start": 102.0, "end": 103.0,
                                   "rows": [{**row, "count": 10, "sum_us": 5e3, "max_us": 900}]})
    wait = {"group": "0", "entered": 8, "completed": 7, "inflight_op": "all_reduce",
            "inflight_since": 104.0, "inflight_dtype": "float32", "inflight_bytes": 16}
    ev("s1", 105.0, "heartbeat", {"groups": [wait]})
    ev("s1", 105.2, "stack", {"group": "0", "seq": 8, "op": "all_reduce", "since": 104.0,
                              "stack": "x" * (TEXT_LIMIT + 10)})
    ev("s1", 106.0, "heartbeat", {"groups": [wait]})
    ev("s1", 107.0, "coll_stats", {"start": 106.0, "end": 107.0,
                                   "rows": [{**row, "count": 1, "sum_us": 2.5e6,
                                             "max_us": 2.5e6}]})
    ev("s1", 107.0, "heartbeat", {"groups": [{"group": "0", "entered": 8, "completed": 8}]})
    ev("s0", 108.0, "error", {"where": "collective", "error_type": "RuntimeError",
                              "error": "gloo says no", "group": "0", "op": "broadcast",
                              "seq": 9})
    for r in (0, 1):
        ev(f"s{r}", 110.0, "exit", {"clean": True})
        ev(f"s{r}", 110.1, "disconnect", {})
    return events


HANG = {"id": "hang:0:", "kind": "hang", "severity": "critical", "ranks": [0], "group": "0",
        "summary": "rank 0 is late", "hint": "look", "evidence": {"waiting": [1]},
        "first_seen": 105.5, "last_seen": 106.5, "active": False}


def by_name(trace: dict, name: str) -> list[dict]:
    return [e for e in timeline(trace) if e["name"] == name]


def test_plain_events_map_to_processes_threads_and_events():
    trace = json.loads("".join(json_chunks(build_trace(plain_job(), findings=[HANG],
                                                       job={"name": "j"}), 7)))
    assert names(trace) == {1: "rank 0 (h0)", 2: "rank 1 (h1)",
                            JOB_PID: "job j: findings and incidents"}
    labels = {e["pid"]: e["args"]["labels"] for e in trace["traceEvents"]
              if e["name"] == "process_labels"}
    assert labels == {1: "pid 10", 2: "pid 11"}
    tids = {(e["pid"], e["args"]["name"]): e["tid"] for e in trace["traceEvents"]
            if e["name"] == "thread_name"}
    assert set(tids) == {(1, "lifecycle"), (1, "group 0 · default_pg"), (2, "lifecycle"),
                         (2, "group 0 · default_pg"), (JOB_PID, "findings")}
    assert len(set(tids.values())) == len(tids) and not set(tids.values()) & {1, 2, JOB_PID}

    # The wait: from inflight_since to the end the completing interval's longest call gives.
    (wait,) = by_name(trace, "all_reduce")
    assert (wait["pid"], wait["tid"]) == (2, tids[(2, "group 0 · default_pg")])
    assert (wait["ts"], wait["dur"]) == (104_000_000, 2_500_000)
    assert wait["args"]["seq"] == 8 and wait["args"]["bytes"] == 16
    assert wait["args"]["end_from"].startswith("the longest all_reduce")
    (init,) = [e for e in by_name(trace, "init_process_group") if e["pid"] == 1]
    assert (init["ts"], init["dur"]) == (100_000_000, 500_000)

    # Counters step to zero where an interval without collectives follows.
    busy = [(e["ts"], e["args"]["busy"]) for e in by_name(trace, "group 0 busy %")]
    assert busy == [(102_000_000, 0.5), (103_000_000, 0.0), (106_000_000, 100.0),
                    (107_000_000, 0.0)]
    seq = [e["args"] for e in by_name(trace, "group 0 seq")]
    assert seq[0] == {"entered": 8, "completed": 7} and seq[-1]["completed"] == 8

    (error,) = by_name(trace, "error: RuntimeError")
    assert error["pid"] == 1 and error["tid"] == tids[(1, "group 0 · default_pg")]
    (stack,) = by_name(trace, "stack: all_reduce #8")
    assert len(stack["args"]["stack"]) < TEXT_LIMIT + 100 and "more characters" in \
        stack["args"]["stack"]
    assert len(by_name(trace, "exit")) == 2 and not by_name(trace, "agent disconnected")

    marks = [(e["name"], e["pid"], e["s"], e["ts"]) for e in timeline(trace)
             if e["cat"] == "finding"]
    assert sorted(marks) == sorted([
        ("hang: rank 0 is late", 1, "p", 105_500_000),
        ("hang: rank 0 is late", JOB_PID, "g", 105_500_000),
        ("hang last seen", 1, "p", 106_500_000), ("hang last seen", JOB_PID, "g", 106_500_000)])


def test_a_wait_that_never_ends_says_so():
    events = [e for e in plain_job() if e["t"] < 106.5]  # the log ends during the wait
    events.append({**events[-1], "id": 99, "t": 106.6, "kind": "disconnect", "body": {}})
    trace = build_trace(events)
    (wait,) = by_name(trace, "all_reduce (never completed)")
    assert (wait["ts"], wait["dur"]) == (104_000_000, 2_000_000)  # until last seen in flight
    assert "connection closed" in wait["args"]["end"]
    assert by_name(trace, "agent disconnected")


def test_a_wait_open_when_the_log_ends_is_still_in_flight():
    trace = build_trace([e for e in plain_job() if e["t"] < 106.5])
    (wait,) = by_name(trace, "all_reduce (still in flight)")
    assert (wait["ts"], wait["dur"]) == (104_000_000, 2_000_000)


def test_collectives_only_the_flight_recorder_saw():
    """DDP's all-reduce runs in C++: its progress comes in the Flight Recorder's counters."""
    def beat(t, enqueued, completed, since):
        return {"id": int(t), "session": "s", "seq": int(t), "t": t, "received_at": t,
                "kind": "heartbeat", "body": {"groups": [{
                    "group": "0", "entered": 0, "completed": 0, "fr_enqueued": enqueued,
                    "fr_completed": completed, "fr_inflight_since": since}]}}

    events = [{"id": 1, "session": "s", "seq": 1, "t": 10.0, "received_at": 10.0,
               "kind": "connect", "body": {"rank": 0}},
              beat(11.0, 40, 39, 10.5), beat(12.0, 40, 39, 10.5), beat(13.0, 41, 41, None)]
    trace = build_trace(events)
    (wait,) = by_name(trace, "C++ collective")
    assert (wait["ts"], wait["dur"]) == (10_500_000, 1_500_000)  # until last seen in flight
    assert wait["args"]["source"] == "flight_recorder" and wait["args"]["seq"] == 40
    assert [e["args"] for e in by_name(trace, "group 0 seq")][-1] == \
        {"enqueued": 41, "completed": 41}


def test_a_rank_learnt_at_init_done_keeps_its_earlier_events():
    """attach() before init_process_group without RANK: the rank comes with init_done."""
    events = [
        {"id": 1, "session": "x", "seq": 1, "t": 50.0, "received_at": 50.0, "kind": "hello",
         "body": {"job": "j", "rank": None, "host": "h", "pid": 3}},
        {"id": 2, "session": "x", "seq": 2, "t": 50.0, "received_at": 50.0,
         "kind": "init_start", "body": {"rank": -1}},
        {"id": 3, "session": "x", "seq": 3, "t": 52.0, "received_at": 52.0,
         "kind": "init_done", "body": {"rank": 3, "world_size": 4, "duration_s": 2.0}},
        {"id": 4, "session": "y", "seq": 1, "t": 51.0, "received_at": 51.0,
         "kind": "init_failed", "body": {"error_type": "ValueError", "error": "no RANK",
                                         "duration_s": 1.0}},
    ]
    trace = build_trace(events)
    assert names(trace)[4] == "rank 3 (h)"
    (init,) = by_name(trace, "init_process_group")
    assert init["pid"] == 4 and (init["ts"], init["dur"]) == (50_000_000, 2_000_000)
    unknown = [p for p, n in names(trace).items() if n.endswith("(rank unknown)")]
    assert len(unknown) == 1 and {e["pid"] for e in by_name(trace, "error: ValueError")} == \
        set(unknown)


def test_incidents_are_instants_on_the_blamed_ranks():
    incident = {"id": "i1", "kind": "hang", "severity": "critical", "ranks": [1],
                "summary": "rank 1 stopped", "hint": "h", "findings": ["hang:0:"],
                "first_seen": 105.0, "last_seen": 106.0, "active": True}
    trace = build_trace(plain_job(), incidents=[incident])
    marks = {(e["pid"], e["s"]) for e in by_name(trace, "incident hang: rank 1 stopped")}
    assert marks == {(2, "p"), (JOB_PID, "g")}
    assert trace["metadata"]["incidents"] == "included"


def test_the_cap_on_plain_events_keeps_an_even_share():
    whole = build_trace(plain_job(), findings=[HANG])
    total = len(timeline(whole))
    for cap in (total, total - 1, 10, 4, 1):
        trace = build_trace(plain_job(), findings=[HANG], max_events=cap)
        kept = timeline(trace)
        assert len(kept) <= cap
        dropped = sum(c["dropped"] for c in trace["metadata"]["cut"].values())
        assert len(kept) + dropped == total
    trace = build_trace(plain_job(), findings=[HANG], max_events=4)
    assert {e["cat"] for e in timeline(trace)} == {"finding"}


def test_the_cap_thins_every_counter_evenly():
    """Four counters a rank and second: each keeps its share, evenly spaced in time."""
    events = []
    for r in (0, 1):
        events.append({"id": len(events) + 1, "session": f"s{r}", "seq": None, "t": 0.0,
                       "received_at": 0.0, "kind": "connect", "body": {"rank": r}})
    for sec in range(1, 101):
        for r in (0, 1):
            for kind, body in (
                    ("coll_stats", {"start": sec - 1.0, "end": float(sec), "rows": [
                        {"group": "0", "op": "all_reduce", "count": 5, "bytes": 20,
                         "sum_us": 500.0, "max_us": 200.0, "hist": [[60, 5]]}]}),
                    ("heartbeat", {"groups": [{"group": "0", "entered": 5 * sec,
                                               "completed": 5 * sec}]})):
                events.append({"id": len(events) + 1, "session": f"s{r}", "seq": None,
                               "t": float(sec), "received_at": float(sec), "kind": kind,
                               "body": body})
    whole = timeline(build_trace(events))
    # connects, 4 counters per rank and second, and 3 set back to 0 as each log ends
    assert len(whole) == 2 + 2 * 100 * 4 + 2 * 3
    trace = build_trace(events, max_events=300)
    assert trace["metadata"]["cut"]["counters"]["kept_one_in"] == 4
    series: dict = {}
    for e in timeline(trace):
        if e["ph"] == "C":
            series.setdefault((e["pid"], e["name"]), []).append(e["ts"] / 1e6)
    assert len(series) == 2 * 4, "every counter of every rank keeps its share"
    for times in series.values():
        gaps = {round(b - a, 6) for a, b in zip(times, times[1:])}
        assert gaps == {4.0} and len(times) >= 25, times  # (+ the final 0 of a summary)


def test_bad_parameters_are_named():
    assert trace_query({}, 10) == (None, None, 10)
    assert trace_query({"start": "1.5", "end": "2", "max_events": "3"}, 10) == (1.5, 2.0, 3)
    with pytest.raises(TraceError, match="start must be a time"):
        trace_query({"start": "inf"}, 10)
    with pytest.raises(TraceError, match="max_events must be an integer from 1 to 10"):
        trace_query({"max_events": "11"}, 10)
    with pytest.raises(TraceError, match="max_events must be a positive integer"):
        build_trace([], max_events=0)


def test_counter_percentiles_agree_with_the_server_s_own():
    import random

    from dashboard.state import LatencyStats
    from dashboard.history.trace_reading import _percentiles

    rng = random.Random(8)
    for _ in range(500):
        hist = [[b, rng.randint(1, 50)] for b in sorted(rng.sample(range(320), rng.randint(1, 8)))]
        longest = rng.uniform(1, 1e7)
        stats = LatencyStats()
        stats.add({"count": 0, "bytes": 0, "sum_us": 0.0, "max_us": longest, "hist": hist})
        assert _percentiles(hist, longest) == (stats.percentile(0.5), stats.percentile(0.99))


def test_a_bad_server_cap_stops_the_start_naming_the_variable():
    from dashboard.web.app import create_app

    with pytest.raises(ValueError, match="PGDASH_TRACE_MAX_EVENTS must be a positive integer"):
        create_app({"TRACE_MAX_EVENTS": "lots"})


def test_every_kind_the_fold_folds_is_drawn_or_named_as_not():
    """The trace reads JobState's fold: a kind the fold learns is drawn, or said not to be."""
    from dashboard.history.trace_reading import NOT_DRAWN, TraceReading
    from dashboard.state.fold import Fold

    folded = {name[4:] for name in vars(Fold) if name.startswith("_on_")}
    drawn = {name[4:] for name in vars(TraceReading) if name.startswith("_on_")}
    assert drawn <= folded, f"readings of kinds the fold does not fold: {drawn - folded}"
    assert folded - drawn == set(NOT_DRAWN)
