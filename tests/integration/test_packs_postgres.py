"""Packs on a real PostgreSQL."""

from __future__ import annotations


from dashboard.storage.compaction import Compactor
from dashboard.storage.store import Store
from tests.helpers.realservers import pg_url, postgres_server  # noqa: F401  (fixtures)
from tests.helpers.simjob import FULL, _job_events, _store_job


def test_packs_on_postgres(pg_url):
    store = Store(pg_url).start()
    try:
        events = _job_events(400)
        job_id = _store_job(store, events)
        stored_before = list(store.log.events(job_id))
        Compactor(store, FULL).run_once()
        assert store.packs.of_job(job_id)
        assert list(store.log.events(job_id)) == stored_before
        got, after = [], stored_before[0]["id"] - 1
        for _ in range(1000):  # as the cluster's tail reads: a few packs at a time
            batch = store.log.events_after(after, 1000)
            if not batch:
                break
            got.extend(batch)
            after = batch[-1]["id"]
        assert [r["id"] for r in got] == [ev["id"] for ev in stored_before]
        mid = stored_before[len(stored_before) // 2]["id"]
        assert list(store.log.events(job_id, after=mid, upto=mid + 50)) == \
            [ev for ev in stored_before if mid < ev["id"] <= mid + 50]
    finally:
        store.close()
