"""The wire format between agent and server: message shapes, limits and their validation.

Both sides import this module (it imports nothing outside the standard library), so a shape is
defined exactly once. The agent builds events with :func:`event`; the server checks every
inbound message with :func:`validate_auth` and :func:`validate_batch` before it stores anything.

An agent connects to the Socket.IO namespace :data:`AGENT_NAMESPACE` with an :class:`Auth`
payload, then emits ``batch`` messages (:class:`Batch`) and waits for each :class:`Ack`.
Every event carries a per-session sequence number; the server keeps the highest one stored per
session and ignores anything at or below it, so resending after a reconnect is always safe.
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1
AGENT_NAMESPACE = "/agent"
UI_NAMESPACE = "/ui"
BATCH_EVENT = "batch"

# Limits enforced by the server; the agent stays below them by construction.
MAX_BATCH_EVENTS = 500
MAX_TEXT = 65_536  # error texts and stacks are evidence: keep them whole up to this size
MAX_NAME = 256
MAX_RANKS = 1_048_576
MAX_LIST = 10_000
MAX_ENV = 512

# Latency histograms: bucket i holds latencies in [2**(i/8), 2**((i+1)/8)) microseconds,
# about 9% wide, so merged percentiles stay within ~9% of the truth at any scale.
HIST_BUCKETS_PER_OCTAVE = 8
HIST_MAX_BUCKET = 8 * 40  # 2**40 us is ~12 days; anything longer is clamped


def hist_bucket(latency_us: float) -> int:
    """Histogram bucket index of a latency in microseconds."""
    if latency_us <= 1.0:
        return 0
    return min(int(math.log2(latency_us) * HIST_BUCKETS_PER_OCTAVE), HIST_MAX_BUCKET)


def hist_bucket_value(index: int) -> float:
    """Representative latency (geometric middle, in microseconds) of a histogram bucket."""
    return 2.0 ** ((index + 0.5) / HIST_BUCKETS_PER_OCTAVE)


class Auth(TypedDict, total=False):
    """Sent as the Socket.IO ``auth`` payload when an agent connects."""

    v: int
    token: str | None
    session: str  # one per agent process (uuid4 hex); the unit of de-duplication
    job: str  # the job name all ranks of one launch agree on
    rank: int | None
    host: str
    pid: int


class Event(TypedDict):
    seq: int  # 1, 2, 3, ... per session
    t: float  # Unix seconds on the agent's clock, when the thing happened
    kind: str
    body: dict[str, Any]


class Batch(TypedDict):
    v: int
    events: list[Event]


class Ack(TypedDict, total=False):
    ok: bool
    stored: int  # events stored by this batch (duplicates are not counted)
    rejected: list[dict[str, Any]]  # [{"seq", "error"}] for events that failed validation
    error: str  # when ok is false: the whole batch was refused
    retry: bool  # when ok is false: whether sending the same batch again can succeed


def event(seq: int, t: float, kind: str, body: dict[str, Any]) -> Event:
    return {"seq": seq, "t": t, "kind": kind, "body": body}


class WireError(ValueError):
    """An inbound message that does not match the wire format; the text says what is wrong."""


# ---------------------------------------------------------------------------------------------
# Validation. Each event kind maps field -> (checker, required). Checkers raise WireError.

def _int(value: Any, name: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise WireError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WireError(f"{name} must be a finite number, got {value!r:.40}")
    return float(value)


def _str(value: Any, name: str, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str):
        raise WireError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise WireError(f"{name} is {len(value)} characters long; the limit is {limit}")
    return value


def _opt(check):
    def checker(value, name):
        return None if value is None else check(value, name)

    return checker


def _rank(value, name):
    return _int(value, name, 0, MAX_RANKS)


def _count(value, name):
    return _int(value, name, 0)


def _text(value, name):
    return _str(value, name, MAX_TEXT)


def _bool(value, name):
    if not isinstance(value, bool):
        raise WireError(f"{name} must be true or false")
    return value


def _list(item_check, limit=MAX_LIST):
    def checker(value, name):
        if not isinstance(value, list):
            raise WireError(f"{name} must be a list, got {type(value).__name__}")
        if len(value) > limit:
            raise WireError(f"{name} has {len(value)} items; the limit is {limit}")
        for i, item in enumerate(value):
            item_check(item, f"{name}[{i}]")
        return value

    return checker


def _str_map(limit=MAX_ENV):
    def checker(value, name):
        if not isinstance(value, dict):
            raise WireError(f"{name} must be an object")
        if len(value) > limit:
            raise WireError(f"{name} has {len(value)} entries; the limit is {limit}")
        for k, v in value.items():
            _str(k, f"{name} key", MAX_NAME)
            _opt(_text)(v, f"{name}[{k}]")
        return value

    return checker


def _obj(spec):
    def checker(value, name):
        _check_fields(value, spec, name)
        return value

    return checker


def _hist_pair(value, name):
    if not (isinstance(value, list) and len(value) == 2):
        raise WireError(f"{name} must be a [bucket, count] pair")
    _int(value[0], f"{name}[0]", 0, HIST_MAX_BUCKET)
    _int(value[1], f"{name}[1]", 1)


def _check_fields(body: Any, spec: dict, where: str) -> None:
    if not isinstance(body, dict):
        raise WireError(f"{where} must be an object, got {type(body).__name__}")
    for field, (check, required) in spec.items():
        if field not in body:
            if required:
                raise WireError(f"{where}.{field} is missing")
            continue
        check(body[field], f"{where}.{field}")


def _count_map(value, name):
    if not isinstance(value, dict) or len(value) > 64:
        raise WireError(f"{name} must be an object of at most 64 counters")
    for k, v in value.items():
        _str(k, f"{name} key")
        _count(v, f"{name}[{k}]")
    return value


def _num_map(value, name):
    if not isinstance(value, dict) or len(value) > 64:
        raise WireError(f"{name} must be an object of at most 64 numbers")
    for k, v in value.items():
        _str(k, f"{name} key")
        _opt(_num)(v, f"{name}[{k}]")
    return value


_GROUP_PROGRESS = {
    "group": (_str, True),
    "entered": (_count, True),
    "completed": (_count, True),
    "inflight_op": (_opt(_str), False),
    "inflight_since": (_opt(_num), False),
    "inflight_dtype": (_opt(_str), False),
    "inflight_bytes": (_opt(_count), False),
    # The Flight Recorder's view, which also counts collectives issued from C++ (DDP).
    "fr_enqueued": (_count, False),
    "fr_completed": (_count, False),
    "fr_inflight_since": (_opt(_num), False),
    # Of the recorder's samples since the last heartbeat, how many found one in flight.
    "fr_busy": (_count, False),
    "fr_samples": (_count, False),
}

COLL_SOURCES = ("wrapper", "flight_recorder")
COLL_TIMINGS = ("wrapper", "device", "host_poll")


def _one_of(value, name, allowed):
    if value not in allowed:
        raise WireError(f"{name} must be one of {list(allowed)}, got {value!r:.40}")
    return value


_COLL_ROW = {
    "group": (_str, True),
    "op": (_str, True),
    "count": (_count, True),
    "bytes": (_count, True),
    "sum_us": (_num, True),
    "max_us": (_num, True),
    "hist": (_list(_hist_pair, HIST_MAX_BUCKET + 1), True),
    # Optional (newer agents): where the row comes from, "wrapper" (the default) or
    # "flight_recorder" (collectives issued from C++), and how exact its latency is:
    # "device" (NCCL's own timing) or "host_poll" (exact to resolution_us).
    "source": (lambda v, n: _one_of(v, n, COLL_SOURCES), False),
    "timing": (lambda v, n: _one_of(v, n, COLL_TIMINGS), False),
    "resolution_us": (_num, False),
}

#: Event kinds an agent may send, and the fields of each body.
EVENT_KINDS: dict[str, dict] = {
    # Identity; first event of every session, repeated if it changes (e.g. rank known at init).
    "hello": {
        "job": (_str, True),
        "rank": (_opt(_rank), False),
        "world_size": (_opt(lambda v, n: _int(v, n, 1, MAX_RANKS)), False),
        "local_rank": (_opt(_rank), False),
        "host": (_str, True),
        "pid": (_count, True),
        "backend": (_opt(_str), False),
        "device": (_opt(_str), False),
        "gpu_uuid": (_opt(_str), False),
        "versions": (_str_map(64), False),
        "env": (_str_map(), False),
    },
    "init_start": {
        "init_method": (_opt(_text), False),
        "backend": (_opt(_str), False),
        "world_size": (_opt(lambda v, n: _int(v, n, -1, MAX_RANKS)), False),
        "rank": (_opt(lambda v, n: _int(v, n, -1, MAX_RANKS)), False),
        "master_addr": (_opt(_str), False),
        "master_port": (_opt(_str), False),
        "timeout_s": (_opt(_num), False),
    },
    "init_done": {
        "rank": (_rank, True),
        "world_size": (lambda v, n: _int(v, n, 1, MAX_RANKS), True),
        "backend": (_opt(_str), False),
        "duration_s": (_num, True),
    },
    "init_failed": {
        "error_type": (_str, True),
        "error": (_text, True),
        "duration_s": (_num, True),
    },
    "group": {
        "name": (_str, True),
        "desc": (_opt(_str), False),
        "backend": (_opt(_str), False),
        "ranks": (_list(_rank, MAX_RANKS), True),
    },
    "coll_stats": {
        "start": (_num, True),
        "end": (_num, True),
        "rows": (_list(_obj(_COLL_ROW)), True),
    },
    "heartbeat": {
        "groups": (_list(_obj(_GROUP_PROGRESS)), True),
        "dropped": (_count_map, False),  # events the agent had to drop, by kind
        "buffered": (_count, False),
    },
    "error": {
        "where": (_str, True),
        "error_type": (_str, True),
        "error": (_text, True),
        "group": (_opt(_str), False),
        "op": (_opt(_str), False),
        "seq": (_opt(_count), False),
    },
    # The training thread's Python stack while it sits in one collective for long.
    "stack": {
        "group": (_str, True),
        "seq": (_count, True),
        "op": (_str, True),
        "since": (_num, True),
        "stack": (_text, True),
    },
    # One reading of this rank's GPU (agent.gpu): numbers are None where NVML can't tell.
    "gpu": {
        "uuid": (_str, True),
        "name": (_opt(_str), False),
        "lost": (_bool, True),
        "values": (_num_map, True),
        "reasons": (_list(_str, 16), True),
        "xids": (_list(_count, 64), True),
    },
    "exit": {
        "clean": (_bool, True),
        "reason": (_opt(_text), False),
        "exitcode": (_opt(_int), False),
    },
}


#: Event kinds the server itself records (never accepted from an agent).
SERVER_KINDS = ("connect", "disconnect")


def validate_auth(auth: Any) -> Auth:
    """Check an agent's connect payload; raise WireError naming the bad field."""
    _check_fields(
        auth,
        {
            "v": (_int, True),
            "token": (_opt(_text), False),
            "session": (lambda v, n: _str(v, n, 64), True),
            "job": (_str, True),
            "rank": (_opt(_rank), False),
            "host": (_str, False),
            "pid": (_count, False),
        },
        "auth",
    )
    if auth["v"] != PROTOCOL_VERSION:
        raise WireError(
            f"agent speaks protocol v{auth['v']}, this server speaks v{PROTOCOL_VERSION}: "
            "install the same pgdash version on the training hosts and the server"
        )
    if not auth["session"] or not auth["job"]:
        raise WireError("auth.session and auth.job must not be empty")
    return auth  # type: ignore[return-value]


def validate_event(ev: Any, where: str = "event") -> Event:
    """Check one event; raise WireError naming the bad field."""
    _check_fields(
        ev,
        {"seq": (lambda v, n: _int(v, n, 1), True), "t": (_num, True),
         "kind": (_str, True), "body": (lambda v, n: v, True)},
        where,
    )
    spec = EVENT_KINDS.get(ev["kind"])
    if spec is None:
        raise WireError(f"{where}.kind {ev['kind']!r:.60} is not one of {sorted(EVENT_KINDS)}")
    _check_fields(ev["body"], spec, f"{where}.body")
    return ev


def validate_batch(batch: Any) -> tuple[list[Event], list[dict[str, Any]]]:
    """Split a batch into valid events and per-event rejections.

    Raises WireError when the envelope itself is wrong (then nothing in it is usable).
    """
    if not isinstance(batch, dict):
        raise WireError(f"batch must be an object, got {type(batch).__name__}")
    if batch.get("v") != PROTOCOL_VERSION:
        raise WireError(f"batch.v must be {PROTOCOL_VERSION}, got {batch.get('v')!r:.20}")
    events = batch.get("events")
    if not isinstance(events, list):
        raise WireError("batch.events must be a list")
    if len(events) > MAX_BATCH_EVENTS:
        raise WireError(f"batch has {len(events)} events; the limit is {MAX_BATCH_EVENTS}")
    good, rejected = [], []
    for i, ev in enumerate(events):
        try:
            good.append(validate_event(ev, f"events[{i}]"))
        except WireError as exc:
            seq = ev.get("seq") if isinstance(ev, dict) else None
            rejected.append({"seq": seq if isinstance(seq, int) else None, "error": str(exc)})
    return good, rejected


RankStatus = Literal["initializing", "running", "exited", "failed", "lost"]
JobStatus = Literal["initializing", "running", "finished", "failed"]
