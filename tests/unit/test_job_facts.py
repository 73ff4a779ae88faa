"""What a job is, as the list, the API and the page say it: how it was launched, which run of
its name it is, where an imported job came from; and the jobs of a database from before those
were stored (revision 0006). A real SQLite file, the real CLI and the app's test client."""

from __future__ import annotations

import json

import sqlalchemy as sa
from click.testing import CliRunner

from dashboard.cli import cli
from dashboard.storage.database import upgrade
from tests.helpers.web import close_app, open_app

LAUNCH = {"command": "train.py --note <b>bold</b>", "launcher": "torchrun",
          "launcher_id": "6fd5bf1d"}


def session_file(path, exported_at: float | None) -> None:
    """A session file as `pgdash export` writes it: rank 0 said how it was launched."""
    header = {"format": "pgdash-session", "version": 1, "job": {"name": "train"}}
    if exported_at is not None:
        header["exported_at"] = exported_at
    hello = {"job": "train", "rank": 0, "world_size": 1, "host": "h", "pid": 1,
             "backend": "gloo", **LAUNCH}
    lines = [header, {"session": {"id": "s0", "rank": 0, "host": "h", "pid": 1,
                                  "first_seen": 100.0}},
             {"event": {"session": "s0", "seq": 1, "t": 100.0, "received_at": 100.0,
                        "kind": "hello", "body": hello}},
             {"event": {"session": "s0", "seq": 2, "t": 110.0, "received_at": 110.0,
                        "kind": "exit", "body": {"clean": True}}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_an_imported_job_is_marked_in_the_api_and_on_its_page(tmp_path):
    url = f"sqlite:///{tmp_path / 'pgdash.db'}"
    session_file(tmp_path / "run-7.pgdash", exported_at=1_765_000_000.0)
    done = CliRunner().invoke(cli, ["import", str(tmp_path / "run-7.pgdash"), "--db", url])
    assert done.exit_code == 0, done.output
    app, client = open_app(url)
    try:
        listed = client.get("/api/jobs").get_json()["jobs"]
        assert len(listed) == 1
        facts = {k: listed[0][k] for k in ("name", "status", "imported", "imported_from",
                                           "exported_at", "run", "attempt", *LAUNCH)}
        assert facts == {"name": "train", "status": "finished", "imported": True,
                         "imported_from": "run-7.pgdash", "exported_at": 1_765_000_000.0,
                         "run": 1, "attempt": 0, **LAUNCH}
        detail = client.get(f"/api/jobs/{listed[0]['id']}").get_json()
        assert {k: detail[k] for k in facts} == facts
        page = client.get(f"/jobs/{listed[0]['id']}").get_data(as_text=True)
        assert "imported from run-7.pgdash, exported" in page
        assert "2025-12-06 05:46 UTC" in page  # the export's time, stated once
        assert "train.py --note &lt;b&gt;bold&lt;/b&gt;" in page  # data, escaped
        assert "<b>bold</b>" not in page
    finally:
        close_app(app)


def test_a_database_at_revision_0006_upgrades_and_keeps_its_jobs(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = sa.create_engine(url)
    upgrade(engine, "0006")
    with engine.begin() as conn:  # what pgdash at revision 0006 stored: two runs of a name
        conn.exec_driver_sql(
            "INSERT INTO jobs (id, name, created_at, status, world_size, backend, started_at, "
            "ended_at) VALUES (1, 'train', 1.0, 'finished', 2, 'gloo', 10.0, 20.0), "
            "(2, 'train', 2.0, 'failed', 4, 'gloo', 30.0, 40.0)")
    engine.dispose()
    app, client = open_app(url)  # the server upgrades the database to head
    try:
        listed = client.get("/api/jobs").get_json()["jobs"]
        assert [(j["id"], j["name"], j["status"], j["world_size"], j["started_at"],
                 j["ended_at"], j["run"], j["imported"], j["command"], j["launcher"],
                 j["attempt"]) for j in listed] == [
            (2, "train", "failed", 4, 30.0, 40.0, 2, False, None, None, None),
            (1, "train", "finished", 2, 10.0, 20.0, 1, False, None, None, None)]
        page = client.get("/jobs/2").get_data(as_text=True)
        assert "run 2" in page and "imported" not in page
        assert 'id="job-launch"' not in client.get("/jobs/1").get_data(as_text=True)
    finally:
        close_app(app)
    # And back: 0007's downgrade leaves the jobs as 0006 had them.
    from alembic import command
    from alembic.config import Config

    from dashboard.resources import resource_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations", "env.py")))
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006")
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT id, name, status, world_size FROM jobs "
                                        "ORDER BY id").all() == [(1, "train", "finished", 2),
                                                                 (2, "train", "failed", 4)]
            columns = {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
            assert "command" not in columns and "imported_from" not in columns
    finally:
        engine.dispose()
