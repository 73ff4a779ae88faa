"""The pages, as a blueprint: the jobs list (``/``) and a job's page (``/jobs/<id>``). The
scripts fill them in from the API and the live feed; the server states only what does not
change as a job runs."""

from __future__ import annotations

import datetime

from flask import Blueprint, render_template

from dashboard import services
from dashboard.web.joblist import row_facts

pages = Blueprint("pages", __name__)


@pages.app_template_filter("utc")
def utc(ts: float, form: str = "%Y-%m-%d %H:%M UTC") -> str:
    """A Unix time as a page states it once, server-side (the scripts show local times)."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(form)


@pages.get("/")
def jobs_page():
    return render_template("jobs.html")


@pages.get("/jobs/<int:job_id>")
def job_page(job_id: int):
    # The header's launch line (command, launcher, run, import) is the job's row: facts
    # that do not change as the job runs, so the page states them once.
    row = services.current().store.jobs.get(job_id)
    return render_template("job.html", job_id=job_id,
                           job=None if row is None else {**row, **row_facts(row)})
