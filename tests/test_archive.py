"""Session files: export, validation on import (the bad line named), the round
trip into another database, and replay's timeline, on a real SQLite file."""

from __future__ import annotations

import json

import pytest

from dashboard.archive import Archive, ArchiveError, export_lines, import_archive, replay
from dashboard.diagnosis import Settings
from dashboard.ingest import Ingest
from dashboard.storage import Store
from test_ingest import auth, batch, ev


@pytest.fixture
def hang_job(tmp_path):
    """Rank 1 waits from t=104 in an all_reduce rank 0 never enters; at 130 both exit."""
    store = Store(f"sqlite:///{tmp_path / 'a.sqlite'}").start()
    now = [100.0]
    ingest = Ingest(store, clock=lambda: now[0]).start()
    sessions = {}
    for r in (0, 1):
        sessions[r], job = ingest.connect(auth(f"s{r}", r))
        ingest.batch(sessions[r], job, batch(
            ev(1, "hello", {"job": "j", "rank": r, "world_size": 2, "host": "h", "pid": 1,
                            "backend": "gloo"}, t=100.0),
            ev(2, "group", {"name": "0", "ranks": [0, 1]}, t=100.0)))
    now[0] = 105.0
    ingest.batch(sessions[1], job, batch(ev(3, "heartbeat", {"groups": [
        {"group": "0", "entered": 8, "completed": 7, "inflight_op": "all_reduce",
         "inflight_since": 104.0}]}, t=105.0)))
    now[0] = 130.0
    for r in (0, 1):
        ingest.batch(sessions[r], job, batch(ev(4, "exit", {"clean": True}, t=130.0)))
    yield store, job
    store.close()


def test_a_job_goes_to_a_file_and_into_another_database(hang_job, tmp_path):
    store, job = hang_job
    lines = list(export_lines(store, job))
    assert json.loads(lines[0])["job"]["status"] == "finished"
    assert len(lines) == 1 + 2 + 2 + 4 + 1 + 2  # header, sessions, connects, hello/group,
    # the heartbeat, the exits
    archive = Archive.read(lines)
    other = Store(f"sqlite:///{tmp_path / 'b.sqlite'}").start()
    try:
        first = import_archive(other, archive, now=200.0)
        second = import_archive(other, archive, now=201.0)  # twice: two jobs, no clash
        assert first != second
        assert [j["status"] for j in other.list_jobs()] == ["finished", "finished"]
        again = list(export_lines(other, first))
        assert again[0] == lines[0]
        strip = [{**json.loads(x)} for x in again[3:]]  # events, session ids prefixed
        assert [e["event"]["kind"] for e in strip] == \
            [json.loads(x)["event"]["kind"] for x in lines[3:]]
    finally:
        other.close()


def test_replay_shows_when_the_hang_came_and_went(hang_job):
    store, job = hang_job
    archive = Archive.read(export_lines(store, job))
    timeline = [(round(m - 100.0), change, f["kind"], f["ranks"])
                for m, change, f in replay(archive, Settings(hang_after=10.0), step=1.0)
                if f["kind"] == "hang"]
    # In flight since 104: a hang from 114 (received at 105, so seen at the first step
    # after 114), gone when the ranks exit at 130.
    assert timeline == [(14, "new", "hang", [0]), (30, "resolved", "hang", [0])]


@pytest.mark.parametrize("mutate, message", [
    (lambda ls: [], "is empty"),
    (lambda ls: ["{nope"] + ls[1:], "line 1: not JSON"),
    (lambda ls: [json.dumps({"format": "pgdash-session", "version": 9, "job": {"name": "x"}})]
     + ls[1:], "session file version 9"),
    (lambda ls: ls[:4] + [json.dumps({"event": {**json.loads(ls[4])["event"],
                                                "kind": "heartbeat", "body": {}}})] + ls[5:],
     "line 5: event.body.groups is missing"),
    (lambda ls: ls[:3] + [ls[3].replace('"received_at":', '"received_at":"x","_":')] + ls[4:],
     "line 4: event.received_at must be a time"),
    (lambda ls: ls + ["[1, 2]"], "expected a JSON object"),
])
def test_a_bad_file_is_refused_naming_the_line_and_what_is_wrong(hang_job, tmp_path,
                                                                   mutate, message):
    store, job = hang_job
    lines = mutate(list(export_lines(store, job)))
    with pytest.raises(ArchiveError, match=message):
        Archive.read(lines, source="f.jsonl")
