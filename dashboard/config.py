"""Every server setting and its default, in one place.

A setting ``NAME`` is read by ``create_app`` from these defaults, then from the environment as
``PGDASH_NAME``, then from the caller's overrides (the command line). Defaults that belong to
one mechanism are defined beside it and only gathered here (the diagnosis thresholds on
:class:`dashboard.diagnosis.Settings`, the agents' rate limits in :mod:`dashboard.ingest.limits`, the
login guard's in :mod:`dashboard.ingest.guard`, the trace cap in :mod:`dashboard.history.trace`), so each
value is written once.
"""

from __future__ import annotations

from pgdash_agent.wire import DEFAULT_PORT
from dashboard.ingest import guard
from dashboard.ingest import limits
from dashboard.storage.compaction import Policy
from dashboard.diagnosis import Settings
from dashboard.history.trace import DEFAULT_MAX_EVENTS as DEFAULT_TRACE_MAX_EVENTS

DEFAULT_DB = "sqlite:///pgdash.db"  # in the working directory
DEFAULT_HOST = "127.0.0.1"  # loopback: nothing beyond this machine reaches the server

# The timer of live diagnosis: the findings book's grid (Settings.diagnose_every), which
# live and replay judge on alike (dashboard.diagnosis.book).
DIAGNOSE_EVERY_S = Settings().diagnose_every

DEFAULTS = {
    "DB": DEFAULT_DB,
    "TOKEN": None,
    "HANG_AFTER": Settings.hang_after,  # --hang-after: a collective waiting this long is hung
    "STALL_AFTER": Settings.stall_after,  # --stall-after: floor of the stall warning
    "NOTIFY": None,  # webhook URL for incidents (dashboard.web.notify)
    "NOTIFY_TIMEOUT": 5.0,
    "NOTIFY_RETRIES": 3,
    "NOTIFY_QUEUE": 256,
    "LOG_INCIDENTS": False,  # one console line per incident event (`pgdash serve` turns it on)
    "REFUSAL_REPORT_S": 60.0,  # a refused agent: one line, then counts at most this often
    "REFUSAL_MAX_AGENTS": 1024,  # refused agents remembered for those counts
    "PUSH_INTERVAL": 0.5,  # seconds between live updates of one job (throttle)
    "MAX_MESSAGE_BYTES": 4_000_000,
    "TRACE_MAX_EVENTS": DEFAULT_TRACE_MAX_EVENTS,  # GET /api/jobs/<id>/trace: the most events
    "METRICS_PER_RANK": False,  # a last-seen series per rank on /metrics (high cardinality)
    "DB_BUSY_TIMEOUT_S": 30.0,  # how long a write waits for a lock another process holds
    **limits.DEFAULTS,  # per-connection rate limits on agents
    **guard.DEFAULTS,  # failed token attempts per client address (PGDASH_LOGIN_*)
    "QUEUE": None,  # redis://host:6379/0: several server processes (dashboard.cluster.node)
    "LEASE_S": 5.0,  # a job owner's lease, when several processes share the database
    # Bounded storage (dashboard.storage.compaction) and stored checkpoints (dashboard.history.rewind)
    "KEEP_FULL_S": Policy.keep_full_s,  # --keep-full: seconds kept at full resolution
    "KEEP_AROUND_FINDINGS_S": Policy.around_findings_s,  # --keep-around-findings
    "COMPACT_CELL_S": Policy.cell_s,
    "COMPACT_EVERY_S": Policy.every_s,
    "PACK_AFTER_S": Policy.pack_after_s,  # a cell this old is stored as one pack; 0: never
    "CHECKPOINT_KEEP_S": Policy.checkpoint_keep_s,  # old checkpoints: one per this; 0: all
    "CHECKPOINT_S": 300.0,  # a stored JobState every this many seconds of the log
    "KEYFRAME_S": 10.0,  # the page's answer stored every this many seconds (history.keyframes)
    "KEYFRAME_KEEP_S": Policy.keyframe_keep_s,  # old keyframes: those at multiples of this
}

__all__ = ["DEFAULTS", "DEFAULT_DB", "DEFAULT_HOST", "DEFAULT_PORT", "DIAGNOSE_EVERY_S"]
