"""The fold: a job's data and how each event kind changes it.

``Fold.apply`` takes stored events in log order and hands each to the method named for its kind
(``_on_hello``, ``_on_heartbeat``, ...): a new event kind is one such method here (and one
reading in dashboard.history.trace_reading, or a line in its NOT_DRAWN). What the API, the page
and diagnosis ask of the data is JobState's (dashboard.state.job), a subclass: this module
writes, that one reads. No Flask, no SQL, no clock.
"""

from __future__ import annotations

import collections
from typing import Any, Hashable, Iterable, Protocol, TypeVar

from dashboard.state.latency import LatencyStats, per_family, upgraded_windows
from dashboard.state.readings import GpuHistory
from dashboard.state.recent import RecentWindows
from dashboard.state.records import (TERMINAL_RANK, RankState, StoredEvent, family_of,
                                     group_order)
from dashboard.state.summaries import PendingSummaries, fold_summaries
from dashboard.state.totals import LatencyTable

# Events that leave the job summary (status, world size, backend, start) as it was, unless
# the rank was lost (a heartbeat revives it), the event starts the job earlier, or the job
# has ended (its end time then follows the last event).
ROUTINE_KINDS = frozenset({"heartbeat", "coll_stats", "stack", "gpu", "group", "snapshot"})
# Server events that say nothing of the session's own agent being alive: its connection
# closed, or its host reader read a rank or sent the boards of its host's ranks (the session
# that started the reader may be the one frozen, or gone).
UNHEARD_KINDS = frozenset({"disconnect", "read", "boards"})
# What a board's row replaces of a heartbeat's (the call in flight: none, unless it says so).
_BOARD_CLEARED = {"inflight_op": None, "inflight_since": None, "inflight_dtype": None,
                  "inflight_bytes": None, "inflight_root": None, "done_op": None,
                  "done_dtype": None, "done_bytes": None}
FR_TALLIES = 30  # heartbeats of Flight Recorder busy tallies kept per (group, rank)
GPU_HISTORY = 120  # GPU readings kept per rank (about two minutes)
# Clock-event reasons that mean the GPU is slowed by heat or power trouble (not just busy).
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                    "hw_power_brake_slowdown")
MAX_ERRORS = 200  # verbatim error texts kept per job (the log keeps them all)
MAX_SNAPSHOT_ANSWERS = 2048  # snapshot answers kept, of the newest requests
MAX_PEER_REQUESTS = 32  # requests whose "peer" readings are kept ...
MAX_PEER_RANKS = 16  # ... of this many silent ranks each (the server asks for 8 at most)
# Latency summaries waiting to be folded together, at most (~10 MB of columns; see _pending)
PENDING_SUMMARIES = 4096
F = TypeVar("F", bound="Fold")  # apply_all returns what it was called on (a JobState)
# (class, event kind) -> its handler (Fold._on_<kind>), or None for a kind not folded
_HANDLERS: dict[tuple[type, str], Any] = {}


class StateObserver(Protocol):
    """What reads the fold event by event (the trace export): told of each event right after
    JobState folded it, with the session it was folded into, so that it reads who the session
    is (rank, host, pid, first seen) and the job's groups from the fold instead of folding
    them a second time."""

    def applied(self, state: "Fold", session: RankState, ev: StoredEvent) -> None: ...


class Fold:
    """A job's data after the events applied so far (see JobState for what is read of it).

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
        # Latency summaries (coll_stats bodies) applied and not yet folded: they are
        # folded together (dashboard.state.summaries) when the tables they go
        # into (collectives, op_seconds, recent) are read, before a change of what folding
        # them depends on (a group's family, a new attempt), or PENDING_SUMMARIES wait.
        self._pending = PendingSummaries()
        # (group, op, rank, source) -> stats; source "wrapper" (Python-issued) or
        # "flight_recorder" (issued from C++, read from the Flight Recorder)
        self._collectives = LatencyTable()
        self.progress: dict[tuple[str, int], dict[str, Any]] = {}
        # rank -> when its heartbeat last showed its collectives (or point-to-point ops) move
        # on, and the longest any rank went without (rules.idle: a job whose every rank
        # stopped issuing collectives, all outside them)
        self.moved_at: dict[int, float] = {}
        self.longest_pause = 0.0
        # rank -> per pair of its groups (in group order) the least and most difference of
        # their collective counts its heartbeats showed: ranks that run one program keep them
        # alike, and a rank that called a collective on the wrong group leaves them
        # (rules.waits.out_of_step names it in a cycle of waits)
        self.count_spread: dict[int, list[int]] = {}
        # rank -> [t, CPU seconds, I/O bytes] at its last move, then the same now (heartbeats'
        # ``cpu_s`` and ``io_b``): whether a rank that stopped issuing collectives works or
        # is blocked
        self.cpu_since_move: dict[int, list[float]] = {}
        # (group, mark level) -> the newest FP_SEQS collective numbers at that level ranks'
        # heartbeats reported a call fingerprint for -> rank -> (fingerprint, t): ranks whose
        # fingerprints differ at one number called something different (rules.desync)
        self.fingerprints: dict[tuple[str, int], dict[int, dict[int, tuple[int, float]]]] = {}
        # group name -> its members as each rank reported them -> reporting rank -> when (as
        # many entries as the groups have members): torch names a group by how many the
        # process made before it, so a rank that skipped a new_group call gives a later group
        # another group's name (rules.desync)
        self.group_views: dict[str, dict[tuple[int, ...], dict[int, float]]] = {}
        # rank -> (new_group calls its process made, the fingerprints of all its calls after
        # each of the newest, when it first reported that many): every rank must make the
        # same calls in the same order (rules.desync)
        self.groups_made: dict[int, tuple[int, tuple[int, ...], float]] = {}
        self.errors: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_ERRORS)
        self.init: dict[str, dict[str, Any]] = {}  # session -> rendezvous timeline
        self.stacks: dict[tuple[str, int], dict[str, Any]] = {}  # (group, rank) -> last stack
        # (group, rank) -> the progress row as it was when the rank exited (the row itself
        # then shows nothing in flight): what it was waiting in when a hung job was stopped
        self.exit_rows: dict[tuple[str, int], dict[str, Any]] = {}
        # rank -> its keys of ``progress``, and how many keys there were (progress only
        # grows, but on a new attempt): built when a rank exits, not stored
        self._progress_index: tuple[int, dict[int, list[tuple[str, int]]]] | None = None
        # (group, rank) -> recent (end, count, sum_us, histogram) summaries, all ops of the
        # group together, for the straggler and slow rules (the histograms' quantiles tell a
        # peer late at nearly every collective from a few long waits, or from waits spread
        # at random) and the heat map, as columns (dashboard.state.recent)
        self._recent = RecentWindows()
        # (group, rank) -> per heartbeat (t, samples in flight, samples) of the Flight Recorder,
        # for groups whose collectives run in C++ (how long a rank waits inside DDP's)
        self.fr_tallies: dict[tuple[str, int], collections.deque] = {}
        # (family, op, source) -> whole second of the agents' clocks -> every rank's summaries
        # (the latency chart's; OP_SECONDS of them; older checkpoints hold group names)
        self._op_seconds: dict[tuple[str, str, str], dict[int, LatencyStats]] = {}
        self.family_of: dict[str, str] = {}  # group name -> its family (records.family_of)
        # request id -> rank -> its answer (pgdash_agent.snapshots), of the newest requests
        self.snapshots: dict[str, dict[int, dict[str, Any]]] = {}
        self.snapshot_answers = 0  # answers in ``snapshots`` (MAX_SNAPSHOT_ANSWERS at most)
        # request id -> silent rank -> another rank's reading of it from outside ("peer"
        # answers: py-spy's dump, or why there is none), of the newest MAX_PEER_REQUESTS
        self.snapshot_peers: dict[str, dict[int, dict[str, Any]]] = {}
        self.gpus: dict[int, dict[str, Any]] = {}  # rank -> latest GPU reading
        self.gpu_history: dict[int, GpuHistory] = {}  # rank -> [t, util, mem, temp, W], ...
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

    def __getstate__(self) -> dict[str, Any]:
        self.fold_pending()
        data = dict(self.__dict__)
        del data["_pending"]
        data.pop("_progress_index", None)
        return data

    def __setstate__(self, data: dict[str, Any]) -> None:
        """A stored checkpoint's state; one an earlier pgdash stored has its latency
        totals and summaries upgraded to today's tables (see latency.upgraded_windows)."""
        for name in ("collectives", "op_seconds", "recent"):  # earlier versions' names
            if name in data:
                data["_" + name] = data.pop(name)
        self.__dict__.update(data)
        self._pending = PendingSummaries()
        self._progress_index = None
        self.__dict__.setdefault("exit_rows", {})  # checkpoints of earlier versions
        self.__dict__.setdefault("snapshots", {})
        self.__dict__.setdefault("snapshot_answers", 0)
        self.__dict__.setdefault("snapshot_peers", {})
        self.__dict__.setdefault("moved_at", {})
        self.__dict__.setdefault("longest_pause", 0.0)
        self.__dict__.setdefault("count_spread", {})
        self.__dict__.setdefault("cpu_since_move", {})
        self.__dict__.setdefault("fingerprints", {})
        self.__dict__.setdefault("group_views", {})
        self.__dict__.setdefault("groups_made", {})
        self.__dict__.pop("_kept", None)  # what views kept beside the fold (stored empty)
        for rank, history in self.gpu_history.items():  # earlier versions: a deque of lists
            if not isinstance(history, GpuHistory):
                self.gpu_history[rank] = GpuHistory(GPU_HISTORY, history)
        if "family_of" not in data:  # checkpoints of earlier versions: series per group
            self.family_of = {name: family_of(g) for name, g in self.groups.items()}
            self._op_seconds = per_family(self._op_seconds, self.family_of)
        if isinstance(self._recent, dict):
            # Checkpoints of earlier versions: a deque of tuples per (group, rank).
            self._recent = upgraded_windows(self._recent)
        if isinstance(self._collectives, dict):  # earlier versions: LatencyStats per key
            self._collectives = LatencyTable.of(self._collectives)

    # -- the latency tables (folded when read) -------------------------------------------------

    def fold_pending(self) -> None:
        """Fold the latency summaries applied since the last time (see ``_pending``)."""
        if self._pending:
            batch, self._pending = self._pending, PendingSummaries()
            fold_summaries(self._collectives, self._op_seconds, self._recent, batch,
                           self.family_of)

    @property
    def collectives(self) -> LatencyTable:
        self.fold_pending()
        return self._collectives

    @property
    def op_seconds(self) -> dict[tuple[str, str, str], dict[int, LatencyStats]]:
        self.fold_pending()
        return self._op_seconds

    @property
    def recent(self) -> RecentWindows:
        self.fold_pending()
        return self._recent

    @recent.setter
    def recent(self, value: RecentWindows) -> None:
        self.fold_pending()
        self._recent = value

    # -- the fold ----------------------------------------------------------------------------

    def apply(self, ev: StoredEvent) -> None:
        # Every event of every job passes here (live and replay): comparisons instead of
        # max(), the handler from a per-class table instead of getattr on a built name.
        self.applied += 1
        if self._memo:  # what memo() remembered holds until an event is applied: free it now
            self._memo.clear()
        if ev["id"] > self.last_event_id:
            self.last_event_id = ev["id"]
        t = ev["t"]
        kind = ev["kind"]
        session = ev["session"]
        rank = self.sessions.get(session)
        started_at = self.started_at
        if (kind not in ROUTINE_KINDS or rank is None or rank.status == "lost"
                or started_at is None or t < started_at
                or self._summary_memo is None or self._summary_memo[1]["ended_at"] is not None):
            self._summary_version += 1
        if started_at is None or t < started_at:
            self.started_at = t
        if self.last_event_at is None or t > self.last_event_at:
            self.last_event_at = t
        if rank is None:
            rank = self.sessions[session] = RankState(rank=None, session=session)
        if kind not in UNHEARD_KINDS and t > rank.last_seen:
            rank.last_seen = t
        if rank.first_seen is None or t < rank.first_seen:
            rank.first_seen = t
        try:
            handler = _HANDLERS[type(self), kind]
        except KeyError:
            handler = _HANDLERS[type(self), kind] = getattr(type(self), "_on_" + kind, None)
        if handler is not None:
            handler(self, rank, ev["body"], t)
        if self.observer is not None:
            self.observer.applied(self, rank, ev)

    def apply_all(self: F, events: Iterable[StoredEvent]) -> F:
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
        self.fold_pending()  # the summaries of the attempt before go where they belong
        for table in (self.progress, self._recent, self.fr_tallies, self.stacks,
                      self.gpu_faults, self.throttled_since, self.moved_at,
                      self.count_spread, self.cpu_since_move, self.fingerprints,
                      self.group_views, self.groups_made):
            table.clear()
        self.longest_pause = 0.0
        self._progress_index = None

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
        if (self.init.get(r.session) or {}).get("done_at"):
            self._new_world(r)
        self.init[r.session] = {"arrived_at": t, "done_at": None, "error": None,
                                **{k: body.get(k) for k in ("init_method", "backend", "rank",
                                                            "world_size", "master_addr",
                                                            "master_port", "timeout_s")}}
        if r.rank is None and body.get("rank") not in (None, -1):
            r.rank = body["rank"]
        r.status = "initializing"

    def _on_init_done(self, r: RankState, body: dict[str, Any], t: float) -> None:
        r.rank, r.world_size = body["rank"], body["world_size"]
        if (self.init.get(r.session) or {}).get("done_at"):  # (its init_start not seen)
            self._new_world(r)
        r.backend = body.get("backend") or r.backend
        self.init.setdefault(r.session, {"arrived_at": t - body["duration_s"]})["done_at"] = t
        if r.status not in TERMINAL_RANK:
            r.status = "running"

    def _new_world(self, r: RankState) -> None:
        """A process that makes its world again numbers its groups and counts its new_group
        calls afresh: what it reported of its groups before goes."""
        for views in self.group_views.values():
            for who in views.values():
                who.pop(r.rank, None)
        self.groups_made.pop(r.rank, None)

    def _on_init_failed(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.init.setdefault(r.session, {"arrived_at": t - body["duration_s"]})["error"] = body
        self._record_error(r, body, t)
        r.status = "failed"

    def _on_group(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None and not self._stale(r):
            views = self.group_views.setdefault(body["name"], {})
            views.setdefault(tuple(body["ranks"]), {}).setdefault(r.rank, t)
        group = self.groups.get(body["name"])
        if group is None or group["ranks"] != body["ranks"]:
            self.fold_pending()  # the summaries so far count in the family they had
            group = self.groups[body["name"]] = {"name": body["name"],
                                                 "desc": body.get("desc"),
                                                 "backend": body.get("backend"),
                                                 "ranks": list(body["ranks"])}
            self.family_of[body["name"]] = family_of(group)

    def _on_coll_stats(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None and not self._stale(r):
            self._pending.add(r.rank, body)
            if len(self._pending) >= PENDING_SUMMARIES:
                self.fold_pending()

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
        made = body.get("groups_made")
        if made:
            marks = tuple(body.get("groups_made_fp") or ())
            if self.groups_made.get(r.rank, (None, None))[:2] != (made, marks):
                self.groups_made[r.rank] = (made, marks, t)
        moved = False
        for row in body["groups"]:
            key = (row["group"], r.rank)
            old = self.progress.get(key)
            stored = self.progress[key] = dict(row, t=t)
            marks = stored.pop("fp", None)  # (kept apart: self.fingerprints)
            if not moved:
                moved = _counts(row) != (_counts(old) if old is not None else _NO_COUNTS)
            if marks:
                note_fingerprints(self.fingerprints, row["group"], r.rank, marks, t)
            if row.get("fr_samples"):
                tallies = self.fr_tallies.get(key)
                if tallies is None:
                    tallies = self.fr_tallies[key] = collections.deque(maxlen=FR_TALLIES)
                tallies.append((t, row.get("fr_busy", 0), row["fr_samples"]))
        if moved:
            before = self.moved_at.get(r.rank)
            if before is not None and t - before > self.longest_pause:
                self.longest_pause = t - before
            self.moved_at[r.rank] = t
            spread_counts(self.count_spread, r.rank, body["groups"])
        cpu = body.get("cpu_s")
        if cpu is not None:
            io = body.get("io_b") or 0
            kept = self.cpu_since_move.get(r.rank)
            if moved or kept is None:
                self.cpu_since_move[r.rank] = [t, cpu, io, t, cpu, io]
            else:
                kept[3:] = t, cpu, io
        if body.get("main_done"):
            use = [t, cpu or 0.0, body.get("io_b") or 0]
            r.main_done = use + use if r.main_done is None else r.main_done[:3] + use
            r.holding = tuple(body.get("holding") or ())

    def _on_boards(self, r: RankState, body: dict[str, Any], t: float) -> None:
        """A host reader's last words (pgdash_agent.board): where each rank of its host stood
        in each group when the reader ended, written by the rank itself at every collective,
        so still there after a death that let its agent say nothing (gloo's abort, the
        launcher's SIGTERM). A group's row replaces the rank's heartbeat's where the board has
        it as far or further, for the process that heartbeat came from (the same pid): the
        rank's progress as it ended. Marked ``board`` (not a heartbeat: nothing moved). How
        the process ended, where the reader saw, is the rank's ``ended``."""
        by_rank = {s.rank: s for s in self.sessions.values()
                   if s.rank is not None and s.attempt == r.attempt}
        for board in body["boards"]:
            owner = by_rank.get(board["rank"])
            if owner is None or owner.pid != board["pid"] or self._stale(owner):
                continue
            if board.get("ended") and not board["alive"]:
                owner.ended = board["ended"]
            for row in board["groups"]:
                key = (row["group"], board["rank"])
                old = self.progress.get(key)
                if old is not None and row["entered"] < old["entered"]:
                    continue
                stored = dict(old or {}, **_BOARD_CLEARED)
                stored.update(row, t=t, board=True)
                self.progress[key] = stored

    def _on_stack(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None and not self._stale(r):
            self.stacks[(body["group"], r.rank)] = dict(body, t=t)

    def _on_snapshot(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is not None and body.get("for_rank") is not None:  # read from outside
            self._on_read(r, body, t)
        elif r.rank is not None:
            self.snapshot_answers = keep_answer(self.snapshots, self.snapshot_answers, r,
                                                body, t)

    def _on_read(self, r: RankState, body: dict[str, Any], t: float) -> None:
        """A silent rank read from outside: by another rank's agent (a ``snapshot`` with
        ``for_rank``), or by the host reader ``r``'s rank started (a ``read``: ``reader_pid``).
        ``by`` is ``r``'s rank either way."""
        peers = self.snapshot_peers.setdefault(body["ask"], {})
        if len(peers) < MAX_PEER_RANKS or body["for_rank"] in peers:
            peers[body["for_rank"]] = dict(body, t=t, by=r.rank)
        while len(self.snapshot_peers) > MAX_PEER_REQUESTS:
            del self.snapshot_peers[next(iter(self.snapshot_peers))]

    def _on_gpu(self, r: RankState, body: dict[str, Any], t: float) -> None:
        if r.rank is None or self._stale(r):
            return
        v = body["values"]
        self.gpus[r.rank] = {"t": t, "uuid": body["uuid"], "name": body.get("name"),
                             "lost": body["lost"], "reasons": body["reasons"], **v}
        history = self.gpu_history.get(r.rank)
        if history is None:
            history = self.gpu_history[r.rank] = GpuHistory(GPU_HISTORY)
        history.append([t, v.get("util_gpu"), v.get("mem_used"), v.get("temp_c"),
                        v.get("power_w")])
        faults = self.gpu_faults.setdefault(r.rank, {})
        for key in gpu_fault_keys(body):
            faults.setdefault(key, t)
        reasons = body["reasons"]
        if reasons and any(reason in THROTTLE_REASONS for reason in reasons):
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
        for key in self._progress_keys(r.rank):
            row = self.progress[key]
            self.exit_rows[key] = dict(row)
            row["inflight_op"] = row["inflight_since"] = row["p2p_op"] = None

    def _progress_keys(self, rank: int) -> list[tuple[str, int]]:
        """The rank's keys of ``progress``. When a job ends, its ranks exit one after the
        other: a pass over every rank's rows for each was quadratic (16,384 ranks: ~10^9
        rows looked at), so the keys are indexed by rank once per set of keys."""
        index = self._progress_index
        if index is None or index[0] != len(self.progress):
            by_rank: dict[int, list[tuple[str, int]]] = {}
            for key in self.progress:
                by_rank.setdefault(key[1], []).append(key)
            index = self._progress_index = (len(self.progress), by_rank)
        return index[1].get(rank, [])

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
            r.closed_owed_s = body.get("owed_s") or 0.0
            r.closed_goodbye = bool(body.get("goodbye"))

    def _record_error(self, r: RankState, body: dict[str, Any], t: float) -> None:
        self.errors.append({"rank": r.rank, "attempt": r.attempt, "t": t, **body})


_NO_COUNTS = (0, 0, 0, 0, 0)
# The groups of a rank whose counts are compared pairwise (its first, in group order): a
# mesh has a few dimensions, and a job that makes a group every epoch would otherwise cost
# a heartbeat ever more pairs.
SPREAD_GROUPS = 8


def pair_differences(rows: list[dict[str, Any]]) -> list[int]:
    """For each pair of a rank's first SPREAD_GROUPS groups (in group order), how many more
    collectives it entered on the second than on the first (either view: the Flight
    Recorder's count, which holds C++-issued ones too, where it has one)."""
    counts = [row.get("fr_enqueued") or row.get("entered", 0)
              for row in sorted(rows, key=lambda row: group_order(row["group"]))
              [:SPREAD_GROUPS]]
    return [counts[j] - counts[i] for i in range(len(counts)) for j in range(i + 1,
                                                                             len(counts))]


def spread_counts(spread: dict[int, list[int]], rank: int, rows: list[dict[str, Any]]) -> None:
    """Widen ``rank``'s spread (least, most, least, most, ... per pair) to its rows now."""
    diffs = pair_differences(rows)
    if not diffs:
        return
    kept = spread.get(rank)
    if kept is None or len(kept) != 2 * len(diffs):  # (a group more: start afresh)
        spread[rank] = [v for d in diffs for v in (d, d)]
        return
    for i, d in enumerate(diffs):
        if d < kept[2 * i]:
            kept[2 * i] = d
        elif d > kept[2 * i + 1]:
            kept[2 * i + 1] = d


FP_SEQS = 2  # collective numbers kept per group and mark level (the newest may be partial)


def note_fingerprints(kept: dict, group: str, rank: int, marks: list, t: float) -> None:
    """File a rank's call fingerprints (``[[seq, hash], ...]``, one per mark level) under
    their collective numbers, keeping the newest FP_SEQS numbers per group and level."""
    for level, (seq, fp) in enumerate(marks):
        by_seq = kept.get((group, level))
        if by_seq is None:
            by_seq = kept[(group, level)] = {}
        seen = by_seq.get(seq)
        if seen is None:
            if len(by_seq) >= FP_SEQS and seq < min(by_seq):
                continue  # older than every number kept
            seen = by_seq[seq] = {}
            while len(by_seq) > FP_SEQS:
                del by_seq[min(by_seq)]
        if rank not in seen:
            seen[rank] = (fp, t)


def _counts(row: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """What a progress row counts: collectives entered and completed in either view, and
    point-to-point ops posted."""
    posted = row.get("p2p_posted")
    return (row.get("entered", 0), row.get("completed", 0), row.get("fr_enqueued", 0),
            row.get("fr_completed", 0), sum(posted.values()) if posted else 0)


def keep_answer(snapshots: dict[str, dict[int, dict[str, Any]]], kept: int, r: RankState,
                body: dict[str, Any], t: float) -> int:
    """File a rank's snapshot answer under its request and return how many answers are kept:
    those of the newest requests, MAX_SNAPSHOT_ANSWERS at most (two of every rank of a
    1,024-rank job: an answer is ~50 frames); the log keeps them all."""
    answers = snapshots.get(body["ask"])
    if answers is None:
        answers = snapshots[body["ask"]] = {}
    kept += r.rank not in answers
    answers[r.rank] = dict(body, t=t, session=r.session)
    while kept > MAX_SNAPSHOT_ANSWERS and len(snapshots) > 1:
        kept -= len(snapshots.pop(next(iter(snapshots))))
    return kept


def gpu_fault_keys(reading: dict[str, Any]) -> list[str]:
    """The faults a GPU reading reports: ``xid:<n>`` per XID, ``lost``, ``ecc`` (uncorrected
    errors), ``remap_failure`` and ``remap_pending`` (row remapping)."""
    v = reading["values"]
    keys = [f"xid:{x}" for x in reading["xids"]]
    keys += [k for k, on in (("lost", reading["lost"]),
                             ("ecc", (v.get("ecc_uncorrected") or 0) > 0),
                             ("remap_failure", (v.get("remap_failure") or 0) > 0),
                             ("remap_pending", (v.get("remap_pending") or 0) > 0)) if on]
    return keys
