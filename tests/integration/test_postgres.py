"""The same server on a real PostgreSQL: migrations, the event log, a real gloo job, findings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from tests.helpers.procs import ROOT, ServerProcess, job_by_name, launch_job, wait_for, wait_job
from tests.helpers.realservers import pg_url, postgres_server  # noqa: F401  (fixtures)
from tests.helpers.jobs import expected_counts


def test_db_upgrade_on_postgres_makes_the_schema_with_the_right_types(pg_url):
    out = subprocess.run([sys.executable, "-m", "dashboard", "db", "upgrade", "--db", pg_url],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "is up to date" in out.stdout, out.stderr
    engine = sa.create_engine(pg_url)
    try:
        inspector = sa.inspect(engine)
        assert {"jobs", "sessions", "events", "findings", "job_owners", "checkpoints",
                "event_packs", "book_log", "book_spans", "keyframes",
                "alembic_version"} <= set(inspector.get_table_names())
        types = {t: {c["name"]: type(c["type"]).__name__ for c in inspector.get_columns(t)}
                 for t in ("jobs", "events", "findings", "job_owners", "event_packs",
                           "book_log", "book_spans", "keyframes")}
        # Unix seconds need a double: a 4-byte REAL would round them to ~2 minutes.
        assert types["events"]["t"] == types["events"]["received_at"] == "DOUBLE_PRECISION"
        assert types["events"]["body"] == "TEXT"
        assert types["events"]["body_z"] == "BYTEA"
        assert types["findings"]["active"] == "BOOLEAN"
        assert types["job_owners"]["expires_at"] == "DOUBLE_PRECISION"
        assert types["event_packs"]["first_at"] == "DOUBLE_PRECISION"
        assert types["event_packs"]["data"] == "BYTEA"
        assert types["book_log"]["at"] == types["book_spans"]["through_at"] == "DOUBLE_PRECISION"
        assert types["book_log"]["body"] == "BYTEA"
        assert types["jobs"]["exported_at"] == "DOUBLE_PRECISION"  # 0007: the launch's facts
        assert (types["jobs"]["command"], types["jobs"]["attempt"]) == ("VARCHAR", "INTEGER")
        assert (types["keyframes"]["at"], types["keyframes"]["answer"]) == \
            ("DOUBLE_PRECISION", "BYTEA")  # 0008
        uniques = {u["name"]: u["column_names"] for u in inspector.get_unique_constraints("events")}
        assert uniques["uq_events_session_seq"] == ["session", "seq"]
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() \
                == "0008"
        # Upgrading again is a no-op, not an error.
        again = subprocess.run([sys.executable, "-m", "dashboard", "db", "upgrade", "--db",
                                pg_url], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert again.returncode == 0, again.stderr
    finally:
        engine.dispose()


def test_processes_migrating_one_database_at_once_all_succeed(pg_url):
    """Several server processes start together on a fresh database: one migrates, the
    others wait for it (an advisory lock) instead of failing on tables that appeared."""
    procs = [subprocess.Popen([sys.executable, "-m", "dashboard", "db", "upgrade", "--db",
                               pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(3)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert [code for code, _ in results] == [0, 0, 0], results


def test_store_on_postgres_returns_ids_in_order_and_refuses_a_duplicate_seq(pg_url):
    from dashboard.storage.store import Store

    store = Store(pg_url).start()
    try:
        job_id = store.writer.submit(lambda c: store.jobs.create(c, "j", 1.0))
        store.writer.submit(lambda c: store.sessions.create(c, "s", job_id, 0, "h", 1, 1.0))
        rows = [{"seq": seq, "t": 1_764_000_000.123456 + seq, "kind": "k", "body": {"n": seq}}
                for seq in range(1, 201)]
        ids = store.writer.submit(lambda c: store.log.insert(c, job_id, "s", rows, 2.0))
        assert ids == sorted(ids) and len(set(ids)) == 200
        stored = list(store.log.events(job_id))
        assert [e["id"] for e in stored] == ids
        assert [e["body"]["n"] for e in stored] == list(range(1, 201))
        assert stored[0]["t"] == 1_764_000_001.123456  # a double, to the microsecond
        with pytest.raises(sa.exc.IntegrityError):
            store.writer.submit(lambda c: store.log.insert(c, job_id, "s", rows[:1], 3.0))
        # The failed transaction stored nothing and the store goes on.
        assert len(list(store.log.events(job_id))) == 200
        assert store.sessions.max_seqs() == {"s": 200}
    finally:
        store.close()


@pytest.fixture
def pg_server(pg_url, tmp_path):
    srv = ServerProcess(pg_url, log_path=tmp_path / "server.log",
                        extra=["--hang-after", "3"]).start()
    yield srv
    srv.stop()


def test_gloo_job_on_postgres_has_exact_counts(pg_server, tmp_path):
    world = 2
    codes = wait_job(launch_job("plan_job.py", world, pg_server.url, "plan-pg", tmp_path),
                     120, tmp_path)
    assert codes == [0] * world
    job = wait_for(lambda: (j := job_by_name(pg_server, "plan-pg")) and j["status"] == "finished"
                   and j, 30, "the job to be finished")
    assert job["world_size"] == world and job["backend"] == "gloo"
    rows = pg_server.api(f"/api/jobs/{job['id']}/collectives")["collectives"]
    assert {(r["group"], r["op"], r["rank"]): r["count"] for r in rows} == \
        expected_counts(world)
    assert pg_server.api(f"/api/jobs/{job['id']}/findings") == {"findings": []}


def test_hang_on_postgres_is_diagnosed_and_the_finding_stored(pg_server, pg_url, tmp_path):
    procs = launch_job("fault_job.py", 3, pg_server.url, "hang-pg", tmp_path, args=["hang"])
    try:
        job = wait_for(lambda: job_by_name(pg_server, "hang-pg"), 60, "the job")
        found = wait_for(lambda: [f for f in pg_server.api(f"/api/jobs/{job['id']}/findings")
                                  ["findings"] if f["kind"] == "hang" and f["active"]],
                         60, "a hang finding")
        assert [f["ranks"] for f in found] == [[2]]
        engine = sa.create_engine(pg_url)
        try:
            def stored():
                with engine.connect() as conn:
                    return conn.execute(sa.text(
                        "SELECT kind, active, body FROM findings WHERE job_id = :j"),
                        {"j": job["id"]}).all()
            rows = wait_for(lambda: [r for r in stored() if r.kind == "hang"], 30,
                            "the hang finding in PostgreSQL")
            assert rows[0].active is True and json.loads(rows[0].body)["ranks"] == [2]
        finally:
            engine.dispose()
    finally:
        for p in procs:
            p.kill()
            p.wait()
