"""The HTTP JSON API (``/api/...``) and ``/metrics``, as a blueprint.

Handlers stay thin: they check the request's shape and read through ingest
(dashboard.ingest.pipeline.Ingest) or a view of a job's state (dashboard.web.views). The API
answers JSON whatever goes wrong, with what to do in the message.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Callable

from flask import Blueprint, abort, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from dashboard import services
from dashboard.diagnosis.incidents import incidents
from dashboard.diagnosis.rules import RULE_ERRORS
from dashboard.history.archive import export_lines
from dashboard.history.trace import TraceError, build_trace, json_chunks, trace_query
from dashboard.ingest.pipeline import Ingest
from dashboard.state import JobState
from dashboard.web import snapshots, views
from dashboard.web.joblist import jobs_payload, row_facts
from dashboard.web.compare import compare
from dashboard.web.live import keyframe_answer, state_at
from dashboard.web.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dashboard.web.metrics import Snapshot, exposition, live_jobs

log = logging.getLogger("pgdash.server")

api = Blueprint("api", __name__)

MAX_JOB_ID = 2**63 - 1  # the largest integer the database stores
# How far past the server's clock a replayed moment may lie (agents' clocks run a little
# ahead of the server's; further than this is a typo, not a moment of the job).
FUTURE_SLACK_S = 300.0


def replay_moment_error(job: dict[str, Any], at: float, now: float) -> str | None:
    """Why ``at`` is no moment of ``job`` to replay (before it started, far in the future),
    or None."""
    started = job.get("started_at")
    if started is not None and at < started:
        return (f"at={at:.3f} is before job {job['id']} started (at {started:.3f}); "
                f"pick a moment from {started:.3f} on")
    if at > now + FUTURE_SLACK_S:
        return (f"at={at:.3f} is {at - now:.0f} s after the server's clock ({now:.3f}); "
                f"pick a moment up to now")
    return None


def found_or_404(found, job_id: int):
    """``found``, or the API's 404 for an unknown job when it is None."""
    if found is None:
        abort(404, description=f"no job with id {job_id}; GET /api/jobs lists them")
    return found


def _ingest() -> Ingest:
    return services.current().ingest


def _job_or_404(job_id: int, view: Callable[[JobState], Any]):
    return found_or_404(_ingest().read(job_id, view), job_id)


@api.app_errorhandler(404)
def not_found(exc):
    if not request.path.startswith("/api/"):
        return exc
    if request.url_rule is None:  # no route: say which there are (a job id is digits)
        routes = sorted({rule.rule.replace("<int:job_id>", "<id>")
                         for rule in current_app.url_map.iter_rules()
                         if rule.rule.startswith("/api/")})
        return jsonify(error=f"no API route {request.path!r:.120}: the routes are "
                             f"{', '.join(routes)}, where <id> is a job's id, a positive "
                             "integer (GET /api/jobs lists them)"), 404
    return jsonify(error=getattr(exc, "description", "not found")), 404


@api.app_errorhandler(HTTPException)
def api_http_error(exc):  # 400, 405, ...: the API answers JSON whatever went wrong
    if request.path.startswith("/api/"):
        return jsonify(error=f"{exc.name}: {exc.description}"), exc.code
    return exc


@api.app_errorhandler(Exception)
def api_crash(exc):
    # A bug must not take a request down with an HTML page or a leaked traceback; the
    # log keeps the traceback for whoever fixes it.
    if isinstance(exc, HTTPException):
        return exc
    log.exception("pgdash: %s %s failed", request.method, request.path)
    if request.path.startswith("/api/") or request.path == "/metrics":
        return jsonify(error=f"the server failed on this request ({type(exc).__name__}); "
                             "its log has the details"), 500
    return "pgdash: the server failed on this request; its log has the details", 500


@api.before_app_request
def job_id_in_range():
    # /api/jobs/<int:job_id> accepts any digits; an id past what the database can hold
    # is simply not a job (SQLite would raise OverflowError).
    job_id = (request.view_args or {}).get("job_id")
    if isinstance(job_id, int) and job_id > MAX_JOB_ID:
        found_or_404(None, job_id)


@api.get("/api/jobs")
def api_jobs():
    return jobs_payload(_ingest())


@api.get("/api/jobs/<int:job_id>")
def api_job(job_id: int):
    detail = _job_or_404(job_id, views.detail)
    return {**detail, **row_facts(_ingest().store.jobs.get(job_id) or {})}


@api.get("/api/jobs/<int:job_id>/collectives")
def api_collectives(job_id: int):
    rank = request.args.get("rank")
    if rank is not None and not rank.isdigit():
        return jsonify(error=f"rank must be a non-negative integer, got {rank!r}"), 400
    return _job_or_404(job_id, lambda s: {"collectives": views.collective_rows(
        s, group=request.args.get("group"), op=request.args.get("op"),
        rank=int(rank) if rank is not None else None)})


@api.get("/metrics")
def metrics():
    parts = services.current()
    ingest = parts.ingest
    counters = dict(ingest.counters)
    if parts.notifier is not None:
        counters.update({f"notify_{k}": v for k, v in parts.notifier.counters.items()})
    if parts.guard is not None:
        counters.update({f"login_{k}": v for k, v in parts.guard.counters.items()})
        counters["login_addresses"] = len(parts.guard)
    counters.update({f"rule_errors:{rule}": n for rule, n in RULE_ERRORS.items()})
    frames = ingest.keyframes
    counters.update(keyframes_made=frames.made, keyframes_skipped=frames.skipped,
                    keyframes_failed=frames.failed,
                    incident_marks_prepared=ingest.incident_frames.marks_folded,
                    incident_frames_jobs=ingest.incident_frames.jobs)
    body = exposition(Snapshot(
        ingest.store.jobs.newest(limit=10_000), live_jobs(ingest), counters,
        ingest.store.writer.commits, ingest.store.writer.write_errors, ingest.lag.current(),
        ingest.agent_connections, per_rank=parts.metrics_per_rank,
        host_readers=ingest.asks.readers_connected(),
        host_relays=ingest.counters["relays_admitted"] - ingest.counters["relays_lost"]))
    if parts.cluster is not None:
        body += parts.cluster.exposition()
    return body, 200, {"Content-Type": METRICS_CONTENT_TYPE}


@api.get("/api/jobs/<int:job_id>/gpus")
def api_gpus(job_id: int):
    return _job_or_404(job_id, lambda s: {"gpus": views.gpu_rows(s)})


@api.get("/api/jobs/<int:job_id>/export")
def api_export(job_id: int):
    lines = found_or_404(export_lines(_ingest().store, job_id), job_id)
    return current_app.response_class(lines, mimetype="application/x-ndjson", headers={
        "Content-Disposition": f'attachment; filename="pgdash-job-{job_id}.jsonl"'})


@api.get("/api/jobs/<int:job_id>/trace")
def api_trace(job_id: int):
    ingest = _ingest()
    try:
        start, end, max_events = trace_query(request.args, services.current().trace_max_events)
    except TraceError as exc:
        return jsonify(error=str(exc)), 400
    job = found_or_404(ingest.store.jobs.get(job_id), job_id)
    findings = found_or_404(ingest.findings(job_id), job_id)
    trace = build_trace(ingest.store.log.events(job_id), findings=findings, job=job,
                        start=start, end=end, max_events=max_events,
                        incidents=incidents(findings))
    return current_app.response_class(json_chunks(trace), mimetype="application/json", headers={
        "Content-Disposition": f'attachment; filename="pgdash-job-{job_id}-trace.json"'})


class _BadMoment(Exception):
    """A moment asked for that is not one of the job's (the message says why)."""


@api.errorhandler(_BadMoment)
def _bad_moment(exc):
    return jsonify(error=str(exc)), 400


def _moment(job_id: int, name: str) -> float:
    """Query parameter ``name`` as a moment of the job (Unix seconds); a 400 otherwise."""
    ingest = _ingest()
    raw = request.args.get(name)
    try:
        at = float(raw) if raw is not None else None
    except ValueError:
        at = None
    if at is None or not math.isfinite(at):
        raise _BadMoment(f"{name} must be a time in Unix seconds, e.g. "
                         f"?{name}=1764000000.5; got {raw!r:.40}")
    job = found_or_404(ingest.store.jobs.get(job_id), job_id)
    bad = replay_moment_error(job, at, ingest.clock())
    if bad:
        raise _BadMoment(bad if name == "at" else f"{name}: {bad}")
    return at


def _state_at(job_id: int, at: float) -> dict[str, Any]:
    """``state_at`` of the job, from the moments kept when it is one (dashboard.web.moments)."""
    parts = services.current()

    def make() -> dict[str, Any] | None:
        return state_at(parts.ingest, job_id, at)

    found = parts.moments.get(job_id, at, make) if parts.moments is not None else make()
    return found_or_404(found, job_id)


# The most ``within`` may say: a keyframe older than this is a different moment.
MAX_WITHIN_S = 300.0


@api.get("/api/jobs/<int:job_id>/state")
def api_state(job_id: int):
    """The job at moment ``at``; with ``within=S``, the newest stored keyframe in
    [at - S, at] will do (its ``at`` says which moment it is; dashboard.history.keyframes), and
    without one the moment is folded. Without ``within`` a keyframe at that very moment is
    its answer (the page's stops at incidents and its steps from them), else it is folded."""
    at = _moment(job_id, "at")
    raw = request.args.get("within")
    within = 0.0
    if raw is not None:
        try:
            within = float(raw)
        except ValueError:
            within = -1.0
    if not 0 <= within <= MAX_WITHIN_S:
        raise _BadMoment(f"within must be seconds from 0 to {MAX_WITHIN_S:g}: how far before "
                         f"at a stored moment may be, e.g. &within=10; got {raw!r:.40}")
    found = _keyframe(job_id, at, within)
    if found is not None:
        return current_app.response_class(found, mimetype="application/json")
    return _state_at(job_id, at)


def _keyframe(job_id: int, at: float, within: float) -> bytes | None:
    """The answer's JSON of the job's newest keyframe in [at - within, at], or None (none,
    or one this pgdash cannot read: the moment is folded instead)."""
    found = _ingest().keyframes.near(job_id, at, within)
    if found is None:
        return None
    try:
        return keyframe_answer(found)
    except (ValueError, KeyError, TypeError):  # not what this pgdash stores
        log.error("pgdash: a keyframe of job %s before %s is unreadable; folding the "
                  "moment instead (DELETE FROM keyframes WHERE job_id = %s drops them)",
                  job_id, at, job_id)
        return None


@api.get("/api/jobs/<int:job_id>/compare")
def api_compare(job_id: int):
    """What changed from moment ``a`` to moment ``b`` (dashboard.web.compare); a moment with
    a keyframe at exactly it (around incidents) is read from it."""
    a, b = _moment(job_id, "a"), _moment(job_id, "b")

    def answer(at: float) -> dict[str, Any]:
        found = _keyframe(job_id, at, 0.0)
        return _state_at(job_id, at) if found is None else json.loads(found)

    return compare(answer(a), answer(b))


@api.get("/api/jobs/<int:job_id>/incidents")
def api_incidents(job_id: int):
    ingest = _ingest()
    found = found_or_404(ingest.incidents(job_id), job_id)
    # The page asks as it opens a job: an ended big job's incidents are made ready to scrub
    # (the keyframes around them stored in the background: dashboard.history.incident_frames).
    ingest.incident_frames.ask(job_id)
    return {"incidents": ingest.read(job_id, lambda s: snapshots.with_snapshots(s, found))
            or found}


@api.get("/api/jobs/<int:job_id>/findings")
def api_findings(job_id: int):
    return {"findings": found_or_404(_ingest().findings(job_id), job_id)}


MAX_SNAPSHOT_RANKS = 4096  # ranks one request may name (ask "all" for more)


@api.post("/api/jobs/<int:job_id>/snapshots")
def api_snapshot_request(job_id: int):
    """Ask ranks for a snapshot: ``{"ranks": [0, 3]}``, ``"all"`` or ``"blamed"`` (the
    ranks of the job's active incidents), ``"native": true`` for native frames too (py-spy
    on the ranks' hosts; it pauses each for a fraction of a second); answers arrive within
    seconds (GET its id)."""
    ingest = _ingest()
    body = request.get_json(silent=True)
    which = body.get("ranks", "all") if isinstance(body, dict) else None
    native = body.get("native", False) if isinstance(body, dict) else False
    if not isinstance(native, bool):
        return jsonify(error=f'"native" must be true or false, got {native!r:.40}'), 400
    if which == "blamed":
        found = found_or_404(ingest.incidents(job_id), job_id)
        which = sorted({r for inc in found if inc["active"] for r in inc["ranks"]})
        if not which:
            return jsonify(error=f"job {job_id} has no active incident: nobody is blamed; "
                                 "name the ranks, or ask for \"all\""), 409
    elif which == "all":
        which = None
    elif not (isinstance(which, list) and 0 < len(which) <= MAX_SNAPSHOT_RANKS and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in which)):
        return jsonify(error='the body must be JSON {"ranks": [0, 3]} (1 to '
                             f'{MAX_SNAPSHOT_RANKS} non-negative integers), {{"ranks": '
                             '"all"} or {"ranks": "blamed"}'), 400
    try:
        made = ingest.asks.request(job_id, which, f"asked by {request.remote_addr}",
                                   native=native)
    except snapshots.UnknownRanks as exc:
        return jsonify(error=str(exc)), 400
    except snapshots.TooSoon as exc:
        return jsonify(error=str(exc)), 429
    except snapshots.Busy as exc:
        return jsonify(error=str(exc)), 503
    made = found_or_404(made, job_id)
    return {**made.row(), "url": f"/api/jobs/{job_id}/snapshots/{made.id}"}, 202


@api.get("/api/jobs/<int:job_id>/snapshots")
def api_snapshots(job_id: int):
    ingest = _ingest()
    remembered = ingest.asks.requests(job_id)
    return {"snapshots": found_or_404(ingest.read(
        job_id, lambda s: snapshots.listing(s, job_id, remembered)), job_id)}


@api.get("/api/jobs/<int:job_id>/snapshots/<request_id>")
def api_snapshot(job_id: int, request_id: str):
    """One request's answers: grouped, with each rank's whole answer for ``?detail=1,5``
    (or ``all``)."""
    ingest = _ingest()
    raw = request.args.get("detail", "")
    if raw == "all":
        detail = None
    elif all(part.isdigit() for part in raw.split(",") if part) and len(raw) <= 20_000:
        detail = {int(part) for part in raw.split(",") if part}
    else:
        return jsonify(error=f"detail must be ranks like 1,5 or all, got {raw!r:.40}"), 400
    made = ingest.asks.get(job_id, request_id)
    early = ingest.asks.early(made) if made is not None else None
    view = ingest.read(job_id, lambda s: snapshots.request_view(
        s, made or snapshots.answered_request(s, job_id, request_id), ingest.clock(), detail,
        early) if made is not None or request_id in s.snapshots else False)
    if view is False:
        return jsonify(error=f"job {job_id} has no snapshot {request_id!r:.80}: "
                             f"GET /api/jobs/{job_id}/snapshots lists them"), 404
    return found_or_404(view, job_id)
