"""Collective tracking: the wrappers that run on the training thread, and their summaries.

Cost on the training thread is what matters here (goal: about +1 us per collective). A wrapper
reads the group, dtype and byte count, bumps the group's sequence number, takes two clock
readings and appends one tuple to a bounded deque. Everything else (latency histograms,
per-interval summaries, completion of ``async_op=True`` works) happens on the agent's
background thread.

Both ``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X`` are replaced, because
code inside c10d calls the module globals (e.g. ``all_gather_into_tensor`` calls
``all_gather_single``; ``all_gather_object`` calls ``all_gather`` twice). Only primitives that
issue backend operations are wrapped, and the two that run another wrapped op (``send`` runs
``isend``, ``recv`` runs ``irecv``) mark the thread so that the inner call is not recorded
again: each user-visible primitive counts once. Object
collectives are not wrapped, so ``all_gather_object`` shows up as the two ``all_gather`` calls
it really makes.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pgdash_agent.flight_stats import WrappedIntervals
from pgdash_agent.wire import LatencySummary

# op name -> (payload parameter, payload is a list of tensors, point-to-point, always async)
OPS: dict[str, tuple[str | None, bool, bool, bool]] = {
    "broadcast": ("tensor", False, False, False),
    "all_reduce": ("tensor", False, False, False),
    "all_reduce_coalesced": ("tensors", True, False, False),
    "reduce": ("tensor", False, False, False),
    "all_gather": ("tensor", False, False, False),
    "all_gather_single": ("input_tensor", False, False, False),
    "all_gather_coalesced": ("input_tensor_list", True, False, False),
    "gather": ("tensor", False, False, False),
    "scatter": ("tensor", False, False, False),
    "reduce_scatter": ("input_list", True, False, False),
    "reduce_scatter_single": ("input", False, False, False),
    "all_to_all_single": ("input", False, False, False),
    "all_to_all": ("input_tensor_list", True, False, False),
    "barrier": (None, False, False, False),
    "monitored_barrier": (None, False, False, False),
    "send": ("tensor", False, True, False),
    "recv": ("tensor", False, True, False),
    "isend": ("tensor", False, True, True),
    "irecv": ("tensor", False, True, True),
}

# Point-to-point ops: (peer parameter, group-relative peer parameter, direction).
P2P_PEER = {"send": ("dst", "group_dst", "send"), "isend": ("dst", "group_dst", "send"),
            "recv": ("src", "group_src", "recv"), "irecv": ("src", "group_src", "recv")}
MAX_P2P_KEYS = 64  # (direction, peer, tag) counts kept per group; more peers are not matched

# Wrapped ops that call other wrapped ops (torch 2.13: send -> isend, recv -> irecv).
NESTING_OPS = frozenset({"send", "recv"})
NESTED_OPS = frozenset({"isend", "irecv"})


def _marking(fn: Callable, local: threading.local) -> Callable:
    """``fn`` with the thread marked busy while it runs (see NESTING_OPS)."""

    def marked(*args, **kwargs):
        local.busy = True
        try:
            return fn(*args, **kwargs)
        finally:
            local.busy = False

    return marked


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
    inflight: tuple | None = None  # (op, dtype, bytes) of the collective entered last
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


def _list_bytes(tensors) -> tuple[Any, int]:
    total = 0
    dtype = None
    for t in tensors:
        dtype = t.dtype
        total += t.nbytes
    return dtype, total


class CollectiveTracker:
    """Installs the wrappers and turns their records into per-interval summaries.

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
        self.fr_enabled = True  # read sequence numbers for agent.flight_stats
        self.fr_wrapped = WrappedIntervals()  # sequence numbers the wrappers issued
        self.fr_failed: collections.deque = collections.deque()  # (track, lo, hi) of raised calls
        self._originals: list[tuple[Any, str, Any]] = []
        self.wrapper_code = None
        # Called (training thread) when an async work is added to an empty ``pending``: the
        # agent's background thread then polls every PGDASH_ASYNC_POLL_S instead of 0.1 s.
        self.wake: Callable[[], None] = lambda: None
        self.waiting: dict[int, float] = {}  # id(work) -> perf_counter() its wait() began
        self._lock = threading.Lock()  # guards slow-path registration only
        self._local = threading.local()  # per thread: inside a wrapped call already?

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

    # -- wrappers ----------------------------------------------------------------------------

    def install(self, modules: list[Any]) -> None:
        """Replace each op in each module by a recording wrapper (same wrapper in all)."""
        wrapped: dict[int, Any] = {}
        for op in OPS:
            for module in modules:
                fn = getattr(module, op, None)
                if fn is None or getattr(fn, "__pgdash_wrapped__", False):
                    continue
                wrapper = wrapped.get(id(fn))
                if wrapper is None:
                    wrapper = wrapped[id(fn)] = self._wrap(fn, op)
                self._originals.append((module, op, fn))
                setattr(module, op, wrapper)

    def install_wait(self, work_cls: Any) -> None:
        """Note which works a thread waits on (``Work.wait``, the class's method): a
        point-to-point op is reported as what a rank waits in only while it is waited on. A
        pipeline posts its next receives ahead, then computes: a stage frozen in compute holds
        posted receives it does not wait in, and is the one its neighbours wait for."""
        original = getattr(work_cls, "wait", None)
        if original is None or getattr(original, "__pgdash_wrapped__", False):
            return
        waiting, clock = self.waiting, self.clock

        def wait(work, *args, **kwargs):
            key = id(work)
            waiting[key] = clock()
            try:
                return original(work, *args, **kwargs)
            finally:
                waiting.pop(key, None)

        wait.__pgdash_wrapped__ = True
        wait.__wrapped__ = original
        wait.__doc__ = original.__doc__
        self._originals.append((work_cls, "wait", original))
        setattr(work_cls, "wait", wait)

    def uninstall(self) -> None:
        for module, op, fn in reversed(self._originals):
            setattr(module, op, fn)
        self._originals.clear()

    def _wrap(self, fn: Callable, op: str) -> Callable:
        payload_name, payload_is_list, p2p, always_async = OPS[op]
        params = list(inspect.signature(fn).parameters)
        g_pos = params.index("group")
        a_pos = params.index("async_op") if "async_op" in params else None
        t_pos = params.index(payload_name) if payload_name else None
        if p2p:
            peer_name, gpeer_name, direction = P2P_PEER[op]
            peer_pos, gpeer_pos = params.index(peer_name), params.index(gpeer_name)
            tag_pos = params.index("tag")
        tracker = self
        tracks = self.tracks
        records = self.records
        pending = self.pending
        clock = self.clock
        cap = self.max_records
        local = self._local
        # send/recv run isend/irecv inside: the outer call marks the thread, the inner one
        # sees the mark and is not counted again. Other ops nest nothing, so they skip both.
        nested_check = op in NESTED_OPS
        call = _marking(fn, local) if op in NESTING_OPS else fn

        def wrapper(*args, **kwargs):
            if not tracker.enabled or (nested_check and local.__dict__.get("busy")):
                return fn(*args, **kwargs)
            n = len(args)
            try:
                group = args[g_pos] if n > g_pos else kwargs.get("group")
                track = tracker.default_track if group is None else tracks.get(group)
                if track is None:  # first sight of this group; None: not a member
                    track = tracker.track_for(group if group is not None else _default_pg())
            except Exception:
                tracker.internal_errors += 1
                track = None
            if track is None:
                return fn(*args, **kwargs)
            try:
                if t_pos is None:
                    dtype, nbytes = None, 0
                else:
                    payload = args[t_pos] if n > t_pos else kwargs.get(payload_name)
                    if payload_is_list:
                        dtype, nbytes = _list_bytes(payload)
                    else:
                        dtype, nbytes = payload.dtype, payload.nbytes
                is_async = always_async or (
                    a_pos is not None and (args[a_pos] if n > a_pos else kwargs.get("async_op")))
                fr_seq = track.fr_seq
                if p2p:  # seq: (op, peer, tag, n), what the peer's n-th opposite op matches
                    track.p2p += 1
                    seq = _p2p_key(track, op, direction, args, kwargs, peer_pos, peer_name,
                                   gpeer_pos, gpeer_name, tag_pos)
                    lo = None
                else:
                    track.entered += 1
                    seq = track.entered
                    track.inflight = (op, dtype, nbytes)
                    lo = track.fr_open = fr_seq() if fr_seq is not None else None
                if p2p:
                    t0 = clock()
                    if not is_async:
                        track.p2p_wait = seq + (t0,)
                else:
                    t0 = track.inflight_since = clock()
            except Exception:
                tracker.internal_errors += 1
                return fn(*args, **kwargs)
            try:
                result = call(*args, **kwargs)
            except BaseException as exc:
                if p2p:
                    track.p2p_wait = None
                    seq = track.p2p
                tracker.on_error(track, op, seq, exc)
                if lo is not None:
                    tracker.fr_mark_failed(track, lo)
                raise
            if p2p and not is_async:
                track.p2p_wait = None
            hi = None
            if lo is not None:
                try:
                    hi = fr_seq()
                except Exception:
                    tracker.internal_errors += 1
                    hi = lo
                track.fr_last = hi
            if is_async and result is not None:
                if len(pending) < cap:
                    if not pending:  # the background thread sleeps up to 0.1 s without
                        tracker.wake()  # any: its poll times the completion
                    pending.append((result, track, op, p2p, seq, nbytes, t0, lo, hi))
                else:
                    tracker.dropped_records += 1
                    if lo is not None:
                        tracker.fr_mark_failed(track, lo)
                track.fr_open = None
                return result
            if not p2p and seq > track.completed:
                track.completed = seq
                track.inflight = None
            if len(records) < cap:
                records.append((track, op, nbytes, t0, clock(), lo, hi))
            else:
                tracker.dropped_records += 1
                if lo is not None:
                    tracker.fr_mark_failed(track, lo)
            track.fr_open = None
            return result

        self.wrapper_code = wrapper.__code__  # the same for every op: finds stuck threads
        wrapper.__pgdash_wrapped__ = True
        wrapper.__wrapped__ = fn
        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
        wrapper.__doc__ = fn.__doc__
        wrapper.__module__ = fn.__module__
        return wrapper

    # -- background thread -------------------------------------------------------------------

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
            if not p2p and seq > track.completed:
                track.completed = seq
                if track.entered == seq:
                    track.inflight = None
            if len(self.records) < self.max_records:
                self.records.append((track, op, nbytes, t0, now, lo, hi))
            else:
                self.dropped_records += 1
                if lo is not None:
                    self.fr_wrapped.add(track.name, lo, hi)
        self.pending.extend(still)

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
        while records:
            track, op, nbytes, t0, t1, lo, hi = records.popleft()
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
                row["inflight_dtype"] = _dtype_name(inflight[1])
                row["inflight_bytes"] = inflight[2]
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

    def stuck(self, older_than: float) -> list[GroupTrack]:
        """Groups whose collective in flight entered more than ``older_than`` seconds ago."""
        now = self.clock()
        return [t for t in list(self.by_name.values())
                if t.inflight is not None and t.entered > t.completed
                and now - t.inflight_since > older_than]


def _p2p_key(track: GroupTrack, op: str, direction: str, args: tuple, kwargs: dict,
             peer_pos: int, peer_name: str, gpeer_pos: int, gpeer_name: str,
             tag_pos: int) -> tuple[str, int, int, int]:
    """Count one point-to-point op by (direction, global peer, tag); its (op, peer, tag, n):
    the n-th op of this rank to that peer with that tag, which the peer's n-th opposite op
    matches. A recv from any source has peer -1 and matches nothing."""
    n = len(args)
    peer = args[peer_pos] if n > peer_pos else kwargs.get(peer_name)
    if peer is None:
        gpeer = args[gpeer_pos] if n > gpeer_pos else kwargs.get(gpeer_name)
        if gpeer is not None:
            peer = track.ranks[gpeer] if 0 <= gpeer < len(track.ranks) else gpeer
    peer = -1 if peer is None else int(peer)
    tag = args[tag_pos] if n > tag_pos else kwargs.get("tag", 0)
    tag = int(tag or 0)
    key = f"{direction}:{peer}:{tag}"
    posted = track.p2p_posted
    count = posted.get(key)
    if count is None and len(posted) >= MAX_P2P_KEYS:
        return op, peer, tag, 0
    posted[key] = count = (count or 0) + 1
    return op, peer, tag, count


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


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _default_pg():
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.default_pg
