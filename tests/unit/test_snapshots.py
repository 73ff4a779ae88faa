"""Snapshots without a job: the agent's answers (bounded, counted, read-only), their wire
shape, the server's requests (rate, unknown ranks, connections that come and go) and how
answers read against a request (statuses, stacks grouped with the odd one out first)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pgdash_agent import native as native_frames
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.outbox import Outbox
from pgdash_agent.snapshots import MAX_PENDING, Snapshots, threads_now
from pgdash_agent.wire import MAX_SNAPSHOT_THREADS, WireError, validate_event
from dashboard.ingest.asks import (ANSWER_WAIT_S, MAX_PEER_ASKS, MIN_INTERVAL_S, PEER_AFTER_S,
                                   Asks, Busy, ReaderLink, TooSoon, UnknownRanks)
from dashboard.ingest import asks as asks_module
from dashboard.state.fold import MAX_PEER_RANKS, MAX_PEER_REQUESTS
from dashboard.web import snapshots as views
from tests.helpers.clock import Clock
from tests.helpers.events import hello, running
from tests.helpers.procs import wait_for


def _agent_snapshots():
    outbox = Outbox(100)
    woken = []
    snaps = Snapshots(CollectiveTracker(lambda pg: ("0", "default_pg", "gloo", [0]),
                                        lambda *a: None, 100),
                      outbox, lambda perf: perf, lambda: {}, lambda: woken.append(1))
    return snaps, outbox, woken


def _sent(outbox):
    return [e for e in outbox.take(100) if e["kind"] == "snapshot"]


def test_the_agent_answers_a_snapshot_with_its_threads_training_thread_first():
    snaps, outbox, woken = _agent_snapshots()
    parked = threading.Event()
    other = threading.Thread(target=parked.wait, name="data-loader", daemon=True)
    other.start()
    try:
        snaps.ask({"ask": "a1", "what": "snapshot", "at": 5.0, "reason": "incident hang:r1"})
        assert woken == [1] and _sent(outbox) == []  # queued; answered on the agent's thread
        snaps.answer()
    finally:
        parked.set()
    (event,) = _sent(outbox)
    body = event["body"]
    assert (body["ask"], body["asked_at"], body["reason"]) == ("a1", 5.0, "incident hang:r1")
    names = [t["name"] for t in body["threads"]]
    assert names[0] == "MainThread" and body["threads"][0]["training"]
    assert "data-loader" in names and not any(n.startswith("pgdash-") for n in names)
    loader = next(t for t in body["threads"] if t["name"] == "data-loader")
    assert loader["frames"][-1]["function"] == "wait"  # where that thread stands
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": body})


@pytest.mark.parametrize("message", [
    None, "snapshot", {"ask": "a", "what": "exec", "code": "import os"},  # nothing is executed
    {"ask": "", "what": "snapshot"}, {"ask": "x" * 65, "what": "snapshot"},
    {"ask": 7, "what": "snapshot"}, {"what": "snapshot"},
    {"ask": "a", "what": "peer", "pid": "1", "rank": 0}, {"ask": "a", "what": "peer", "pid": 0,
                                                         "rank": 0},
    {"ask": "a", "what": "peer", "pid": 5, "rank": -1}, {"ask": "a", "what": "peer", "pid": 5},
    {"ask": "a", "what": "peer", "pid": True, "rank": 0}])
def test_questions_the_agent_does_not_answer_are_counted_and_ignored(message):
    snaps, outbox, woken = _agent_snapshots()
    snaps.ask(message)
    snaps.answer()
    assert (snaps.ignored, woken, _sent(outbox)) == (1, [], [])


def test_a_flood_of_questions_keeps_the_newest_and_counts_the_rest():
    snaps, outbox, _ = _agent_snapshots()
    for i in range(MAX_PENDING + 3):
        snaps.ask({"ask": f"a{i}", "what": "snapshot"})
    snaps.answer()
    asked = [e["body"]["ask"] for e in _sent(outbox)]
    assert asked == [f"a{i}" for i in range(3, MAX_PENDING + 3)] and snaps.dropped == 3


def test_a_snapshot_body_is_bounded_on_the_wire():
    body = {"ask": "a", "threads": [{"name": "t", "frames": []}] * (MAX_SNAPSHOT_THREADS + 1)}
    with pytest.raises(WireError, match="threads"):
        validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": body})
    assert len(threads_now()) <= MAX_SNAPSHOT_THREADS


def _asks(world=3, log=None):
    state = (log or running(world)).state()
    clock = Clock()
    asks = Asks(lambda job_id, view, timeout=None: view(state) if job_id == 1 else None, clock,
                schedule=lambda delay, call: asks.scheduled.append((delay, call)))
    asks.scheduled = []  # the timers a request set (peers read after PEER_AFTER_S)
    sent = {r: [] for r in range(world)}
    for r in range(world):
        asks.link(f"s{r}", sent[r].append)
    return asks, sent, clock, state


def test_a_request_asks_each_connected_rank_once_and_remembers_who_was_not():
    asks, sent, clock, _ = _asks()
    first, second = sent[2].append, sent[2].append  # two connections of session s2
    asks.link("s2", first)
    asks.link("s2", second)  # a reconnect: the newer connection is the one asked
    asks.unlink("s2", first)  # the older one's end leaves the newer linked
    assert asks.linked("s2")
    asks.unlink("s2", second)
    made = asks.request(1, None, "asked by a test")
    assert (made.asked, made.not_connected) == ([0, 1], [2])
    assert sent[0] == [{"ask": made.id, "what": "snapshot", "at": 1000.0,
                        "reason": "asked by a test"}] and sent[2] == []
    with pytest.raises(TooSoon):
        asks.request(1, [0, 1], "again")
    clock.t += MIN_INTERVAL_S
    asks.request(1, [0], "again, later")
    with pytest.raises(UnknownRanks, match="job 1 has no rank 5: its ranks are 0-2"):
        asks.request(1, [0, 5], "x")
    assert asks.request(9, None, "x") is None  # an unknown job
    assert [r.reason for r in asks.requests(1)] == ["asked by a test", "again, later"][::-1]


def test_a_rank_whose_exit_is_folded_is_not_asked_and_reads_as_gone_with_its_last_stack():
    """Its connection may outlive it a moment (the demo's kill snapshot asked four dead ranks,
    each then 'asked, silent'): it is not asked, and reads as ended, not as blocked."""
    log = running(3)
    log.add("s1", "stack", {"group": "0", "op": "all_reduce", "seq": 5, "waited_s": 3.0,
                            "stack": "File \"train.py\", line 9, in step"}, t=104.0)
    log.add("s1", "exit", {"clean": False, "code": 1, "error": "boom"}, t=105.0)
    asks, sent, clock, state = _asks(log=log)  # every rank's connection still linked
    made = asks.request(1, None, "asked by a test")
    assert (made.asked, made.not_connected) == ([0, 2], [1])
    assert sent[1] == []
    row = views.request_view(state, made, clock.t + ANSWER_WAIT_S + 1)["ranks"]["1"]
    assert (row["status"], row["rank_status"], row["exit_at"]) == ("not connected", "failed",
                                                                   105.0)
    assert "train.py" in row["last_stack"]["stack"]


def test_an_incident_snapshots_its_blamed_ranks_and_a_few_victims_at_once():
    asks, sent, _, _ = _asks(world=6)
    asks.request(1, [4], "asked by a user")  # a moment ago: the incident's request is forced
    asks.on_incident("new", {"id": 1}, {"id": "hang:r4", "ranks": [4]})
    asks.on_incident("resolved", {"id": 1}, {"id": "hang:r4", "ranks": [4]})
    (made, _user) = asks.requests(1)
    assert made.asked == [0, 1, 2, 4] and made.reason == "incident hang:r4"
    assert len(sent[4]) == 2 and sent[5] == []
    # Ranks that never arrived (init_incomplete blames them): the others are asked.
    asks.clock.t += 60
    asks.on_incident("new", {"id": 1}, {"id": "init:r7-8", "ranks": [7, 8]})
    assert asks.requests(1)[0].asked == [0, 1, 2]
    # One that blames no rank yet (a job whose every rank stands still outside collectives:
    # where each stands decides) asks the first ranks; one for information asks none.
    asks.clock.t += 60
    asks.on_incident("new", {"id": 1}, {"id": "stopped", "ranks": [], "severity": "info"})
    assert len(asks.requests(1)) == 3
    asks.on_incident("new", {"id": 1}, {"id": "hang:stall:-:idle", "ranks": [],
                                        "severity": "warning"})
    assert asks.requests(1)[0].asked == [0, 1, 2, 3, 4, 5]


def _answer(log, rank, ask, t, frames):
    log.add(f"s{rank}", "snapshot", {"ask": ask, "threads": [
        {"name": "MainThread", "training": True, "frames": frames}]}, t=t)


def _frames(*lines):
    return [{"file": "train.py", "line": n, "function": "step", "code": f"line {n}"}
            for n in lines]


def test_answers_read_against_their_request_with_the_odd_stack_first():
    asks, sent, clock, _ = _asks(world=5)
    link = sent[4].append
    asks.link("s4", link)
    asks.unlink("s4", link)  # rank 4's agent holds no connection here
    log = running(5)
    log.add("s4", "exit", {"clean": False}, t=100.5)  # rank 4 failed: nobody left to ask
    made = asks.request(1, None, "test")
    for rank in (0, 1):
        _answer(log, rank, made.id, 101.0, _frames(10, 20))
    _answer(log, 2, made.id, 101.0, _frames(10, 42))
    log.add("s3", "stack", {"group": "0", "seq": 5, "op": "all_reduce", "since": 99.0,
                            "stack": "rank 3 waited here"}, t=100.0)
    log.add("s2", "gpu", {"uuid": "GPU-2", "lost": False, "reasons": [], "xids": [],
                          "values": {"util_gpu": 97.0, "temp_c": 71.0}}, t=100.2)
    log.add("s2", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": "Connection closed by peer"}, t=100.4)
    state = log.state()
    view = views.request_view(state, made, now=clock.t + 1, detail={2})
    # Beside its answer, what the server knows of the rank: its last GPU reading and error.
    shown = view["ranks"]["2"]
    assert (shown["gpu"]["util_gpu"], shown["gpu"]["t"]) == (97.0, 100.2)
    assert shown["error"] == {"t": 100.4, "where": "collective", "error_type": "RuntimeError",
                              "error": "Connection closed by peer"}
    whole = views.request_view(state, made, now=clock.t + 1, detail=None)["ranks"]["0"]
    assert "threads" in whole and "gpu" not in whole and "error" not in whole  # none known
    assert "threads" not in view["ranks"]["0"] and view["ranks"]["0"]["stack_group"] == 1
    assert {r: row["status"] for r, row in view["ranks"].items()} == \
        {"0": "answered", "1": "answered", "2": "answered", "3": "waiting",
         "4": "not connected"}
    assert [g["ranks"] for g in view["groups"]] == [[2], [0, 1]]
    assert view["groups"][0]["where"]["line"] == 42
    assert 'File "train.py", line 42, in step' in view["ranks"]["2"]["threads"][0]["stack"]
    later = views.request_view(state, made, now=clock.t + ANSWER_WAIT_S)
    assert later["ranks"]["3"]["status"] == "no answer" and later["missing"] == [3, 4]
    assert later["ranks"]["3"]["last_stack"]["stack"] == "rank 3 waited here"
    assert later["ranks"]["3"]["rank_status"] == "running"  # alive, yet silent
    assert (later["ranks"]["4"]["rank_status"], later["ranks"]["4"]["exit_at"]) == \
        ("failed", 100.5)


def test_an_answer_shows_as_it_arrives_and_reads_the_same_once_folded(monkeypatch):
    """Behind a backlog the writer folds an answer seconds after it came in (1,024 ranks):
    the request's view shows it as it arrives (Asks.arrived / Asks.early)."""
    asks, _, clock, _ = _asks(world=3)
    log = running(3)
    made = asks.request(1, [1, 2], "two ranks")
    body = {"ask": made.id, "threads": [{"name": "MainThread", "training": True,
                                         "frames": _frames(7)}]}

    def snapshot(seq, answer):
        return {"seq": seq, "t": 101.0, "kind": "snapshot", "body": answer}

    # Not kept: a rank not asked, an answer to a request made elsewhere, other kinds.
    asks.arrived("s0", 1, [snapshot(5, body)])
    asks.arrived("s1", 1, [snapshot(5, {**body, "ask": "elsewhere"}),
                           {"seq": 6, "t": 101.0, "kind": "exit", "body": {"clean": True}}])
    assert asks.early(made) == {}
    asks.arrived("s1", 1, [snapshot(7, body)])
    before = views.request_view(log.state(), made, clock.t + 1, None, asks.early(made))
    assert {r: row["status"] for r, row in before["ranks"].items()} == \
        {"1": "answered", "2": "waiting"}
    log.add("s1", "snapshot", body, t=101.0)  # the writer folds it
    folded = views.request_view(log.state(), made, clock.t + 1, None)
    assert folded == before
    assert views.request_view(log.state(), made, clock.t + 1, None, asks.early(made)) == folded
    # Bounded, the oldest let go first.
    monkeypatch.setattr(asks_module, "MAX_EARLY", 1)
    asks.arrived("s2", 1, [snapshot(8, body)])
    assert list(asks.early(made)) == [2]


def test_a_silent_rank_is_read_from_outside_by_a_rank_of_its_host_that_answered():
    log = running(3)
    log.add("s2", "hello", {**hello(2, world=3), "host": "node1"}, t=100.0)  # another host
    asks, sent, clock, _ = _asks(log=log)
    made = asks.request(1, None, "all")
    ((delay, later),) = asks.scheduled
    assert delay == PEER_AFTER_S
    _answer(log, 0, made.id, 101.0, _frames(10))
    # Asks reads the state it was made with; give it the one with rank 0's answer.
    asks.read = lambda job_id, view, timeout=None: view(log.state())
    asks.lag = lambda: 10.0  # ingest behind: answers may be late, nobody is read
    later()
    assert not [m for m in sent[0] if m["what"] == "peer"]
    behind = views.request_view(log.state(), made, clock.t + ANSWER_WAIT_S)["ranks"]
    assert "the server was behind" in behind["1"]["read_from_outside"]["error"]
    assert "read_from_outside" not in behind["0"]  # it answered
    asks.lag = lambda: 0.0
    later()
    # Rank 1 (silent, on node0) is read by rank 0; rank 2 (silent, alone on node1) is not.
    (question,) = [m for m in sent[0] if m["what"] == "peer"]
    assert (question["ask"], question["pid"], question["rank"]) == (made.id, 101, 1)
    assert [m["what"] for m in sent[2]] == ["snapshot"] and made.peers == {1: 0}
    view = views.request_view(log.state(), made, clock.t + 1)
    assert view["ranks"]["1"]["read_from_outside"] == {"by": 0}  # asked, not read yet
    assert view["ranks"]["2"]["read_from_outside"] == {  # why nobody read it
        "error": "no other rank of its host answered (alone there, or all silent), and no "
                 "host reader of it is connected here (pgdash_agent.reader: it needs py-spy "
                 "on the host and protocol v2, and PGDASH_HOST_READER and PGDASH_PEER_READ "
                 "left on), so nobody there could read it"}
    late = views.request_view(log.state(), made, clock.t + PEER_AFTER_S + ANSWER_WAIT_S)
    assert late["ranks"]["1"]["read_from_outside"] == {
        "by": 0, "error": "its agent did not answer that question either"}
    dump = ('Process 101: python train.py\n\nThread 101 (active+gil): "MainThread"\n'
            '    match (re/__init__.py:166)\n    <module> (train.py:42)\n')
    log.add("s0", "snapshot", {"ask": made.id, "threads": [], "for_rank": 1,
                               "peer_dump": dump}, t=102.0)
    view = views.request_view(log.state(), made, clock.t + ANSWER_WAIT_S)
    assert view["ranks"]["1"]["status"] == "no answer"  # its own agent never answered
    assert view["ranks"]["1"]["read_from_outside"] == {"by": 0, "t": 102.0, "dump": dump,
                                                       "gil_held_by": "MainThread"}
    assert view["ranks"]["0"]["status"] == "answered"  # its own answer stays its own


def test_a_rank_alone_on_its_host_is_read_by_the_host_reader_and_only_what_was_asked_is_kept():
    log = running(3)
    log.add("s2", "hello", {**hello(2, world=3), "host": "node1"}, t=100.0)  # alone on node1
    asks, sent, clock, _ = _asks(log=log)
    reader_sent, elsewhere = [], []
    reader = ReaderLink(1, "node1", "s2", 2, 4242, reader_sent.append)
    asks.link_reader(ReaderLink(1, "node9", "s0", 0, 4243, elsewhere.append))  # another host
    asks.link_reader(reader)
    made = asks.request(1, None, "all")
    ((_, later),) = asks.scheduled
    _answer(log, 0, made.id, 101.0, _frames(10))
    asks.read = lambda job_id, view, timeout=None: view(log.state())
    later()
    # Rank 1 is read by rank 0's agent as before; rank 2, alone, by node1's reader.
    assert [m["rank"] for m in sent[0] if m["what"] == "peer"] == [1] and elsewhere == []
    (question,) = reader_sent
    assert (question["what"], question["ask"], question["pid"], question["rank"]) == (
        "peer", made.id, 102, 2)
    asked = views.request_view(log.state(), made, clock.t + 1)["ranks"]["2"]
    assert asked["read_from_outside"] == {"by": 2, "host_reader": True}
    assert not asks.reader_asked(reader, made.id, 1)  # not asked of it
    assert asks.reader_asked(reader, made.id, 2)
    assert not asks.reader_asked(reader, made.id, 2)  # once
    silent_since = log.state().rank_index()[2].last_seen
    dump = 'Thread 102 (active+gil): "MainThread"\n    match (re/__init__.py:166)\n'
    log.add("s2", "read", {"ask": made.id, "for_rank": 2, "peer_dump": dump,
                           "reader_pid": 4242}, t=103.0, seq=None)
    state = log.state()
    assert state.rank_index()[2].last_seen == silent_since  # a reading is not its agent's
    read = views.request_view(state, made, clock.t + ANSWER_WAIT_S)["ranks"]["2"]
    assert read["read_from_outside"] == {"by": 2, "t": 103.0, "dump": dump,
                                         "gil_held_by": "MainThread", "host_reader": True,
                                         "reader_pid": 4242}
    asks.unlink_reader(reader)  # its connection ended: nobody reads node1 any more
    clock.t += MIN_INTERVAL_S
    again = asks.request(1, None, "again")
    asks.scheduled[-1][1]()
    assert len(reader_sent) == 1
    assert "no host reader" in views.request_view(log.state(), again, clock.t + 1)[
        "ranks"]["2"]["read_from_outside"]["error"]


def test_a_host_readers_questions_and_readings_are_checked():
    from pgdash_agent import reader as host_reader
    from pgdash_agent.wire import validate_read

    good = {"ask": "a1", "what": "peer", "pid": 4321, "rank": 3, "at": 5.0, "reason": "r"}
    assert host_reader.question(good) == ("a1", 4321, 3, 5.0, "r")
    for bad in ({**good, "what": "snapshot"}, {**good, "pid": "4321"}, {**good, "pid": 0},
                {**good, "rank": -1}, {**good, "ask": ""}, {**good, "ask": "x" * 65},
                {**good, "pid": True}, ["peer"], None):
        assert host_reader.question(bad) is None, bad
    assert host_reader.question({**good, "at": "soon", "reason": 7})[3:] == (None, None)
    read = validate_read({"ask": "a1", "for_rank": 3, "peer_dump": "Thread 1", "extra": 1})
    assert read == {"ask": "a1", "for_rank": 3, "peer_dump": "Thread 1"}  # (defaults omitted)
    for bad, field in (({"for_rank": 3}, "ask"), ({"ask": "a1"}, "for_rank"),
                       ({"ask": "a1", "for_rank": -2}, "for_rank"),
                       ({"ask": "a1", "for_rank": 1, "peer_dump": "x" * 70_000}, "peer_dump")):
        with pytest.raises(WireError, match=field):
            validate_read(bad)
    # Which rank starts its host's reader.
    wanted = host_reader.wanted
    assert wanted({"LOCAL_RANK": "0"}, True)  # (with py-spy or not: it sends the boards)
    assert wanted({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "1"}, True)
    assert not wanted({"LOCAL_RANK": "1"}, True)
    # mp.spawn, a bare python: which rank is first on its host is not known, so the first
    # to claim it starts the reader (reader.claim).
    assert not wanted({}, True)
    assert wanted({}, True, lambda: True)
    assert not wanted({"LOCAL_RANK": "1"}, True, lambda: True)
    assert not wanted({}, False, lambda: True)
    assert not wanted({"LOCAL_RANK": "0"}, False)  # PGDASH_HOST_READER=0


def test_at_most_eight_silent_ranks_a_request_are_read_from_outside_and_the_rest_say_so():
    world = MAX_PEER_ASKS + 4
    log = running(world)
    asks, sent, clock, _ = _asks(world, log=log)
    made = asks.request(1, None, "all")
    ((_, later),) = asks.scheduled
    _answer(log, 0, made.id, 101.0, _frames(10))  # rank 0 answers; every other rank is silent
    asks.read = lambda job_id, view, timeout=None: view(log.state())
    later()
    questions = [m for m in sent[0] if m["what"] == "peer"]
    assert [q["rank"] for q in questions] == list(range(1, MAX_PEER_ASKS + 1))
    ranks = views.request_view(log.state(), made, clock.t + ANSWER_WAIT_S)["ranks"]
    assert ranks[str(MAX_PEER_ASKS)]["read_from_outside"] == {"by": 0}
    for rank in range(MAX_PEER_ASKS + 1, world):
        assert ranks[str(rank)]["read_from_outside"] == {
            "error": f"only {MAX_PEER_ASKS} silent ranks are read from outside per request"}


def test_readings_from_outside_are_kept_apart_and_bounded():
    log = running(2)
    for rank in range(MAX_PEER_RANKS + 3):  # an agent naming ranks without end
        log.add("s0", "snapshot", {"ask": "r1", "threads": [], "for_rank": rank,
                                   "native_error": "py-spy failed"}, t=101.0)
    state = log.state()
    assert state.snapshots == {} and len(state.snapshot_peers["r1"]) == MAX_PEER_RANKS
    for i in range(MAX_PEER_REQUESTS + 1):
        log.add("s0", "snapshot", {"ask": f"q{i}", "threads": [], "for_rank": 1,
                                   "native_error": "x"}, t=102.0)
    assert len(log.state().snapshot_peers) == MAX_PEER_REQUESTS


def test_the_agent_reads_another_process_only_of_its_own_launch(tmp_path):
    mine = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2"}
    same = subprocess.Popen(["sleep", "30"], env=mine)
    other = subprocess.Popen(["sleep", "30"], env={**mine, "MASTER_PORT": "29501"})
    try:
        for proc in (same, other):  # until exec: a child just forked still has our environment
            wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"),
                     10, "sleep started")
        assert native_frames.same_launch(same.pid, mine) is None
        assert "MASTER_PORT differs" in native_frames.same_launch(other.pid, mine)
        assert "names no launch" in native_frames.same_launch(same.pid, {})
        assert native_frames.same_launch(os.getpid(), mine) == "that is this process"
        assert "MASTER_PORT differs" in native_frames.peer_dump("/bin/true", other.pid, mine)[1]
    finally:
        for proc in (same, other):
            proc.kill()
            proc.wait()
    snaps, outbox, _ = _agent_snapshots()  # no py-spy here: it says so, for that rank
    snaps.ask({"ask": "a", "what": "peer", "pid": same.pid, "rank": 1})
    snaps.answer()
    (event,) = _sent(outbox)
    assert event["body"]["for_rank"] == 1 and event["body"]["threads"] == []
    assert "py-spy is not installed" in event["body"]["native_error"]
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": event["body"]})


def test_an_incident_shows_its_culprits_newest_answer_since_it_began():
    log = running(2)
    _answer(log, 1, "old", 101.0, _frames(7))
    _answer(log, 1, "new", 130.0, _frames(9))
    state = log.state()
    incident = {"id": "hang:r1", "ranks": [1], "first_seen": 120.0}
    (shown,) = views.with_snapshots(state, [incident])
    assert shown["snapshot"]["ask"] == "new" and "line 9" in shown["snapshot"]["stack"]
    (too_early,) = views.with_snapshots(state, [dict(incident, first_seen=140.0)])
    assert "snapshot" not in too_early


def test_a_snapshot_draws_its_recent_collectives_once_on_the_perfetto_timeline():
    from dashboard.history.trace import build_trace
    from tests.helpers.trace import timeline

    log = running(2)
    ring = [["0", "all_reduce", 4096, 100.0 + i, 100.5 + i] for i in range(3)]
    for t, recent in ((104.0, ring), (106.0, ring[1:] + [["0", "broadcast", 8, 104.0, 104.2]])):
        log.add("s1", "snapshot", {"ask": f"a{t}", "reason": "incident hang:r1", "threads": [
            {"name": "MainThread", "training": True, "frames": _frames(42)}],
            "recent": recent}, t=t)
    trace = build_trace(log.events)
    drawn = [e for e in timeline(trace) if e.get("cat") == "collective"]
    assert [(e["name"], e["ts"], e["dur"]) for e in drawn] == [
        ("all_reduce", 100_000_000, 500_000), ("all_reduce", 101_000_000, 500_000),
        ("all_reduce", 102_000_000, 500_000), ("broadcast", 104_000_000, 200_000)]
    threads = {e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(name.endswith("· completed (from snapshots)") for name in threads)
    (instant, _) = [e for e in timeline(trace) if e.get("cat") == "snapshot"]
    assert 'line 42' in instant["args"]["stacks"]["MainThread"]


def test_answers_kept_in_the_state_are_bounded_oldest_requests_first(monkeypatch):
    from dashboard.state import fold

    monkeypatch.setattr(fold, "MAX_SNAPSHOT_ANSWERS", 4)
    log = running(2)
    for i in range(3):
        for rank in (0, 1):
            _answer(log, rank, f"a{i}", 101.0 + i, _frames(i))
    state = log.state()
    assert list(state.snapshots) == ["a1", "a2"] and state.snapshot_answers == 4


def test_incidents_ask_at_most_once_a_while_per_job_and_never_while_behind(monkeypatch):
    from dashboard.ingest import asks as module

    asks, sent, clock, state = _asks(world=4)
    lag = [0.0]
    asks.lag = lambda: lag[0]
    for rank in range(4):  # a burst: four incidents at once (a node died)
        asks.on_incident("new", {"id": 1}, {"id": f"crash:r{rank}", "ranks": [rank]})
    assert len(asks.requests(1)) == 1 and asks.counters["snapshot_auto_skipped"] == 3
    clock.t += module.AUTO_EVERY_S
    lag[0] = 5.0  # ingest behind: the answers would add to its backlog
    asks.on_incident("new", {"id": 1}, {"id": "hang:r2", "ranks": [2]})
    assert len(asks.requests(1)) == 1
    # A user may still ask a few ranks, not many.
    monkeypatch.setattr(module, "MAX_RANKS_WHEN_BEHIND", 2)
    with pytest.raises(Busy, match="ingest is 5 s behind the agents"):
        asks.request(1, [0, 1, 3], "more ranks than a server behind takes")
    asks.request(1, [2], "the blamed rank")
    lag[0] = 0.0
    clock.t += module.AUTO_EVERY_S
    asks.on_incident("new", {"id": 1}, {"id": "hang:r2", "ranks": [2]})
    assert [r.reason for r in asks.requests(1)][:2] == ["incident hang:r2", "the blamed rank"]


def test_the_list_holds_requests_remembered_and_those_known_only_by_their_answers():
    """After a restart (or for another process's requests) the answers in the log still list
    their request, at the time the agents say they were asked, with how many answered."""
    asks, sent, clock, _ = _asks(world=3)
    remembered = asks.request(1, [0, 1, 2], "asked by a user")
    log = running(3)
    _answer(log, 0, remembered.id, clock.t + 0.1, _frames(1))
    log.add("s1", "snapshot", {"ask": "before", "asked_at": 50.0, "reason": "incident hang:r1",
                               "threads": []}, t=50.2)
    _answer(log, 2, "before", 50.3, _frames(2))
    listed = views.listing(log.state(), 1, asks.requests(1))
    assert [(r["id"], r["answered"], r["asked"]) for r in listed] == [
        (remembered.id, 1, [0, 1, 2]), ("before", 2, [1, 2])]
    assert listed[1]["asked_at"] == 50.0 and listed[1]["reason"] == "incident hang:r1"


# -- native frames (pgdash_agent.native) ------------------------------------------------------

def test_py_spys_dump_is_read_per_thread_whatever_it_names_threads_by():
    from pgdash_agent.native import parse_dump

    dump = ('Process 7: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n'
            'Thread 7 (idle): "MainThread"\n    clock_nanosleep (libc.so.6)\n'
            '    <module> (train.py:3)\nThread 0x7F12AB (active): "loader"\n'
            '    poll (libc.so.6)\n\nThread 9 (idle)\n    futex_wait (libc.so.6)\n')
    assert parse_dump(dump) == {7: "clock_nanosleep (libc.so.6)\n<module> (train.py:3)",
                                0x7F12AB: "poll (libc.so.6)", 9: "futex_wait (libc.so.6)"}


def test_native_frames_come_only_when_asked_and_say_why_when_they_cannot():
    snaps, outbox, _ = _agent_snapshots()
    snaps.ask({"ask": "a1", "what": "snapshot"})
    snaps.ask({"ask": "a2", "what": "snapshot", "native": "yes"})  # only true asks
    snaps.ask({"ask": "a3", "what": "snapshot", "native": True})  # no py-spy here
    snaps.answer()
    plain, not_true, without = (e["body"] for e in _sent(outbox))
    for body in (plain, not_true):
        assert "native_error" not in body and not any("native" in t or "ids" in t
                                                      for t in body["threads"])
    assert without["native_error"].startswith("py-spy is not installed")
    assert not any("ids" in t for t in without["threads"])  # matching ids are not sent
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": without})


def test_py_spy_is_found_beside_this_python_when_it_is_not_on_path(monkeypatch):
    """A virtual environment run without activating it (.venv/bin/torchrun): its py-spy is
    not on PATH, but beside the interpreter; PGDASH_PY_SPY, when given, is the only one."""
    import sys
    from pathlib import Path

    from pgdash_agent.native import find_py_spy

    monkeypatch.setenv("PATH", "")
    assert find_py_spy({}) == str(Path(sys.executable).with_name("py-spy"))
    assert find_py_spy({"PGDASH_PY_SPY": "/nonexistent/py-spy"}) is None


def test_native_frames_are_py_spys_of_this_very_thread(tmp_path):
    """The real py-spy (the test extra installs it) dumps this process: the training thread's
    native frames end in the agent's own wait for py-spy."""
    import sys
    from pathlib import Path

    from pgdash_agent.native import find_py_spy

    py_spy = find_py_spy({"PGDASH_PY_SPY": str(Path(sys.executable).with_name("py-spy"))})
    assert py_spy is not None, "pip install py-spy (the test extra has it)"
    assert find_py_spy({"PGDASH_PY_SPY": str(tmp_path / "none"), "PATH": ""}) is None
    snaps, outbox, _ = _agent_snapshots()
    snaps.py_spy = py_spy
    snaps.ask({"ask": "n1", "what": "snapshot", "native": True})
    snaps.answer()
    (event,) = _sent(outbox)
    body = event["body"]
    assert "native_error" not in body, body.get("native_error")
    training = body["threads"][0]
    assert training["training"] and "native_stacks" in training["native"], training["native"]
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": body})


# A py-spy that stops the process it reads and never ends: what a py-spy killed mid-dump can
# leave behind (benfred/py-spy#416). Its arguments are py-spy's: dump --native --pid PID.
STOPPING_PY_SPY = '#!/bin/sh\nkill -STOP "$4"\nexec sleep 30\n'


def _stopping_py_spy(tmp_path):
    path = tmp_path / "py-spy"
    path.write_text(STOPPING_PY_SPY)
    path.chmod(0o755)
    return str(path)


def test_a_py_spy_that_times_out_reading_its_own_rank_leaves_it_running(tmp_path):
    """The rank cannot wake itself once stopped: the shell around py-spy does, after its
    timeout. Run in a child process, so that a failure stops that child, not the tests."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pgdash_agent.native import native_stacks; "
         "print(native_stacks(sys.argv[1], timeout=1.0)[1])", _stopping_py_spy(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=Path(native_frames.__file__).parents[1])
    try:
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
    assert out.strip() == "py-spy did not finish within 1 s"


def test_a_py_spy_that_times_out_reading_a_peer_wakes_it_unless_it_was_stopped_before(
        tmp_path):
    py_spy = _stopping_py_spy(tmp_path)
    launch = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29577", "WORLD_SIZE": "2"}
    peer = subprocess.Popen(["sleep", "60"], env=launch)
    try:
        wait_for(lambda: Path(f"/proc/{peer.pid}/cmdline").read_bytes().startswith(b"sleep"),
                 10, "sleep started")
        dump, why = native_frames.peer_dump(py_spy, peer.pid, launch, timeout=1.0)
        assert (dump, why) == (None, "py-spy did not finish within 1 s")
        assert not native_frames._stopped(peer.pid)  # py-spy's stop undone
        os.kill(peer.pid, signal.SIGSTOP)  # a rank stopped by the fault being debugged
        wait_for(lambda: native_frames._stopped(peer.pid), 10, "the peer stopped")
        native_frames.peer_dump(py_spy, peer.pid, launch, timeout=1.0)
        assert native_frames._stopped(peer.pid)  # not ours to wake
    finally:
        peer.kill()
        peer.wait()


def test_where_yama_lets_only_ancestors_trace_a_rank_it_lets_its_users_processes(
        tmp_path, monkeypatch):
    """A rank blocked with the GIL held cannot name a tracer, so at attach it names any
    process of its user (Yama's ptrace_scope 1 only; this machine has no Yama, so the scope
    is a file here and the prctl calls are recorded), and a dump of its own native frames
    puts that back afterwards instead of Yama's rule."""
    import sys
    from pathlib import Path

    from pgdash_agent.config import AgentConfig

    monkeypatch.setattr(native_frames, "_standing_tracer", 0)
    named = []
    monkeypatch.setattr(native_frames, "_allow_tracer", named.append)
    scope = tmp_path / "ptrace_scope"
    for value in ("0\n", "2\n", "3\n"):
        scope.write_text(value)
        assert native_frames.allow_peer_reads(str(scope)) is False
    assert native_frames.allow_peer_reads(str(tmp_path / "no-yama")) is False
    assert named == []
    scope.write_text("1\n")
    assert native_frames.allow_peer_reads(str(scope)) is True
    assert named == [native_frames.PR_SET_PTRACER_ANY]

    py_spy = str(Path(sys.executable).with_name("py-spy"))
    stacks, why = native_frames.native_stacks(py_spy)
    assert why is None and stacks
    assert named[1] not in (0, native_frames.PR_SET_PTRACER_ANY)  # py-spy's pid, for the dump
    assert named[2:] == [native_frames.PR_SET_PTRACER_ANY]  # ... and any process again
    assert AgentConfig.from_env({"PGDASH_PEER_READ": "0"}).peer_read is False
    assert AgentConfig.from_env({}).peer_read is True


def test_the_ring_holds_python_and_cpp_issued_collectives_by_end_time_numbered():
    snaps, outbox, _ = _agent_snapshots()
    snaps.tracker.recent.extend([("0", "all_reduce", 64, 10.0, 10.5, 7),
                                 ("0", "broadcast", 8, 11.0, 11.2, None)])
    snaps._cpp_recent = lambda: [("1", "all_reduce", 4096, 10.6, 10.9, 3)]  # DDP's bucket
    snaps.ask({"ask": "r", "what": "snapshot"})
    snaps.answer()
    (event,) = _sent(outbox)
    assert event["body"]["recent"] == [["0", "all_reduce", 64, 10.0, 10.5, 7],
                                       ["1", "all_reduce", 4096, 10.6, 10.9, 3, "flight_recorder"],
                                       ["0", "broadcast", 8, 11.0, 11.2, None]]
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": event["body"]})
    # An agent from before sends five fields: still read.
    old = dict(event["body"], recent=[["0", "all_reduce", 64, 10.0, 10.5]])
    validate_event({"seq": 1, "t": 1.0, "kind": "snapshot", "body": old})
    log = running(2)
    log.add("s0", "snapshot", old, t=12.0)
    request = views.answered_request(log.state(), 1, "r")
    row = views.request_view(log.state(), request, 13.0, None)["ranks"]["0"]
    assert row["recent"] == [{"group": "0", "op": "all_reduce", "bytes": 64, "start": 10.0,
                              "end": 10.5, "seq": None, "source": "wrapper"}]


def test_clustered_a_rank_connected_to_another_process_is_asked_through_it():
    """Process A holds ranks 0 and 1, B holds rank 2: A's request relays rank 2's question
    (Membership.publish_ask on Redis) and B delivers it to the connection it holds."""
    relayed = []
    state = running(3).state()
    def read(job_id, view, timeout=None):
        return view(state)

    a = Asks(read, Clock(), relay=lambda s, m: relayed.append((s, m)))
    b = Asks(read, Clock())
    sent = {r: [] for r in range(3)}
    for r in (0, 1):
        a.link(f"s{r}", sent[r].append)
    b.link("s2", sent[2].append)
    made = a.request(1, None, "asked")
    assert (made.asked, made.relayed, made.not_connected) == ([0, 1, 2], [2], [])
    ((sessions, message),) = relayed
    assert sessions == ["s2"] and message["ask"] == made.id and not sent[2]
    b.deliver(sessions, message)
    a.deliver(sessions, message)  # A got its own publish too: it holds no s2, sends nothing
    assert sent[2] == [message] and len(sent[0]) == len(sent[1]) == 1
    assert a.counters["asks_relayed"] == 1 and b.counters["asks_sent"] == 1
    assert made.row()["relayed"] == [2]


def test_clustered_a_silent_rank_connected_elsewhere_is_read_through_that_process():
    """A asked ranks 1 and 2 through B (Redis); neither answered. Rank 1 is read by rank 0's
    agent, which answered and is also connected to B; rank 2, alone on node1, by node1's
    host reader, connected to B too."""
    log = running(3)
    log.add("s2", "hello", {**hello(2, world=3), "host": "node1"}, t=100.0)  # alone on node1
    relayed = []
    def read(job_id, view, timeout=None):
        return view(log.state())

    clock = Clock()
    scheduled = []
    a = Asks(read, clock, relay=lambda *args: relayed.append(args),
             schedule=lambda delay, call: scheduled.append(call))
    b = Asks(read, clock)
    sent = {r: [] for r in range(3)}
    for r in range(3):
        b.link(f"s{r}", sent[r].append)
    reader_sent = []
    reader = ReaderLink(1, "node1", "s2", 2, 4242, reader_sent.append)
    b.link_reader(reader)
    made = a.request(1, None, "all")
    assert made.relayed == [0, 1, 2] and len(scheduled) == 1  # read from outside later too
    _answer(log, 0, made.id, 101.0, _frames(10))  # only rank 0 answers
    relayed.clear()
    scheduled[0]()
    assert [(sessions, m["rank"], host) for sessions, m, host in relayed] == [
        (["s0"], 1, None), ([], 2, (1, "node1"))]
    for sessions, message, host in relayed:  # every process gets the publish: A too
        a.deliver(sessions, message, host)
        b.deliver(sessions, message, host)
    assert [(m["what"], m["rank"], m["pid"]) for m in sent[0]] == [("peer", 1, 101)]
    assert [(m["what"], m["rank"], m["pid"]) for m in reader_sent] == [("peer", 2, 102)]
    assert b.reader_asked(reader, made.id, 2)  # B takes the reading it delivered the ask of
    view = views.request_view(log.state(), made, clock.t + 1)["ranks"]
    assert view["1"]["read_from_outside"] == {"by": 0}
    assert "the others were asked to have theirs read it" in \
        view["2"]["read_from_outside"]["error"]
    dump = 'Thread 102 (active+gil): "MainThread"\n    match (re/__init__.py:166)\n'
    log.add("s2", "read", {"ask": made.id, "for_rank": 2, "peer_dump": dump,
                           "reader_pid": 4242}, t=103.0, seq=None)
    read_by_b = views.request_view(log.state(), made, clock.t + 1)["ranks"]["2"]
    assert read_by_b["read_from_outside"]["reader_pid"] == 4242  # A's view, once folded
    # A question for a host reader nobody holds, or not a peer one, is sent to none.
    b.deliver([], {**relayed[1][1], "what": "snapshot"}, (1, "node1"))
    b.deliver([], relayed[1][1], (1, "node7"))
    assert len(reader_sent) == 1
    # A relayed rank heard since the question has a live agent (its answer may only be
    # unfolded here yet): not paused by py-spy for nothing.
    assert [r[0] for r in asks_module.silent_ranks(log.state(), made, {})] == [1, 2]
    log.add("s1", "heartbeat", {"groups": []}, t=made.asked_at + 0.5)  # (a clock ahead)
    assert [r[0] for r in asks_module.silent_ranks(log.state(), made, {})] == [1, 2]
    log.add("s1", "heartbeat", {"groups": []}, t=made.asked_at + 2)
    assert [r[0] for r in asks_module.silent_ranks(log.state(), made, {})] == [2]


def test_a_host_readers_reading_is_drawn_on_its_ranks_track_with_the_dump():
    from dashboard.history.trace import build_trace
    from tests.helpers.trace import timeline

    log = running(2)
    dump = 'Thread 101 (active+gil): "MainThread"\n    match (re/__init__.py:166)\n'
    log.add("s0", "read", {"ask": "a1", "for_rank": 1, "peer_dump": dump, "took_ms": 210.0,
                           "reader_pid": 4242}, t=104.0)
    (instant,) = [e for e in timeline(build_trace(log.events)) if e.get("cat") == "snapshot"]
    assert instant["name"] == "rank 1 read from outside (host reader)"
    assert instant["ts"] == 104_000_000
    assert instant["args"]["reader_pid"] == 4242 and "match" in instant["args"]["dump"]
