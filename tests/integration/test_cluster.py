"""Two `pgdash serve` processes on one real PostgreSQL and one real Redis serve one job whose
ranks are split between them: diagnosed as one, seen live from either, surviving the owner."""

from __future__ import annotations

import collections
import json
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import socketio
import sqlalchemy as sa

from pgdash_agent.wire import UI_NAMESPACE
from tests.helpers.closing import disconnect
from tests.helpers.procs import (ROOT, WAIT_S, ServerProcess, get_body, job_by_name, launch_job,
                                 wait_for, wait_job)
from tests.helpers.realservers import pg_url, postgres_server, redis_url  # noqa: F401  (fixtures)
from tests.helpers.tcp_balancer import Balancer


@pytest.fixture
def pair(pg_url, redis_url, tmp_path):
    """Start two `pgdash serve --queue` processes on one database (stopped by PID after)."""
    started: list[ServerProcess] = []

    def start(*extra):
        for name in ("a", "b"):
            started.append(ServerProcess(pg_url, log_path=tmp_path / f"server-{name}.log",
                                         extra=["--queue", redis_url, *extra]).start())
        return started

    yield start
    for srv in started:
        srv.stop()


def owner_of(pg_url, job_id):
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT owner, expires_at FROM job_owners "
                                        "WHERE job_id = :j"), {"j": job_id}).all()
    finally:
        engine.dispose()


def hangs(server, job_id):
    return [f for f in server.api(f"/api/jobs/{job_id}/findings")["findings"]
            if f["kind"] == "hang"]


def test_queue_needs_postgresql_and_a_reachable_redis(tmp_path, redis_url, pg_url):
    def serve(*args):
        return subprocess.run([sys.executable, "-m", "dashboard", "serve", "--port", "0", *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)

    out = serve("--db", f"sqlite:///{tmp_path}/x.db", "--queue", redis_url)
    assert out.returncode != 0 and "must share one PostgreSQL database" in out.stderr
    out = serve("--db", pg_url, "--queue", "redis://127.0.0.1:1/0")
    assert out.returncode != 0 and "cannot reach Redis" in out.stderr
    assert "PGDASH_QUEUE" in out.stderr


def test_split_job_is_diagnosed_once_and_seen_live_from_the_other_process(
        pair, pg_url, tmp_path):
    a, b = pair("--hang-after", "3")
    ui = socketio.Client(reconnection=False)
    inbox: queue.Queue = queue.Queue()
    ui.on("job", lambda payload: inbox.put(("job", payload)), namespace=UI_NAMESPACE)
    ui.on("job_delta", lambda payload: inbox.put(("job_delta", payload)),
          namespace=UI_NAMESPACE)
    # Ranks 0 and 1 report to A, rank 2 (the one that hangs) to B.
    procs = launch_job("fault_job.py", 3, a.url, "split", tmp_path, args=["hang"],
                       rank_env={2: {"PGDASH_SERVER": b.url}})
    try:
        job = wait_for(lambda: (j := job_by_name(a, "split")) and j["world_size"] == 3 and j,
                       60, "the job on A")
        assert [j["id"] for j in b.api("/api/jobs")["jobs"]] == [job["id"]], \
            "ranks on two processes must make one job"
        owners = wait_for(lambda: owner_of(pg_url, job["id"]), 30, "an owner")
        assert len(owners) == 1
        other = b if _owns(a, owners[0][0]) else a

        # A browser on the process that does NOT own the job watches it live.
        ui.connect(other.url, namespaces=[UI_NAMESPACE], transports=["websocket"],
                   wait_timeout=WAIT_S)
        assert ui.call("watch", {"job": job["id"]}, namespace=UI_NAMESPACE) == {"ok": True}
        # The owner's deltas may reach the room before the snapshot it was asked for;
        # the page ignores those too (they build on a version it does not have yet).
        while True:
            kind, snap = inbox.get(timeout=15)
            if kind == "job":
                break
        assert snap["job_id"] == job["id"]
        version = snap["v"]

        for server in (a, b):
            found = wait_for(lambda s=server: [f for f in hangs(s, job["id"]) if f["active"]],
                             60, f"the hang on {server.url}")
            assert [f["ranks"] for f in found] == [[2]], found
        detail = other.api(f"/api/jobs/{job['id']}")
        assert [r["rank"] for r in detail["ranks"]] == [0, 1, 2]

        # The hang reaches the browser on the other process as deltas from the owner.
        deadline = time.monotonic() + 30
        seen_hang = False
        while time.monotonic() < deadline and not seen_hang:
            kind, msg = inbox.get(timeout=10)
            if kind == "job_delta" and msg["base"] == version:
                version = msg["v"]
                rows = [r for _, r in msg["rows"].get("findings", [])] + \
                    (msg["sections"].get("findings") or [])
                seen_hang = any(f["kind"] == "hang" and f["ranks"] == [2] for f in rows)
            elif kind == "job":
                version = msg["v"]
                seen_hang = any(f["kind"] == "hang" for f in msg["sections"]["findings"])
        assert seen_hang, "the browser on the other process never saw the hang"

        owner = a if other is b else b
        # The hang's snapshot, asked by the owner, reached the ranks connected to the other
        # process through Redis: every rank answered, rank 2 asleep where it hangs.
        request = wait_for(lambda: next((r for r in owner.api(
            f"/api/jobs/{job['id']}/snapshots")["snapshots"]
            if r["reason"] == "incident hang:r2"), None), 30, "the incident's snapshot")
        assert request["relayed"] and sorted(request["asked"]) == [0, 1, 2], request
        view = wait_for(lambda: (v := owner.api(
            f"/api/jobs/{job['id']}/snapshots/{request['id']}?detail=2"))["complete"] and v,
            30, "every rank's answer")
        assert {r: row["status"] for r, row in view["ranks"].items()} == \
            {"0": "answered", "1": "answered", "2": "answered"}
        assert "time.sleep(3600)" in view["ranks"]["2"]["threads"][0]["stack"]
        assert "pgdash_cluster_owned_jobs 1" in _metrics(owner)
        assert "pgdash_cluster_owned_jobs 0" in _metrics(other)
        # One hang, stored once: the other process did not diagnose it a second time.
        time.sleep(2)
        assert len(hangs(a, job["id"])) == len(hangs(b, job["id"])) == 1
        engine = sa.create_engine(pg_url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT count(*) FROM findings WHERE job_id = :j "
                                            "AND kind = 'hang'"), {"j": job["id"]}).scalar() == 1
        finally:
            engine.dispose()
    finally:
        disconnect(ui)
        for p in procs:
            p.kill()
            p.wait()


def _metrics(server) -> str:
    return get_body(server.url + "/metrics", timeout=5).decode()


def _owns(server, owner):
    """Whether ``owner`` (a job_owners.owner) is this server process (its pid)."""
    return f":{server.proc.pid}:" in owner


def test_owner_killed_mid_job_the_other_takes_over_with_exact_counts(pair, pg_url, tmp_path):
    a, b = pair()
    balancer = Balancer([("127.0.0.1", a.port), ("127.0.0.1", b.port)]).start()
    steps = 300
    procs = launch_job("loop_job.py", 2, balancer.url, "failover", tmp_path,
                       args=[str(steps), "0.03"])
    try:
        job = wait_for(lambda: (j := job_by_name(a, "failover")) and a.api(
            f"/api/jobs/{j['id']}/collectives")["collectives"] and j, 60, "first collectives")
        assert balancer.backends_used() == {0, 1}, "ranks should land on both processes"
        owners = wait_for(lambda: owner_of(pg_url, job["id"]), 30, "an owner")
        owner, survivor = (a, b) if _owns(a, owners[0][0]) else (b, a)
        owner.kill()
        killed_at = time.monotonic()
        assert all(p.poll() is None for p in procs), "training goes on"
        wait_for(lambda: (o := owner_of(pg_url, job["id"])) and _owns(survivor, o[0][0]),
                 20, "the survivor to own the job")
        takeover = time.monotonic() - killed_at
        assert wait_job(procs, 180, tmp_path) == [0, 0]
        done = wait_for(lambda: (j := survivor.api(f"/api/jobs/{job['id']}"))["status"]
                        == "finished" and j, 30, "the job finished on the survivor")
        assert {r["status"] for r in done["ranks"]} == {"exited"}
        assert all(not r["dropped"] for r in done["ranks"]), done["ranks"]
        rows = survivor.api(f"/api/jobs/{job['id']}/collectives")["collectives"]
        counts = collections.Counter({(r["group"], r["op"], r["rank"]): r["count"]
                                      for r in rows})
        assert counts == {("0", "all_reduce", 0): steps, ("0", "all_reduce", 1): steps,
                          ("0", "barrier", 0): 1, ("0", "barrier", 1): 1}
        assert len(survivor.api("/api/jobs")["jobs"]) == 1
        assert not [f for f in survivor.api(f"/api/jobs/{job['id']}/findings")["findings"]
                    if f["kind"] in ("hang", "rank_lost") and f["active"]]
        print(f"takeover after {takeover:.1f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        balancer.stop()


def in_own_thread(body) -> None:
    """Run ``body`` on a fresh thread and re-raise what it raised there.

    Playwright's sync API refuses a thread where another sync Playwright is alive, and
    tests/integration/test_browser.py keeps one for the whole session on the main thread; a second
    Chromium on its own thread coexists with it.
    """
    failure: list[BaseException] = []

    def run():
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="chromium", daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the browser part did not finish within 300 s"
    if failure:
        raise failure[0]


def test_browser_on_the_process_that_does_not_own_the_job_sees_it_live(pair, pg_url):
    """Real Chromium on the non-owner: the page builds on the owner's snapshot and deltas,
    relayed through Redis, and shows the hang the owner found."""
    playwright = pytest.importorskip("playwright.sync_api", reason=(
        "the playwright package is missing: pip install -c constraints.txt -e '.[test]'"))
    from tests.helpers.browser import (CHROMIUM_ARGS, COLLECTIVES, LIVE_MS, FakeAgent, Watched,
                                       chromium_path, rank_row)

    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed: apt-get install chromium (tools/test does "
                    "this when run as root), or point PGDASH_CHROMIUM at a Chromium binary")
    expect = playwright.expect
    a, b = pair("--hang-after", "1")
    agents = [FakeAgent(a.url if rank < 2 else b.url, "hung-split", rank,
                        host="node-a" if rank < 2 else "node-b", world_size=3)
              for rank in range(3)]

    def browse():
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.set_default_timeout(10_000)
                page = context.new_page()
                watched = Watched(page)
                page.on("pageerror", lambda exc: watched.errors.append(f"page error: {exc}"))
                page.on("console", watched.on_console)
                check_page(page, expect)
                watched.assert_clean()
            finally:
                browser.close()

    def check_page(page, expect):
        agents[0].send("group", {"name": "0", "desc": "default_pg", "backend": "gloo",
                                 "ranks": [0, 1, 2]})
        agents[0].collectives(3)
        job = wait_for(lambda: job_by_name(a, "hung-split"), 30, "the job")
        owners = wait_for(lambda: owner_of(pg_url, job["id"]), 30, "an owner")
        other = b if _owns(a, owners[0][0]) else a

        page.goto(f"{other.url}/jobs/{job['id']}")
        expect(page.locator("#live-text")).to_have_text("Live")
        expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text("3")
        page.evaluate("window.__sameDocument = true")

        # Ranks on both processes move; the page on `other` follows without a reload.
        agents[0].collectives(4)
        expect(rank_row(page, 0).locator("td").nth(COLLECTIVES)).to_have_text(
            "7", timeout=LIVE_MS)
        stuck_since = time.time() - 5
        for agent in agents[:2]:
            agent.send("heartbeat", {"groups": [{"group": "0", "entered": 5, "completed": 4,
                                                 "inflight_op": "all_reduce",
                                                 "inflight_since": stuck_since}]})
        agents[2].send("heartbeat", {"groups": [{"group": "0", "entered": 4,
                                                 "completed": 4}]})
        finding = page.locator("#findings li.finding[data-kind='hang']")
        expect(finding).to_have_count(1, timeout=3 * LIVE_MS)
        expect(finding.locator(".blamed")).to_have_text("rank 2")
        expect(page.locator("#job-verdict")).to_have_text(
            "1 critical incident · at fault: rank 2")
        assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"

    try:
        in_own_thread(browse)
    finally:
        closers = [threading.Thread(target=x.close, daemon=True) for x in agents]
        for t in closers:
            t.start()
        for t in closers:
            t.join(timeout=15)


# ----------------------------------------------------- the pieces, on the real PostgreSQL --

class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _event_row(job_id, session, seq):
    return {"job_id": job_id, "session": session, "seq": seq, "t": 1.0, "received_at": 1.0,
            "kind": "heartbeat", "body": "{}"}


def test_log_tail_waits_for_an_id_committed_late_and_delivers_in_id_order(pg_url):
    from dashboard.cluster.node import LogTail
    from dashboard.storage.schema import events
    from dashboard.storage.store import Store

    store = Store(pg_url).start()
    clock = Clock()
    try:
        job_id = store.writer.submit(lambda c: store.jobs.create(c, "tail", 1.0))
        tail = LogTail(store, clock=clock, gap_wait=5.0)
        tail.start_at_end()
        slow = store.engine.connect()
        slow_tx = slow.begin()
        held = slow.execute(sa.insert(events).returning(events.c.id),
                            [_event_row(job_id, "slow", 1)]).scalar()
        with store.engine.begin() as fast:  # a higher id, committed first
            fast.execute(sa.insert(events), [_event_row(job_id, "fast", 1)])
        assert tail.poll() == [], "an id below a missing one must wait for it"
        clock.now += 4.0
        assert tail.poll() == []
        slow_tx.commit()
        slow.close()
        got = tail.poll()
        assert [(r["id"], r["session"]) for r in got] == [(held, "slow"), (held + 1, "fast")]

        # A gap that never fills (a rolled-back insert) is passed over after gap_wait ...
        with store.engine.connect() as gone:
            tx = gone.begin()
            lost_id = gone.execute(sa.insert(events).returning(events.c.id),
                                   [_event_row(job_id, "gone", 1)]).scalar()
            tx.rollback()
        with store.engine.begin() as conn:
            conn.execute(sa.insert(events), [_event_row(job_id, "after", 1)])
        assert tail.poll() == []
        clock.now += 5.1
        assert [r["session"] for r in tail.poll()] == ["after"]
        assert tail.passed_over == 1 and tail.cursor == lost_id + 1
        # ... and an id passed over that commits after all is delivered late, not lost.
        with store.engine.begin() as conn:
            conn.execute(sa.insert(events), [{**_event_row(job_id, "late", 1), "id": lost_id}])
        assert [(r["id"], r["session"]) for r in tail.poll()] == [(lost_id, "late")]
        assert tail.late_delivered == 1
    finally:
        store.close()


def test_leases_one_owner_at_a_time_and_takeover_only_after_expiry(pg_url):
    from dashboard.cluster.node import Leases
    from dashboard.storage.store import Store

    store = Store(pg_url).start()
    clock = Clock()
    try:
        job_id = store.writer.submit(lambda c: store.jobs.create(c, "leased", 1.0))
        a = Leases(store, owner="a", lease_s=5.0, clock=clock)
        b = Leases(store, owner="b", lease_s=5.0, clock=clock)
        assert b.orphans() == [job_id]
        assert a.claim(job_id) and not b.claim(job_id)
        assert b.orphans() == [] and b.owner_of(job_id) == "a"
        clock.now += 4.0
        assert a.renew() == set()  # renewed in time: still a's
        clock.now += 4.0
        assert not b.claim(job_id)
        clock.now += 2.0  # a stopped renewing 6 s ago
        assert b.orphans() == [job_id]
        assert b.claim(job_id) and b.takeovers == 1
        assert a.renew() == {job_id} and not a.owns(job_id) and a.lost == 1
        b.release()
        assert b.owner_of(job_id) is None and a.claim(job_id) and a.takeovers == 0
        store.writer.submit(lambda c: store.jobs.update(c, job_id, {
            "status": "finished", "world_size": 1, "backend": "gloo", "started_at": 1.0,
            "ended_at": 2.0}))
        clock.now += 60
        assert b.orphans() == [], "an ended job needs no owner"
    finally:
        store.close()


def test_an_agent_moving_to_the_other_process_is_deduped_against_the_log(pair):
    from tests.helpers.agents import HELLO, agent_client, ev, send

    a, b = pair()
    first = agent_client(a.url, session="mover", job="moving")
    try:
        hello = {**HELLO, "job": "moving"}
        assert send(first, [ev(1, "hello", hello), ev(2, "heartbeat", {"groups": []}),
                            ev(3, "heartbeat", {"groups": []})])["stored"] == 3
    finally:
        disconnect(first)
    second = agent_client(b.url, session="mover", job="moving")
    try:  # it resends what it was not sure of, plus new events
        ack = send(second, [ev(seq, "heartbeat", {"groups": []}) for seq in range(2, 6)])
        assert ack["stored"] == 2
    finally:
        disconnect(second)
    jobs = b.api("/api/jobs")["jobs"]
    assert [j["name"] for j in jobs] == ["moving"], "the move must not split the job"
    metrics = get_body(b.url + "/metrics", timeout=5).decode()
    assert 'pgdash_ingest_events_total{result="duplicate"} 2' in metrics
    assert "pgdash_cluster_tail_age_seconds" in metrics


def test_a_process_stopped_with_sigterm_hands_its_jobs_over_at_once(pair, pg_url):
    """A rolling restart: the stopped owner releases its leases, so the other process takes
    the job well before a 30 s lease could have run out."""
    from tests.helpers.agents import HELLO, agent_client, ev, send

    a, b = pair("--lease", "30")
    agent = agent_client(a.url, session="handover", job="handover")
    try:
        assert send(agent, [ev(1, "hello", {**HELLO, "job": "handover"})])["stored"] == 1
        job = wait_for(lambda: job_by_name(a, "handover"), 30, "the job")
        owners = wait_for(lambda: owner_of(pg_url, job["id"]), 30, "an owner")
        owner, other = (a, b) if _owns(a, owners[0][0]) else (b, a)
        stopped_at = time.monotonic()
        owner.stop()  # SIGTERM
        assert owner.proc.returncode == 0, "SIGTERM must stop the server cleanly"
        wait_for(lambda: (o := owner_of(pg_url, job["id"])) and _owns(other, o[0][0]),
                 25, "the other process to own the job")
        assert time.monotonic() - stopped_at < 25  # the lease alone would take 30 s or more
    finally:
        disconnect(agent)


def test_a_request_made_at_one_process_is_read_by_a_host_reader_connected_to_the_other(
        pair, tmp_path):
    """Both ranks of a host blocked with the GIL held, connected (with their host reader) to
    process A; a snapshot asked at B reaches them through Redis, and B then has A's host
    reader read them: the readings show in B's view once folded from the shared log."""
    a, b = pair("--hang-after", "600")
    py_spy = str(Path(sys.executable).with_name("py-spy"))  # the test extra installs it
    procs = launch_job("fault_job.py", 2, a.url, "gilcluster", tmp_path, args=["gil-all"],
                       env={"PGDASH_PY_SPY": py_spy})
    try:
        job = wait_for(lambda: job_by_name(b, "gilcluster"), 60, "the job, seen from B")
        for rank in (0, 1):
            wait_for(lambda: "FAULT" in (tmp_path / f"gilcluster-rank{rank}.log").read_text(),
                     60, f"rank {rank} blocked")
        wait_for(lambda: "pgdash_host_readers 1.0" in _metrics(a), 30, "A's host reader")
        assert "pgdash_host_readers 0.0" in _metrics(b)
        time.sleep(1.0)  # their agents have stopped with them
        req = urllib.request.Request(f"{b.url}/api/jobs/{job['id']}/snapshots",
                                     data=json.dumps({"ranks": "all"}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as resp:
            assert resp.status == 202
            made = json.loads(resp.read())
        assert sorted(made["relayed"]) == [0, 1], made
        view = wait_for(lambda: all((v := b.api(made["url"]))["ranks"][r].get(
            "read_from_outside", {}).get("t") for r in ("0", "1")) and v, 60,
            "both ranks read by A's host reader, in B's view")
        for r in ("0", "1"):
            outside = view["ranks"][r]["read_from_outside"]
            assert outside["host_reader"] is True and outside["by"] == 0, outside
            assert "fault_job.py" in outside["dump"] and "match" in outside["dump"], outside
    finally:
        for p in procs:
            p.kill()
            p.wait()
