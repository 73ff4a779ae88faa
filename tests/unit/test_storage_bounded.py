"""Bounded storage: compact bodies, the 0004 upgrade, compaction, stored checkpoints."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle

import pytest
import sqlalchemy as sa

from dashboard.history import archive
from dashboard.storage.codec import decode_body, decode_state, encode_body, encode_state
from dashboard.storage.compaction import Compactor, Policy
from dashboard.storage.thinning import COMPACTABLE, SortedIds, plan
from dashboard.history.rewind import Rewind
from dashboard.state import JobState
from dashboard.storage.database import upgrade
from dashboard.storage.store import Store
from dashboard.web import views
from tests.helpers.simjob import (RANKS, T0, _fold, _job_events, _send_live, _store_job, _views,
                                  insert_old_job)


def test_a_plans_deletions_answer_membership_asked_in_order_and_out_of_order():
    """The compactor asks of each event of a cell, in id order, whether the plan deleted it;
    asked out of order (or again), the answer is the same."""
    from array import array

    ids = SortedIds(array("q", [3, 5, 6, 10, 40]))
    assert [i for i in range(45) if i in ids] == [3, 5, 6, 10, 40]
    assert [i in ids for i in (40, 6, 7, 3, 2, 41, 10)] == [True, True, False, True, False,
                                                              False, True]
    assert len(ids) == 5 and list(ids) == [3, 5, 6, 10, 40]
    assert not SortedIds(array("q")) and 1 not in SortedIds(array("q"))


def test_a_merged_summary_sums_each_buckets_count_over_the_cells_summaries():
    from dashboard.storage.thinning import _MergedSummary

    merged = _MergedSummary()
    row = {"group": "0", "op": "all_reduce", "count": 3, "bytes": 30, "sum_us": 9.0,
           "max_us": 4.0}
    merged.add({"start": 1.0, "end": 1.5, "rows": [dict(row, hist=[[20, 1], [22, 2]])]})
    merged.add({"start": 1.5, "end": 2.0, "rows": [dict(row, hist=[[22, 1], [21, 2]],
                                                        max_us=5.0)]})
    body = merged.body()
    assert (body["start"], body["end"]) == (1.0, 2.0)
    (out,) = body["rows"]
    assert out["hist"] == [[20, 1], [21, 2], [22, 3]]
    assert (out["count"], out["bytes"], out["sum_us"], out["max_us"]) == (6, 60, 18.0, 5.0)


def _compacted(events: list[dict], updates: dict, deletes: list[int]) -> list[dict]:
    gone = set(deletes)
    return [dict(ev, body=updates.get(ev["id"], ev["body"])) for ev in events
            if ev["id"] not in gone]


# -- the codec -------------------------------------------------------------------------------

def test_compact_bodies_read_back_identically_and_are_far_smaller_than_json():
    events = _job_events(30)
    json_bytes = sum(len(msgspec_json(ev["body"])) for ev in events)
    packed = [encode_body(ev["body"]) for ev in events]
    assert [decode_body(p) for p in packed] == [ev["body"] for ev in events]
    assert sum(map(len, packed)) * 2 < json_bytes
    # Plain (format 02): rows the compactor packs soon, read back the same, uncompressed.
    plain = [encode_body(ev["body"], compress=False) for ev in events]
    assert [decode_body(p) for p in plain] == [ev["body"] for ev in events]
    assert {p[0] for p in plain} == {2} and {p[0] for p in packed} == {1}
    with pytest.raises(ValueError, match="format 03; this pgdash reads formats 01 and 02"):
        decode_body(b"\x03abc")


def msgspec_json(body: dict) -> bytes:
    import msgspec
    return msgspec.json.encode(body)


def test_a_checkpoint_refuses_a_pickle_it_did_not_write():
    state = _fold(_job_events(20))
    again = decode_state(encode_state(state))
    assert _views(again) == _views(state)

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    import zlib
    forged = b"\x01" + zlib.compress(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match="not written by pgdash"):
        decode_state(forged)
    assert gc.isenabled()  # decoding pauses the garbage collector, and only meanwhile
    # A checkpoint cut short or damaged says so, wherever the damage is.
    blob = encode_state(state)
    for damaged in (blob[:len(blob) // 2], blob[:-3], blob[:40] + bytes(64) + blob[104:]):
        with pytest.raises(ValueError, match="cannot be read"):
            decode_state(damaged)
    assert gc.isenabled()


def test_a_checkpoint_that_pickled_the_timeline_beside_the_book_still_loads():
    """A Timeline (the state with its findings book, what Ingest and replay checkpoint) was
    pickled as dashboard.diagnosis.book.Timeline until it moved to dashboard.diagnosis.timeline;
    such checkpoints load and read the same."""
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.timeline import Timeline
    from dashboard.storage.codec import compress_state

    timeline = Timeline(1, "j", Settings())
    for ev in _job_events(60, hang=(T0 + 40, T0 + 59)):
        timeline.apply(ev)
    timeline.advance(T0 + 60)
    assert timeline.book.findings()  # the hang: the book holds something to read back
    stored = decode_state(encode_state(timeline))  # as checkpointed: no memo caches
    raw = pickle.dumps(stored, protocol=3)  # unframed: editable
    old = raw.replace(b"cdashboard.diagnosis.timeline\nTimeline\n",
                      b"cdashboard.diagnosis.book\nTimeline\n")
    assert old != raw and b"dashboard.diagnosis.timeline" not in old
    loaded = decode_state(compress_state(old))
    assert type(loaded) is Timeline
    assert _views(loaded.state) == _views(timeline.state)
    assert loaded.book.findings() == timeline.book.findings()
    assert loaded.judged_through == timeline.judged_through


def test_pausing_the_garbage_collector_nests_and_keeps_it_off_if_it_was():
    from dashboard.storage.codec import gc_paused

    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()  # a program that runs without it: pgdash does not turn it back on
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- compaction, pure ------------------------------------------------------------------------

def test_a_compacted_log_folds_to_the_same_newest_state_and_keeps_every_lifecycle_event():
    events = _job_events(900, exit_rank_at=T0 + 500.5)
    cutoff = events[-1]["received_at"] - 200  # the window: its last 200 s stay whole
    old = [ev for ev in events if ev["received_at"] < (cutoff // 60) * 60]
    floors = {}
    for ev in events:
        floors[ev["session"]] = ev["received_at"] - 200
    updates, deletes = plan(old, 60.0, keep=[], session_floor=floors)
    assert len(deletes) > len(old) * 0.75  # it thins
    compacted = _compacted(events, updates, deletes)
    gone = set(deletes)
    assert all(ev["id"] not in gone for ev in events if ev["kind"] not in COMPACTABLE)
    # The newest state is the same for everything the page and diagnosis use...
    assert _views(_fold(compacted)) == _views(_fold(events))
    # ...and the cell holding rank 3's exit was kept whole.
    exit_cell = (T0 + 500.5) // 60
    assert all(ev["id"] not in gone for ev in events if ev["received_at"] // 60 == exit_cell)
    # An XID reading and the throttle transitions of rank 1 are kept: exact fault times.
    assert _fold(compacted).gpu_faults == _fold(events).gpu_faults
    # At a moment beyond the window, cumulative statistics and progress agree at cell ends.
    at = (T0 + 360) // 60 * 60 - 0.001
    early_full, early_comp = _fold(events, at), _fold(compacted, at)
    assert views.collective_rows(early_comp) == views.collective_rows(early_full)
    assert views.progress_rows(early_comp) == views.progress_rows(early_full)
    # Compacting again changes nothing.
    again, gone_again = plan([ev for ev in compacted if ev["received_at"] < (cutoff // 60) * 60],
                             60.0, keep=[], session_floor=floors)
    assert again == {} and list(gone_again) == []


def test_full_resolution_is_kept_around_a_finding():
    events = _job_events(600)
    keep = [(T0 + 200, T0 + 260)]
    updates, deletes = plan(events, 60.0, keep=keep)
    gone = set(deletes) | set(updates)
    near = [ev for ev in events if T0 + 200 <= ev["received_at"] <= T0 + 260]
    assert near and all(ev["id"] not in gone for ev in near)
    assert any(ev["received_at"] < T0 + 140 for ev in events if ev["id"] in gone)
    assert any(ev["received_at"] > T0 + 320 for ev in events if ev["id"] in gone)


def test_policy_settings_are_named_when_wrong():
    with pytest.raises(ValueError, match="PGDASH_KEEP_FULL_S"):
        Policy(keep_full_s=30.0)
    with pytest.raises(ValueError, match="PGDASH_KEEP_FULL_S='soon'"):
        Policy.from_env({"PGDASH_KEEP_FULL_S": "soon"})
    assert Policy.from_env({"PGDASH_KEEP_FULL_S": "600"}, around_findings_s=60.0) == \
        Policy(keep_full_s=600.0, around_findings_s=60.0)
    with pytest.raises(ValueError, match="PGDASH_KEYFRAME_KEEP_S is 60 s: .* up to 30 seconds"):
        Policy.from_env({"PGDASH_KEYFRAME_KEEP_S": "60"})


# -- on a real database ----------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    yield s
    s.close()


def test_the_compactor_thins_a_stored_job_through_the_writer_and_export_still_works(store):
    events = _job_events(1500, hang=(T0 + 600, T0 + 700))
    job_id = _store_job(store, events)
    finding = {"id": "hang:0", "kind": "hang", "severity": "critical", "active": False,
               "first_seen": T0 + 660, "last_seen": T0 + 700}
    store.writer.submit(lambda conn: store.findings.save(conn, job_id, [finding]))
    told = []

    @contextlib.contextmanager
    def guard(*span):
        told.append(span)
        yield

    compactor = Compactor(store, Policy(keep_full_s=300, around_findings_s=120), guard=guard)
    size_before = _file_bytes(store)
    removed = compactor.run_once()
    stored = list(store.log.events(job_id))
    assert removed == len(events) - len(stored) > len(events) // 2
    # The pages it freed went back to the file system (a new SQLite file, auto_vacuum).
    assert _file_bytes(store) < size_before / 2
    assert told and all(end <= events[-1]["received_at"] - 300 for _, _, end in told)
    by_id = {ev["id"]: ev for ev in stored}
    # Nothing inside the window or near the finding is touched.
    original = {i + 1: ev for i, ev in enumerate(events)}  # ids as stored (one writer)
    for i, ev in original.items():
        if ev["received_at"] >= events[-1]["received_at"] - 300 or \
                T0 + 540 <= ev["received_at"] < T0 + 820:
            assert by_id[i]["body"] == ev["body"], ev
    assert _views(_fold(stored)) == _views(_fold(events))
    assert compactor.run_once() == 0  # nothing more to do
    # A compacted job exports and imports like any other.
    lines = list(archive.export_lines(store, job_id))
    loaded = archive.Archive.read(lines, "export")
    new_id = archive.import_archive(store, loaded, T0 + 2000)
    assert _views(_fold(list(store.log.events(new_id))))["collectives"] == \
        _views(_fold(stored))["collectives"]


def _file_bytes(store: Store) -> int:
    """The SQLite file's size once its write-ahead log is folded in."""
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return os.path.getsize(store.engine.url.database)


def test_scrubbing_back_starts_from_a_stored_checkpoint_also_after_a_restart(store):
    events = _job_events(1200)
    job_id = _store_job(store, events)
    # copies_bytes=0: no in-memory copies
    first = Rewind(store, copies_bytes=0, persist_every_s=120.0)
    first.view(job_id, "j", events[-1]["received_at"], lambda s: None)
    first.wait_saved()  # compressed off the scrub's thread, then queued
    store.writer.wait_idle()
    assert first.checkpoints_saved >= 8
    restarted = Rewind(store, copies_bytes=0, persist_every_s=120.0)
    for at in (T0 + 1000.5, T0 + 500.5, T0 + 130.0):  # backwards
        before = restarted.events_read
        got = restarted.view(job_id, "j", at, _views)
        assert got == _views(_fold(events, at)), at
        assert restarted.events_read - before < 130 * 3 * RANKS  # not from the start
    assert restarted.checkpoints_loaded == 3


def test_a_database_at_the_previous_revision_upgrades_and_reads_back_identically(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    upgrade(engine, "0003")
    events = _job_events(40)
    with engine.begin() as conn:  # what pgdash up to revision 0003 wrote: JSON bodies
        insert_old_job(conn)
        conn.exec_driver_sql(
            "INSERT INTO events (id, job_id, session, seq, t, received_at, kind, body) "
            "VALUES (?, 1, ?, ?, ?, ?, ?, ?)",
            [(ev["id"], ev["session"], ev["seq"], ev["t"], ev["received_at"], ev["kind"],
              msgspec_json(ev["body"]).decode()) for ev in events])
    engine.dispose()
    store = Store(url).start()  # upgrades to head
    try:
        assert list(store.log.events(1)) == events
        more = [dict(ev, seq=ev["seq"] + 1000) for ev in events[:5]]
        store.writer.submit(lambda conn: store.log.insert_archived(conn, 1, more))
        with store.engine.connect() as conn:
            kinds = conn.exec_driver_sql(
                "SELECT body_z IS NULL, COUNT(*) FROM events GROUP BY 1").all()
        assert sorted(kinds) == [(0, 5), (1, len(events))]  # old rows left as they were
        got = list(store.log.events(1))
        assert [ev["body"] for ev in got] == [ev["body"] for ev in events + more]
    finally:
        store.close()


def test_the_live_fold_stores_checkpoints_as_the_job_runs(store):
    """No scrub needed: the writer stores the live state at each period's start, and a
    restarted server's state?at starts from one of them."""
    from dashboard.ingest.pipeline import Ingest

    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0]).start()
    ingest.rewind.persist_every_s = 60.0
    job_id = _send_live(ingest, clock, _job_events(400), "live")
    ingest.rewind.wait_saved()  # compressed off the writer thread, then queued
    store.writer.wait_idle()
    assert ingest.rewind.checkpoints_saved >= 5
    restarted = Ingest(store, clock=lambda: clock[0]).start()
    at = T0 + 250.7
    # (Ingest folds a Timeline: the state with its findings book, stored together.)
    got = restarted.rewind.view(job_id, "live", at, lambda timeline: _views(timeline.state))
    assert restarted.rewind.checkpoints_loaded == 1
    assert restarted.rewind.events_read < 70 * 3 * RANKS  # from a checkpoint, not the start
    assert got == _views(JobState(job_id, "live").apply_all(
        ev for ev in store.log.events(job_id) if ev["received_at"] <= at))


def test_a_read_inside_a_write_opens_its_connection_at_once_and_new_files_still_reclaim(
        tmp_path):
    # A pooled connection opened while a write is in progress once asked SQLite for
    # auto_vacuum, which waits for that write's lock: the live diagnosis read a new job's
    # findings that way, under the lock the writer wanted next, and the agent's first
    # connection to a new server hung for the whole busy timeout.
    store = Store(f"sqlite:///{tmp_path / 'p.db'}", busy_timeout_s=2.0).start()
    try:
        store.writer.submit(lambda conn: store.jobs.create(conn, "first", T0))

        def write_then_read(conn):
            store.jobs.create(conn, "second", T0)
            store.engine.dispose()  # the read below opens a new connection
            return store.jobs.newest()  # what was committed before this write

        assert [j["name"] for j in store.writer.submit(write_then_read, timeout=30)] == ["first"]
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2  # incremental
    finally:
        store.close()
