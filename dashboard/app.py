"""The server edge: Flask app factory, HTTP JSON API, Socket.IO namespaces, live push.

Handlers stay thin: they validate the request's shape and call :class:`dashboard.ingest.Ingest`
or read a :class:`dashboard.state.JobState` view.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from flask import Flask, abort, jsonify, render_template, request
from flask_socketio import SocketIO, join_room, leave_room, rooms

from agent.wire import AGENT_NAMESPACE, BATCH_EVENT, UI_NAMESPACE
from dashboard.diagnosis import Settings
from dashboard.ingest import Ingest, Refused
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


def job_payload(ingest: Ingest, job_id: int) -> dict[str, Any] | None:
    """Everything the live job page shows, in one message."""
    payload = ingest.read(job_id, lambda s: {
        "job": s.detail(), "collectives": s.collective_rows(), "progress": s.progress_rows(),
        "timeline": s.timeline_rows(), "rendezvous": s.rendezvous_rows(),
        "errors": s.error_rows(), "gpus": []})
    if payload is not None:
        payload["findings"] = ingest.findings(job_id) or []
        payload["server_time"] = ingest.clock()
    return payload


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
        payload = job_payload(ingest, job_id)
        if payload is None:
            return {"ok": False, "error": f"no job with id {job_id}"}
        join_room(f"job:{job_id}", namespace=UI_NAMESPACE)
        socketio.emit("job", payload, to=request.sid, namespace=UI_NAMESPACE)
        return {"ok": True}


class LivePush:
    """Pushes changed jobs to watching browsers, at most once per interval per job."""

    def __init__(self, socketio: SocketIO, ingest: Ingest, interval: float):
        self.socketio = socketio
        self.ingest = ingest
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgdash-push", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ingest.diagnose_live()
                if self.ingest.jobs_dirty.is_set():
                    self.ingest.jobs_dirty.clear()
                    self.socketio.emit("jobs", jobs_payload(self.ingest), to="jobs",
                                       namespace=UI_NAMESPACE)
                for job_id in self.ingest.take_dirty():
                    payload = job_payload(self.ingest, job_id)
                    if payload is not None:
                        self.socketio.emit("job", payload, to=f"job:{job_id}",
                                           namespace=UI_NAMESPACE)
            except Exception:
                log.exception("pgdash: live push failed; retrying next interval")
