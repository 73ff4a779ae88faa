"""Collective tracking: each group's progress on this rank, and its collectives' summaries.

The wrappers (``pgdash_agent.collective_wrappers``) run on the training thread and only write
here: a group's sequence numbers and the collective in flight (:class:`GroupTrack`), one
record per call into a bounded deque, one item per ``async_op=True`` work. Everything else
happens on the agent's background thread, in :class:`CollectiveTracker`: completion of async
works, latency histograms, per-interval summaries, the per-group progress a heartbeat carries
(what a hang looks like) and the groups stuck in one collective. Its own room because it is
the state both threads share, kept apart from the hot path that fills it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pgdash_agent.flight_stats import WrappedIntervals
from pgdash_agent.wire import SIZED, LatencySummary


RECENT_COLLECTIVES = 256  # collectives a snapshot shows, the newest (all groups together)
# The fingerprints of this many of a process's newest new_group calls go in each heartbeat.
GROUPS_MADE_KEPT = 8
MAX_LAST_CALLS = 8  # groups whose last collective a failure reports


@dataclass(eq=False, slots=True)
class GroupTrack:
    """Progress of one process group as seen from this rank (written by the training thread)."""

    name: str
    desc: str | None
    backend: str | None
    ranks: list[int]
    entered: int = 0  # collectives entered (the group's sequence number)
    completed: int = 0  # highest sequence number completed
    p2p: int = 0  # point-to-point operations entered
    inflight: tuple | None = None  # (op, dtype, bytes, root) of the collective entered last
    # The root (global rank: a broadcast's or scatter's src, a reduce's or gather's dst) of
    # the collective numbered ``completed``, None for one without: what ranks that are past a
    # collective say about it when two ranks inside it disagree on the root (rules.desync)
    done_root: int | None = None
    # (op, dtype, bytes, root) of the collective numbered ``completed``: a collective that
    # raises is reported with it (rules.desync: the rank whose size changed from its call
    # before, in a size mismatch that aborted another rank)
    done: tuple | None = None
    before: tuple = (0, None)  # (completed, done) as they were before the last completion
    inflight_since: float = 0.0  # perf_counter() at enter
    # The backend's sequence number (``pg._get_sequence_number_for_group``), read around each
    # wrapped collective so that the Flight Recorder's entries of it are not counted again
    # (pgdash_agent.flight_stats); None where the backend has none.
    fr_seq: Callable[[], int] | None = None
    fr_open: int | None = None  # the number before a wrapped collective still running
    # Up to here every number counts as the wrapper's: intervals that could not be kept
    # (bounded queues full) must never be counted again from the Flight Recorder.
    fr_lost_upto: int = -1
    fr_last: int | None = None  # the number after the last wrapped call: up to it, all Python's
    # Point-to-point: ops posted per (direction, peer, tag) so far, "send:3:0" -> count (the
    # server matches a recv's number against its peer's sends: P2P has no group-wide sequence
    # number), and the blocking send/recv in flight as (op, peer, tag, number, perf_counter).
    p2p_posted: dict[str, int] = dataclasses.field(default_factory=dict)
    p2p_wait: tuple | None = None
    # A fingerprint of every collective called on the group (pgdash_agent.collective_wrappers
    # .fingerprint), and (seq, fingerprint) after the newest collective numbered a multiple
    # of each of FP_MARKS: what ranks compare to find one that called something different.
    fp: int = 0
    fp_marks: list = dataclasses.field(default_factory=lambda: [None, None, None])
    # Its slot on this process's board (pgdash_agent.board), once taken (-1: none free), and
    # the last call written there as (op, dtype, its text)
    board_off: int | None = None
    board_sig: tuple = (None, None, b"")



class CollectiveTracker:
    """Keeps each group's track and turns the wrappers' records into per-interval summaries.

    Args:
        describe_group: maps a ProcessGroup object to ``(name, desc, backend, ranks)``, or None
            when the object is not a group this rank belongs to.
        on_error: called with ``(track, op, seq, exc)`` when a wrapped call raises; must not
            raise itself.
        max_records: bound on collectives recorded but not yet summarised.
        clock: the perf-counter clock (injected for tests).
    """

    def __init__(self, describe_group: Callable[[Any], tuple | None],
                 on_error: Callable[[GroupTrack, str, int, BaseException], None],
                 max_records: int, clock: Callable[[], float] = time.perf_counter):
        self.describe_group = describe_group
        self.on_error = on_error
        self.max_records = max_records
        self.clock = clock
        self.enabled = True
        self.tracks: dict[Any, GroupTrack] = {}  # ProcessGroup -> track
        self.by_name: dict[str, GroupTrack] = {}
        self.default_track: GroupTrack | None = None
        self.new_tracks: collections.deque[GroupTrack] = collections.deque()
        self.records: collections.deque = collections.deque()
        self.pending: collections.deque = collections.deque()  # async works not yet completed
        self.dropped_records = 0
        self.internal_errors = 0
        self._summary: dict[tuple[str, str], LatencySummary] = {}
        # The newest collectives summarised, (group, op, bytes, start, end, the Flight
        # Recorder's sequence number or None) on the perf clock: what a snapshot shows of the minute before (pgdash_agent.snapshots). Filled
        # by summarise() on the agent's thread, never by the training thread.
        self.recent: collections.deque = collections.deque(maxlen=RECENT_COLLECTIVES)
        self.fr_enabled = True  # read sequence numbers for agent.flight_stats
        self.fr_wrapped = WrappedIntervals()  # sequence numbers the wrappers issued
        self.fr_failed: collections.deque = collections.deque()  # (track, lo, hi) of raised calls
        # Called (training thread) when an async work is added to an empty ``pending``: the
        # agent's background thread then polls every PGDASH_ASYNC_POLL_S instead of 0.1 s.
        self.wake: Callable[[], None] = lambda: None
        self.waiting: dict[int, float] = {}  # id(work) -> perf_counter() its wait() began
        # Async collectives (async_op=True) not seen complete yet, by id(work), and the
        # seconds a thread was blocked in their wait() so far: what such a collective cost
        # the rank. Its time from issue to completion is not a wait (the rank computed
        # meanwhile: an overlapped all_reduce), and read as one it made healthy ranks look
        # like stragglers (bench/corpus/healthy_async_allreduce_overlap.py). A work whose
        # future was taken leaves (its waiter is elsewhere: DDP's reducer, for the agent's
        # comm hook), and is timed from issue to completion, as before.
        self.async_blocked: dict[int, float] = {}
        # (new_group calls this process made, after each of the newest a fingerprint of all
        # of them so far): every rank of the job must make the same calls, in the same order,
        # members or not. What a heartbeat sends (``groups_made``), so that a rank that
        # skipped or changed one is seen even when its call then hangs. Replaced whole by the
        # training thread, read whole by the agent's.
        self.groups_made: tuple[int, tuple[int, ...]] = (0, ())
        # Where each collective stands, for the host reader to tell after this process is
        # gone (pgdash_agent.board): set by the agent when its host runs a reader.
        self.board = None
        self._lock = threading.Lock()  # guards slow-path registration only

    # -- groups ------------------------------------------------------------------------------

    def track_for(self, pg: Any) -> GroupTrack | None:
        """The track of a ProcessGroup object, registering it on first sight (slow path)."""
        track = self.tracks.get(pg)
        if track is not None:
            return track
        described = self.describe_group(pg)
        if described is None:
            return None
        with self._lock:
            name = described[0]
            track = self.by_name.get(name)
            if track is None or track.ranks != described[3]:
                track = GroupTrack(*described)
                track.fr_seq = _sequence_reader(pg, track) if self.fr_enabled else None
                self.by_name[name] = track
                self.new_tracks.append(track)
            self.tracks[pg] = track
        return track

    def set_default(self, pg: Any) -> None:
        self.default_track = self.track_for(pg) if pg is not None else None

    def made_group(self, ranks: tuple[int, ...]) -> None:
        """Count a new_group call of these (global) ranks, before it is made."""
        made, marks = self.groups_made
        mark = hash((marks[-1] if marks else 0, len(ranks), *ranks)) & 0xFFFFFFFF
        self.groups_made = (made + 1, (*marks, mark)[-GROUPS_MADE_KEPT:])

    def new_world(self) -> None:
        """The process made its world (again): torch numbers its groups afresh."""
        self.groups_made = (0, ())

    # -- background thread (and the wrappers' slow paths) ------------------------------------

    def poll_async(self) -> None:
        """Record completion of async works that finished since the last poll."""
        now = self.clock()
        still = []
        while self.pending:
            item = self.pending.popleft()
            work, track, op, p2p, seq, nbytes, t0, lo, hi = item
            try:
                done = work.is_completed()
            except Exception:
                done = True  # a failed work counts as ended; its error surfaces on wait()
            if not done:
                still.append(item)
                continue
            key = id(work)
            if not p2p and key in self.async_blocked:  # the time it blocked the rank
                blocked = self.async_blocked.pop(key)
                began = self.waiting.get(key)
                if began is not None:  # (waited on now: its wait() is about to return)
                    blocked += max(0.0, now - began)
                t0 = now - blocked
            if not p2p and seq > track.completed:
                track.completed = seq
                if self.board is not None:
                    self.board.complete(track, seq)
                if track.entered == seq:
                    track.done_root = track.inflight[3] if track.inflight else None
                    track.inflight = None
                else:
                    track.done_root = None  # its own root was replaced by a later call's
            if len(self.records) < self.max_records:
                self.records.append((track, op, nbytes, t0, now, lo, hi))
            else:
                self.dropped_records += 1
                if lo is not None:
                    self.fr_wrapped.add(track.name, lo, hi)
        self.pending.extend(still)
        if len(self.async_blocked) > 2 * len(self.pending) + 64:  # (a wait() that raced a poll)
            keep = {id(item[0]) for item in self.pending}
            for key in [k for k in self.async_blocked if k not in keep]:
                self.async_blocked.pop(key, None)

    def summarise(self) -> None:
        """Fold pending records into the current interval's summaries."""
        summary = self._summary
        records = self.records
        wrapped = self.fr_wrapped
        while self.fr_failed:
            track, lo, hi = self.fr_failed.popleft()
            wrapped.add(track.name, lo, hi)
        for track in list(self.by_name.values()):
            if track.fr_lost_upto > wrapped.lost_upto.get(track.name, -1):
                wrapped.lost_upto[track.name] = track.fr_lost_upto
        recent = self.recent
        while records:
            track, op, nbytes, t0, t1, lo, hi = records.popleft()
            recent.append((track.name, op, nbytes, t0, t1, hi))
            if lo is not None:
                wrapped.add(track.name, lo, hi)
            key = (track.name, op)
            s = summary.get(key)
            if s is None:
                s = summary[key] = LatencySummary()
            s.add((t1 - t0) * 1e6, nbytes)

    def fr_mark_failed(self, track: GroupTrack, lo: int) -> None:
        """A wrapped call whose record will not come (it raised, or the records were full):
        its Flight Recorder entries still belong to the wrapper. Training thread; never
        raises."""
        try:
            hi = track.fr_seq() if track.fr_seq is not None else lo
            track.fr_last = hi
            if len(self.fr_failed) < self.max_records:
                self.fr_failed.append((track, lo, hi))
            elif hi > track.fr_lost_upto:
                track.fr_lost_upto = hi
        except Exception:
            self.internal_errors += 1
        track.fr_open = None

    def fr_open_calls(self) -> tuple[dict[str, int], dict[str, list[tuple[int, int]]]]:
        """For agent.flight_stats, after a Flight Recorder dump: the wrapped calls still
        running (group -> number before the call), and the intervals of async works not
        completed yet. The open calls are read first and the records drained after, so a
        call that ended in between is found in one or the other."""
        opened = {t.name: t.fr_open for t in list(self.by_name.values())
                  if t.fr_open is not None}
        self.summarise()
        spans: dict[str, list[tuple[int, int]]] = {}
        for item in list(self.pending):
            if item[7] is not None:
                spans.setdefault(item[1].name, []).append((item[7], item[8]))
        return opened, spans

    def take_summary(self) -> list[dict[str, Any]]:
        """The rows of the interval that just ended (empty if no collective ran)."""
        self.summarise()
        rows = [s.row(g, op) for (g, op), s in self._summary.items()]
        self._summary = {}
        return rows

    def progress(self, perf_to_wall: Callable[[float], float],
                 flight: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Per group: sequence numbers and the collective in flight (what a hang looks like).

        ``flight`` adds the Flight Recorder's counters per group name (see agent.flight).
        """
        rows = []
        waits = {}  # track -> the oldest point-to-point op a thread waits on, not complete
        waiting = self.waiting
        for item in list(self.pending):
            if item[3] and item[1] not in waits:
                began = waiting.get(id(item[0]))
                if began is not None:
                    waits[item[1]] = item[4] + (began,)
        for track in list(self.by_name.values()):
            inflight = track.inflight
            busy = track.entered > track.completed and inflight is not None
            row = {"group": track.name, "entered": track.entered, "completed": track.completed,
                   "inflight_op": inflight[0] if busy else None,
                   "inflight_since": round(perf_to_wall(track.inflight_since), 6) if busy
                   else None}
            if busy:  # the signature ranks must agree on at this sequence number (desync)
                row["inflight_dtype"] = dtype_name(inflight[1])
                row["inflight_bytes"] = inflight[2]
                if inflight[3] is not None:
                    row["inflight_root"] = inflight[3]
            if track.done_root is not None:
                row["done_root"] = track.done_root
            marks = [list(m) for m in track.fp_marks if m is not None]
            if marks:
                row["fp"] = marks
            if busy and track.fr_open is not None:  # its place in the Flight Recorder's order
                row["inflight_fr"] = track.fr_open + 1
            if track.fr_last is not None:
                row["fr_wrapped"] = track.fr_last
            if track.p2p_posted:
                row["p2p_posted"] = dict(track.p2p_posted)
                wait = track.p2p_wait or waits.get(track)
                if wait is not None:
                    op, peer, tag, n, since = wait
                    row.update(p2p_op=op, p2p_peer=peer, p2p_tag=tag, p2p_n=n,
                               p2p_since=round(perf_to_wall(since), 6))
            if flight and track.name in flight:
                row.update(flight[track.name])
            rows.append(row)
        return rows

    def last_calls(self) -> list[list]:
        """[group, seq, op, dtype, bytes] of the last two collectives completed on each group
        (MAX_LAST_CALLS groups at most, the most recently used first): what a failure
        reports, so that ranks that fail together after a collective whose sizes disagreed
        tell the odd one (rules.desync): one that got past that collective before it failed
        still says what it called there."""
        tracks = sorted((t for t in list(self.by_name.values()) if t.done is not None),
                        key=lambda t: -t.inflight_since)[:MAX_LAST_CALLS]
        out = []
        for t in tracks:
            out.append([t.name, t.completed, *call_signature(t.done)])
            seq, done = t.before
            if done is not None and seq:
                out.append([t.name, seq, *call_signature(done)])
        return out

    def stuck(self, older_than: float) -> list[GroupTrack]:
        """Groups whose collective in flight entered more than ``older_than`` seconds ago."""
        now = self.clock()
        return [t for t in list(self.by_name.values())
                if t.inflight is not None and t.entered > t.completed
                and now - t.inflight_since > older_than]


def _sequence_reader(pg: Any, track: GroupTrack) -> Callable[[], int] | None:
    """The number the Flight Recorder stamps on the group's next collective entry, as
    ``collective_seq_id``, minus one; None where the backend has no such counter.

    NCCL's ``_get_sequence_number_for_group`` counts collectives only, like its entries. Gloo's
    counts point-to-point operations too while its entries' number does not (torch 2.13: a
    barrier after three recvs is entry 1 while the group's number is 4), so the wrapped
    point-to-point calls of the group are taken off (a gloo p2p issued from C++ would skew it).
    """
    reader = getattr(pg, "_get_sequence_number_for_group", None)
    try:
        if reader is None:
            return None
        int(reader())
    except Exception:
        return None
    if "gloo" in str(track.backend or "") and "nccl" not in str(track.backend):
        return lambda: reader() - track.p2p
    return reader


def call_signature(call: tuple) -> list:
    """[op, dtype, bytes] of an (op, dtype, bytes, root) a wrapper kept; bytes 0 for a
    collective whose size may differ by rank (not in SIZED)."""
    return [call[0], dtype_name(call[1]), call[2] if call[0] in SIZED else 0]


def dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")

