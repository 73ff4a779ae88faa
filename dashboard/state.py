"""JobState: the derived state of one job, a pure fold over its event log.

No Flask, no SQL, no clock: ``apply`` takes stored events in log order, and everything the API
and the page show is computed from what was applied. Live mode and replay feed the same events,
so they see the same state. JobState holds the data, one handler per event kind and a small
read surface (ranks, groups, the job's and attempts' status, per-group indexes); the rows the
API and the page show, and the display states judged at a moment, are in dashboard.web.views.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Callable, Hashable, Iterable, Protocol, TypedDict

from pgdash_agent.wire import hist_bucket, hist_bucket_value

TERMINAL_RANK = ("exited", "failed", "lost")
# Events that leave the job summary (status, world size, backend, start) as it was, unless
# the rank was lost (a heartbeat revives it), the event starts the job earlier, or the job
# has ended (its end time then follows the last event).
P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})  # agent.collectives' point-to-point ops
ROUTINE_KINDS = frozenset({"heartbeat", "coll_stats", "stack", "gpu", "group"})
FLIGHT_OP = "C++ collective"  # what progress_rows calls a collective only the Flight Recorder saw
MEMO_ENTRIES = 16  # JobState.memo(): a quiet job is diagnosed at ever new times
RECENT_INTERVALS = 60  # latency summaries kept per (group, rank) for the straggler rule
FR_TALLIES = 30  # heartbeats of Flight Recorder busy tallies kept per (group, rank)
OP_SECONDS = 60  # seconds of merged summaries kept per (group, op) for the latency chart
GPU_HISTORY = 120  # GPU readings kept per rank (about two minutes)
# Clock-event reasons that mean the GPU is slowed by heat or power trouble (not just busy).
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                    "hw_power_brake_slowdown")
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
    attempt: int = 0  # which restart of the job this session belongs to (0 = first launch)
    first_seen: float | None = None
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
    # What its exit said (``exit`` event's reason, e.g. "SIGTERM from torchrun"), for the page
    exit_reason: str | None = None
    # When the rank destroyed its default process group (``left`` event): it left
    # distributed training, though its process may go on.
    left_at: float | None = None
    # How the process was started, as its hello said (pgdash_agent.identity.Launch); None from
    # older agents (and in checkpoints stored before: the class default stands in).
    command: str | None = None
    launcher: str | None = None
    launcher_id: str | None = None
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LatencyStats:
    count: int = 0
    bytes: int = 0
    sum_us: float = 0.0
    max_us: float = 0.0
    # bucket -> count. A plain dict, not a Counter: a 256-rank state holds ~36,000 of them,
    # and unpickling a Counter runs its __init__ (a third of a checkpoint's load time).
    hist: dict[int, int] = dataclasses.field(default_factory=dict)
    # Flight Recorder rows timed by host polls: their widest poll gap (None: exact timing)
    resolution_us: float | None = None

    def add(self, row: dict[str, Any]) -> None:
        # The hottest line of ingest (every row of every rank's summary, twice): plain dict
        # arithmetic.
        self.count += row["count"]
        self.bytes += row["bytes"]
        self.sum_us += row["sum_us"]
        if row["max_us"] > self.max_us:
            self.max_us = row["max_us"]
        hist = self.hist
        get = hist.get
        for bucket, n in row["hist"]:
            hist[bucket] = get(bucket, 0) + n

    def merge(self, other: "LatencyStats") -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)
        hist = self.hist
        for bucket, n in other.hist.items():
            hist[bucket] = hist.get(bucket, 0) + n
        if other.resolution_us is not None:
            self.resolution_us = max(self.resolution_us or 0.0, other.resolution_us)

    def percentile(self, q: float) -> float | None:
        """Latency (us) at quantile q from the histogram, never above the true maximum."""
        if not sum(self.hist.values()):
            return None
        return round(min(quantile_us(self.hist, q, self.max_us), self.max_us), 3)


class StateObserver(Protocol):
    """What reads the fold event by event (the trace export): told of each event right after
    JobState folded it, with the session it was folded into, so that it reads who the session
    is (rank, host, pid, first seen) and the job's groups from the fold instead of folding
    them a second time."""

    def applied(self, state: "JobState", session: RankState, ev: StoredEvent) -> None: ...


class JobState:
    """Everything known about one job after the events applied so far.

    Args:
        observer: told of every event applied (see StateObserver); the live and stored
            states have none.
    """

    # A class default, so that checkpoints neither store one nor need one to load.
    observer: StateObserver | None = None

    def __init__(self, job_id: int, name: str, observer: StateObserver | None = None):
        if observer is not None:
            self.observer = observer
        self.job_id = job_id
        self.name = name
        self.sessions: dict[str, RankState] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        # (group, op, rank, source) -> stats; source "wrapper" (Python-issued) or
        # "flight_recorder" (issued from C++, read from the Flight Recorder)
        self.collectives: dict[tuple[str, str, int, str], LatencyStats] = {}
        self.progress: dict[tuple[str, int], dict[str, Any]] = {}
        self.errors: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_ERRORS)
        self.init: dict[str, dict[str, Any]] = {}  # session -> rendezvous timeline
        self.stacks: dict[tuple[str, int], dict[str, Any]] = {}  # (group, rank) -> last stack
        # (group, rank) -> the progress row as it was when the rank exited (the row itself
        # then shows nothing in flight): what it was waiting in when a hung job was stopped
        self.exit_rows: dict[tuple[str, int], dict[str, Any]] = {}
        # (group, rank) -> recent (end, count, sum_us, histogram) summaries, all ops of the
        # group together, for the straggler and slow rules (the histograms' quantiles tell a
        # peer late at nearly every collective from a few long waits, or from waits spread
        # at random) and the heat map; the histogram is flat: (bucket, count, bucket, ...)
        self.recent: dict[tuple[str, int], collections.deque] = {}
        # (group, rank) -> per heartbeat (t, samples in flight, samples) of the Flight Recorder,
        # for groups whose collectives run in C++ (how long a rank waits inside DDP's)
        self.fr_tallies: dict[tuple[str, int], collections.deque] = {}
        # (group, op, source) -> whole second of the agents' clocks -> every rank's summaries
        self.op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]] = {}
        self.gpus: dict[int, dict[str, Any]] = {}  # rank -> latest GPU reading
        self.gpu_history: dict[int, collections.deque] = {}  # rank -> [t, util, mem, temp, W]
        # rank -> fault key ("xid:79", "ecc", "remap_failure", "lost", ...) -> first seen
        self.gpu_faults: dict[int, dict[str, float]] = {}
        self.throttled_since: dict[int, float] = {}  # rank -> start of the current throttling
        self.attempt = 0  # the current attempt: the highest any session reported
        self.attempt_started: dict[int, float] = {0: 0.0}  # attempt -> its first event's time
        self.started_at: float | None = None
        self.last_event_at: float | None = None
        self.last_event_id = 0
        self.applied = 0
        self._summary_version = 0  # bumped by every event that may change summary()
        self._summary_memo: tuple[int, dict[str, Any]] | None = None
        self._ranks_memo: tuple[int, dict[int, RankState]] | None = None
        self._memo: dict[Hashable, Any] = {}  # see memo()
        self._memo_applied = 0

    def __setstate__(self, data: dict[str, Any]) -> None:
        """A stored checkpoint's state; one an earlier pgdash stored has its latency
        summaries upgraded to (end, count, sum_us, histogram) (see _upgraded_point)."""
        self.__dict__.update(data)
        self.__dict__.setdefault("exit_rows", {})  # checkpoints of earlier versions
        for key, window in self.recent.items():
            # A window is all old or all new (a loaded state is upgraded whole): its ends tell.
            if window and not (_current_point(window[0]) and _current_point(window[-1])):
                self.recent[key] = collections.deque(map(_upgraded_point, window),
                                                     maxlen=window.maxlen)

    # -- the fold ----------------------------------------------------------------------------

    def apply(self, ev: StoredEvent) -> None:
        self.applied += 1
        self.last_event_id = max(self.last_event_id, ev["id"])
        t = ev["t"]
        rank = self.sessions.get(ev["session"])
        memo = self._summary_memo
        if (ev["kind"] not in ROUTINE_KINDS or rank is None or rank.status == "lost"
                or self.started_at is None or t < self.started_at
                or memo is None or memo[1]["ended_at"] is not None):
            self._summary_version += 1
        if self.started_at is None or t < self.started_at:
            self.started_at = t
        self.last_event_at = t if self.last_event_at is None else max(self.last_event_at, t)
        if rank is None:
            rank = self.sessions[ev["session"]] = RankState(rank=None, session=ev["session"])
        if ev["kind"] not in ("disconnect",):
            rank.last_seen = max(rank.last_seen, t)
        if rank.first_seen is None or t < rank.first_seen:
            rank.first_seen = t
        handler = getattr(self, "_on_" + ev["kind"], None)
        if handler is not None:
            handler(rank, ev["body"], t)
        if self.observer is not None:
            self.observer.applied(self, rank, ev)

    def apply_all(self, events: Iterable[StoredEvent]) -> "JobState":
        for ev in events:
            self.apply(ev)
        return self

    def _set_attempt(self, r: RankState, attempt: int | None, t: float) -> None:
        """A session says which attempt it belongs to; a higher one than any so far is a
        restart of the job (torchrun --max-restarts): what the earlier attempt left in flight
        says nothing about the new one, so progress, waits and faults start afresh."""
        if attempt is None or attempt == r.attempt:
            return
        r.attempt = attempt
        if attempt <= self.attempt:
            return
        self.attempt = attempt
        self.attempt_started[attempt] = t
        for table in (self.progress, self.recent, self.fr_tallies, self.stacks,
                      self.gpu_faults, self.throttled_since):
            table.clear()

    def _stale(self, r: RankState) -> bool:
        """Whether a session belongs to an attempt the job has left behind."""
        return r.attempt < self.attempt

    def _on_hello(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.hello_at is None:
            r.hello_at = t
        self._set_attempt(r, body.get("attempt"), t)
        for key in ("rank", "host", "local_rank", "pid", "device", "backend", "world_size",
                    "versions", "env", "command", "launcher", "launcher_id"):
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
        if r.rank is None or self._stale(r):
            return
        per_group: dict[str, list] = {}  # one point per group and interval, all ops together
        second = int(body["end"])
        for row in body["rows"]:
            source = row.get("source", "wrapper")
            key = (row["group"], row["op"], r.rank, source)
            stats = self.collectives.get(key)
            if stats is None:
                stats = self.collectives[key] = LatencyStats()
            stats.add(row)
            if row.get("timing") == "host_poll":
                stats.resolution_us = max(stats.resolution_us or 0.0, row.get("resolution_us", 0.0))
            series_key = (row["group"], row["op"], source)
            series = self.op_seconds.get(series_key)
            if series is None:
                series = self.op_seconds[series_key] = {}
            merged = series.get(second)
            if merged is None:
                merged = series[second] = LatencyStats()
                if len(series) > OP_SECONDS:
                    del series[min(series)]
            merged.add(row)
            if row.get("timing") == "host_poll" or row["op"] in P2P_OPS:
                # Timed to a poll gap, not the collective: kept out of the time-inside-
                # collectives windows (heat map, straggler), which would read the gaps as waits.
                # A pipeline's receives wait for the stage before it to compute: no straggler
                # there either (its bubble makes the first stage wait least, always).
                continue
            point = per_group.get(row["group"])
            if point is None:
                point = per_group[row["group"]] = [body["end"], 0, 0.0, {}]
            point[1] += row["count"]
            point[2] += row["sum_us"]
            hist = point[3]
            for bucket, n in row["hist"]:
                hist[bucket] = hist.get(bucket, 0) + n
        for group, (end, count, sum_us, hist) in per_group.items():
            # The histogram stays so that the straggler rule can pool intervals: one flat
            # (bucket, count, bucket, count, ...) tuple, a third of the memory of pairs (a
            # 1,024-rank job holds 60 of them per rank and group).
            window = self.recent.get((group, r.rank))
            if window is None:
                window = self.recent[(group, r.rank)] = collections.deque(
                    maxlen=RECENT_INTERVALS)
            window.append((end, count, sum_us,
                           tuple(itertools.chain.from_iterable(sorted(hist.items())))))

    def _on_heartbeat(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.status == "lost":
            r.status, r.exit_at = "running", None
        elif r.status == "initializing" and body["groups"] and r.session not in self.init:
            # Progress of a group, though no init_process_group was seen (one imported by
            # name before the agent came, as DeviceMesh's): the rank is past its rendezvous.
            r.status = "running"
            self._summary_version += 1
        r.dropped = dict(body.get("dropped") or {})
        if r.rank is None or self._stale(r):
            return
        for row in body["groups"]:
            key = (row["group"], r.rank)
            self.progress[key] = dict(row, t=t)
            if row.get("fr_samples"):
                tallies = self.fr_tallies.get(key)
                if tallies is None:
                    tallies = self.fr_tallies[key] = collections.deque(maxlen=FR_TALLIES)
                tallies.append((t, row.get("fr_busy", 0), row["fr_samples"]))

    def _on_stack(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None and not self._stale(r):
            self.stacks[(body["group"], r.rank)] = dict(body, t=t)

    def _on_gpu(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is None or self._stale(r):
            return
        v = body["values"]
        self.gpus[r.rank] = {"t": t, "uuid": body["uuid"], "name": body.get("name"),
                             "lost": body["lost"], "reasons": body["reasons"], **v}
        history = self.gpu_history.get(r.rank)
        if history is None:
            history = self.gpu_history[r.rank] = collections.deque(maxlen=GPU_HISTORY)
        history.append([t, v.get("util_gpu"), v.get("mem_used"), v.get("temp_c"),
                        v.get("power_w")])
        faults = self.gpu_faults.setdefault(r.rank, {})
        keys = [f"xid:{x}" for x in body["xids"]]
        keys += [k for k, on in (("lost", body["lost"]),
                                 ("ecc", (v.get("ecc_uncorrected") or 0) > 0),
                                 ("remap_failure", (v.get("remap_failure") or 0) > 0),
                                 ("remap_pending", (v.get("remap_pending") or 0) > 0)) if on]
        for key in keys:
            faults.setdefault(key, t)
        if any(reason in THROTTLE_REASONS for reason in body["reasons"]):
            self.throttled_since.setdefault(r.rank, t)
        else:
            self.throttled_since.pop(r.rank, None)

    def _on_error(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self._record_error(r, body, t)
        if body["where"] == "uncaught":
            r.status = "failed"

    def _on_exit(self, r: RankState, body: dict[str, Any], t: float) -> None:
        r.status = "exited" if body["clean"] else "failed"
        r.exit_at = t
        r.exit_reason = body.get("reason")
        if self._stale(r):
            return
        for key, row in self.progress.items():
            if key[1] == r.rank:
                self.exit_rows[key] = dict(row)
                row["inflight_op"] = row["inflight_since"] = row["p2p_op"] = None

    def _on_left(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if body.get("group") is None and r.left_at is None:
            r.left_at = t

    def _on_connect(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self._set_attempt(r, body.get("attempt"), t)
        if r.rank is None and body.get("rank") is not None:
            r.rank = body["rank"]  # what the agent knew when it connected; hello may refine
            r.host = body.get("host") or r.host
        if r.status == "lost":
            r.status, r.exit_at = "running", None

    def _on_disconnect(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.status not in TERMINAL_RANK:
            r.status = "lost"
            r.exit_at = t

    def _record_error(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.errors.append({"rank": r.rank, "attempt": r.attempt, "t": t, **body})

    # -- derived views -----------------------------------------------------------------------

    def ranks(self) -> list[RankState]:
        """One entry per rank: the latest session that claimed it, in rank order."""
        return list(self.rank_index().values())

    def rank_index(self) -> dict[int, RankState]:
        """Rank -> the latest session of the current attempt that claimed it, in rank order
        (read-only). Earlier attempts' ranks are history (see attempt_rows), not diagnosed.

        Which session holds a rank changes only with the events that may change the summary,
        so it is remembered likewise: diagnosis asks once per group, hundreds of times.
        """
        memo = self._ranks_memo
        if memo is not None and memo[0] == self._summary_version:
            return memo[1]
        index = self._ranks_of(self.attempt)
        self._ranks_memo = (self._summary_version, index)
        return index

    def _ranks_of(self, attempt: int) -> dict[int, RankState]:
        by_rank: dict[int, RankState] = {}
        for r in self.sessions.values():
            if r.rank is not None and r.attempt == attempt:
                by_rank[r.rank] = r
        return {k: by_rank[k] for k in sorted(by_rank)}

    @property
    def world_size(self) -> int | None:
        return self.summary()["world_size"]

    @property
    def backend(self) -> str | None:
        return self.summary()["backend"]

    @property
    def status(self) -> str:
        return self.summary()["status"]

    @property
    def ended_at(self) -> float | None:
        return self.summary()["ended_at"]

    def summary(self) -> dict[str, Any]:
        """The job as /api/jobs lists it; the properties above read it.

        World size and backend are what most ranks say; how the job was launched (command,
        launcher, launcher_id) is what rank 0 of the current attempt said, else the first
        session of it that said it; ``attempt`` is the current attempt. Ingest asks before
        and after every batch, so at 1,024 ranks it is one pass over the sessions, remembered
        until an event that may change it is applied (not the routine heartbeats and
        summaries of a running job: see ROUTINE_KINDS).
        """
        memo = self._summary_memo
        if memo is not None and memo[0] == self._summary_version:
            return dict(memo[1])
        by_rank = self.rank_index()
        sizes: dict[int, int] = {}
        backends: dict[str, int] = {}
        for r in self.sessions.values():
            if r.attempt != self.attempt:
                continue
            if r.world_size:
                sizes[r.world_size] = sizes.get(r.world_size, 0) + 1
            if r.backend:
                backends[r.backend] = backends.get(r.backend, 0) + 1
        world_size = max(sizes, key=sizes.get) if sizes else None  # first of the most common
        backend = max(backends, key=backends.get) if backends else None
        status, ended_at = _status_of(by_rank, world_size, self.last_event_at)
        launched = by_rank.get(0)
        if launched is None or launched.launcher is None:
            launched = next((r for r in self.sessions.values()
                             if r.attempt == self.attempt and r.launcher is not None), None)
        summary = {"id": self.job_id, "name": self.name, "status": status,
                   "world_size": world_size, "backend": backend,
                   "started_at": self.started_at, "ended_at": ended_at,
                   "attempt": self.attempt,
                   **{key: getattr(launched, key, None)
                      for key in ("command", "launcher", "launcher_id")}}
        self._summary_memo = (self._summary_version, summary)
        return dict(summary)

    def attempt_rows(self) -> list[dict[str, Any]]:
        """Each attempt of the job (torchrun restarts it after a failure), oldest first:
        when it started and ended, how it ended, and its ranks. An earlier attempt that never
        ended by itself was ended by the restart: it failed."""
        rows = []
        for attempt in sorted({r.attempt for r in self.sessions.values()} | {self.attempt}):
            ranks = self._ranks_of(attempt)
            members = [r for r in self.sessions.values() if r.attempt == attempt]
            sizes = collections.Counter(r.world_size for r in members if r.world_size)
            world_size = sizes.most_common(1)[0][0] if sizes else None
            status, ended_at = _status_of(ranks, world_size, self.last_event_at)
            if attempt < self.attempt:
                following = min(a for a in self.attempt_started if a > attempt)
                if status not in ("finished", "failed"):
                    status, ended_at = "failed", self.attempt_started[following]
            starts = [r.first_seen for r in members if r.first_seen is not None]
            rows.append({"attempt": attempt, "started_at": min(starts) if starts else None,
                         "ended_at": ended_at, "status": status, "world_size": world_size,
                         "ranks": [rank_row(r) for r in ranks.values()]})
        return rows

    def current_init(self) -> dict[str, dict[str, Any]]:
        """Session -> rendezvous timeline, for the sessions of the current attempt."""
        return {session: entry for session, entry in self.init.items()
                if self.sessions[session].attempt == self.attempt}

    def op_stats(self, families: dict[str, str] | None = None
                 ) -> dict[tuple[str, str, str], tuple[LatencyStats, set[str], set[int]]]:
        """(family, op, source) -> (every rank's statistics merged, its groups, its ranks)."""
        families = self.families() if families is None else families
        merged: dict[tuple[str, str, str], tuple[LatencyStats, set[str], set[int]]] = {}
        for (g, o, rk, src), s in self.collectives.items():
            key = (families.get(g, g), o, src)
            entry = merged.get(key)
            if entry is None:
                entry = merged[key] = (LatencyStats(), set(), set())
            total, groups, ranks = entry
            total.merge(s)
            groups.add(g)
            ranks.add(rk)
        return merged

    def families(self) -> dict[str, str]:
        """Group name -> its family: the description it shares with others, else its name."""
        return {name: family_of(g) for name, g in self.groups.items()}

    def progress_of(self, group: str) -> dict[int, dict[str, Any]]:
        """Progress rows of one group by rank (read-only; indexed once per state version)."""
        return self.grouped("progress").get(group, {})

    def fr_tallies_of(self, group: str) -> dict[int, collections.deque]:
        """Flight Recorder busy tallies of one group by rank (read-only, indexed likewise)."""
        return self.grouped("fr_tallies").get(group, {})

    def flight_only(self, group: str) -> bool:
        """Whether the group's collectives were seen only by the Flight Recorder (DDP's, in
        C++), not by the agent's Python wrappers."""
        rows = self.progress_of(group).values()
        return not any(row["entered"] for row in rows) and any(
            row.get("fr_enqueued") for row in rows)

    def recent_of(self, group: str) -> dict[int, collections.deque]:
        """Recent latency summaries of one group by rank (read-only, indexed likewise)."""
        return self.grouped("recent").get(group, {})

    def grouped(self, table: str) -> dict[str, dict[int, Any]]:
        """One of the per (group, rank) tables (``progress``, ``recent``, ``fr_tallies``) as
        group -> rank -> value (read-only; indexed once per state version)."""
        # Diagnosis asks per group for hundreds of groups at 1,024 ranks: one pass, not one
        # per group.
        def build() -> dict[str, dict[int, Any]]:
            grouped: dict[str, dict[int, Any]] = collections.defaultdict(dict)
            for (group, rank), value in getattr(self, table).items():
                grouped[group][rank] = value
            return grouped

        return self.memo(("grouped", table), build)

    def memo(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, remembered until the next event is applied (for read-only indexes
        that views and diagnosis would otherwise rebuild per group)."""
        if self._memo_applied != self.applied or len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
            self._memo_applied = self.applied
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def claims(self, rank: int | None, session: str, attempt: int = 0) -> bool:
        """Whether another session of that attempt already holds ``rank`` in this job."""
        if rank is None:
            return False
        return any(r.rank == rank and s != session and r.attempt == attempt
                   for s, r in self.sessions.items())


def _current_point(point: tuple) -> bool:
    return len(point) == 4 and isinstance(point[3], tuple)


def _upgraded_point(point: tuple) -> tuple:
    """A latency summary point as older checkpoints stored it, in today's layout: (end, count,
    sum_us, p50_us, p25_us, histogram) drops its two quantiles (nothing read them); (end,
    count, sum_us, p50_us, p25_us), kept before histograms were, puts all its collectives in
    the bucket of its lower quartile (of its mean, before quartiles were kept)."""
    if _current_point(point):
        return point
    if len(point) >= 6:
        return tuple(point[:3]) + (point[5],)
    end, count, sum_us = point[:3]
    typical = point[4] if len(point) > 4 else sum_us / max(1, count)
    return end, count, sum_us, (hist_bucket(typical), count) if count > 0 else ()


def _status_of(by_rank: dict[int, RankState], world_size: int | None,
               last_event_at: float | None) -> tuple[str, float | None]:
    """(status, ended_at) of a job, or of one attempt, from its ranks."""
    statuses = collections.Counter(r.status for r in by_rank.values())
    if not by_rank:
        status = "initializing"
    elif sum(statuses[k] for k in TERMINAL_RANK) == len(by_rank):
        complete = world_size is None or len(by_rank) >= world_size
        status = "finished" if statuses["exited"] == len(by_rank) and complete else "failed"
    elif statuses["running"] or statuses["exited"]:
        status = "running"
    else:
        status = "initializing"
    ended_at = None
    if status in ("finished", "failed"):
        ends = [r.exit_at for r in by_rank.values() if r.exit_at is not None]
        ended_at = max(ends) if ends else last_event_at
    return status, ended_at


def quantile_us(hist: dict[int, int], q: float, default: float) -> float:
    """Quantile ``q`` of a latency histogram (bucket -> count): at least ``q`` of the
    collectives took at most this long (the bucket's middle); ``default`` when it is empty."""
    target = q * sum(hist.values())
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= target:
            return hist_bucket_value(bucket)
    return default


def rank_row(r: RankState) -> dict[str, Any]:
    """One rank as the API shows it."""
    return {"rank": r.rank, "attempt": r.attempt, "host": r.host,
            "local_rank": r.local_rank, "pid": r.pid, "device": r.device,
            "status": r.status, "last_seen": r.last_seen, "dropped": r.dropped}


def family_of(group: dict[str, Any]) -> str:
    """The family a group belongs to: its description unless torch left it generic."""
    desc = group.get("desc")
    return desc if desc and desc != "undefined" else group["name"]


def group_order(name: str) -> tuple[int, Any]:
    """Groups in the order people count them: numbered ones by number, then by name."""
    return (0, int(name)) if name.isdigit() else (1, name)
