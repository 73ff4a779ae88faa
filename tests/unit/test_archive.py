"""Session files: export, validation on import (the bad line named), the round
trip into another database, and replay's timeline, on a real SQLite file."""

from __future__ import annotations

import json

import pytest

from dashboard.history.archive import Archive, ArchiveError, export_lines, import_archive, replay
from dashboard.diagnosis import Settings
from dashboard.storage.store import Store
from tests.helpers.ingest import hang_job  # noqa: F401  (the fixture


def test_a_job_goes_to_a_file_and_into_another_database(hang_job, tmp_path):
    store, _, job = hang_job
    lines = list(export_lines(store, job, now=300.0))
    assert json.loads(lines[0])["job"]["status"] == "finished"
    assert len(lines) == 1 + 2 + 2 + 4 + 2 + 2  # header, sessions, connects, hello/group,
    # heartbeats, exits
    archive = Archive.read(lines)
    other = Store(f"sqlite:///{tmp_path / 'b.sqlite'}").start()
    try:
        first = import_archive(other, archive, now=200.0)
        second = import_archive(other, archive, now=201.0)  # twice: two jobs, no clash
        assert first != second
        assert [j["status"] for j in other.jobs.newest()] == ["finished", "finished"]
        again = list(export_lines(other, first, now=300.0))
        assert again[0] == lines[0]
        strip = [{**json.loads(x)} for x in again[3:]]  # events, session ids prefixed
        assert [e["event"]["kind"] for e in strip] == \
            [json.loads(x)["event"]["kind"] for x in lines[3:]]
    finally:
        other.close()


def test_an_imported_job_is_marked_and_no_agent_joins_it(hang_job, tmp_path):
    from dashboard.ingest.pipeline import Ingest
    from tests.helpers.ingest import auth

    store, _, job = hang_job
    lines = list(export_lines(store, job, now=300.0))
    archive = Archive.read(lines)
    assert archive.exported_at == 300.0
    other = Store(f"sqlite:///{tmp_path / 'b.sqlite'}").start()
    try:
        imported = import_archive(other, archive, now=400.0,
                                  source=str(tmp_path / "hang.pgdash"))
        row = other.jobs.get(imported)
        assert (row["name"], row["imported_from"], row["exported_at"], row["created_at"]) == (
            "j", "hang.pgdash", 300.0, 400.0)
        # A live launch under the same name (rank 2: the record holds ranks 0 and 1 only)
        # is a job of its own, not a third rank of the record.
        _, live = Ingest(other, clock=lambda: 500.0).start().connect(auth("live", 2))
        assert live != imported and other.jobs.get(live)["imported_from"] is None
        assert other.jobs.get(live)["run"] == 2  # the second job called "j" here
        # A file from before export times were written: imported, time unknown.
        header = json.loads(lines[0])
        del header["exported_at"]
        old = Archive.read([json.dumps(header)] + lines[1:], source="old.pgdash")
        again = import_archive(other, old, now=401.0, source="/some/where/old.pgdash")
        assert (other.jobs.get(again)["imported_from"], other.jobs.get(again)["exported_at"]) \
            == ("old.pgdash", None)
    finally:
        other.close()


def test_replay_shows_when_the_hang_came_and_went(hang_job):
    store, _, job = hang_job
    archive = Archive.read(export_lines(store, job))
    timeline = [(round(m - 100.0), change, f["kind"], f["ranks"])
                for m, change, f in replay(archive, Settings(hang_after=10.0), step=1.0)
                if f["kind"] == "hang"]
    # In flight since 104: a hang from 114 (received at 105, so seen at the first step
    # after 114), gone when the ranks exit at 130.
    assert timeline == [(14, "new", "hang", [0]), (30, "resolved", "hang", [0])]


def _session_field(lines: list[str], key: str, value) -> list[str]:
    """The file with the first session line's ``key`` set to ``value``."""
    i = next(i for i, line in enumerate(lines) if '"session"' in line[:12])
    session = json.loads(lines[i])["session"]
    return lines[:i] + [json.dumps({"session": {**session, key: value}})] + lines[i + 1:]


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
    # What would fail the store's insert, not the reading (a fuzzed file found the host):
    (lambda ls: _session_field(ls, "host", {}), r"line 2: session.host must be a string of"),
    (lambda ls: _session_field(ls, "host", "h" * 257), "session.host must be a string of at"),
    (lambda ls: _session_field(ls, "pid", 2**40), "session.pid must be a 32-bit integer"),
    (lambda ls: _session_field(ls, "rank", True), "session.rank must be a 32-bit integer"),
    (lambda ls: _session_field(ls, "first_seen", "x"), "session.first_seen must be a time"),
])
def test_a_bad_file_is_refused_naming_the_line_and_what_is_wrong(hang_job, tmp_path,
                                                                   mutate, message):
    store, _, job = hang_job
    lines = mutate(list(export_lines(store, job)))
    with pytest.raises(ArchiveError, match=message):
        Archive.read(lines, source="f.jsonl")


def test_a_host_readers_reading_goes_to_the_file_and_back(hang_job, tmp_path):
    """A ``read`` (a server event: the host reader's py-spy dump of a silent rank) exports
    and imports with its session, checked like the server's other events."""
    store, ingest, job = hang_job
    reader = ingest.connect_reader({"v": 2, "session": "s0", "job": "j", "rank": 0,
                                    "host": "h", "pid": 1, "reader": 4242}, None, lambda m: None)
    reader.asked[("req1", 1)] = True  # what Asks.ask_peers marks when it asks it
    read = {"ask": "req1", "for_rank": 1, "peer_dump": "Thread 1 (active+gil)", "took_ms": 5.0}
    assert ingest.reader_read(reader, read) is None
    assert "was not asked" in ingest.reader_read(reader, read)  # once
    store.writer.wait_idle()
    lines = list(export_lines(store, job, now=300.0))
    (line,) = [json.loads(x) for x in lines[3:] if json.loads(x)["event"]["kind"] == "read"]
    assert line["event"]["body"] == {**read, "reader_pid": 4242}
    other = Store(f"sqlite:///{tmp_path / 'b.sqlite'}").start()
    try:
        again = list(export_lines(other, import_archive(other, Archive.read(lines), now=200.0),
                                  now=300.0))
        assert [json.loads(x)["event"]["body"] for x in again[3:]
                if json.loads(x)["event"]["kind"] == "read"] == [{**read, "reader_pid": 4242}]
    finally:
        other.close()
