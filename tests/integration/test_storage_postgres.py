"""Bounded storage on a real PostgreSQL: compaction and stored checkpoints."""

from __future__ import annotations


from dashboard.storage.compaction import Compactor, Policy
from dashboard.history.rewind import Rewind
from dashboard.storage.store import Store
from tests.helpers.realservers import pg_url, postgres_server  # noqa: F401  (fixtures)
from tests.helpers.simjob import T0, _fold, _job_events, _store_job, _views


def test_compaction_and_stored_checkpoints_work_on_postgres(pg_url):
    store = Store(pg_url).start()
    try:
        events = _job_events(900, hang=(T0 + 300, T0 + 360))
        job_id = _store_job(store, events)
        removed = Compactor(store, Policy(keep_full_s=240, around_findings_s=60)).run_once()
        stored = list(store.log.events(job_id))
        assert removed == len(events) - len(stored) > len(events) // 2
        assert _views(_fold(stored)) == _views(_fold(events))
        first = Rewind(store, copies_bytes=0, persist_every_s=120.0)
        first.view(job_id, "j", stored[-1]["received_at"], lambda s: None)
        first.wait_saved()
        store.writer.wait_idle()
        restarted = Rewind(store, copies_bytes=0, persist_every_s=120.0)
        at = T0 + 800.5  # inside the window: folds the same as the full log
        assert restarted.view(job_id, "j", at, _views) == _views(_fold(stored, at))
        assert restarted.checkpoints_loaded == 1
    finally:
        store.close()
