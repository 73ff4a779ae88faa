"""JobState: the derived state of one job, a pure fold over its event log.

No Flask, no SQL, no clock: ``apply`` takes stored events in log order, and everything the API
and the page show is computed from what was applied. Live mode and replay feed the same events,
so they see the same state.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, TypedDict

from agent.wire import hist_bucket_value

TERMINAL_RANK = ("exited", "failed", "lost")
RECENT_INTERVALS = 60  # latency summaries kept per (group, rank) for the straggler rule
MAX_ERRORS = 200  # verbatim error texts kept per job (the log keeps them all)


class StoredEvent(TypedDict):
    """An event as the log holds it: what the agent sent plus where and when it arrived."""

    id: int
    session: str
    seq: int | None  # None for events the server recorded itself (connect, disconnect)
    t: float
    received_at: float
    kind: str
    body: dict[str, Any]


@dataclasses.dataclass
class RankState:
    rank: int | None
    session: str
    host: str = ""
    local_rank: int | None = None
    pid: int | None = None
    device: str | None = None
    backend: str | None = None
    world_size: int | None = None
    status: str = "initializing"
    last_seen: float = 0.0
    hello_at: float | None = None
    exit_at: float | None = None
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LatencyStats:
    count: int = 0
    bytes: int = 0
    sum_us: float = 0.0
    max_us: float = 0.0
    hist: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, row: dict[str, Any]) -> None:
        self.count += row["count"]
        self.bytes += row["bytes"]
        self.sum_us += row["sum_us"]
        self.max_us = max(self.max_us, row["max_us"])
        for bucket, n in row["hist"]:
            self.hist[bucket] += n

    def percentile(self, q: float) -> float | None:
        """Latency (us) at quantile q from the histogram, never above the true maximum."""
        total = sum(self.hist.values())
        if not total:
            return None
        target = q * total
        seen = 0
        for bucket in sorted(self.hist):
            seen += self.hist[bucket]
            if seen >= target:
                return round(min(hist_bucket_value(bucket), self.max_us), 3)
        return round(self.max_us, 3)


class JobState:
    """Everything known about one job after the events applied so far."""

    def __init__(self, job_id: int, name: str):
        self.job_id = job_id
        self.name = name
        self.sessions: dict[str, RankState] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.collectives: dict[tuple[str, str, int], LatencyStats] = {}
        self.progress: dict[tuple[str, int], dict[str, Any]] = {}
        self.errors: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_ERRORS)
        self.init: dict[str, dict[str, Any]] = {}  # session -> rendezvous timeline
        self.stacks: dict[tuple[str, int], dict[str, Any]] = {}  # (group, rank) -> last stack
        # (group, rank) -> recent (t, count, sum_us) summaries, for straggler/slow rules
        self.recent: dict[tuple[str, int], collections.deque] = {}
        self.started_at: float | None = None
        self.last_event_at: float | None = None
        self.last_event_id = 0
        self.applied = 0

    # -- the fold ----------------------------------------------------------------------------

    def apply(self, ev: StoredEvent) -> None:
        self.applied += 1
        self.last_event_id = max(self.last_event_id, ev["id"])
        t = ev["t"]
        if self.started_at is None or t < self.started_at:
            self.started_at = t
        self.last_event_at = t if self.last_event_at is None else max(self.last_event_at, t)
        rank = self.sessions.get(ev["session"])
        if rank is None:
            rank = self.sessions[ev["session"]] = RankState(rank=None, session=ev["session"])
        if ev["kind"] not in ("disconnect",):
            rank.last_seen = max(rank.last_seen, t)
        handler = getattr(self, "_on_" + ev["kind"], None)
        if handler is not None:
            handler(rank, ev["body"], t)

    def apply_all(self, events: Iterable[StoredEvent]) -> "JobState":
        for ev in events:
            self.apply(ev)
        return self

    def _on_hello(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.hello_at is None:
            r.hello_at = t
        for key in ("rank", "host", "local_rank", "pid", "device", "backend", "world_size",
                    "versions", "env"):
            if body.get(key) is not None:
                setattr(r, key, body[key])
        if body.get("backend") and r.status == "initializing":
            r.status = "running"  # attached after init_process_group

    def _on_init_start(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.init[r.session] = {"arrived_at": t, "done_at": None, "error": None,
                                **{k: body.get(k) for k in ("init_method", "backend", "rank",
                                                            "world_size", "master_addr",
                                                            "master_port", "timeout_s")}}
        if r.rank is None and body.get("rank") not in (None, -1):
            r.rank = body["rank"]
        r.status = "initializing"

    def _on_init_done(self, r: RankState, body: dict[str, Any], t: float) -> None:
        r.rank, r.world_size = body["rank"], body["world_size"]
        r.backend = body.get("backend") or r.backend
        self.init.setdefault(r.session, {"arrived_at": t - body["duration_s"]})["done_at"] = t
        if r.status not in TERMINAL_RANK:
            r.status = "running"

    def _on_init_failed(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.init.setdefault(r.session, {"arrived_at": t - body["duration_s"]})["error"] = body
        self._record_error(r, body, t)
        r.status = "failed"

    def _on_group(self, r: RankState, body: dict[str, Any], t: float) -> None:
        group = self.groups.get(body["name"])
        if group is None or group["ranks"] != body["ranks"]:
            self.groups[body["name"]] = {"name": body["name"], "desc": body.get("desc"),
                                         "backend": body.get("backend"),
                                         "ranks": list(body["ranks"])}

    def _on_coll_stats(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is None:
            return
        for row in body["rows"]:
            key = (row["group"], row["op"], r.rank)
            stats = self.collectives.get(key)
            if stats is None:
                stats = self.collectives[key] = LatencyStats()
            stats.add(row)
            window = self.recent.get((row["group"], r.rank))
            if window is None:
                window = self.recent[(row["group"], r.rank)] = collections.deque(
                    maxlen=RECENT_INTERVALS)
            window.append((body["end"], row["count"], row["sum_us"]))

    def _on_heartbeat(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.status == "lost":
            r.status = "running"
        r.dropped = dict(body.get("dropped") or {})
        if r.rank is None:
            return
        for row in body["groups"]:
            self.progress[(row["group"], r.rank)] = dict(row, t=t)

    def _on_stack(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None:
            self.stacks[(body["group"], r.rank)] = dict(body, t=t)

    def _on_error(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self._record_error(r, body, t)
        if body["where"] == "uncaught":
            r.status = "failed"

    def _on_exit(self, r: RankState, body: dict[str, Any], t: float) -> None:
        r.status = "exited" if body["clean"] else "failed"
        r.exit_at = t
        for key, row in self.progress.items():
            if key[1] == r.rank:
                row["inflight_op"] = row["inflight_since"] = None

    def _on_connect(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is None and body.get("rank") is not None:
            r.rank = body["rank"]  # what the agent knew when it connected; hello may refine
            r.host = body.get("host") or r.host
        if r.status == "lost":
            r.status = "running"

    def _on_disconnect(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.status not in TERMINAL_RANK:
            r.status = "lost"
            r.exit_at = t

    def _record_error(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.errors.append({"rank": r.rank, "t": t, **body})

    # -- derived views -----------------------------------------------------------------------

    def ranks(self) -> list[RankState]:
        """One entry per rank: the latest session that claimed it."""
        by_rank: dict[int, RankState] = {}
        for r in self.sessions.values():
            if r.rank is not None:
                by_rank[r.rank] = r
        return [by_rank[k] for k in sorted(by_rank)]

    @property
    def world_size(self) -> int | None:
        sizes = collections.Counter(r.world_size for r in self.sessions.values() if r.world_size)
        return sizes.most_common(1)[0][0] if sizes else None

    @property
    def backend(self) -> str | None:
        names = collections.Counter(r.backend for r in self.sessions.values() if r.backend)
        return names.most_common(1)[0][0] if names else None

    @property
    def status(self) -> str:
        ranks = self.ranks()
        if not ranks:
            return "initializing"
        if all(r.status in TERMINAL_RANK for r in ranks):
            complete = self.world_size is None or len(ranks) >= self.world_size
            clean = all(r.status == "exited" for r in ranks)
            return "finished" if clean and complete else "failed"
        if any(r.status in ("running", "exited") for r in ranks):
            return "running"
        return "initializing"

    @property
    def ended_at(self) -> float | None:
        if self.status not in ("finished", "failed"):
            return None
        ends = [r.exit_at for r in self.ranks() if r.exit_at is not None]
        return max(ends) if ends else self.last_event_at

    def summary(self) -> dict[str, Any]:
        """The job as /api/jobs lists it."""
        return {"id": self.job_id, "name": self.name, "status": self.status,
                "world_size": self.world_size, "backend": self.backend,
                "started_at": self.started_at, "ended_at": self.ended_at}

    def detail(self) -> dict[str, Any]:
        """The job as /api/jobs/<id> returns it."""
        return {
            **self.summary(),
            "ranks": [{"rank": r.rank, "host": r.host, "local_rank": r.local_rank,
                       "pid": r.pid, "device": r.device, "status": r.status,
                       "last_seen": r.last_seen, "dropped": r.dropped}
                      for r in self.ranks()],
            "groups": [{"id": g["name"], **g} for g in
                       sorted(self.groups.values(), key=lambda g: _group_order(g["name"]))],
        }

    def collective_rows(self, group: str | None = None, op: str | None = None,
                        rank: int | None = None) -> list[dict[str, Any]]:
        rows = []
        for (g, o, rk), s in sorted(self.collectives.items(),
                                    key=lambda kv: (_group_order(kv[0][0]), kv[0][1], kv[0][2])):
            if (group is not None and g != group) or (op is not None and o != op) or (
                    rank is not None and rk != rank):
                continue
            rows.append({"group": g, "op": o, "rank": rk, "count": s.count,
                         "p50_us": s.percentile(0.5), "p99_us": s.percentile(0.99),
                         "max_us": round(s.max_us, 3), "bytes": s.bytes})
        return rows

    def progress_rows(self) -> list[dict[str, Any]]:
        return [{"group": g, "rank": rk, "entered": row["entered"],
                 "completed": row["completed"], "inflight_op": row.get("inflight_op"),
                 "inflight_since": row.get("inflight_since")}
                for (g, rk), row in sorted(self.progress.items(),
                                           key=lambda kv: (_group_order(kv[0][0]), kv[0][1]))]

    def error_rows(self) -> list[dict[str, Any]]:
        """Verbatim error texts with rank and time, newest first."""
        return [dict(e) for e in reversed(self.errors)]

    def rendezvous_rows(self) -> list[dict[str, Any]]:
        """When each rank arrived at init_process_group and when it finished (or failed)."""
        rows = []
        for session, entry in self.init.items():
            r = self.sessions[session]
            error = entry.get("error")
            rows.append({"rank": r.rank, "host": r.host, "arrived_at": entry.get("arrived_at"),
                         "done_at": entry.get("done_at"),
                         "error": error.get("error") if error else None})
        return sorted(rows, key=lambda row: (row["rank"] is None, row["rank"] or 0))

    def timeline_rows(self) -> list[dict[str, Any]]:
        """Per group and rank, recent intervals: [end time, collectives, microseconds inside]."""
        return [{"group": g, "rank": rank, "points": [list(p) for p in window]}
                for (g, rank), window in sorted(self.recent.items(),
                                                key=lambda kv: (_group_order(kv[0][0]),
                                                                kv[0][1]))]

    def claims(self, rank: int | None, session: str) -> bool:
        """Whether another session already holds ``rank`` in this job."""
        if rank is None:
            return False
        return any(r.rank == rank and s != session for s, r in self.sessions.items())


def _group_order(name: str) -> tuple[int, Any]:
    return (0, int(name)) if name.isdigit() else (1, name)
