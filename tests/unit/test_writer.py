"""The writer's bound on agents' batches: in events, queued and being written."""

from __future__ import annotations

import queue
import threading

import pytest
import sqlalchemy as sa

from dashboard.storage.writer import Writer, WriterStopped
from tests.helpers.procs import wait_for


@pytest.fixture
def writer(tmp_path):
    writer = Writer(sa.create_engine(f"sqlite:///{tmp_path / 'w.db'}"), events_limit=100)
    writer.start()
    yield writer
    writer.stop()
    writer.engine.dispose()


def _hold(writer: Writer) -> threading.Event:
    """The writer runs nothing else until the returned event is set."""
    release, holding = threading.Event(), threading.Event()
    writer.submit_nowait(lambda conn: (holding.set(), release.wait(30)), bounded=False)
    assert holding.wait(10)
    return release


def test_agents_events_queued_are_bounded_and_the_servers_own_writes_are_not(writer):
    release = _hold(writer)
    first = writer.submit_nowait(lambda conn: "a", events=60)
    with pytest.raises(queue.Full):
        writer.submit_nowait(lambda conn: "b", events=60)
    second = writer.submit_nowait(lambda conn: "c", events=40)  # exactly the bound
    with pytest.raises(queue.Full):
        writer.submit_nowait(lambda conn: None, events=1)
    assert not writer.has_room(1) and writer.queued_events() == 100
    own = writer.submit_nowait(lambda conn: "own", bounded=False)  # never refused
    release.set()
    assert [f.result(10) for f in (first, second, own)] == ["a", "c", "own"]
    writer.wait_idle()
    assert writer.queued_events() == 0
    # One batch larger than the whole bound still goes in, alone: an agent is never stuck.
    assert writer.submit_nowait(lambda conn: "big", events=500).result(10) == "big"


def test_a_transaction_takes_at_most_half_the_events_bound(writer):
    release = _hold(writer)
    futures = [writer.submit_nowait(lambda conn: None, events=20) for _ in range(5)]
    commits = writer.commits
    release.set()
    for f in futures:
        f.result(10)
    writer.wait_idle()
    # the held task's, then 20+20+20 (60 >= 50: no more), then 20+20, then wait_idle's
    assert writer.commits - commits == 4


def test_what_a_stopped_writer_fails_gives_its_room_back(tmp_path):
    writer = Writer(sa.create_engine(f"sqlite:///{tmp_path / 'w.db'}"), events_limit=100)
    pending = writer.submit_nowait(lambda conn: None, events=70)  # never started
    writer.stop()
    with pytest.raises(WriterStopped):
        pending.result(1)
    assert writer.queued_events() == 0
    with pytest.raises(WriterStopped):
        writer.submit_nowait(lambda conn: None, events=10)
    assert writer.queued_events() == 0
    writer.engine.dispose()


@pytest.mark.parametrize("grace_s", [0.0, 30.0])
def test_a_stopping_writer_writes_its_own_tasks_and_agents_batches_only_within_the_grace(
        writer, grace_s):
    """Agents' batches queued when the server stops are not acknowledged yet: past the grace
    they fail unwritten, and their agents send them again; the server's own writes are
    written whatever the grace."""
    release = _hold(writer)
    ran = []
    agents = [writer.submit_nowait(lambda conn, i=i: ran.append(i), events=10)
              for i in range(3)]
    own = writer.submit_nowait(lambda conn: ran.append("own") or "own", bounded=False)
    stopping = threading.Thread(target=writer.stop, args=(grace_s,))
    stopping.start()
    try:
        wait_for(lambda: writer._closed, 10, "the writer closed", interval=0.01)
        release.set()
        stopping.join(10)
    finally:
        release.set()
    assert own.result(1) == "own"
    if grace_s:
        assert ran == [0, 1, 2, "own"] and all(f.result(1) is None for f in agents)
    else:
        assert ran == ["own"]
        for pending in agents:
            with pytest.raises(WriterStopped, match="the agent sends it again"):
                pending.result(1)
    assert writer.queued_events() == 0

