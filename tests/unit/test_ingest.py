"""Ingest without sockets: job assignment, de-duplication and the fold, on a real SQLite file."""

import threading

import pytest

from dashboard.web import views
from dashboard.ingest.pipeline import Ingest, Refused
from dashboard.web.live import state_at
from dashboard.storage.store import Store
from dashboard.storage.codec import encode_state
from tests.helpers.ingest import auth, batch, ev, hang_job  # noqa: F401  (hang_job: a fixture)


@pytest.fixture
def ingest(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    clock = iter(range(1000, 100000)).__next__
    yield Ingest(store, token=None, clock=lambda: float(clock())).start()
    store.close()


def lifecycle(rank, world=2):
    return batch(ev(1, "hello", {"job": "j", "rank": rank, "world_size": world, "host": "h",
                                 "pid": 1, "backend": "gloo"}),
                 ev(2, "exit", {"clean": True}, t=2.0))


def test_a_late_rank_joins_its_launch_even_after_the_others_exited(ingest):
    s0, job = ingest.connect(auth("a", 0))
    ingest.batch(s0, job, lifecycle(0))
    ingest.disconnect(s0)
    assert ingest.read(job, lambda s: s.status) == "failed"  # 1 of 2 ranks so far
    s1, job1 = ingest.connect(auth("b", 1))
    assert job1 == job
    ingest.batch(s1, job1, lifecycle(1))
    assert ingest.read(job, lambda s: s.status) == "finished"
    assert [j["status"] for j in ingest.store.jobs.newest()] == ["finished"]


def test_a_rank_number_taken_again_starts_a_new_job(ingest):
    _, first = ingest.connect(auth("a", 0))
    _, second = ingest.connect(auth("c", 0))
    assert second != first
    _, reconnect = ingest.connect(auth("a", 0))
    assert reconnect == first, "the same session reconnecting stays in its job"


def test_resent_events_are_stored_once(ingest):
    session, job = ingest.connect(auth("a", 0))
    first = lifecycle(0)
    assert ingest.batch(session, job, first)["stored"] == 2
    assert ingest.batch(session, job, first)["stored"] == 0
    kinds = [e["kind"] for e in ingest.store.log.events(job)]
    assert kinds == ["connect", "hello", "exit"]
    assert ingest.counters["duplicate_events"] == 2


def test_state_is_rebuilt_from_the_log_after_a_restart(ingest, tmp_path):
    session, job = ingest.connect(auth("a", 0))
    ingest.batch(session, job, lifecycle(0, world=1))
    live = ingest.read(job, views.detail)
    fresh = Ingest(ingest.store).start()
    assert fresh.read(job, views.detail) == live
    assert fresh.batch(session, job, lifecycle(0, world=1))["stored"] == 0


def test_wrong_token_is_refused(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    try:
        guarded = Ingest(store, token="t").start()
        with pytest.raises(Refused, match="wrong or missing token"):
            guarded.connect(auth("a", 0))
        assert guarded.connect({**auth("a", 0), "token": "t"})[1] == 1
    finally:
        store.close()


def test_findings_are_stored_and_survive_a_restart_resolved_ones_included(ingest):
    from dashboard.diagnosis import Settings

    ingest.settings = Settings(hang_after=5.0, lost_after=1e9)
    # Moments are judged on a grid of the server's clock, which only moves forward.
    now = [1000.0]
    ingest.clock = lambda: now[0]
    sessions = {}
    for r in range(3):
        sessions[r] = ingest.connect(auth(f"s{r}", r))
        hello = {"job": "j", "rank": r, "world_size": 3, "host": "h", "pid": r,
                 "backend": "gloo"}
        ingest.batch(*sessions[r], batch(ev(1, "hello", hello, t=now[0]), ev(2, "group", {
            "name": "0", "ranks": [0, 1, 2]}, t=now[0])))

    def heartbeat(r, seq, entered, inflight_since):
        row = {"group": "0", "entered": entered, "completed": entered - 1 if inflight_since
               else entered, "inflight_op": "all_reduce" if inflight_since else None,
               "inflight_since": inflight_since}
        ingest.batch(*sessions[r], batch(ev(seq, "heartbeat", {"groups": [row]}, t=now[0])))

    now[0] = 1010.0
    for r in (0, 1):
        heartbeat(r, 3, 5, 1004.0)
    heartbeat(2, 3, 4, None)
    now[0] = 1012.0
    ingest.diagnosis.run()
    (hang,) = ingest.findings(sessions[0][1])
    assert hang["kind"] == "hang" and hang["ranks"] == [2] and hang["active"]
    assert (hang["first_seen"], hang["last_seen"]) == (1009.0, 1012.0)
    now[0] = 1013.0
    for r in range(3):  # rank 2 arrives: the hang is over
        heartbeat(r, 4, 5, None)
    now[0] = 1014.0
    ingest.diagnosis.run()
    (resolved,) = ingest.findings(sessions[0][1])
    # (last seen at the last moment of the grid before rank 2's news: 1012.5)
    assert not resolved["active"] and resolved["last_seen"] == 1012.5

    # A restarted server rebuilds the book from the log, on the same moments: the same times.
    restarted = Ingest(ingest.store, clock=lambda: 1030.0, settings=ingest.settings).start()
    (kept,) = restarted.findings(sessions[0][1])
    assert kept["id"] == hang["id"] and not kept["active"] and kept["ranks"] == [2]
    assert (kept["first_seen"], kept["last_seen"]) == (1009.0, 1012.5)


def test_state_at_a_past_moment_is_what_was_known_then(hang_job):
    """The state at each moment holds only what had arrived, with the findings active then."""
    _, ingest, job = hang_job
    before = state_at(ingest, job, 99.0)
    assert before["ranks"] == [] and before["findings"] == []
    early = state_at(ingest, job, 106.0)  # waiting, not long enough to be a hang
    assert [r["status"] for r in early["ranks"]] == ["running", "running"]
    assert {p["rank"]: p["entered"] for p in early["progress"]} == {0: 7, 1: 8}
    assert early["findings"] == []
    hung = state_at(ingest, job, 120.0)
    assert [(f["kind"], f["ranks"]) for f in hung["findings"]] == [("hang", [0])]
    assert hung["findings"][0]["evidence"]["waiting"] == [1]
    done = state_at(ingest, job, 131.0)
    assert done["job"]["status"] == "finished"
    assert [f for f in done["findings"] if f["active"]] == []
    # The book keeps what resolved, with the times live showed: the hang judged from 114
    # (in flight since 104, hang_after 10) to 129.5, the last moment of the grid (every
    # 0.5 s) before the exits.
    (hang,) = [f for f in done["findings"] if f["kind"] == "hang"]
    assert (hang["first_seen"], hang["last_seen"]) == (114.0, 129.5)
    assert any(hang["id"] in i["findings"] for i in done["incidents"])
    assert state_at(ingest, 12345, 131.0) is None


def test_scrubbing_gives_a_fresh_fold_at_every_moment_and_reads_only_what_it_must(tmp_path):
    """Rewind (behind state_at) against folding from scratch, moving forward, back and to
    random moments over a job of a few thousand events."""
    import random

    from dashboard.history.rewind import Rewind
    from dashboard.state import JobState

    store = Store(f"sqlite:///{tmp_path / 'long.sqlite'}").start()
    now = [100.0]
    ingest = Ingest(store, clock=lambda: now[0]).start()
    try:
        sessions = {}
        for r in range(3):
            sessions[r], job = ingest.connect(auth(f"s{r}", r, job="long"))
            ingest.batch(sessions[r], job, batch(ev(1, "hello", {
                "job": "long", "rank": r, "world_size": 3, "host": "h", "pid": 1,
                "backend": "gloo"}, t=100.0)))
        for i in range(1, 600):
            now[0] = 100.0 + i
            for r in range(3):
                ingest.batch(sessions[r], job, batch(ev(1 + i, "heartbeat", {"groups": [
                    {"group": "0", "entered": i + (r == 1), "completed": i,
                     "inflight_op": "all_reduce" if r == 1 else None,
                     "inflight_since": now[0] if r == 1 else None}]}, t=now[0])))
        events = list(store.log.events(job))
        # As Ingest's own: it folds Timelines (state and book), as the checkpoints the live
        # fold stored hold.
        rewind = Rewind(store, spacing=300, checkpoints=4, new_state=ingest.rewind.new_state)

        def fresh(at):
            return JobState(job, "long").apply_all(e for e in events if e["received_at"] <= at)

        def seen(fold):
            state = getattr(fold, "state", fold)
            return (state.applied, state.summary(), views.progress_rows(state))

        moments = [150.5, 400.0, 650.0, 120.0, 399.0] + [
            random.Random(7).uniform(90, 720) for _ in range(5)]
        for at in moments:
            assert rewind.view(job, "long", at, seen) == seen(fresh(at)), at
        # Forward from the cursor reads the events in between (and the one after them).
        rewind.view(job, "long", 600.5, seen)
        before = rewind.events_read
        assert rewind.view(job, "long", 610.5, seen) == seen(fresh(610.5))
        assert rewind.events_read - before == 1 + sum(600.5 < e["received_at"] <= 610.5
                                                     for e in events)
        # Back in time: from a checkpoint, not from the first event.
        before = rewind.events_read
        assert rewind.view(job, "long", 500.0, seen) == seen(fresh(500.0))
        assert rewind.events_read - before < sum(e["received_at"] <= 500.0 for e in events) // 2
        assert len(rewind._checkpoints[job]) <= 4
        # Copies stay within their bytes, thinned as they grow; one over half of them is
        # not taken (a big job keeps its cursor alone).
        size = len(encode_state(rewind.cursor(job), level=1))
        for budget, most in ((int(2.5 * size), 2), (int(1.5 * size), 0)):
            bounded = Rewind(store, spacing=300, checkpoints=4, copies_bytes=budget,
                             new_state=ingest.rewind.new_state)
            for at in (650.0, 300.0, 500.0, 200.0):
                assert bounded.view(job, "long", at, seen) == seen(fresh(at)), at
                assert bounded._copies_held() <= budget
            assert len(bounded._checkpoints.get(job, [])) <= most
            assert most == 0 or bounded._checkpoints[job]
    finally:
        store.close()


def test_scrub_copies_of_all_jobs_share_their_bytes(tmp_path):
    """Two jobs scrubbed in turn: their copies together stay within the budget, the job
    holding most gives way, and each keeps some."""
    from dashboard.history.rewind import Rewind, _Point
    from dashboard.state import JobState

    def state(job: int, n: int) -> JobState:
        return JobState(job, "j").apply_all(
            {"id": i, "session": f"s{i % 4}", "seq": i, "t": 100.0 + i, "received_at": 100.0 + i,
             "kind": "heartbeat", "body": {"groups": []}} for i in range(1, n))

    size = len(encode_state(state(1, 50), level=1))
    store = Store(f"sqlite:///{tmp_path / 'copies.sqlite'}")
    rewind = Rewind(store, copies_bytes=int(5.5 * size), checkpoints=16)
    for job in (1, 2):
        for k in range(1, 9):
            rewind._mark(job, _Point(100.0 + k, 10 * k, state(job, 50)))
            assert rewind._copies_held() <= rewind.copies_bytes
    kept = {job: len(marks) for job, marks in rewind._checkpoints.items()}
    assert kept[1] >= 1 and kept[2] >= 1 and sum(kept.values()) <= 5, kept


def test_a_known_session_reconnects_at_once_while_the_writer_is_behind(ingest):
    """A server behind its agents still takes back a session it knows: its job is known, the
    connect event is queued in order; only a session it has never seen waits for the
    writer (it may create the job)."""
    session, job = ingest.connect(auth("a", 0))
    ingest.batch(session, job, batch(ev(1, "hello", {"job": "j", "rank": 0, "world_size": 2,
                                                     "host": "h", "pid": 1})))
    ingest.disconnect(session)
    release = threading.Event()
    ingest.store.writer.submit_nowait(lambda conn: release.wait(60))  # the writer is busy
    answer = []
    thread = threading.Thread(target=lambda: answer.append(ingest.connect(auth("a", 0))))
    thread.start()
    thread.join(20)  # a waiting admission would wait for the writer's 30 s timeout
    try:
        assert answer == [(session, job)]
    finally:
        release.set()
    ingest.batch(session, job, batch(ev(2, "heartbeat", {"groups": []}, t=3.0)))
    assert [e["kind"] for e in ingest.store.log.events(job)] == [
        "connect", "hello", "disconnect", "connect", "heartbeat"]
    assert ingest.read(job, lambda s: s.ranks()[0].status) == "running"


def test_a_v1_batch_behind_a_busy_writer_is_answered_in_time_and_stored_once(
        ingest, monkeypatch):
    """A v1 batch waits for its write at most V1_ACK_WAIT_S: then its agent is told to send it
    again, well before its own ack timeout would make it reconnect. It stays queued, so it is
    stored as it comes to the writer, and the agent's second copy adds nothing."""
    from dashboard.ingest import pipeline

    monkeypatch.setattr(pipeline, "V1_ACK_WAIT_S", 0.2)
    session, job = ingest.connect(auth("a", 0))
    release = threading.Event()
    ingest.store.writer.submit_nowait(lambda conn: release.wait(60))  # the writer is busy
    try:
        ack = ingest.batch(session, job, lifecycle(0))
    finally:
        release.set()
    assert ack["ok"] is False and ack["retry"] is True and 1.0 <= ack["retry_after"] <= 5.0
    assert "waits in its write queue" in ack["error"]
    assert ingest.counters["v1_acks_deferred"] == 1
    assert ingest.batch(session, job, lifecycle(0)) == {"ok": True, "stored": 0,
                                                        "rejected": []}
    assert [e["kind"] for e in ingest.store.log.events(job)] == ["connect", "hello", "exit"]


def test_a_connection_closed_while_its_ack_was_owed_says_how_long(ingest):
    """The disconnect the server records says how long it had kept the agent waiting (the
    rank_lost rule's patience for an agent that gave up on a server behind); an imported
    one is checked like any server event."""
    from pgdash_agent.wire import WireError, validate_server_event

    session, job = ingest.connect(auth("a", 0))
    hello = ev(1, "hello", {"job": "j", "rank": 0, "world_size": 2, "host": "h", "pid": 1})
    ack, pending = ingest.batch_nowait(session, job, [hello])
    pending.result(10)  # stored; the acknowledgement never went out
    ingest.disconnect(session)
    ingest.store.writer.wait_idle()
    last = list(ingest.store.log.events(job))[-1]
    assert last["kind"] == "disconnect" and last["body"]["owed_s"] >= 1.0
    assert ingest.read(job, lambda s: s.ranks()[0].closed_owed_s) == last["body"]["owed_s"]
    session, job = ingest.connect(auth("b", 1))
    ingest.disconnect(session)  # nothing owed
    ingest.store.writer.wait_idle()
    assert list(ingest.store.log.events(job))[-1]["body"] == {}
    with pytest.raises(WireError, match="owed_s"):
        validate_server_event({"t": 1.0, "kind": "disconnect", "body": {"owed_s": -1}})


def test_a_write_error_without_a_message_is_named_by_its_type():
    from dashboard.storage.database import describe_write_error

    text = describe_write_error("sqlite:////tmp/x.db", TimeoutError())
    assert text == "could not write to database /tmp/x.db: TimeoutError"


def test_a_stopping_server_stores_what_its_writer_holds_without_folding_it(ingest):
    """At SIGTERM an overloaded server's writer held 15 s of batches, each folded and judged
    before its commit: it took 18 s to exit with 1,024 agents connected. Stopping, it only
    stores them (and acknowledges them); a restart folds the log."""
    session, job = ingest.connect(auth("a", 0))
    ingest.batch(session, job, batch(ev(1, "hello", {"job": "j", "rank": 0, "world_size": 1,
                                                     "host": "h", "pid": 1})))
    release = threading.Event()
    ingest.store.writer.submit_nowait(lambda conn: release.wait(60))  # the writer is behind
    queued = batch(ev(2, "heartbeat", {"groups": []}, t=2.0), ev(3, "exit", {"clean": True}, t=3.0))
    ack, pending = ingest.batch_nowait(session, job, queued["events"])
    ingest.stop()
    release.set()
    assert ack["ok"] and pending.result(timeout=20) == 2  # stored: acknowledged
    assert [e["kind"] for e in ingest.store.log.events(job)][-2:] == ["heartbeat", "exit"]
    assert ingest.read(job, lambda s: s.ranks()[0].status) == "initializing"  # not folded
    assert Ingest(ingest.store).start().read(job, lambda s: s.ranks()[0].status) == "exited"


def test_a_job_silent_for_hours_loads_without_judging_every_moment_since(ingest, monkeypatch):
    """A job whose agents vanished without a word (the server was down, the cluster lost
    power) stays "running" in the log; read hours later, its book starts from the findings
    stored then instead of judging every moment since (86,400 a day: a bench's job stored
    months before took minutes to open)."""
    now = [1000.0]
    ingest.clock = lambda: now[0]
    session, job = ingest.connect(auth("s0", 0))
    ingest.batch(session, job, batch(ev(1, "hello", {
        "job": "j", "rank": 0, "world_size": 1, "host": "h", "pid": 1, "backend": "gloo"},
        t=now[0])))
    now[0] = 1000.0 + 3 * 3600  # more moments than LiveBooks.RECOMPUTE_MAX_DIAGNOSES
    from dashboard.diagnosis import book as book_module

    judged = []
    real = book_module.diagnose
    monkeypatch.setattr(book_module, "diagnose", lambda *a: judged.append(a[1]) or real(*a))
    later = Ingest(ingest.store, clock=lambda: now[0], settings=ingest.settings).start()
    assert later.read(job, lambda s: s.status) == "running"
    later.findings(job)  # judged from now on
    assert len(judged) <= 2, f"{len(judged)} moments judged to open the job"
    now[0] += 30  # and on from there, as any live job
    later.diagnosis.run()
    assert [(f["kind"], f["ranks"]) for f in later.findings(job) if f["active"]] == \
        [("rank_lost", [0])]


def test_a_snapshot_request_waits_for_a_busy_jobs_state_a_bounded_time(ingest, monkeypatch):
    """A server far behind its agents holds a job's state for long stretches (the writer
    judges the moments it owes under the lock). A request for a snapshot waited 60 s for
    it at 1,024 ranks; it now says the server is busy after READ_WAIT_S, and asks nothing."""
    from dashboard.ingest import asks as asks_module

    monkeypatch.setattr(asks_module, "READ_WAIT_S", 0.2)
    session, job = ingest.connect(auth("a", 0))
    ingest.batch(session, job, lifecycle(0, world=1))
    held, release = threading.Event(), threading.Event()

    def writer_judging():
        with ingest.cache.lock:
            held.set()
            release.wait(10)

    busy = threading.Thread(target=writer_judging)
    busy.start()
    try:
        held.wait(5)
        with pytest.raises(asks_module.Busy, match="catching up with this job's agents"):
            ingest.asks.request(job, None, "asked by a test")
        assert ingest.asks.requests(job) == []
        assert ingest.asks.counters["snapshot_requests_busy"] == 1
    finally:
        release.set()
        busy.join()
    assert ingest.asks.request(job, None, "again").asked == []  # free: asked (none connected)


def test_a_full_writer_refuses_unread_batches_and_the_agents_later_ones_wait_as_long(ingest):
    """Past the writer's bound in events, an agent's batch is refused before it is validated,
    with a wait; its later batches are refused with the rest of that wait (a shorter one
    sent them all again at once), and nothing is lost once there is room."""
    session, job = ingest.connect(auth("a", 0))
    hello = ev(1, "hello", {"job": "j", "rank": 0, "world_size": 1, "host": "h", "pid": 1})
    assert ingest.batch(session, job, batch(hello))["ok"]
    writer = ingest.store.writer
    writer.events_limit = 3
    release = threading.Event()
    writer.submit_nowait(lambda conn: release.wait(60), bounded=False)  # the writer is busy
    try:
        beats = [ev(seq, "heartbeat", {"groups": []}, t=float(seq)) for seq in range(2, 8)]
        ack, pending = ingest.batch_nowait(session, job, beats[:3])  # fills the bound
        assert ack["ok"] and pending is not None
        refused, none = ingest.batch_nowait(session, job, [beats[3], {"seq": "junk"}])
        assert none is None and refused["retry"] and refused["retry_after"] >= 1.0
        assert "overloaded" in refused["error"]
        assert ingest.counters["rejected_events"] == 0  # refused unread: nothing validated
        later, _ = ingest.batch_nowait(session, job, beats[4:])
        assert later["retry"] and "earlier batch" in later["error"]
        assert later["retry_after"] >= 0.9 * refused["retry_after"]
    finally:
        release.set()
    assert pending.result(10) == 3
    writer.wait_idle()
    assert writer.queued_events() == 0
    for part in (beats[3:4], beats[4:]):  # the agent sends them again, in order
        assert ingest.batch(session, job, batch(*part))["ok"]
    assert [e["seq"] for e in ingest.store.log.events(job) if e["seq"]] == list(range(1, 8))


def _reopened(store, job, **kwargs):
    """A restarted server opening the ended job: (its Ingest, what it showed, whether
    another thread could take the states lock while the job was folded)."""
    from dashboard.diagnosis import Settings

    fresh = Ingest(store, clock=lambda: 500.0, settings=Settings(hang_after=10.0),
                   **kwargs).start()
    fold, free = fresh.books.fold, []

    def watched(*args, **kwargs):
        def take():  # what the writer does for every live batch
            if fresh.cache.lock.acquire(timeout=5):
                free.append(True)
                fresh.cache.lock.release()
        taker = threading.Thread(target=take)
        taker.start()
        taker.join()
        return fold(*args, **kwargs)

    fresh.books.fold = watched
    shown = (fresh.read(job, views.detail),
             [(f["kind"], f["ranks"], f["first_seen"], f["active"])
              for f in fresh.findings(job)])
    return fresh, shown, bool(free)


def test_an_ended_job_opened_after_a_restart_is_folded_without_the_states_lock(hang_job):
    """Opening an old job folds its log (at 1,024 ranks, seconds); the writer must not wait
    for that behind the states lock: a live 1,024-rank job beside it fell 108 s behind its
    agents (bench/capacity.py --stored). What the job shows is what a fold under the lock
    (a running job's load) shows."""
    store, _live, job = hang_job
    locked = Ingest(store, clock=lambda: 500.0, settings=_live.settings).start()
    locked.ready = lambda job_id, timeout=None: None
    before = (locked.read(job, views.detail),
              [(f["kind"], f["ranks"], f["first_seen"], f["active"])
               for f in locked.findings(job)])
    fresh, shown, free = _reopened(store, job)
    assert free, "the states lock was held while the job was folded"
    assert shown == before
    assert ("hang", [0], 114.0, False) in shown[1]
    assert fresh.cache.held(job) is not None  # folded once: held from now on


def test_an_ended_job_whose_log_grew_while_it_was_folded_is_loaded_again(hang_job):
    """A late event (a rank's last words after the others ended) stored while an ended job
    is folded off the states lock: that fold is not held (it lacks the event); the job is
    loaded under the lock instead, with it."""
    store, _live, job = hang_job
    fresh = Ingest(store, clock=lambda: 500.0, settings=_live.settings).start()
    fold = fresh.books.fold

    def then_a_late_event(*args, **kwargs):
        loaded = fold(*args, **kwargs)

        def late(conn):
            store.log.insert(conn, job, "s0", [{"seq": 9, "t": 131.0, "kind": "heartbeat",
                                                "body": {"groups": []}}], 131.0)

        store.writer.submit(late)
        fresh.books.fold = fold  # once
        return loaded

    fresh.books.fold = then_a_late_event
    fresh.ready(job)
    assert fresh.cache.held(job) is None  # the fold without the late event was dropped
    newest = store.log.max_id()
    assert fresh.read(job, lambda s: s.last_event_id) == newest  # loaded with it


def test_a_job_that_ends_stores_a_checkpoint_that_opening_it_starts_from(hang_job):
    """As a job ends, the live fold stores its state just after the batch that ended it;
    a restarted server opening the job decodes that instead of folding the log up to
    PGDASH_CHECKPOINT_S back (at 1,024 ranks a minute, beside the live jobs), and shows what
    folding all of its log shows."""
    import math

    import sqlalchemy as sa

    from dashboard.storage.schema import checkpoints

    from dashboard.diagnosis import Settings

    store, _held_back, _ = hang_job  # (its server fell behind: no checkpoint at its end)
    assert store.checkpoints.before(1, math.inf) is None
    # The same hang on a server that keeps up: every rank reports every second.
    now = [100.0]
    live = Ingest(store, clock=lambda: now[0], settings=Settings(hang_after=10.0)).start()
    sessions = {r: live.connect(auth(f"k{r}", r, job="kept-up")) for r in (0, 1)}
    job = sessions[0][1]
    for r in (0, 1):
        live.batch(*sessions[r], batch(
            ev(1, "hello", {"job": "kept-up", "rank": r, "world_size": 2, "host": "h",
                            "pid": 1, "backend": "gloo"}, t=100.0),
            ev(2, "group", {"name": "0", "ranks": [0, 1]}, t=100.0)))
    rows = {0: {"group": "0", "entered": 7, "completed": 7, "inflight_op": None},
            1: {"group": "0", "entered": 8, "completed": 7, "inflight_op": "all_reduce",
                "inflight_since": 104.0, "inflight_dtype": "float32", "inflight_bytes": 4}}
    for second in range(104, 130):
        now[0] = float(second)
        for r in (0, 1):
            live.batch(*sessions[r], batch(ev(second, "heartbeat", {"groups": [rows[r]]},
                                              t=now[0])))
    now[0] = 130.0
    for r in (0, 1):
        live.batch(*sessions[r], batch(ev(200, "exit", {"clean": True}, t=130.0)))
    assert live.read(job, lambda s: s.status) == "finished"
    live.rewind.wait_saved()
    store.writer.wait_idle()
    stored = store.checkpoints.before(job, math.inf)
    assert stored is not None and stored[1] == math.nextafter(130.0, math.inf)
    fresh, shown, _ = _reopened(store, job)
    assert fresh.counters["checkpoints_loaded_live"] == 1
    with store.engine.begin() as conn:
        conn.execute(sa.delete(checkpoints))
    full, from_start, _ = _reopened(store, job)
    assert full.counters["checkpoints_loaded_live"] == 0
    assert shown == from_start
    assert ("hang", [0], 114.0, False) in shown[1]
    assert [f["kind"] for f in live.findings(job)] == ["hang"]
    # A job stored without one (an older pgdash's) gets it as it is first opened: the next
    # server to open it decodes it too.
    full.rewind.wait_saved()
    store.writer.wait_idle()
    assert store.checkpoints.before(job, math.inf)[1] == stored[1]
    again, shown_again, _ = _reopened(store, job)
    assert again.counters["checkpoints_loaded_live"] == 1
    assert shown_again == from_start
