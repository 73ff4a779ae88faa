"""The server's own lag is never blamed on a rank: measured, reported, and verdicts wait for it."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.parse

import socketio
import websocket

from pgdash_agent.wire import AGENT_V2_PATH, PROTOCOL_V2, UI_NAMESPACE, decode_v2, encode_v2

from dashboard.diagnosis import Settings, diagnose
from dashboard.ingest.lag import LAG_REFRESH_S, IngestLag
from dashboard.server import make_server
from dashboard.state import JobState
from tests.helpers.clock import Clock
from tests.helpers.closing import disconnect
from tests.helpers.events import hello
from tests.helpers.procs import job_by_name, launch_job, metric, wait_for, wait_job


def test_lag_is_how_much_later_than_usual_batches_are_folded():
    clock = Clock()
    lag = IngestLag(clock)
    # Two agents whose clocks are off by +30 s and -2 s: their usual delay is their floor.
    for i in range(10):
        clock.t += 1
        lag.folded("a", clock.t - 30.2, clock.t)
        lag.folded("b", clock.t + 2.0 - 0.1, clock.t)
    assert lag.current() == 0.0
    for i in range(5):  # now every batch is folded 4 s late
        clock.t += 1
        lag.folded("a", clock.t - 30.2 - 4, clock.t)
        lag.folded("b", clock.t + 2.0 - 0.1 - 4, clock.t)
    assert abs(lag.current() - 4.0) < 1e-6
    clock.t += 6  # nothing folded for a while: that window is over
    assert lag.current() == 0.0


def test_one_agent_resending_old_events_is_not_overload():
    clock = Clock()
    lag = IngestLag(clock)
    for i in range(5):
        clock.t += 1
        for s in range(20):
            lag.folded(f"s{s}", clock.t - 0.1, clock.t)
    lag.folded("s0", clock.t - 300, clock.t)  # its backlog after an outage
    assert lag.current() < 1.0


def test_a_queued_write_and_a_pause_of_the_server_count_as_lag():
    clock = Clock()
    backlog = [0.0]
    lag = IngestLag(clock, lambda: backlog[0])
    backlog[0] = 7.5
    assert lag.current() == 7.5
    backlog[0] = 0.0
    lag.paused(20.0)
    clock.t += 10
    assert lag.current() == 20.0  # still reading what arrived while it was stopped
    clock.t += 20
    assert lag.current() == 0.0


def test_a_pause_the_watchdog_has_not_woken_to_notice_is_lag_already():
    """Right after SIGCONT the first request served (/metrics, a page) may run before the
    pause watchdog: the lag it reads is the pause all the same."""
    import time as real_time

    lag = IngestLag(Clock())
    lag._beat = real_time.monotonic() - 20.0  # the watchdog last ran 20 s ago: stopped since
    assert lag.current() >= 19.0
    assert lag.current() >= 19.0  # noticed once, kept for the window after it


def test_events_received_but_not_folded_count_as_lag_and_silence_does_not():
    """A rank whose batches wait for the writer, or were refused with a full queue, is read
    late, not silent: the lag is how far what came from it leads what is folded. A rank that
    sends nothing leads by nothing."""
    clock = Clock()
    lag = IngestLag(clock)
    for s in ("a", "b", "silent"):
        lag.folded(s, clock.t - 0.1, clock.t)
    clock.t += 30
    lag.received("a", clock.t - 0.2)  # queued (or refused: sent again) and not folded yet
    lag.received("b", clock.t - 20.0)
    assert abs(lag.current() - 29.9) < 1e-6  # a: 1029.8 received, 999.9 folded
    lag.folded("a", clock.t - 0.2, clock.t)  # a is read; b still leads by 10.1 s
    assert abs(lag.current() - 10.1) < 1e-6
    lag.read_through("b", clock.t - 20.0)  # b's batch was sent again and is already stored
    assert lag.current() < 0.2  # a's batch was folded 0.1 s later than usual
    lag.received("b", clock.t - 1.0)  # an agent that gives up on what it sent is forgotten
    assert lag.current() > 5
    clock.t += 121
    assert lag.current() == 0.0


def test_the_lag_verdicts_wait_for_is_measured_at_most_every_refresh_a_pause_at_once():
    """Measuring reads the whole window; judged_at is asked per batch while behind."""
    clock = Clock()
    lag = IngestLag(clock)
    lag.folded("a", clock.t - 0.1, clock.t)
    clock.t += 30
    lag.received("a", clock.t - 0.1)  # 30 s of a's events not folded yet: behind
    assert abs(lag.judged_at(clock.t) - (clock.t - 30.0)) < 1e-6
    lag.folded("a", clock.t - 0.1, clock.t)  # caught up, but not measured again yet
    half = clock.t + LAG_REFRESH_S / 2
    assert abs(lag.judged_at(half) - (half - 30.0)) < 1e-6
    clock.t += 2 * LAG_REFRESH_S
    assert lag.judged_at(clock.t) == clock.t
    lag.paused(20.0)  # the server stood still: heeded at once
    assert abs(lag.judged_at(clock.t) - (clock.t - 20.0)) < 1e-6


def _job_with_two_ranks() -> JobState:
    state = JobState(1, "j")
    for i, rank in enumerate((0, 1)):
        state.apply({"id": i + 1, "session": f"s{rank}", "seq": 1, "t": 100.0,
                     "received_at": 100.0, "kind": "hello",
                     "body": {"job": "j", "rank": rank, "world_size": 2, "host": "h", "pid": 1,
                              "backend": "gloo"}})
    return state


def test_verdicts_judged_back_by_the_lag_blame_no_one():
    state = _job_with_two_ranks()
    s = Settings()
    # Heard from both at 100; at 100 + lost_after + 5 they look silent ...
    assert {f["kind"] for f in diagnose(state, 100 + s.lost_after + 5, s)} == {"rank_lost"}
    # ... unless the server is 10 s behind: then it is 100 + lost_after - 5 for them.
    assert diagnose(state, 100 + s.lost_after + 5 - 10, s) == []


def test_a_rank_that_reconnects_within_the_grace_is_not_lost():
    state = _job_with_two_ranks()
    s = Settings()
    state.apply({"id": 3, "session": "s1", "seq": None, "t": 101.0, "received_at": 101.0,
                 "kind": "disconnect", "body": {}})
    state.apply({"id": 5, "session": "s0", "seq": 2, "t": 103.0, "received_at": 103.0,
                 "kind": "heartbeat", "body": {"groups": []}})  # rank 0 still reports
    assert diagnose(state, 101.0 + s.reconnect_grace / 2, s) == []
    lost = diagnose(state, 101.0 + s.reconnect_grace, s)
    assert [(f["kind"], f["ranks"]) for f in lost] == [("rank_lost", [1])]
    state.apply({"id": 4, "session": "s1", "seq": None, "t": 101.5, "received_at": 101.5,
                 "kind": "connect", "body": {"rank": 1, "host": "h"}})
    assert diagnose(state, 101.0 + s.reconnect_grace, s) == []


def test_a_server_stopped_for_longer_than_lost_after_blames_no_rank(server, tmp_path):
    """SIGSTOP the server for 20 s (> lost_after, > the agents' ack timeout) while a job
    trains: when it resumes, the heartbeats it has not read yet must not look like silence,
    and the agents' reconnects must not look like lost ranks."""
    procs = launch_job("loop_job.py", 2, server.url, "paused", tmp_path, args=["400", "0.1"],
                       env={"PGDASH_INTERVAL_S": "0.5"})
    try:
        job = wait_for(lambda: job_by_name(server, "paused"), 60, "the job")
        wait_for(lambda: len(server.api(f"/api/jobs/{job['id']}")["ranks"]) == 2 and all(
            r["status"] == "running" for r in server.api(f"/api/jobs/{job['id']}")["ranks"]),
            60, "both ranks running")
        pushed: list[dict] = []  # what a watching browser is sent
        ui = socketio.Client(reconnection=False)
        ui.on("job", pushed.append, namespace=UI_NAMESPACE)
        ui.on("job_delta", pushed.append, namespace=UI_NAMESPACE)
        ui.connect(server.url, namespaces=[UI_NAMESPACE], transports=["websocket"])
        ui.call("watch", {"job": job["id"]}, namespace=UI_NAMESPACE, timeout=10)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(20)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        lag = wait_for(lambda: metric(server, "pgdash_ingest_lag_seconds"), 30,
                       "the server to report its lag")
        assert lag >= 15  # it says how far behind it was, on /metrics and to the page
        wait_for(lambda: any((m.get("server_behind_s") or 0) >= 15 for m in pushed), 30,
                 "the page to be told the server is behind")
        disconnect(ui)
        # Give it time to catch up and the agents to reconnect; then no finding at all.
        wait_for(lambda: all(r["status"] == "running" for r in
                             server.api(f"/api/jobs/{job['id']}")["ranks"]), 60,
                 "both ranks running again")
        time.sleep(3)
        assert server.api(f"/api/jobs/{job['id']}/findings")["findings"] == []
    finally:
        for p in procs:
            p.kill()
        wait_job(procs, 30)


def test_metrics_per_rank_only_when_asked_and_escaped():
    from dashboard.web.metrics import LiveJob, Snapshot, exposition

    job = LiveJob({"name": 'a"b\\c', "status": "running"},
                  [{"rank": 3, "status": "running", "last_seen": 1764000000.125, "dropped": {}}],
                  [], [])
    quiet = exposition(Snapshot([], [job], {}, 0, 0))
    assert "rank=" not in quiet
    loud = exposition(Snapshot([], [job], {}, 0, 0, per_rank=True)).splitlines()
    (seen,) = [l for l in loud if l.startswith("pgdash_rank_last_seen_timestamp_seconds{")]
    assert seen == ('pgdash_rank_last_seen_timestamp_seconds{job="a\\"b\\\\c",rank="3"} '
                    '1.764000000125e+09')


def _v2_agent(url: str, session: str, rank: int) -> websocket.WebSocket:
    """A v2 agent's connection that has sent its auth (the reply is left to read)."""
    parsed = urllib.parse.urlparse(url)
    ws = websocket.create_connection(f"ws://{parsed.hostname}:{parsed.port}{AGENT_V2_PATH}",
                                     timeout=30)
    ws.send_binary(encode_v2({"auth": {"v": PROTOCOL_V2, "session": session, "job": "held",
                                       "rank": rank, "host": "h", "pid": 100 + rank}}))
    return ws


def test_agents_are_admitted_while_the_writer_is_behind(tmp_path):
    """A writer far behind (held here) keeps no thread waiting on it to admit agents: every
    connect and disconnect is queued for it at once, in order, whatever the queue's bound.
    (Each used to wait for its commit on one of a handful of threads: beside a CPU hog a
    1,024-rank job's agents then could not get back in, and 981 ranks were called lost.)"""
    server = make_server(f"sqlite:///{tmp_path / 'held.db'}", "127.0.0.1", 0).start()
    writer = server.services.ingest.store.writer
    writer.queue_limit = 4  # agents' batches are refused past it; admissions never are
    held, holding = threading.Event(), threading.Event()

    def hold() -> None:  # the writer runs nothing else until held is set
        held.clear()
        holding.clear()
        writer.submit_nowait(lambda conn: (holding.set(), held.wait(60)), bounded=False)
        holding.wait(30)

    agents: list[websocket.WebSocket] = []
    try:
        hold()
        world = 20  # more than the threads of a default executor on any machine here
        agents = [_v2_agent(server.url, f"s{rank}", rank) for rank in range(world)]
        wait_for(lambda: writer.queued() >= world, 30, "every admission queued for the writer")
        held.set()
        assert all(decode_v2(ws.recv())["ok"] for ws in agents)
        job_id = server.services.ingest.admission.job_of("s0")
        # Held again: half the agents drop and come back. A reconnection is taken at once,
        # and its disconnect and connect wait for the writer in that order.
        hold()
        for rank in range(world // 2):
            agents[rank].close()
            agents[rank] = _v2_agent(server.url, f"s{rank}", rank)
            assert decode_v2(agents[rank].recv()) == {"ok": True, "job": job_id}
        wait_for(lambda: writer.queued() >= 2 * (world // 2), 30,
                 "the disconnects and connects queued")
        held.set()
        writer.wait_idle(30)
        ranks = server.services.ingest.read(job_id, lambda state: {
            r.rank: r.status for r in state.ranks()})
        assert sorted(ranks) == list(range(world)) and "lost" not in ranks.values()
        assert server.services.ingest.findings(job_id) == []
    finally:
        held.set()
        for ws in agents:
            ws.close()
        server.stop()


def test_a_rank_whose_reports_come_late_is_not_lost_while_its_connection_is_heard(tmp_path):
    """An overloaded server reads some ranks' reports far later than others' (their agents
    wait for acks, then send 20 s of reports at once). Here rank 2's agent sends heartbeats
    20 s old, every half second: the fold reads it 20 s behind the others, and on that alone
    the rank was lost (925 rank_lost criticals on a healthy 1,024-rank job beside a CPU hog).
    Its connection says it is there. Once it sends nothing, it is lost as before."""
    server = make_server(f"sqlite:///{tmp_path / 'late.db'}", "127.0.0.1", 0).start()
    ingest = server.services.ingest
    ingest.settings = Settings(lost_after=5.0)
    agents: list[websocket.WebSocket] = []
    seq = [0, 0, 0]

    def send(rank: int, kind: str, body: dict) -> None:
        seq[rank] += 1
        t = time.time() - (20.0 if rank == 2 else 0.0)
        agents[rank].send_binary(encode_v2({"id": seq[rank], "events": [
            {"seq": seq[rank], "t": t, "kind": kind, "body": body}]}))
        while "id" not in (reply := decode_v2(agents[rank].recv())):
            pass  # the server's question (an incident asks its ranks for stacks)
        assert reply["ok"], reply

    def beat(ranks) -> None:
        for rank in ranks:
            send(rank, "heartbeat", {"groups": [{"group": "0", "entered": seq[rank],
                                                 "completed": seq[rank], "inflight_op": None,
                                                 "inflight_since": None}]})

    def lost() -> list[list[int]]:
        return [f["ranks"] for f in ingest.findings(job_id) or []
                if f["kind"] == "rank_lost" and f["active"]]

    try:
        agents = [_v2_agent(server.url, f"s{rank}", rank) for rank in range(3)]
        assert all(decode_v2(ws.recv())["ok"] for ws in agents)
        for rank in range(3):
            send(rank, "hello", hello(rank, world=3))
            send(rank, "init_start", {"rank": rank, "world_size": 3})
            send(rank, "init_done", {"rank": rank, "world_size": 3, "backend": "gloo",
                                     "duration_s": 0.1})
            send(rank, "group", {"name": "0", "ranks": [0, 1, 2]})
        job_id = ingest.admission.job_of("s0")
        until = time.monotonic() + 12.0  # judged every half second, 20 s behind the others
        while time.monotonic() < until:
            beat(range(3))
            time.sleep(0.5)
        on_the_fold_alone = ingest.read(job_id, lambda state: [
            f["ranks"] for f in diagnose(state, ingest.judged_at(), Settings(lost_after=5.0))])
        assert on_the_fold_alone == [[2]]
        assert ingest.findings(job_id) == []
        wait_for(lambda: (beat((0, 1)), time.sleep(0.5), lost())[2], 60,
                 "rank 2 lost once its connection is quiet too")
        assert lost() == [[2]]
    finally:
        for ws in agents:
            ws.close()
        server.stop()
