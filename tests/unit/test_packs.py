"""Packs: a job's older events stored one cell per row (event_packs), read back as the log."""

from __future__ import annotations

import math

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.history import archive
from dashboard.cluster.node import LogTail
from dashboard.storage.codec import RawBody, body_of, encode_body, encode_state, raw_body
from dashboard.storage.packformat import PACK_V1, decode_pack, encode_pack, open_pack
from dashboard.storage.compaction import Compactor, Policy
from dashboard.history.rewind import Rewind
from dashboard.state import JobState
from dashboard.storage.database import upgrade
from dashboard.storage.log import load_body
from dashboard.storage.packs import OpenPacks, UnreadablePack
from dashboard.storage.store import Store
from tests.helpers.simjob import (FULL, RANKS, T0, _fold, _job_events, _store_job, _views,
                                  insert_old_job)


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    yield s
    s.close()


def _stored(events: list[dict], first_id: int = 1) -> list[dict]:
    """The events as the store numbers them (one writer: consecutive ids)."""
    return [dict(ev, id=first_id + i) for i, ev in enumerate(events)]


def _rows_and_packs(store: Store) -> tuple[int, int, int]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT COUNT(*) FROM events").scalar()
        packs, packed = conn.exec_driver_sql(
            "SELECT COUNT(*), COALESCE(SUM(n), 0) FROM event_packs").first()
    return rows, packs, packed


def _pack_data(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT job_id, first_id, last_id, n, thinned, data FROM event_packs "
            "ORDER BY job_id, first_id").all()


# -- the codec -------------------------------------------------------------------------------

def test_a_pack_reads_back_every_field_and_skips_what_is_asked():
    events = _stored(_job_events(30))
    events[5] = dict(events[5], seq=None, kind="disconnect", body={})  # a server event
    data = encode_pack(events)
    assert decode_pack(data) == events
    assert decode_pack(data, after=events[9]["id"], upto=events[19]["id"]) == events[10:20]
    assert sum(len(encode_body(ev["body"])) for ev in events) > 1.5 * len(data)
    with pytest.raises(ValueError, match="format 07"):
        decode_pack(b"\x07" + data[1:])
    with pytest.raises(ValueError, match="cannot be read"):
        decode_pack(data[:-20])


def test_bodies_moved_unread_make_the_same_pack_and_read_back_as_dicts():
    events = _stored(_job_events(30))
    data = encode_pack(events)
    raw = list(open_pack(data).events(raw=True))
    assert all(isinstance(ev["body"], RawBody) for ev in raw)
    assert [dict(ev, body=body_of(ev["body"])) for ev in raw] == events
    assert encode_pack(raw) == data  # what the compactor writes from them
    assert raw_body(encode_body(events[3]["body"])) == raw[3]["body"]
    with pytest.raises(ValueError, match="format 07"):
        raw_body(b"\x07" + encode_body(events[3]["body"])[1:])


def _agent_like(events: list[dict]) -> list[dict]:
    """The events with their latencies and watts rounded as the agent sends them
    (pgdash_agent.wire rounds to the nanosecond; NVML reports milliwatts)."""
    out = []
    for ev in events:
        body = ev["body"]
        if ev["kind"] == "coll_stats":
            body = dict(body, rows=[dict(r, sum_us=round(r["sum_us"], 3),
                                         max_us=round(r["max_us"], 3)) for r in body["rows"]])
        out.append(dict(ev, body=body))
    return out


def test_format_2_stores_the_agents_decimals_as_integers_and_format_1_still_reads():
    events = _stored(_agent_like(_job_events(120)))
    v1, v2 = encode_pack(events, version=PACK_V1), encode_pack(events)
    assert v1[0] == 1 and v2[0] == 2
    assert decode_pack(v1) == events and decode_pack(v2) == events
    assert len(v2) < 0.8 * len(v1)  # the measured floats were most of the bytes
    # A decimal column that does not fit its bodies is named, not misread.
    import zlib
    fields = msgspec.msgpack.decode(zlib.decompress(v2[1:]))
    assert fields[11], "no decimal column found"
    fields[11][0][1] = 10_000  # an offset past the end of its bodies
    damaged = b"\x02" + zlib.compress(msgspec.msgpack.encode(fields))
    with pytest.raises(ValueError, match="cannot be read: a decimal column"):
        open_pack(damaged)


@pytest.mark.parametrize("seconds", [1, 30, 300])
def test_a_payload_made_in_pieces_is_what_msgspec_makes_of_the_whole(seconds):
    """The payload is written piece by piece (never joined whole): its framing is the one
    msgspec gives the same fields, whatever the bodies' bytes need (bin 8, 16 or 32)."""
    import zlib

    from dashboard.storage.packformat import pack_payload

    events = _stored(_agent_like(_job_events(seconds)))
    for decimals in (True, False):
        payload = pack_payload(events, decimals=decimals)
        assert msgspec.msgpack.encode(msgspec.msgpack.decode(payload)) == payload
        assert len(msgspec.msgpack.decode(payload)) == 11 + decimals
    assert zlib.decompress(encode_pack(events)[1:]) == pack_payload(events)


_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10**12, 10**12).map(lambda k: k / 1000),  # decimals: integer columns
    st.sampled_from([0.0, -0.0, 0.1, 1e-3, 5e-324, 2.0 ** 53 / 1000, 9007199254740.993,
                     -123.456, 1e300]))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_FLOATS, _FLOATS, st.integers(0, 127)), min_size=1, max_size=30),
       st.booleans())
def test_any_floats_read_back_bit_for_bit(values, nested):
    # Bodies of one layout and length (one group): every float's bytes must come back
    # exactly, decimal or not (-0.0, NaN payloads, 1e300, a string holding 0xcb).
    events = []
    for i, (x, y, k) in enumerate(values):
        body = {"x": x, "s": "\u00cb\xcb", "k": k, "w": [y, [x, None]] if nested else y}
        events.append({"id": i + 1, "session": "s", "seq": i + 1, "t": 1.5, "received_at": 2.5,
                       "kind": "gpu", "body": body})
    back = decode_pack(encode_pack(events))
    assert [msgspec.msgpack.encode(ev["body"]) for ev in back] == \
        [msgspec.msgpack.encode(ev["body"]) for ev in events]
    assert all(math.copysign(1, a["body"]["x"]) == math.copysign(1, b["body"]["x"])
               for a, b in zip(back, events))


# -- on a real database ----------------------------------------------------------------------

def test_a_packed_log_folds_to_the_same_state_at_every_event_and_exports_the_same(store):
    events = _stored(_job_events(400))
    job_id = _store_job(store, events)
    before = list(archive.export_lines(store, job_id, now=1.0))
    compactor = Compactor(store, FULL)
    assert compactor.run_once() == 0  # nothing thinned...
    rows, packs, packed = _rows_and_packs(store)
    assert packs >= 5 and packed + rows == len(events) and rows < len(events) // 4  # ...packed
    # Each session's newest event stays a row (admission and the compactor read those).
    newest = {}
    for ev in events:
        newest[ev["session"]] = ev["id"]
    with store.engine.connect() as conn:
        kept = {r[0] for r in conn.exec_driver_sql("SELECT id FROM events")}
    assert set(newest.values()) <= kept
    stored = list(store.log.events(job_id))
    assert stored == events
    # The same state after every event, folded from the packed log and from the original.
    full, packed_fold = JobState(job_id, "j"), JobState(job_id, "j")
    for i, (a, b) in enumerate(zip(events, stored)):
        full.apply(a)
        packed_fold.apply(b)
        assert packed_fold.summary() == full.summary(), i
        if i % 500 == 0:
            assert _views(packed_fold) == _views(full), i
    # state?at (a fresh Rewind: from the log) at moments all over the packed part.
    rewind = Rewind(store, copies_bytes=0, persist_every_s=120.0)
    for at in (T0 + 350.5, T0 + 20.25, T0 + 200.0, T0 + 61.7, T0 + 300.01):
        assert rewind.view(job_id, "j", at, _views) == _views(_fold(events, at)), at
    assert list(archive.export_lines(store, job_id, now=1.0)) == before
    # Packing again changes nothing.
    data = _pack_data(store)
    compactor.run_once()
    assert _pack_data(store) == data


def _body_formats(store: Store) -> set[int]:
    with store.engine.connect() as conn:
        return {bytes(r[0])[0] for r in conn.exec_driver_sql("SELECT body_z FROM events")}


def test_rows_the_compactor_packs_are_stored_plain_and_others_compressed(store, tmp_path):
    """Where cells are packed, a row lives minutes: its body is stored plain (format 02, no
    zlib on the writer), and it reads back, packs and folds as a compressed one does."""
    events = _stored(_job_events(200))
    compactor = Compactor(store, FULL)
    job_id = _store_job(store, events)
    assert _body_formats(store) == {2}
    assert list(store.log.events(job_id)) == events
    compactor.run_once()
    rows, packs, _ = _rows_and_packs(store)
    assert packs and rows < len(events) // 4
    assert list(store.log.events(job_id)) == events
    # Never packed (PGDASH_PACK_AFTER_S=0): rows stay, compressed.
    kept = Store(f"sqlite:///{tmp_path / 'kept.sqlite'}").start()
    try:
        Compactor(kept, Policy(keep_full_s=3600, pack_after_s=0))
        kept_id = _store_job(kept, events)
        assert _body_formats(kept) == {1}
        assert list(kept.log.events(kept_id)) == events
    finally:
        kept.close()


def test_a_quiet_job_packs_its_newest_cells_too_and_goes_on_after_them(store):
    events = _stored(_job_events(150))
    job_id = _store_job(store, events)
    last = events[-1]["received_at"]
    now = last + 30
    compactor = Compactor(store, FULL, clock=lambda: now)
    compactor.run_once()
    rows, _, _ = _rows_and_packs(store)
    assert rows > 4 * RANKS  # the newest cells may still get events: rows
    now = last + FULL.pack_after_s + FULL.cell_s  # quiet that long: an ended job
    compactor.run_once()
    rows, packs, packed = _rows_and_packs(store)
    assert rows == RANKS and packed + rows == len(events)  # each session's newest stays
    assert list(store.log.events(job_id)) == events
    # The job goes on (its agents come back): later events read after the packs.
    more = _stored([dict(ev, seq=ev["seq"] + 10_000, t=ev["t"] + 400,
                         received_at=ev["received_at"] + 400) for ev in events[-40:]],
                   first_id=len(events) + 1)
    store.writer.submit(lambda conn: store.log.insert_archived(conn, job_id, more))
    now = more[-1]["received_at"] + 1
    compactor.run_once()
    assert list(store.log.events(job_id)) == events + more
    assert _views(_fold(list(store.log.events(job_id)))) == _views(_fold(events + more))


def test_job_events_is_right_across_pack_and_row_boundaries(store):
    events = _stored(_job_events(300))
    job_id = _store_job(store, events)
    Compactor(store, FULL).run_once()
    packs = store.packs.of_job(job_id)
    assert len(packs) >= 3
    edges = {0, len(events), len(events) + 5}
    for p in packs:
        edges |= {p["first_id"] - 1, p["first_id"], p["first_id"] + 1, p["last_id"] - 1,
                  p["last_id"], p["last_id"] + 1, (p["first_id"] + p["last_id"]) // 2}
    with store.engine.connect() as conn:  # rows left inside packs' ranges, and after them
        edges |= {r[0] for r in conn.exec_driver_sql("SELECT id FROM events LIMIT 40")}
    edges = sorted(edges)
    for after in edges[::3]:
        for upto in [None] + [e for e in edges[1::4] if e >= after]:
            want = [ev for ev in events
                    if ev["id"] > after and (upto is None or ev["id"] <= upto)]
            assert list(store.log.events(job_id, after=after, upto=upto)) == want, (after, upto)
            assert list(store.log.events(job_id, chunk=7, after=after, upto=upto)) == want
            assert list(store.log.events(job_id, after=after, upto=upto, keep=True)) == want


def test_the_cluster_tail_sees_packed_events_of_every_job(store):
    """A follower that lags behind the packing reads every event, in id order, from two
    jobs whose ids interleave (their packs overlap in id)."""
    one, two = _job_events(240, seed=1), _job_events(240, seed=2)

    def write(conn) -> tuple[int, int]:
        ids = []
        for name in ("a", "b"):
            job = store.jobs.create(conn, name, T0)
            for r in range(RANKS):
                store.sessions.create(conn, f"{name}{r}", job, r, "h", 1, T0)
            ids.append(job)
        for x, y in zip(one, two):  # interleaved, as two live jobs are stored
            store.log.insert_archived(conn, ids[0], [dict(x, session="a" + x["session"][1:])])
            store.log.insert_archived(conn, ids[1], [dict(y, session="b" + y["session"][1:])])
        return tuple(ids)
    jobs = store.writer.submit(write)
    Compactor(store, FULL).run_once()
    assert {p["first_id"] for p in store.packs.of_job(jobs[0])} and store.packs.of_job(jobs[1])
    tail = LogTail(store, chunk=333)
    got = []
    for _ in range(1000):
        rows = tail.poll()
        if not rows:
            break
        got.extend(rows)
    assert [r["id"] for r in got] == list(range(1, 2 * len(one) + 1))
    by_job = {jobs[0]: one, jobs[1]: two}
    seen = {jobs[0]: 0, jobs[1]: 0}
    for row in got:
        want = by_job[row["job_id"]][seen[row["job_id"]]]
        seen[row["job_id"]] += 1
        assert (row["seq"], row["kind"], load_body(row)) == \
            (want["seq"], want["kind"], want["body"])
    # A late id (passed over, fetched by id) comes out of a pack too.
    some = [5, 6, 400, 401, 2 * len(one)]
    assert [r["id"] for r in store.log.events_by_id(some)] == some
    assert load_body(store.log.events_by_id([400])[0]) == got[399]["body"]


def test_a_database_at_revision_0004_upgrades_reads_back_identically_then_packs(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    upgrade(engine, "0004")
    events = _stored(_job_events(200))
    with engine.begin() as conn:  # what pgdash at revision 0004 wrote: compact rows
        insert_old_job(conn)
        conn.exec_driver_sql(
            "INSERT INTO events (id, job_id, session, seq, t, received_at, kind, body, body_z) "
            "VALUES (?, 1, ?, ?, ?, ?, ?, '', ?)",
            [(ev["id"], ev["session"], ev["seq"], ev["t"], ev["received_at"], ev["kind"],
              encode_body(ev["body"])) for ev in events])
    engine.dispose()
    store = Store(url).start()  # upgrades to head
    try:
        assert list(store.log.events(1)) == events
        Compactor(store, FULL).run_once()
        assert _rows_and_packs(store)[1] >= 2
        assert list(store.log.events(1)) == events
    finally:
        store.close()
    # And back: a downgrade unpacks, losing nothing.
    engine = sa.create_engine(url)
    upgrade(engine, "0005")
    from alembic import command
    from alembic.config import Config

    from dashboard.resources import resource_dir
    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations", "env.py")))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM events").scalar() == len(events)
    engine.dispose()


def test_after_a_restart_admission_still_refuses_a_packed_seq(tmp_path):
    from dashboard.ingest.pipeline import Ingest

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    store = Store(url).start()
    events = _stored(_job_events(300))
    job_id = _store_job(store, events)
    Compactor(store, FULL).run_once()
    store.close()
    store = Store(url).start()  # a restart
    try:
        top = {}
        for ev in events:
            top[ev["session"]] = ev["seq"]
        assert store.sessions.max_seqs() == top
        with store.engine.connect() as conn:
            assert store.sessions.max_seq(conn, "s0") == top["s0"]
        ingest = Ingest(store, clock=lambda: T0 + 400).start()
        session, got_job = ingest.connect({"v": 1, "session": "s0", "job": "j", "rank": 0,
                                           "host": "h", "pid": 100})
        assert got_job == job_id
        old = next(ev for ev in events if ev["session"] == "s0" and ev["seq"] == 7)
        ack, pending = ingest.batch_nowait(session, job_id, [
            {"seq": 7, "t": old["t"], "kind": old["kind"], "body": old["body"]},
            {"seq": top["s0"] + 1, "t": T0 + 400, "kind": "heartbeat", "body": {
                "groups": [], "dropped": {}, "buffered": 0}}])
        assert ack["ok"]
        assert pending.result(timeout=30) == 1  # the packed seq 7 refused as a duplicate
        assert ingest.counters["duplicate_events"] == 1
        seqs = [ev["seq"] for ev in store.log.events(job_id) if ev["session"] == "s0"]
        assert seqs.count(7) == 1 and seqs[-1] == top["s0"] + 1
    finally:
        store.close()


def test_an_unreadable_pack_names_its_row_and_the_other_jobs_read_on(store):
    first = _store_job(store, _stored(_job_events(200)))
    second_events = _stored(_job_events(200, seed=9), first_id=len(_job_events(200)) + 1)

    def write(conn) -> int:
        job = store.jobs.create(conn, "k", T0)
        for r in range(RANKS):
            store.sessions.create(conn, f"k{r}", job, r, "h", 1, T0)
        store.log.insert_archived(conn, job, [dict(ev, session="k" + ev["session"][1:])
                                              for ev in second_events])
        return job
    second = store.writer.submit(write)
    Compactor(store, FULL).run_once()
    bad = store.packs.of_job(first)[1]["first_id"]
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE event_packs SET data = ? WHERE first_id = ?",
                             (b"\x09future", bad))
    with pytest.raises(UnreadablePack, match=r"table event_packs, job 1, .*format 09.*"
                                             r"upgrade pgdash.*DELETE FROM event_packs"):
        list(store.log.events(first))
    assert [ev["id"] for ev in store.log.events(second)] == [ev["id"] for ev in second_events]
    tail_ids, after = [], 0  # page by page, as the cluster's tail reads it
    while page := store.log.events_after(after, 100_000):
        tail_ids += [r["id"] for r in page]
        after = page[-1]["id"]
    assert store.log.unreadable_packs == 1
    assert set(ev["id"] for ev in second_events) <= set(tail_ids)
    assert len(tail_ids) == 2 * len(second_events) - store.packs.of_job(first)[1]["n"]


def test_a_full_resolution_pack_is_thinned_once_it_ages_past_the_window(store):
    events = _stored(_job_events(1500))
    split = next(i for i, ev in enumerate(events) if ev["received_at"] > T0 + 500)

    def add(part: list[dict]) -> None:
        store.writer.submit(lambda conn: store.log.insert_archived(conn, 1, part))
    _store_job(store, events[:split])
    compactor = Compactor(store, Policy(keep_full_s=300, around_findings_s=60,
                                        pack_after_s=60))
    compactor.run_once()
    early = store.packs.of_job(1)
    assert any(not p["thinned"] for p in early) and any(p["thinned"] for p in early)
    add(events[split:])
    compactor.run_once()
    horizon = events[-1]["received_at"] - 300
    packs = store.packs.of_job(1)
    assert all(p["thinned"] == (p["last_at"] < (horizon // 60) * 60) for p in packs)
    stored = list(store.log.events(1))
    assert len(stored) < len(events) // 2
    assert _views(_fold(stored)) == _views(_fold(events))
    # The same as compacting the whole log at once, on a fresh server (no memory of it).
    data = _pack_data(store)
    again = Compactor(store, Policy(keep_full_s=300, around_findings_s=60, pack_after_s=60))
    assert again.run_once() == 0 and again.packed == 0
    assert _pack_data(store) == data


def _two_stores(tmp_path) -> tuple[list[dict], int, Policy, list[Store]]:
    """A 1,500-second job's events, where its first 800 s end, a policy that thins past
    300 s, and two stores holding those 800 s (to compact two ways and compare)."""
    events = _stored(_job_events(1500))
    split = next(i for i, ev in enumerate(events) if ev["received_at"] > T0 + 800)
    stores = [Store(f"sqlite:///{tmp_path / f'{i}.sqlite'}").start() for i in range(2)]
    for s in stores:
        _store_job(s, events[:split])
    return events, split, Policy(keep_full_s=300, around_findings_s=60, pack_after_s=60), stores


def test_after_a_restart_the_compactor_goes_on_where_the_packs_end(tmp_path):
    """A fresh compactor (a restarted server) reads only what lies past the stored packs,
    and leaves the same packs as one that never stopped."""
    events, split, policy, stores = _two_stores(tmp_path)
    try:
        kept = Compactor(stores[0], policy)
        kept.run_once()
        Compactor(stores[1], policy).run_once()
        before = stores[1].packs.of_job(1)
        assert any(p["thinned"] for p in before) and any(not p["thinned"] for p in before)
        for s in stores:
            s.writer.submit(lambda conn, s=s: s.log.insert_archived(conn, 1, events[split:]))
        read: list[int] = []
        walk = stores[1].log.events_until
        stores[1].log.events_until = lambda *args, **kw: (
            read.append(ev["id"]) or ev for ev in walk(*args, **kw))
        kept.run_once()
        restarted = Compactor(stores[1], policy)
        restarted.run_once()
        assert _pack_data(stores[1]) == _pack_data(stores[0])
        assert restarted.packed == kept.packed - len(before)
        # What it read: the events past the newest pack, and no event of a final pack.
        final_upto = max(p["last_id"] for p in before if p["thinned"])
        assert read and min(read) > final_upto
        assert sum(i <= before[-1]["last_id"] for i in read) <= len(read) - len(events[split:])
        assert list(stores[1].log.events(1)) == list(stores[0].log.events(1))
    finally:
        for s in stores:
            s.close()


def test_old_checkpoints_are_thinned_but_not_near_findings_or_in_the_window(store):
    events = _stored(_job_events(1500))
    job_id = _store_job(store, events)
    finding = {"id": "hang:0", "kind": "hang", "severity": "critical", "active": False,
               "first_seen": T0 + 600, "last_seen": T0 + 610}
    store.writer.submit(lambda conn: store.findings.save(conn, job_id, [finding]))
    state = encode_state(_fold(events[:50]))
    moments = [T0 - T0 % 60 + 60 * k for k in range(1, 25)]  # a checkpoint a minute
    for k, at in enumerate(moments):
        store.writer.submit(lambda conn, k=k, at=at: store.checkpoints.save(
            conn, job_id, 10 * k + 1, at, state))
    policy = Policy(keep_full_s=300, around_findings_s=60, checkpoint_keep_s=600)
    Compactor(store, policy).run_once()
    left = [at for _, at in store.checkpoints.of_job(job_id)]
    horizon = (events[-1]["received_at"] - 300) // 60 * 60
    near = [at for at in moments if T0 + 540 <= at <= T0 + 670]
    assert near and set(near) <= set(left)
    assert all(at in left for at in moments if at >= horizon)
    old = [at for at in left if at < horizon and at not in near]
    assert len({at // 600 for at in old}) == len(old)  # one per 600 s...
    assert {at // 600 for at in old} == {at // 600 for at in moments
                                         if at < horizon and at not in near}  # ...each
    # A scrub that folds across a removed one does not store it again.
    removed = next(at for at in moments if at < horizon and at not in left)
    store.writer.submit(lambda conn: store.checkpoints.save(conn, job_id, 9999, removed, state))
    assert [at for _, at in store.checkpoints.of_job(job_id)] == left


def test_pack_settings_are_named_when_wrong():
    with pytest.raises(ValueError, match="PGDASH_PACK_AFTER_S"):
        Policy(pack_after_s=10)
    with pytest.raises(ValueError, match="PGDASH_PACK_AFTER_S='later'"):
        Policy.from_env({"PGDASH_PACK_AFTER_S": "later"})
    with pytest.raises(ValueError, match="PGDASH_CHECKPOINT_KEEP_S"):
        Policy(checkpoint_keep_s=-1)
    assert Policy.from_env({"PGDASH_PACK_AFTER_S": "0"}).pack_after_s == 0


def test_a_pack_write_that_fails_midway_leaves_the_rows_as_they_were(store):
    """Writing a pack and deleting its rows is one transaction: a failure after both
    statements (a crash before the commit) leaves the log as it was."""
    events = _stored(_job_events(120))
    job_id = _store_job(store, events)
    pack = store.packs.row(job_id, events[:200], False)

    def task(conn) -> None:
        store.packs.write(conn, job_id, [pack], [], (events[0]["id"], events[199]["id"]))
        raise RuntimeError("the process died here")
    with pytest.raises(RuntimeError):
        store.writer.submit(task)
    assert not store.packs.of_job(job_id)
    assert list(store.log.events(job_id)) == events


# -- packs opened for reading, kept ------------------------------------------------------------

def test_a_scrub_opens_each_pack_once_and_the_next_only_when_the_read_gets_there(store):
    events = _stored(_job_events(300))
    job_id = _store_job(store, events)
    Compactor(store, FULL).run_once()
    packs = store.packs.of_job(job_id)
    assert len(packs) >= 3
    kept = store.log.open_packs
    first = packs[0]
    inside = [ev for ev in events if first["first_id"] < ev["id"] < first["last_id"]]
    assert list(store.log.events(job_id)) == events  # a single pass keeps nothing
    assert (kept.opened, kept.kept_bytes()) == (0, 0)
    for _ in range(3):  # moment after moment inside one cell: one open
        assert list(store.log.events(job_id, after=first["first_id"],
                                     upto=first["last_id"] - 1, keep=True)) == inside
    assert (kept.opened, kept.reused) == (1, 2)
    read = store.log.events(job_id, after=first["first_id"], keep=True)  # a fold that stops
    assert [next(read)["id"] for _ in range(3)] == [ev["id"] for ev in inside[:3]]
    read.close()
    assert (kept.opened, kept.reused) == (1, 3)  # the cell after it was not opened
    assert list(store.log.events(job_id, keep=True)) == events
    assert kept.opened == len(packs) and kept.kept_bytes() > 0


def test_a_pack_rewritten_is_read_from_its_new_bytes(store):
    events = _stored(_job_events(1500))
    _store_job(store, events)
    Compactor(store, Policy(keep_full_s=10_000, around_findings_s=60, pack_after_s=60)).run_once()
    full = list(store.log.events(1, keep=True))
    assert full == events  # every pack read, and kept
    thinning = Compactor(store, Policy(keep_full_s=300, around_findings_s=60, pack_after_s=60))
    thinning.run_once()
    assert any(p["thinned"] for p in store.packs.of_job(1))
    fresh = Store(store.url).start()  # nothing kept: what the file holds now
    try:
        want = list(fresh.log.events(1))
    finally:
        fresh.close()
    assert len(want) < len(full)
    assert list(store.log.events(1, keep=True)) == want


def test_packs_kept_are_let_go_once_idle_and_kept_within_their_bytes(store):
    _store_job(store, _stored(_job_events(300)))
    Compactor(store, FULL).run_once()
    rows = _pack_data(store)
    assert len(rows) >= 3
    now = [0.0]
    kept = OpenPacks(max_bytes=10**9, idle_s=60.0, monotonic=lambda: now[0])
    packs = [kept.open(r) for r in rows]
    assert kept.open(rows[0]) is packs[0] and kept.reused == 1
    assert kept.kept_bytes() == sum(p.nbytes for p in packs)
    now[0] = 30.0
    kept.open(rows[1])  # read again: younger than the others
    now[0] = 75.0
    kept.sweep()
    assert kept.kept_bytes() == packs[1].nbytes
    assert kept.open(rows[0]) is not packs[0]  # let go, so opened again
    small = OpenPacks(max_bytes=packs[0].nbytes + packs[1].nbytes // 2)
    for r in rows:
        small.open(r)
    assert small.kept_bytes() == packs[-1].nbytes  # the newest that fits; the older went
    assert small.open(rows[-1]) is not None and small.reused == 1


def test_a_cell_of_more_events_than_a_pack_holds_is_several_packs_and_reads_the_same(
        tmp_path, monkeypatch):
    """A cell is streamed into packs of at most PACK_EVENTS (so that neither the compactor
    nor a reader holds a big job's whole cell): packed and thinned, the log reads, folds and
    compacts again exactly as with one pack a cell, and a restarted compactor goes on."""
    from dashboard.storage import compaction

    events, split, policy, stores = _two_stores(tmp_path)
    try:
        whole = Compactor(stores[0], policy)
        whole.run_once()
        monkeypatch.setattr(compaction, "PACK_EVENTS", 37)
        small = Compactor(stores[1], policy)
        small.run_once()
        for s in stores:
            s.writer.submit(lambda conn, s=s: s.log.insert_archived(conn, 1, events[split:]))
        monkeypatch.setattr(compaction, "PACK_EVENTS", 10**9)
        whole.run_once()
        monkeypatch.setattr(compaction, "PACK_EVENTS", 37)
        small.run_once()
        one, several = (s.packs.of_job(1) for s in stores)
        assert len(several) > 3 * len(one) and max(p["n"] for p in several) == 37
        assert {p["thinned"] for p in several} == {True, False}
        stored = list(stores[1].log.events(1))
        assert stored == list(stores[0].log.events(1))
        assert len(stored) < len(events) // 2  # thinned
        assert _views(_fold(stored)) == _views(_fold(events))
        data = _pack_data(stores[1])
        again = Compactor(stores[1], policy)  # a restarted server: nothing left to do
        assert again.run_once() == 0 and again.packed == 0
        small.run_once()
        assert _pack_data(stores[1]) == data
    finally:
        for s in stores:
            s.close()


def test_a_compactor_closed_mid_cell_stops_at_once_and_leaves_the_log_whole(
        store, monkeypatch):
    """Closing the compactor (a stopping server) while it reads a cell stops it within one
    pace of events (a 1,024-rank cell is seconds of work) and writes nothing of that cell:
    the log reads as before, and the next compactor does the rest."""
    import threading
    import time as _time

    from dashboard.storage import compaction

    events = _stored(_job_events(600))
    job_id = _store_job(store, events)
    monkeypatch.setattr(compaction, "PACE_EVENTS", 20)
    policy = Policy(keep_full_s=300, around_findings_s=60, pack_after_s=60, every_s=0.01)
    slow = Compactor(store, policy, duty=1.0, clock=lambda: events[-1]["received_at"] + 1000)
    inside, after_close = threading.Event(), []
    add = compaction._Packer.add

    def slow_add(packer, ev):  # a big cell: each event takes a while
        if slow.packed:
            inside.set()  # a cell packed: the compactor is in the next one
        if slow._stop.is_set():
            after_close.append(ev["id"])
        _time.sleep(0.002)
        add(packer, ev)
    monkeypatch.setattr(compaction._Packer, "add", slow_add)
    slow.start()
    assert inside.wait(30)
    slow.close()
    assert len(after_close) <= 20 and slow.errors == 0
    monkeypatch.setattr(compaction._Packer, "add", add)
    rows, _, _ = _rows_and_packs(store)
    assert rows > RANKS  # it stopped inside the pass
    stored = list(store.log.events(job_id))
    ids = [ev["id"] for ev in stored]
    assert ids == sorted(set(ids)) and set(ids) <= {ev["id"] for ev in events}  # no doubles
    assert _views(_fold(stored)) == _views(_fold(events))  # nothing the fold reads lost
    done = Compactor(store, policy, clock=lambda: events[-1]["received_at"] + 1000)
    done.run_once()
    rows, packs, packed = _rows_and_packs(store)
    assert packs > slow.packed and rows == RANKS
    assert _views(_fold(list(store.log.events(job_id)))) == _views(_fold(events))
