"""The server edge: Flask app factory, HTTP JSON API, Socket.IO namespaces, live push.

Handlers stay thin: they validate the request's shape and call :class:`dashboard.ingest.Ingest`
or read a :class:`dashboard.state.JobState` view.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask import Flask, abort, current_app, jsonify, render_template, request
from flask_socketio import SocketIO, join_room, leave_room, rooms

from agent.wire import AGENT_NAMESPACE, BATCH_EVENT, UI_NAMESPACE
from dashboard.diagnosis import Settings
from dashboard.ingest import Ingest, Refused
from dashboard.metrics import exposition
from dashboard.resources import resource_dir
from dashboard.storage import Store

log = logging.getLogger("pgdash.server")

DEFAULTS = {
    "DB": "sqlite:///pgdash.db",
    "TOKEN": None,
    "HANG_AFTER": 60.0,
    "PUSH_INTERVAL": 0.5,  # seconds between live updates of one job (throttle)
    "MAX_MESSAGE_BYTES": 4_000_000,
}


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """Build the server. Config: defaults, then ``PGDASH_*`` variables, then ``test_config``."""
    app = Flask(__name__, static_folder=str(resource_dir("static", "vendor")),
                static_url_path="/static")
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("PGDASH")
    if test_config:
        app.config.update(test_config)
    app.json.sort_keys = False

    store = Store(app.config["DB"]).start()
    ingest = Ingest(store, token=app.config["TOKEN"],
                    settings=Settings(hang_after=float(app.config["HANG_AFTER"]))).start()
    socketio = SocketIO(app, async_mode="threading", async_handlers=False,
                        max_http_buffer_size=app.config["MAX_MESSAGE_BYTES"],
                        cors_allowed_origins=[], logger=False, engineio_logger=False)
    app.extensions["pgdash"] = ingest
    _register_pages(app)
    _register_api(app, ingest)
    _register_agent_namespace(socketio, ingest)
    _register_ui_namespace(socketio, ingest)
    app.extensions["pgdash_pusher"] = LivePush(socketio, ingest, app.config["PUSH_INTERVAL"])
    return app


def _job_or_404(ingest: Ingest, job_id: int, view):
    result = ingest.read(job_id, view)
    if result is None:
        abort(404, description=f"no job with id {job_id}; GET /api/jobs lists them")
    return result


def _register_pages(app: Flask) -> None:
    @app.get("/")
    def jobs_page():
        return render_template("jobs.html")

    @app.get("/jobs/<int:job_id>")
    def job_page(job_id: int):
        return render_template("job.html", job_id=job_id)


def _register_api(app: Flask, ingest: Ingest) -> None:
    @app.errorhandler(404)
    def not_found(exc):
        if request.path.startswith("/api/"):
            return jsonify(error=getattr(exc, "description", "not found")), 404
        return exc

    @app.get("/api/jobs")
    def api_jobs():
        return jobs_payload(ingest)

    @app.get("/api/jobs/<int:job_id>")
    def api_job(job_id: int):
        return _job_or_404(ingest, job_id, lambda s: s.detail())

    @app.get("/api/jobs/<int:job_id>/collectives")
    def api_collectives(job_id: int):
        rank = request.args.get("rank")
        if rank is not None and not rank.isdigit():
            return jsonify(error=f"rank must be a non-negative integer, got {rank!r}"), 400
        return _job_or_404(ingest, job_id, lambda s: {"collectives": s.collective_rows(
            group=request.args.get("group"), op=request.args.get("op"),
            rank=int(rank) if rank is not None else None)})

    @app.get("/metrics")
    def metrics():
        body = exposition(ingest.store.list_jobs(limit=10_000), ingest.live_views(),
                          dict(ingest.counters), ingest.store.commits,
                          ingest.store.write_errors)
        return body, 200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    @app.get("/api/jobs/<int:job_id>/gpus")
    def api_gpus(job_id: int):
        return _job_or_404(ingest, job_id, lambda s: {"gpus": s.gpu_rows()})

    @app.get("/api/jobs/<int:job_id>/findings")
    def api_findings(job_id: int):
        found = ingest.findings(job_id)
        if found is None:
            abort(404, description=f"no job with id {job_id}; GET /api/jobs lists them")
        return {"findings": found}


def _register_agent_namespace(socketio: SocketIO, ingest: Ingest) -> None:
    sessions: dict[str, tuple[str, int]] = {}  # sid -> (session, job id)

    @socketio.on("connect", namespace=AGENT_NAMESPACE)
    def agent_connect(auth=None):
        try:
            sessions[request.sid] = ingest.connect(auth)
        except Refused as exc:
            log.warning("%s", exc)
            from flask_socketio import ConnectionRefusedError

            raise ConnectionRefusedError(str(exc)) from None

    @socketio.on(BATCH_EVENT, namespace=AGENT_NAMESPACE)
    def agent_batch(payload=None):
        known = sessions.get(request.sid)
        if known is None:
            return {"ok": False, "error": "not connected: reconnect", "retry": True}
        return ingest.batch(known[0], known[1], payload)

    @socketio.on("disconnect", namespace=AGENT_NAMESPACE)
    def agent_disconnect(*_args):
        known = sessions.pop(request.sid, None)
        if known is not None:
            ingest.disconnect(known[0])


# The live page's history of collectives: seconds on its grid, and the raw points kept in
# all (the newest of each group and rank) for clients that read ``timeline``.
TIMELINE_BINS = 30
TIMELINE_MAX_POINTS = 1024


def job_payload(ingest: Ingest, job_id: int,
                cache: "ViewCache | None" = None) -> dict[str, Any] | None:
    """Everything the live job page shows, in one message.

    ``ops`` (per group family and op) and ``timeline_grid`` (rank x second) are what the
    page draws; they stay small at 1,024 ranks. ``timeline`` keeps its shape for other
    clients, bounded to TIMELINE_MAX_POINTS points. With a ``cache`` (the live push has
    one), the expensive history views of a big job are reused for a while (see ViewCache);
    ranks, progress and findings are always fresh.
    """
    def views(s):
        def part(name, build):
            return build() if cache is None else cache.get((job_id, name), s.applied, build)

        return {
            "job": s.detail(),
            "collectives": part("collectives", s.collective_rows),
            "progress": s.progress_rows(),
            "timeline": part("timeline",
                             lambda: s.timeline_rows(max_points=TIMELINE_MAX_POINTS)),
            "rendezvous": part("rendezvous", s.rendezvous_rows),
            "errors": s.error_rows(), "gpus": part("gpus", s.gpu_rows),
            "ops": part("ops", s.op_rows),
            "timeline_grid": part("timeline_grid", lambda: s.timeline_grid(TIMELINE_BINS))}

    payload = ingest.read(job_id, views)
    if payload is not None:
        payload["findings"] = ingest.findings(job_id) or []
        payload["server_time"] = ingest.clock()
    return payload


class ViewCache:
    """Reuses a view that is expensive to build, for a time in proportion to its cost.

    A view that took C seconds is rebuilt at most every ``factor`` x C seconds (never later
    than ``max_age``), and is reused as long as nothing was applied to the job. Views that
    cost under ``min_cost`` (a small job's) are always fresh; a 1,024-rank job's history
    views (~100 ms) then cost about a tenth of the push thread instead of most of it, and
    they hold the state lock (which ingest needs to fold events) that much less.
    """

    def __init__(self, factor: float = 10.0, max_age: float = 1.0, min_cost: float = 0.005,
                 max_entries: int = 512):
        self.factor, self.max_age, self.min_cost = factor, max_age, min_cost
        self.max_entries = max_entries
        self._entries: dict[tuple, tuple[float, float, int, Any]] = {}

    def get(self, key: tuple, version: int, build) -> Any:
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None:
            built_at, cost, built_version, value = entry
            if built_version == version or (cost >= self.min_cost and now - built_at < min(
                    self.max_age, self.factor * cost)):
                return value
        value = build()
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (now, time.monotonic() - now, version, value)
        return value


JOB_FIELDS = ("id", "name", "status", "world_size", "backend", "started_at", "ended_at")


def jobs_payload(ingest: Ingest) -> dict[str, Any]:
    """The jobs list, newest first (from the jobs table, so it stays cheap with many jobs)."""
    return {"jobs": [{k: job[k] for k in JOB_FIELDS} for job in ingest.store.list_jobs()]}


def _register_ui_namespace(socketio: SocketIO, ingest: Ingest) -> None:
    @socketio.on("watch", namespace=UI_NAMESPACE)
    def ui_watch(what=None):
        if not isinstance(what, dict):
            return {"ok": False, "error": 'send {"jobs": true} or {"job": <id>}'}
        for room in rooms(namespace=UI_NAMESPACE):  # one watch per connection
            if room != request.sid:
                leave_room(room, namespace=UI_NAMESPACE)
        if what.get("jobs") is True:
            join_room("jobs", namespace=UI_NAMESPACE)
            socketio.emit("jobs", jobs_payload(ingest), to=request.sid, namespace=UI_NAMESPACE)
            return {"ok": True}
        job_id = what.get("job")
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            return {"ok": False, "error": f"job must be an integer id, got {job_id!r:.40}"}
        pusher = current_app.extensions.get("pgdash_pusher")
        payload = job_payload(ingest, job_id, pusher.cache if pusher is not None else None)
        if payload is None:
            return {"ok": False, "error": f"no job with id {job_id}"}
        join_room(f"job:{job_id}", namespace=UI_NAMESPACE)
        socketio.emit("job", payload, to=request.sid, namespace=UI_NAMESPACE)
        if pusher is not None:  # this watcher is up to date: the next push waits its interval
            pusher.sent(job_id)
        return {"ok": True}


class LivePush:
    """Pushes changed jobs to watching browsers, at most once per interval per job."""

    def __init__(self, socketio: SocketIO, ingest: Ingest, interval: float):
        self.socketio = socketio
        self.ingest = ingest
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pushed_at: dict[int, float] = {}  # job id -> when it was last sent (monotonic)
        self.cache = ViewCache()  # shared with the first payload a new watcher gets

    def sent(self, job_id: int) -> None:
        """A full payload of ``job_id`` just went out (a new watcher got one)."""
        self._pushed_at[job_id] = time.monotonic()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgdash-push", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watched(self, room: str) -> bool:
        """Whether any browser watches ``room`` (an unwatched job costs no payload)."""
        try:
            participants = self.socketio.server.manager.get_participants(UI_NAMESPACE, room)
            return next(iter(participants), None) is not None
        except (AttributeError, KeyError):
            return True  # a manager without that API: push as before

    def _run(self) -> None:
        next_diagnosis = 0.0
        pushed_at = self._pushed_at
        jobs_pushed_at = 0.0  # the jobs list, likewise
        waiting: set[int] = set()  # changed jobs not pushed yet (throttled)
        cache = self.cache
        # Wake often, push each changed job as soon as its own interval allows: an update
        # waits ~0.05 s for the loop instead of half an interval on average.
        tick = min(self.interval, 0.05)
        while not self._stop.wait(tick):
            try:
                # Diagnosis of a 1,024-rank job takes a few hundred ms of a GIL it shares with
                # ingest: run it at most every interval and at most a quarter of the time.
                started = time.monotonic()
                if started >= next_diagnosis:
                    self.ingest.diagnose_live()
                    next_diagnosis = started + max(self.interval,
                                                   3 * (time.monotonic() - started))
                if self.ingest.jobs_dirty.is_set() and started - jobs_pushed_at >= self.interval:
                    self.ingest.jobs_dirty.clear()
                    jobs_pushed_at = started
                    self.socketio.emit("jobs", jobs_payload(self.ingest), to="jobs",
                                       namespace=UI_NAMESPACE)
                waiting |= self.ingest.take_dirty()
                for job_id in sorted(waiting):
                    now = time.monotonic()
                    if now - pushed_at.get(job_id, 0.0) < self.interval:
                        continue
                    waiting.discard(job_id)
                    room = f"job:{job_id}"
                    if not self._watched(room):
                        continue
                    pushed_at[job_id] = now
                    payload = job_payload(self.ingest, job_id, cache)
                    if payload is not None:
                        self.socketio.emit("job", payload, to=room, namespace=UI_NAMESPACE)
            except Exception:
                log.exception("pgdash: live push failed; retrying next interval")
