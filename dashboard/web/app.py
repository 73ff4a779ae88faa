"""The server edge: Flask app factory, HTTP JSON API, Socket.IO namespaces, live push.

Handlers stay thin: they validate the request's shape and call :class:`dashboard.ingest.pipeline.Ingest`
or read a :class:`dashboard.state.JobState` view.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

import msgspec
from flask import Flask, abort, current_app, jsonify, render_template, request
from flask_socketio import SocketIO, join_room, leave_room, rooms
from werkzeug.exceptions import HTTPException

from pgdash_agent.wire import AGENT_NAMESPACE, BATCH_EVENT, UI_NAMESPACE
from dashboard.web import access
from dashboard.ingest import limits
from dashboard.web import views
from dashboard.ingest import guard as login_guard
from dashboard.history.archive import export_lines
from dashboard.config import DEFAULTS, DIAGNOSE_EVERY_S
from dashboard.diagnosis import Settings
from dashboard.diagnosis.incidents import incidents
from dashboard.ingest.pipeline import Ingest, Refused
from dashboard.ingest.lag import LAG_WARN_S
from dashboard.web.live import Feed, ViewCache, sections
from dashboard.web.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dashboard.web.metrics import Snapshot, exposition
from dashboard.storage.compaction import Compactor, Policy
from dashboard.console import IncidentLog, RefusalLog, listeners
from dashboard.web.notify import Notifier
from dashboard.resources import resource_dir
from dashboard.storage.database import database_url
from dashboard.storage.schema import JOB_FIELDS as STORED_JOB_FIELDS
from dashboard.storage.store import Store
from dashboard.history.trace import TraceError, build_trace, json_chunks, trace_query

log = logging.getLogger("pgdash.server")

def _flag(value: Any) -> bool:
    """A boolean setting that may come from the environment as text."""
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """Build the server. Config: defaults, then ``PGDASH_*`` variables, then ``test_config``."""
    app = Flask(__name__, static_folder=str(resource_dir("static", "vendor")),
                static_url_path="/static")
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("PGDASH")
    if test_config:
        app.config.update(test_config)
    app.json.sort_keys = False
    _trace_cap(app)  # a bad PGDASH_TRACE_MAX_EVENTS stops the start, named

    queue_url = app.config["QUEUE"] or None
    if queue_url:
        _check_cluster_config(app.config["DB"], queue_url)
    notifier = None
    if app.config["NOTIFY"]:
        notifier = Notifier(app.config["NOTIFY"], base_url=app.config.get("PUBLIC_URL"),
                            timeout=float(app.config["NOTIFY_TIMEOUT"]),
                            retries=int(app.config["NOTIFY_RETRIES"]),
                            max_queue=int(app.config["NOTIFY_QUEUE"])).start()
    store = Store(app.config["DB"],
                  busy_timeout_s=float(app.config["DB_BUSY_TIMEOUT_S"])).start()
    # Token guesses are counted per address on every door: pages, API, /ui and agents.
    guard = login_guard.from_config(app.config) if app.config["TOKEN"] else None
    app.extensions["pgdash_login_guard"] = guard
    refusals = _refusal_log(app.config)
    console = IncidentLog() if _flag(app.config["LOG_INCIDENTS"]) else None
    ingest = Ingest(store, token=app.config["TOKEN"], guard=guard,
                    settings=Settings(hang_after=float(app.config["HANG_AFTER"]),
                                      stall_after=float(app.config["STALL_AFTER"])),
                    on_incident=listeners(notifier, console), refusals=refusals).start()
    app.extensions["pgdash_notifier"] = notifier
    app.extensions["pgdash_refusals"] = refusals
    app.extensions["pgdash_compactor"] = _compactor(app.config, ingest)
    socketio = SocketIO(app, async_mode="threading", async_handlers=False,
                        max_http_buffer_size=app.config["MAX_MESSAGE_BYTES"],
                        cors_allowed_origins=[], logger=False, engineio_logger=False,
                        message_queue=queue_url, channel="pgdash-socketio")
    app.extensions["pgdash"] = ingest
    ingest.lag.start()  # the pause watchdog: a stopped server never blames a rank
    access.register(app, socketio, app.config["TOKEN"], guard)
    _register_pages(app, ingest)
    _register_api(app, ingest)
    app.extensions["pgdash_limits"] = _rate_limits(app.config)
    _register_agent_namespace(socketio, ingest, app.extensions["pgdash_limits"])
    _register_ui_namespace(socketio, ingest)
    pusher = LivePush(socketio, ingest, app.config["PUSH_INTERVAL"])
    app.extensions["pgdash_pusher"] = pusher
    if queue_url:
        from dashboard.cluster.node import ClusterNode

        node = ClusterNode(ingest, queue_url, lease_s=float(app.config["LEASE_S"]))
        node.on_claimed = ingest.adopt
        node.on_snapshot_request = pusher.send_snapshot
        ingest.cluster = pusher.cluster = node
    return app


def _refusal_log(config: dict[str, Any]) -> RefusalLog:
    """The console's log of refused agents, from PGDASH_REFUSAL_REPORT_S / _MAX_AGENTS."""
    try:
        every, most = float(config["REFUSAL_REPORT_S"]), int(config["REFUSAL_MAX_AGENTS"])
    except (TypeError, ValueError):
        raise ValueError(f"PGDASH_REFUSAL_REPORT_S (seconds) and PGDASH_REFUSAL_MAX_AGENTS (a "
                         f"count) must be positive numbers, got "
                         f"{config['REFUSAL_REPORT_S']!r:.40} and "
                         f"{config['REFUSAL_MAX_AGENTS']!r:.40}") from None
    return RefusalLog(every_s=every, max_agents=most)


def _compactor(config: dict[str, Any], ingest: Ingest) -> Compactor:
    """The background compactor (started with the server) and the checkpoint period."""
    try:
        policy = Policy(keep_full_s=float(config["KEEP_FULL_S"]),
                        around_findings_s=float(config["KEEP_AROUND_FINDINGS_S"]),
                        cell_s=float(config["COMPACT_CELL_S"]),
                        every_s=float(config["COMPACT_EVERY_S"]),
                        pack_after_s=float(config["PACK_AFTER_S"]),
                        checkpoint_keep_s=float(config["CHECKPOINT_KEEP_S"]))
        every = float(config["CHECKPOINT_S"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"storage settings (PGDASH_KEEP_FULL_S, PGDASH_KEEP_AROUND_FINDINGS_S, "
                         f"PGDASH_COMPACT_CELL_S, PGDASH_COMPACT_EVERY_S, PGDASH_PACK_AFTER_S, "
                         f"PGDASH_CHECKPOINT_KEEP_S, PGDASH_CHECKPOINT_S): {exc}") from None
    if every < 0 or (every and (every / policy.cell_s) % 1):
        # Compaction never rewrites part of what a stored checkpoint holds only if the
        # checkpoints' moments are cell boundaries.
        raise ValueError(f"PGDASH_CHECKPOINT_S ({every:g}) must be 0 (none) or a multiple of "
                         f"PGDASH_COMPACT_CELL_S ({policy.cell_s:g})")
    ingest.rewind.persist_every_s = every
    return Compactor(ingest.store, policy, guard=ingest.rewind.compacting,
                     owns=lambda job_id: ingest.cluster is None or ingest.cluster.owns(job_id),
                     clock=ingest.clock)


def _check_cluster_config(db: str, queue_url: str) -> None:
    """Several processes need a shared database and a reachable Redis; say which is wrong."""
    if urlsplit(queue_url).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"--queue / PGDASH_QUEUE must be a Redis URL such as "
                         f"redis://127.0.0.1:6379/0 (what several server processes share), "
                         f"got {queue_url!r:.200}")
    database_url(db)  # a wrong --db is named as such, before what --queue needs of it
    if not db.startswith("postgresql"):
        raise ValueError(f"--queue / PGDASH_QUEUE ({queue_url}) runs several server processes, "
                         f"which must share one PostgreSQL database: pass --db "
                         f"postgresql+psycopg://USER@HOST/DB (got {db})")
    try:
        import redis
    except ImportError:
        raise ValueError("--queue / PGDASH_QUEUE needs the redis client: "
                         "pip install 'pgdash[redis]'") from None
    try:
        redis.Redis.from_url(queue_url, socket_connect_timeout=5).ping()
    except (redis.RedisError, ValueError) as exc:
        raise ValueError(f"--queue / PGDASH_QUEUE {queue_url!r:.200}: cannot reach Redis "
                         f"({' '.join(str(exc).split())}); check that Redis runs and listens "
                         f"there, e.g. redis://127.0.0.1:6379/0") from None


def _job_or_404(ingest: Ingest, job_id: int, view):
    return _found_or_404(ingest.read(job_id, view), job_id)


def _found_or_404(found, job_id: int):
    """``found``, or the API's 404 for an unknown job when it is None."""
    if found is None:
        abort(404, description=f"no job with id {job_id}; GET /api/jobs lists them")
    return found


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


def _utc(ts: float, form: str = "%Y-%m-%d %H:%M UTC") -> str:
    """A Unix time as a page states it once, server-side (the scripts show local times)."""
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(form)


def _register_pages(app: Flask, ingest: Ingest) -> None:
    app.add_template_filter(_utc, "utc")

    @app.get("/")
    def jobs_page():
        return render_template("jobs.html")

    @app.get("/jobs/<int:job_id>")
    def job_page(job_id: int):
        # The header's launch line (command, launcher, run, import) is the job's row: facts
        # that do not change as the job runs, so the page states them once.
        row = ingest.store.jobs.get(job_id)
        return render_template("job.html", job_id=job_id,
                               job=None if row is None else {**row, **row_facts(row)})


def _register_api(app: Flask, ingest: Ingest) -> None:
    @app.errorhandler(404)
    def not_found(exc):
        if not request.path.startswith("/api/"):
            return exc
        if request.url_rule is None:  # no route: say which there are (a job id is digits)
            routes = sorted({rule.rule.replace("<int:job_id>", "<id>")
                             for rule in app.url_map.iter_rules()
                             if rule.rule.startswith("/api/")})
            return jsonify(error=f"no API route {request.path!r:.120}: the routes are "
                                 f"{', '.join(routes)}, where <id> is a job's id, a positive "
                                 "integer (GET /api/jobs lists them)"), 404
        return jsonify(error=getattr(exc, "description", "not found")), 404

    @app.errorhandler(HTTPException)
    def api_http_error(exc):  # 400, 405, ...: the API answers JSON whatever went wrong
        if request.path.startswith("/api/"):
            return jsonify(error=f"{exc.name}: {exc.description}"), exc.code
        return exc

    @app.errorhandler(Exception)
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

    @app.before_request
    def job_id_in_range():
        # /api/jobs/<int:job_id> accepts any digits; an id past what the database can hold
        # is simply not a job (SQLite would raise OverflowError).
        job_id = (request.view_args or {}).get("job_id")
        if isinstance(job_id, int) and job_id > MAX_JOB_ID:
            _found_or_404(None, job_id)

    @app.get("/api/jobs")
    def api_jobs():
        return jobs_payload(ingest)

    @app.get("/api/jobs/<int:job_id>")
    def api_job(job_id: int):
        detail = _job_or_404(ingest, job_id, views.detail)
        return {**detail, **row_facts(ingest.store.jobs.get(job_id) or {})}

    @app.get("/api/jobs/<int:job_id>/collectives")
    def api_collectives(job_id: int):
        rank = request.args.get("rank")
        if rank is not None and not rank.isdigit():
            return jsonify(error=f"rank must be a non-negative integer, got {rank!r}"), 400
        return _job_or_404(ingest, job_id, lambda s: {"collectives": views.collective_rows(s,
            group=request.args.get("group"), op=request.args.get("op"),
            rank=int(rank) if rank is not None else None)})

    @app.get("/metrics")
    def metrics():
        counters = dict(ingest.counters)
        notifier = app.extensions.get("pgdash_notifier")
        if notifier is not None:
            counters.update({f"notify_{k}": v for k, v in notifier.counters.items()})
        guard = app.extensions.get("pgdash_login_guard")
        if guard is not None:
            counters.update({f"login_{k}": v for k, v in guard.counters.items()})
            counters["login_addresses"] = len(guard)
        body = exposition(Snapshot(
            ingest.store.jobs.newest(limit=10_000), ingest.live_views(), counters,
            ingest.store.writer.commits, ingest.store.writer.write_errors, ingest.lag.current(),
            ingest.agent_connections, per_rank=_flag(app.config["METRICS_PER_RANK"])))
        if ingest.cluster is not None:
            body += ingest.cluster.exposition()
        return body, 200, {"Content-Type": METRICS_CONTENT_TYPE}

    @app.get("/api/jobs/<int:job_id>/gpus")
    def api_gpus(job_id: int):
        return _job_or_404(ingest, job_id, lambda s: {"gpus": views.gpu_rows(s)})

    @app.get("/api/jobs/<int:job_id>/export")
    def api_export(job_id: int):
        lines = _found_or_404(export_lines(ingest.store, job_id), job_id)
        return app.response_class(lines, mimetype="application/x-ndjson", headers={
            "Content-Disposition": f'attachment; filename="pgdash-job-{job_id}.jsonl"'})

    @app.get("/api/jobs/<int:job_id>/trace")
    def api_trace(job_id: int):
        try:
            start, end, max_events = trace_query(request.args, _trace_cap(app))
        except TraceError as exc:
            return jsonify(error=str(exc)), 400
        job = _found_or_404(ingest.store.jobs.get(job_id), job_id)
        findings = _found_or_404(ingest.findings(job_id), job_id)
        trace = build_trace(ingest.store.log.events(job_id), findings=findings, job=job,
                            start=start, end=end, max_events=max_events,
                            incidents=incidents(findings))
        return app.response_class(json_chunks(trace), mimetype="application/json", headers={
            "Content-Disposition": f'attachment; filename="pgdash-job-{job_id}-trace.json"'})

    @app.get("/api/jobs/<int:job_id>/state")
    def api_state(job_id: int):
        raw = request.args.get("at")
        try:
            at = float(raw) if raw is not None else None
        except ValueError:
            at = None
        if at is None or not math.isfinite(at):
            return jsonify(error=f"at must be a time in Unix seconds, e.g. ?at=1764000000.5; "
                                 f"got {raw!r:.40}"), 400
        job = _found_or_404(ingest.store.jobs.get(job_id), job_id)
        bad = replay_moment_error(job, at, ingest.clock())
        if bad:
            return jsonify(error=bad), 400
        return _found_or_404(ingest.state_at(job_id, at), job_id)

    @app.get("/api/jobs/<int:job_id>/incidents")
    def api_incidents(job_id: int):
        return {"incidents": _found_or_404(ingest.incidents(job_id), job_id)}

    @app.get("/api/jobs/<int:job_id>/findings")
    def api_findings(job_id: int):
        return {"findings": _found_or_404(ingest.findings(job_id), job_id)}


def _trace_cap(app: Flask) -> int:
    raw = app.config["TRACE_MAX_EVENTS"]
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"PGDASH_TRACE_MAX_EVENTS must be a positive integer, got {raw!r:.40}")
    return raw


def _rate_limits(config) -> Callable[[], limits.ConnectionLimits]:
    """A factory of one connection's limits, from the PGDASH_MAX_*_PER_S settings."""
    values = {}
    for name in limits.DEFAULTS:
        problem = limits.settings_error(name, config[name])
        if problem:
            raise ValueError(problem)
        values[name] = float(config[name])
    return lambda: limits.ConnectionLimits(values[limits.EVENTS_PER_S],
                                           values[limits.BYTES_PER_S], values[limits.BURST_S])


def _register_agent_namespace(socketio: SocketIO, ingest: Ingest,
                              new_limits: Callable[[], limits.ConnectionLimits]) -> None:
    sessions: dict[str, tuple[str, int]] = {}  # sid -> (session, job id)
    rates: dict[str, limits.ConnectionLimits] = {}  # sid -> its rate limits

    @socketio.on("connect", namespace=AGENT_NAMESPACE)
    def agent_connect(auth=None):
        try:
            guard = current_app.extensions["pgdash_login_guard"]
            address = guard.address(request.remote_addr, request.headers) if guard else \
                request.remote_addr
            sessions[request.sid] = ingest.connect(auth, address)
            rates[request.sid] = new_limits()
        except Refused as exc:  # ingest's refusal log says it, once per agent
            from flask_socketio import ConnectionRefusedError

            raise ConnectionRefusedError(str(exc)) from None

    @socketio.on(BATCH_EVENT, namespace=AGENT_NAMESPACE)
    def agent_batch(payload=None):
        known = sessions.get(request.sid)
        if known is None:
            return {"ok": False, "error": "not connected: reconnect", "retry": True}
        ingest.counters["batches_v1"] += 1
        refusal = _over_rate(rates.get(request.sid), payload)
        if refusal is not None:
            ingest.counters["rate_limited_batches"] += 1
            ingest.hold(known[0], payload.get("events") if isinstance(payload, dict) else None)
            return {"ok": False, "error": refusal.reason, "retry": True,
                    "retry_after": refusal.retry_after}
        ack = ingest.batch(known[0], known[1], payload)
        # The job's id lets the agent name its page (v2 says it in the handshake).
        return {**ack, "job": known[1]} if ack.get("ok") else ack

    @socketio.on("disconnect", namespace=AGENT_NAMESPACE)
    def agent_disconnect(*_args):
        rates.pop(request.sid, None)
        known = sessions.pop(request.sid, None)
        if known is not None:
            ingest.disconnect(known[0])


def _over_rate(rate: limits.ConnectionLimits | None, payload: Any) -> limits.Refusal | None:
    """Charge a batch to its connection's limits (before validation: garbage costs too)."""
    if rate is None:
        return None
    events = payload.get("events") if isinstance(payload, dict) else None
    count = len(events) if isinstance(events, list) else 1
    size = 0
    if rate.counts_bytes:  # what its JSON weighs (msgspec: a few us, json.dumps ~0.1 ms)
        try:
            size = len(msgspec.json.encode(payload, enc_hook=str))
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
            size = 0  # unserialisable: validation refuses it anyway
    return rate.admit(count, size)


MAX_JOB_ID = 2**63 - 1  # the largest integer the database stores
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
        pusher: LivePush = current_app.extensions["pgdash_pusher"]
        if not pusher.watch(job_id, request.sid):
            return {"ok": False, "error": f"no job with id {job_id}"}
        return {"ok": True}


class LivePush:
    """Sends watching browsers a snapshot of their job, then throttled deltas of it.

    At most one message per job per ``interval`` goes to its room, whatever the rank count;
    the message format is in :mod:`dashboard.web.live`. A lock keeps the push thread and a new
    watcher's snapshot in one order, so every delta a room gets applies to what each of its
    members has.
    """

    def __init__(self, socketio: SocketIO, ingest: Ingest, interval: float):
        self.socketio = socketio
        self.ingest = ingest
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._feeds: dict[int, Feed] = {}  # watched jobs: what their rooms were sent last
        self._pushed_at: dict[int, float] = {}  # job id -> when it was last sent (monotonic)
        self._judged_at: dict[int, float] = {}  # job id -> the event time its feed was judged at
        self.cache = ViewCache()
        self.cluster = None  # dashboard.cluster.node.ClusterNode with several server processes

    def start(self) -> None:
        if self.cluster is not None and self._thread is None:
            self.cluster.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgdash-push", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.cluster is not None:
            self.cluster.stop()

    def _sections(self, job_id: int) -> dict[str, Any] | None:
        # Judged at the server's event time, the same function replay uses (state?at=).
        at = self.ingest.judged_at()
        found = self.ingest.findings(job_id)
        if found is None:
            return None
        self._judged_at[job_id] = at
        return self.ingest.read(job_id, lambda s: sections(
            s, self.cache, at=at, findings=found, settings=self.ingest.settings))

    def watch(self, job_id: int, sid: str) -> bool:
        """Bring the job's room up to date, then add ``sid`` with a snapshot; False if there
        is no such job."""
        if self.cluster is not None and not self.cluster.owns(job_id) and \
                self.cluster.leases.owner_of(job_id) is not None:
            # Another process owns it: its deltas reach this room through the message
            # queue, and it sends the snapshot they build on.
            if self.ingest.store.jobs.get(job_id) is None:
                return False
            join_room(self._room(job_id), sid=sid, namespace=UI_NAMESPACE)
            self.cluster.request_snapshot(job_id, sid)
            return True
        with self._lock:
            if not self._push(job_id):
                return False
            join_room(self._room(job_id), sid=sid, namespace=UI_NAMESPACE)
            self.socketio.emit("job", self._snapshot(job_id), to=sid, namespace=UI_NAMESPACE)
            return True

    def _snapshot(self, job_id: int) -> dict[str, Any]:
        return {**self._feeds[job_id].snapshot(job_id), **self._clock_fields(),
                "at": self._judged_at.get(job_id)}

    def _clock_fields(self) -> dict[str, Any]:
        """The server's time, and how far behind the agents its ingest is when that is worth
        saying (dashboard.ingest.lag: verdicts are held that long); the page shows them as given."""
        lag = self.ingest.lag.current()
        return {"server_time": self.ingest.clock(),
                "server_behind_s": round(lag, 1) if lag >= LAG_WARN_S else None}

    def send_snapshot(self, job_id: int, sid: str) -> None:
        """Clustered: a browser on another process watches a job this one owns."""
        with self._lock:
            if self._push(job_id):
                self.socketio.emit("job", self._snapshot(job_id), to=sid,
                                   namespace=UI_NAMESPACE)

    @staticmethod
    def _room(job_id: int) -> str:
        return f"job:{job_id}"

    def _push(self, job_id: int) -> bool:
        """Under the lock: send the job's room what changed since it was last sent."""
        fresh = self._sections(job_id)
        if fresh is None:
            return False
        self._pushed_at[job_id] = time.monotonic()
        feed = self._feeds.get(job_id)
        if feed is None:
            # Clustered, a job's next owner starts a feed of its own: versions that its
            # watchers cannot mistake for the last owner's (they then ask for a snapshot).
            first = 1 if self.cluster is None else int(time.time() * 1000) % 2**31
            self._feeds[job_id] = Feed(fresh, version=first)
            return True
        message = feed.advance(job_id, fresh)
        if message is not None:
            message.update(self._clock_fields(), at=self._judged_at.get(job_id))
            self.socketio.emit("job_delta", message, to=self._room(job_id),
                               namespace=UI_NAMESPACE)
        return True

    def _watched(self, job_id: int) -> bool:
        """Whether any browser watches the job (an unwatched job costs nothing)."""
        if self.cluster is not None:
            return True  # watchers on other processes are not visible from here
        try:
            participants = self.socketio.server.manager.get_participants(
                UI_NAMESPACE, self._room(job_id))
            return next(iter(participants), None) is not None
        except (AttributeError, KeyError):
            return True  # a manager without that API: push as before

    def _run(self) -> None:
        next_diagnosis = 0.0
        jobs_pushed_at = 0.0  # the jobs list, likewise
        waiting: set[int] = set()  # changed jobs not pushed yet (throttled)
        # Wake often, push each changed job as soon as its own interval allows: an update
        # waits ~0.05 s for the loop instead of half an interval on average.
        tick = min(self.interval, 0.05)
        while not self._stop.wait(tick):
            self.ingest.lag.check_pause()  # a pause is said before anything is judged
            try:
                # Diagnosis of a 1,024-rank job takes ~45 ms of a GIL it shares with ingest:
                # judge the moments of the findings book's grid (every 0.5 s) that no batch
                # has judged yet, at most a quarter of the time.
                started = time.monotonic()
                if started >= next_diagnosis:
                    self.ingest.diagnose_live()
                    # A rank's display state changes with time alone (a wait turns into
                    # "behind"): judge every watched job again; unchanged sends nothing.
                    waiting |= set(self._feeds)
                    next_diagnosis = started + max(DIAGNOSE_EVERY_S,
                                                   4 * (time.monotonic() - started))
                if self.ingest.jobs_dirty.is_set() and started - jobs_pushed_at >= self.interval:
                    self.ingest.jobs_dirty.clear()
                    jobs_pushed_at = started
                    self.socketio.emit("jobs", jobs_payload(self.ingest), to="jobs",
                                       namespace=UI_NAMESPACE)
                waiting |= self.ingest.take_dirty()
                if self.cluster is not None:  # only the owner pushes a job
                    waiting = {j for j in waiting if self.cluster.owns(j)}
                for job_id in sorted(waiting):
                    if time.monotonic() - self._pushed_at.get(job_id, 0.0) < self.interval:
                        continue
                    waiting.discard(job_id)
                    with self._lock:
                        if self._watched(job_id):
                            self._push(job_id)
                        else:  # nobody left to send deltas to: the next watcher starts anew
                            self._feeds.pop(job_id, None)
            except Exception:
                log.exception("pgdash: live push failed; retrying next interval")
