"""One lifecycle: the findings and incidents a live server gave for a real fault-injected job
equal those from replaying its export, from importing it into another server, and from
``state?at=`` at the moments live showed them (dashboard.diagnosis.book)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import sqlalchemy as sa

from tests.helpers.procs import ROOT, ServerProcess, job_by_name, launch_job, wait_for
from dashboard.history.archive import Archive, replay_timeline
from dashboard.diagnosis import Settings
from dashboard.diagnosis.book import Book, LogRow
from dashboard.diagnosis.timeline import BookLog
from dashboard.ingest.pipeline import Ingest
from dashboard.web.live import state_at
from dashboard.storage.schema import book_log, book_spans
from dashboard.storage.store import Store
from tests.helpers.realservers import pg_url, postgres_server  # noqa: F401  (fixtures)

FLAGS = ["--stall-after", "3", "--hang-after", "8"]
SETTINGS = Settings(stall_after=3.0, hang_after=8.0)  # as FLAGS tell the servers

FINDING = ("id", "kind", "severity", "ranks", "group", "first_seen", "last_seen", "active")
INCIDENT = ("id", "kind", "severity", "ranks", "findings", "first_seen", "last_seen", "active")


def gist(rows, keys):
    return sorted((tuple(json.dumps(r[k]) for k in keys) for r in rows))


def test_live_replay_import_and_state_at_give_the_same_findings_and_incidents(tmp_path):
    live = ServerProcess(f"sqlite:///{tmp_path / 'live.db'}", log_path=tmp_path / "live.log",
                         extra=FLAGS).start()
    procs = launch_job("fault_job.py", 3, live.url, "book", tmp_path, args=["hang", "30"])
    other = None
    try:
        job = wait_for(lambda: job_by_name(live, "book"), 60, "the job")
        path = f"/api/jobs/{job['id']}"
        snapshots: dict[float, list[dict]] = {}  # last moment judged -> the findings then

        def look(until_kind):
            found = live.api(path + "/findings")["findings"]
            active = [f for f in found if f["active"]]
            if active:  # an active finding's last_seen is the last moment the book judged
                snapshots[max(f["last_seen"] for f in active)] = found
            return any(f["kind"] == until_kind and f["active"] for f in found)

        # Rank 2 never enters its 6th all_reduce: a stall (3 s), then the hang (8 s).
        wait_for(lambda: look("stall"), 60, "the stall", interval=0.3)
        wait_for(lambda: look("hang"), 60, "the hang", interval=0.3)
        # The hung job is stopped as hung jobs end (a scheduler kills it): the culprit first,
        # then the rest. Its departures are the hang's last evidence, not new findings.
        procs[2].send_signal(signal.SIGKILL)

        def rank_2_lost():
            look("hang")
            return any(r["rank"] == 2 and r["status"] == "lost" for r in live.api(path)["ranks"])

        wait_for(rank_2_lost, 30, "rank 2 lost", interval=0.3)
        for p in procs[:2]:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)

        def settled():
            first = live.api(path + "/findings")["findings"]
            time.sleep(2.5)  # more than the grid step and the reconnect grace
            second = live.api(path + "/findings")["findings"]
            return first if first == second and live.api(path)["status"] == "failed" \
                else None

        findings = wait_for(settled, 60, "the findings to settle")
        incidents = live.api(path + "/incidents")["incidents"]
        kinds = {f["kind"] for f in findings}
        assert {"stall", "hang"} <= kinds and "rank_lost" not in kinds, kinds
        (hang,) = [f for f in findings if f["kind"] == "hang"]
        assert hang["active"] and hang["ranks"] == [2] and hang["evidence"]["stopped"]["ranks"]
        assert any(not f["active"] for f in findings), "something resolved"
        assert any(i["id"] == "hang:r2" for i in incidents), incidents

        # 1. Replaying the export with the same rules and book.
        with urllib.request.urlopen(live.url + path + "/export", timeout=30) as resp:
            lines = resp.read().decode().splitlines(keepends=True)
        (tmp_path / "book.jsonl").write_text("".join(lines))
        timeline = replay_timeline(Archive.read(lines), SETTINGS)
        assert gist(timeline.book.findings(), FINDING) == gist(findings, FINDING)
        assert gist(timeline.book.incidents(), INCIDENT) == gist(incidents, INCIDENT)

        # 2. Imported into another database, served by another server.
        subprocess.run([sys.executable, "-m", "dashboard", "import", str(tmp_path / "book.jsonl"),
                        "--db", f"sqlite:///{tmp_path / 'other.db'}"], cwd=ROOT, check=True,
                       capture_output=True, timeout=120)
        other = ServerProcess(f"sqlite:///{tmp_path / 'other.db'}", extra=FLAGS,
                              log_path=tmp_path / "other.log").start()
        imported = job_by_name(other, "book")
        there = other.api(f"/api/jobs/{imported['id']}/findings")["findings"]
        assert gist(there, FINDING) == gist(findings, FINDING)
        there = other.api(f"/api/jobs/{imported['id']}/incidents")["incidents"]
        assert gist(there, INCIDENT) == gist(incidents, INCIDENT)

        # 3. state?at= at the moments live was seen at, in scrubbing order (back and forth),
        # and at the end.
        assert len(snapshots) >= 3, sorted(snapshots)
        moments = sorted(snapshots)
        for at in moments[::2] + moments[1::2][::-1]:
            then = live.api(f"{path}/state?at={at}")
            assert gist(then["findings"], FINDING) == gist(snapshots[at], FINDING), at
        end = live.api(f"{path}/state?at={time.time()}")
        assert gist(end["findings"], FINDING) == gist(findings, FINDING)
        assert gist(end["incidents"], INCIDENT) == gist(incidents, INCIDENT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        live.stop()
        if other is not None:
            other.stop()

    # 4. The live book's stored log answers state?at= without judging a moment again, and a
    # restarted server's book continues it; with the log gone, every moment is judged again:
    # the same findings.
    store = Store(f"sqlite:///{tmp_path / 'live.db'}").start()
    try:
        span = store.findings.log_span(job["id"])
        assert span is not None and span[0] <= min(moments) and span[1] >= max(moments), span
        logged = Ingest(store, settings=SETTINGS).start()
        for at in moments:
            then = state_at(logged, job["id"], at)
            assert gist(then["findings"], FINDING) == gist(snapshots[at], FINDING), at
            assert logged.rewind.cursor(job["id"]).book is None, "a moment was judged"
        restarted = Ingest(store, clock=lambda: span[1] + 1, settings=SETTINGS).start()
        assert restarted.state(job["id"]) is not None
        book = restarted.books.held(job["id"])
        assert gist(book.findings(), FINDING) == gist(findings, FINDING)
        assert book.diagnosed <= 4, "the restarted book judged what the log holds"

        store.writer.submit(lambda conn: [conn.execute(sa.delete(t))
                                          for t in (book_log, book_spans)])
        judged = Ingest(store, settings=SETTINGS).start()
        for at in moments:
            then = state_at(judged, job["id"], at)
            assert gist(then["findings"], FINDING) == gist(snapshots[at], FINDING), at
        assert judged.rewind.cursor(job["id"]).book.diagnosed > 0
        # Rebuilding a book by judging is bounded in time too: past it, the book is the
        # findings the earlier run stored (here at once: no time at all allowed).
        hurried = Ingest(store, settings=SETTINGS).start()
        hurried.books.RECOMPUTE_MAX_S = 0.0
        assert hurried.state(job["id"]) is not None and hurried.books.held(job["id"]) is None
        # They are live's, as it last stored them: a last_seen that moved alone may lag.
        assert gist(hurried.findings(job["id"]), FINDING[:-2] + ("active",)) == \
            gist(findings, FINDING[:-2] + ("active",))
    finally:
        store.close()


def test_the_book_keeps_first_seen_the_earliest_and_resolved_findings_inactive():
    """The lifecycle rules on plain data: a finding's first_seen is the earliest any moment
    gave, a finding no longer reported stays, inactive, with the last moment it was seen,
    and coming back is news again."""
    from tests.helpers.events import progress, running

    log = running(2)  # at t=100
    progress(log, 0, 101, ("0", 3, 2, "all_reduce", 101.0))
    progress(log, 1, 101, ("0", 2, 2, None, None))
    book = Book(Settings(hang_after=5.0, diagnose_every=1.0))  # whole seconds
    book.start(100.0)
    changes = book.tick_through(log.state(), 107.0)
    assert [(c.at, [(ch.value, f["kind"]) for ch, f in c.findings]) for c in changes] == [
        (106.0, [("new", "hang")]), (107.0, [("updated", "hang")])]  # (its text: 6 s, 7 s)
    assert [(ch.value, i["id"]) for ch, i in changes[0].incidents] == [("new", "hang:r1")]
    (hang,) = book.findings()
    assert (hang["first_seen"], hang["last_seen"], hang["active"]) == (106.0, 107.0, True)
    for r in (0, 1):
        progress(log, r, 108, ("0", 3, 3, None, None))
    (resolved,) = book.tick_through(log.state(), 108.0)
    assert [(ch.value, f["active"], f["last_seen"]) for ch, f in resolved.findings] == [
        ("resolved", False, 107.0)]
    assert [(ch.value, i["active"]) for ch, i in resolved.incidents] == [("resolved", False)]
    assert book.tick_through(log.state(), 110.0) == []  # nothing changes: nothing to tell
    assert [f["first_seen"] for f in book.findings()] == [106.0]


@pytest.fixture(params=["sqlite", "postgresql"])
def log_store(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'log.db'}" if request.param == "sqlite" else \
        request.getfixturevalue("pg_url")
    store = Store(url).start()
    yield store
    store.close()


def test_a_stored_book_log_gives_the_book_as_it_was_at_every_moment(log_store):
    """A recording book's log, stored (SQLite and PostgreSQL), read back as of each moment,
    equals the book as it was then: findings, first/last_seen, active, incidents."""
    from tests.helpers.events import progress, running

    settings = Settings(hang_after=5.0, diagnose_every=1.0)
    log = running(2)  # at t=100
    progress(log, 0, 101, ("0", 3, 2, "all_reduce", 101.0))
    progress(log, 1, 101, ("0", 2, 2, None, None))
    book = Book(settings)
    book.record()
    book.start(100.0)
    job_id = log_store.writer.submit(lambda conn: log_store.jobs.create(conn, "logged", 100.0))
    then: dict[float, Book] = {}
    for at in range(101, 116):
        if at == 110:  # the hang resolves
            for r in (0, 1):
                progress(log, r, 110, ("0", 3, 3, None, None))
        book.tick_through(log.state(), float(at))
        then[float(at)] = (book.findings(), book.incidents())
        since, rows = book.take_log()
        log_store.writer.submit(lambda conn: log_store.findings.save_log(
            conn, job_id, since, rows, book.judged_through))
    # Stored twice (a retried write): the same log.
    save_log = log_store.findings.save_log
    log_store.writer.submit(lambda conn: save_log(conn, job_id, None, rows, 115.0))
    span = log_store.findings.log_span(job_id)
    assert span == (100.0, 115.0)
    stored = BookLog(settings, *span, lambda until: (
        [LogRow(*r) for r in log_store.findings.log_rows(job_id, until)[0]],
        log_store.findings.log_rows(job_id, until)[1]))
    kinds = set()
    for at, (findings, incidents) in then.items():
        read = stored.book_at(at)
        assert gist(read.findings(), FINDING) == gist(findings, FINDING), at
        assert gist(read.incidents(), INCIDENT) == gist(incidents, INCIDENT), at
        kinds |= {(f["kind"], f["active"]) for f in findings}
    assert kinds == {("hang", True), ("hang", False)}  # the log saw it start and resolve

    # A record that does not continue the span (a server that judged nothing meanwhile)
    # starts the job's log afresh; one that continues it keeps it.
    log_store.writer.submit(lambda conn: save_log(conn, job_id, 115.0, [], 120.0))
    assert log_store.findings.log_span(job_id) == (100.0, 120.0)
    log_store.writer.submit(lambda conn: save_log(conn, job_id, 200.0, [], 201.0))
    assert log_store.findings.log_span(job_id) == (200.0, 201.0)
    assert log_store.findings.log_rows(job_id, 300.0) == ([], None)


def test_a_log_the_writer_cannot_queue_stops_that_book_recording(tmp_path):
    """A full write queue must not leave a hole in a stored log: the book whose rows could
    not be queued records nothing more, so its stored span never claims their moments."""
    import collections

    from dashboard.ingest.livebooks import LiveBooks
    from dashboard.state import JobState

    store = Store(f"sqlite:///{tmp_path / 'full.db'}", queue_limit=1)  # writer not started
    books = LiveBooks(store, Settings(), lambda: 100.0, lambda: 100.0, None,
                      collections.Counter(), lambda job_id, changed: None)
    books.before_fold(None, 1, JobState(1, "j"), 100.0)  # a new job's book, recording
    assert books.held(1) is not None
    assert books.save_logs([(1, 100.0, [], 100.0)])  # queued
    assert not books.save_logs(books.take_logs(lambda job_id: True))  # the queue is full
    assert books.counters["book_log_dropped"] == 1
    books.stop_recording([1])
    assert books.take_logs(lambda job_id: True) == []
    store.engine.dispose()
