"""The server's parts, built once and in order from its settings: :func:`build` makes the
one typed :class:`Services` that the app factory (dashboard.web.app), the HTTP server
(dashboard.server) and the v2 front serve from.

The order is the dependency order, and each part gets what it needs in its constructor:
settings checked → notifier → store → login guard, refusal log → cluster membership →
ingest → compactor → Socket.IO → live push → cluster node. Nothing is linked after it is
built: the live push subscribes to ingest's diagnosis rounds, the cluster node drives
ingest's log follower.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from flask import current_app
from flask_socketio import SocketIO

from dashboard.cluster.node import ClusterNode, Membership
from dashboard.console import IncidentLog, RefusalLog, listeners
from dashboard.config import DIAGNOSE_EVERY_S
from dashboard.diagnosis import Settings
from dashboard.ingest import guard as login_guard
from dashboard.ingest import limits
from dashboard.ingest.pipeline import Ingest
from dashboard.storage.compaction import Compactor, Policy
from dashboard.storage.database import database_url
from dashboard.storage.store import Store
from dashboard.web.live import keyframe
from dashboard.web.moments import Moments
from dashboard.web.notify import Notifier
from dashboard.web.push import LivePush


@dataclasses.dataclass
class Services:
    """One server's parts. ``start()`` runs their threads; ``stop()`` stops what feeds
    browsers and owns jobs, ``close()`` what is left (after the listeners stopped)."""

    store: Store
    ingest: Ingest
    compactor: Compactor
    refusals: RefusalLog
    socketio: SocketIO
    pusher: LivePush
    new_limits: Callable[[], limits.ConnectionLimits]  # one agent connection's rate limits
    guard: login_guard.LoginGuard | None = None  # with a token: failed guesses per address
    notifier: Notifier | None = None
    cluster: Membership | None = None  # several server processes (--queue)
    node: ClusterNode | None = None
    metrics_per_rank: bool = False
    trace_max_events: int = 0
    moments: Moments | None = None  # the last few replayed moments, kept (state?at=, compare)

    def start(self) -> "Services":
        if self.node is not None:
            self.node.start()
        self.ingest.diagnosis.start()
        self.pusher.start()
        self.compactor.start()
        return self

    def stop(self) -> None:
        self.ingest.stop()
        self.pusher.stop()
        self.ingest.diagnosis.stop()
        if self.node is not None:
            self.node.stop()  # hands this process's jobs over at once

    def close(self) -> None:
        self.compactor.close()
        self.store.close()
        self.refusals.close()  # the counts not told yet


def current() -> Services:
    """The services of the app handling the request (dashboard.web.app.create_app)."""
    return current_app.extensions["pgdash"]


def build(config: Mapping[str, Any]) -> Services:
    """Every part of a server, from its settings (dashboard.config.DEFAULTS' names).

    Raises:
        ValueError: a setting is wrong; the message names it and says what it must be.
    """
    trace_max_events = trace_cap(config)  # a bad PGDASH_TRACE_MAX_EVENTS stops the start
    queue_url = config["QUEUE"] or None
    if queue_url:
        _check_cluster_config(config["DB"], queue_url)
    policy, checkpoint_every_s = _storage_policy(config)
    keyframe_every_s = _keyframe_period(config)
    new_limits = _rate_limits(config)
    refusals = _refusal_log(config)
    notifier = None
    if config["NOTIFY"]:
        notifier = Notifier(config["NOTIFY"], base_url=config.get("PUBLIC_URL"),
                            timeout=float(config["NOTIFY_TIMEOUT"]),
                            retries=int(config["NOTIFY_RETRIES"]),
                            max_queue=int(config["NOTIFY_QUEUE"])).start()
    store = Store(config["DB"], busy_timeout_s=float(config["DB_BUSY_TIMEOUT_S"])).start()
    # Token guesses are counted per address on every door: pages, API, /ui and agents.
    guard = login_guard.from_config(config) if config["TOKEN"] else None
    console = IncidentLog() if flag(config["LOG_INCIDENTS"]) else None
    cluster = Membership(store, queue_url, lease_s=float(config["LEASE_S"])) \
        if queue_url else None
    ingest = Ingest(store, token=config["TOKEN"], guard=guard,
                    settings=Settings(hang_after=float(config["HANG_AFTER"]),
                                      stall_after=float(config["STALL_AFTER"])),
                    on_incident=listeners(notifier, console), refusals=refusals,
                    cluster=cluster, checkpoint_every_s=checkpoint_every_s,
                    keyframe_every_s=keyframe_every_s, render_keyframe=keyframe).start()
    ingest.lag.start()  # the pause watchdog: a stopped server never blames a rank
    compactor = Compactor(store, policy, guard=ingest.rewind.compacting, owns=ingest.owns,
                          clock=ingest.clock)
    socketio = SocketIO(async_mode="threading", async_handlers=False,
                        max_http_buffer_size=config["MAX_MESSAGE_BYTES"],
                        cors_allowed_origins=[], logger=False, engineio_logger=False,
                        message_queue=queue_url, channel="pgdash-socketio")
    pusher = LivePush(socketio, ingest, config["PUSH_INTERVAL"], cluster=cluster)
    node = ClusterNode(cluster, ingest.follower, on_snapshot_request=pusher.send_snapshot,
                       on_ask=ingest.asks.deliver) if cluster is not None else None
    return Services(store=store, ingest=ingest, compactor=compactor, refusals=refusals,
                    socketio=socketio, pusher=pusher, new_limits=new_limits, guard=guard,
                    notifier=notifier, cluster=cluster, node=node,
                    metrics_per_rank=flag(config["METRICS_PER_RANK"]),
                    trace_max_events=trace_max_events,
                    moments=Moments(ingest.clock))


def flag(value: Any) -> bool:
    """A boolean setting that may come from the environment as text."""
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def trace_cap(config: Mapping[str, Any]) -> int:
    raw = config["TRACE_MAX_EVENTS"]
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"PGDASH_TRACE_MAX_EVENTS must be a positive integer, got {raw!r:.40}")
    return raw


def _refusal_log(config: Mapping[str, Any]) -> RefusalLog:
    """The console's log of refused agents, from PGDASH_REFUSAL_REPORT_S / _MAX_AGENTS."""
    try:
        every, most = float(config["REFUSAL_REPORT_S"]), int(config["REFUSAL_MAX_AGENTS"])
    except (TypeError, ValueError):
        raise ValueError(f"PGDASH_REFUSAL_REPORT_S (seconds) and PGDASH_REFUSAL_MAX_AGENTS (a "
                         f"count) must be positive numbers, got "
                         f"{config['REFUSAL_REPORT_S']!r:.40} and "
                         f"{config['REFUSAL_MAX_AGENTS']!r:.40}") from None
    return RefusalLog(every_s=every, max_agents=most)


def _storage_policy(config: Mapping[str, Any]) -> tuple[Policy, float]:
    """The compactor's policy and the checkpoint period (PGDASH_CHECKPOINT_S)."""
    try:
        policy = Policy(keep_full_s=float(config["KEEP_FULL_S"]),
                        around_findings_s=float(config["KEEP_AROUND_FINDINGS_S"]),
                        cell_s=float(config["COMPACT_CELL_S"]),
                        every_s=float(config["COMPACT_EVERY_S"]),
                        pack_after_s=float(config["PACK_AFTER_S"]),
                        checkpoint_keep_s=float(config["CHECKPOINT_KEEP_S"]),
                        keyframe_keep_s=float(config["KEYFRAME_KEEP_S"]))
        every = float(config["CHECKPOINT_S"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"storage settings (PGDASH_KEEP_FULL_S, PGDASH_KEEP_AROUND_FINDINGS_S, "
                         f"PGDASH_COMPACT_CELL_S, PGDASH_COMPACT_EVERY_S, PGDASH_PACK_AFTER_S, "
                         f"PGDASH_CHECKPOINT_KEEP_S, PGDASH_CHECKPOINT_S, "
                         f"PGDASH_KEYFRAME_KEEP_S): {exc}") from None
    if every < 0 or (every and (every / policy.cell_s) % 1):
        # Compaction never rewrites part of what a stored checkpoint holds only if the
        # checkpoints' moments are cell boundaries.
        raise ValueError(f"PGDASH_CHECKPOINT_S ({every:g}) must be 0 (none) or a multiple of "
                         f"PGDASH_COMPACT_CELL_S ({policy.cell_s:g})")
    return policy, every


def _keyframe_period(config: Mapping[str, Any]) -> float:
    """PGDASH_KEYFRAME_S: 0 (none) or a multiple of the diagnosis grid (a keyframe is a
    moment the findings book judged)."""
    raw = config["KEYFRAME_S"]
    try:
        every = float(raw)
    except (TypeError, ValueError):
        every = -1.0
    if not (every == 0 or (math.isfinite(every) and every > 0 and
                           math.isclose(every / DIAGNOSE_EVERY_S,
                                        round(every / DIAGNOSE_EVERY_S)))):
        raise ValueError(f"PGDASH_KEYFRAME_S must be 0 (no keyframes) or a multiple of "
                         f"{DIAGNOSE_EVERY_S:g} seconds, e.g. 10; got {raw!r:.40}")
    return every


def _rate_limits(config: Mapping[str, Any]) -> Callable[[], limits.ConnectionLimits]:
    """A factory of one connection's limits, from the PGDASH_MAX_*_PER_S settings."""
    values = {}
    for name in limits.DEFAULTS:
        problem = limits.settings_error(name, config[name])
        if problem:
            raise ValueError(problem)
        values[name] = float(config[name])
    return lambda: limits.ConnectionLimits(values[limits.EVENTS_PER_S],
                                           values[limits.BYTES_PER_S], values[limits.BURST_S])


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
