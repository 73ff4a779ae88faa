"""The jobs list and a job's row facts, as the API (GET /api/jobs) and the live feed (the
``jobs`` event) send them."""

from __future__ import annotations

from typing import Any

from dashboard.ingest.pipeline import Ingest
from dashboard.storage.schema import JOB_FIELDS as STORED_JOB_FIELDS

JOB_FIELDS = ("id", "name", *STORED_JOB_FIELDS)  # what GET /api/jobs lists per job


def row_facts(job: dict[str, Any]) -> dict[str, Any]:
    """What a job's row says beside its summary: which run of its name it is, and whether
    ``pgdash import`` made it (from which file, exported when)."""
    return {"run": job.get("run"), "imported": job.get("imported_from") is not None,
            "imported_from": job.get("imported_from"), "exported_at": job.get("exported_at")}


def jobs_payload(ingest: Ingest) -> dict[str, Any]:
    """The jobs list, newest first (from the jobs table, so it stays cheap with many jobs)."""
    counts = ingest.active_incidents  # known for jobs diagnosed since the server started
    return {"jobs": [{**{k: job[k] for k in JOB_FIELDS}, **row_facts(job),
                      "incidents": counts.get(job["id"])}
                     for job in ingest.store.jobs.newest()]}
