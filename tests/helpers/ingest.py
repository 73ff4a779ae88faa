"""Ingest without sockets: auth and batches as the agent sends them, and a stored job with a
hang that resolves (the ``hang_job`` fixture)."""

import pytest

from dashboard.ingest.pipeline import Ingest
from dashboard.storage.store import Store
from pgdash_agent.wire import PROTOCOL_VERSION


def auth(session, rank, job="j"):
    return {"v": PROTOCOL_VERSION, "session": session, "job": job, "rank": rank,
            "host": "h", "pid": 1}


def batch(*events):
    return {"v": PROTOCOL_VERSION, "events": list(events)}


def ev(seq, kind, body, t=1.0):
    return {"seq": seq, "t": t, "kind": kind, "body": body}


@pytest.fixture
def hang_job(tmp_path):
    """(store, ingest, job id): rank 1 waits from t=104 in an all_reduce rank 0 never
    entered (rank 0 reports #7 done); at 130 both exit. Events arrive when they say."""
    from dashboard.diagnosis import Settings

    store = Store(f"sqlite:///{tmp_path / 'hang.sqlite'}").start()
    now = [100.0]
    ingest = Ingest(store, clock=lambda: now[0], settings=Settings(hang_after=10.0)).start()
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
         "inflight_since": 104.0, "inflight_dtype": "float32", "inflight_bytes": 4}]},
        t=105.0)))
    ingest.batch(sessions[0], job, batch(ev(3, "heartbeat", {"groups": [
        {"group": "0", "entered": 7, "completed": 7, "inflight_op": None}]}, t=105.0)))
    now[0] = 130.0
    for r in (0, 1):
        ingest.batch(sessions[r], job, batch(ev(4, "exit", {"clean": True}, t=130.0)))
    yield store, ingest, job
    store.close()
