"""The collective wrappers: stand-ins for torch.distributed's primitives, on the training thread.

Cost on the training thread is what matters here (goal: about +1 us per collective). A wrapper
reads the group, dtype and byte count, bumps the group's sequence number, takes two clock
readings and appends one tuple to a bounded deque. Everything else (latency histograms,
per-interval summaries, completion of ``async_op=True`` works) happens on the agent's
background thread, in :class:`pgdash_agent.collectives.CollectiveTracker`, whose queues and
counters the wrappers write. This file is its own room because it is the hot path: a change
here is paid by every collective of every job, so it holds nothing else.

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

import inspect
import threading
import zlib
from typing import Any, Callable

from pgdash_agent.collectives import SIZED, CollectiveTracker, GroupTrack

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

# Collectives with a root: (its parameter, the group-relative one). Ranks must agree on it.
ROOTS = {"broadcast": ("src", "group_src"), "scatter": ("src", "group_src"),
         "reduce": ("dst", "group_dst"), "gather": ("dst", "group_dst")}

# Point-to-point ops: (peer parameter, group-relative peer parameter, direction).
P2P_PEER = {"send": ("dst", "group_dst", "send"), "isend": ("dst", "group_dst", "send"),
            "recv": ("src", "group_src", "recv"), "irecv": ("src", "group_src", "recv")}
MAX_P2P_KEYS = 64  # (direction, peer, tag) counts kept per group; more peers are not matched

# The fingerprint's marks: after each collective numbered a multiple of 16, 256, 4,096 (a
# heartbeat a second sees the same mark on every rank at 1 to ~2,000 collectives a second).
FP_MASKS = (15, 255, 4095)

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


def _list_bytes(tensors) -> tuple[Any, int]:
    total = 0
    dtype = None
    for t in tensors:
        dtype = t.dtype
        total += t.nbytes
    return dtype, total


class CollectiveWrappers:
    """Installs the wrappers that record each collective into ``tracker``, and takes them out.

    Args:
        tracker: the :class:`~pgdash_agent.collectives.CollectiveTracker` whose groups,
            bounded queues and counters the wrappers write (and whose ``enabled`` they obey).
    """

    def __init__(self, tracker: CollectiveTracker):
        self.tracker = tracker
        self._originals: list[tuple[Any, str, Any]] = []
        self.wrapper_code = None
        self._local = threading.local()  # per thread: inside a wrapped call already?
        # dtype -> a number every process gives it (a dtype's own hash is its address)
        self._dtype_codes: dict[Any, int] = {None: 0}

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
        waiting, clock = self.tracker.waiting, self.tracker.clock
        blocked = self.tracker.async_blocked

        def wait(work, *args, **kwargs):
            key = id(work)
            began = waiting[key] = clock()
            try:
                return original(work, *args, **kwargs)
            finally:
                waiting.pop(key, None)
                if key in blocked:  # an async collective still pending: its blocked time
                    try:
                        blocked[key] += clock() - began
                    except KeyError:  # (seen complete meanwhile, on the agent's thread)
                        pass

        wait.__pgdash_wrapped__ = True
        wait.__wrapped__ = original
        wait.__doc__ = original.__doc__
        self._originals.append((work_cls, "wait", original))
        setattr(work_cls, "wait", wait)
        original_future = getattr(work_cls, "get_future", None)
        if original_future is None or getattr(original_future, "__pgdash_wrapped__", False):
            return

        def get_future(work, *args, **kwargs):
            # A future taken is waited on elsewhere (DDP's reducer, in C++, for its comm
            # hook's all-reduce): its time from issue to completion is what the rank waits.
            blocked.pop(id(work), None)
            return original_future(work, *args, **kwargs)

        get_future.__pgdash_wrapped__ = True
        get_future.__wrapped__ = original_future
        get_future.__doc__ = original_future.__doc__
        self._originals.append((work_cls, "get_future", original_future))
        setattr(work_cls, "get_future", get_future)

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
        r_pos = params.index("op") if "op" in params else None  # the reduce op
        op_code = list(OPS).index(op)
        sized = op in SIZED
        dtype_codes = self._dtype_codes
        root_names = ROOTS.get(op)
        if root_names is not None:
            root_name, groot_name = root_names
            root_pos = params.index(root_name) if root_name in params else None
            groot_pos = params.index(groot_name) if groot_name in params else None
        tracker = self.tracker
        tracks = tracker.tracks
        records = tracker.records
        pending = tracker.pending
        async_blocked = tracker.async_blocked
        clock = tracker.clock
        cap = tracker.max_records
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
                    root = None if root_names is None else _root(
                        track, args, kwargs, root_pos, root_name, groot_pos, groot_name)
                    track.inflight = (op, dtype, nbytes, root)
                    red = 0 if r_pos is None else _red(args[r_pos] if n > r_pos
                                                       else kwargs.get("op", 0))
                    code = dtype_codes.get(dtype)
                    if code is None:
                        code = dtype_codes[dtype] = zlib.crc32(str(dtype).encode())
                    # The group's fingerprint after this call: the same on every rank that
                    # called the same ones (only ints are hashed: theirs is the same in
                    # every process, unlike a string's or a dtype's).
                    fp = track.fp = hash((track.fp, op_code, code, nbytes if sized else 0,
                                          -1 if root is None else root, red)) & 0xFFFFFFFF
                    if not seq & 15:
                        _mark(track.fp_marks, seq, fp)
                    lo = track.fr_open = fr_seq() if fr_seq is not None else None
                if p2p:
                    t0 = clock()
                    if not is_async:
                        track.p2p_wait = seq + (t0,)
                else:
                    t0 = track.inflight_since = clock()
                    if tracker.board is not None:
                        tracker.board.enter(track, seq, op, dtype, nbytes, t0, root)
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
                    if not p2p:
                        async_blocked[id(result)] = 0.0
                else:
                    tracker.dropped_records += 1
                    if lo is not None:
                        tracker.fr_mark_failed(track, lo)
                track.fr_open = None
                return result
            if not p2p and seq > track.completed:
                track.before = (track.completed, track.done)
                track.completed = seq
                track.done_root = root
                track.done, track.inflight = track.inflight, None
                if tracker.board is not None:
                    tracker.board.done(track, seq, nbytes)
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


def _red(op: Any) -> int:
    """A reduce op as a number every process gives it (``ReduceOp.MAX`` and ``RedOpType.MAX``
    hash to their value); -2 for one that cannot be hashed."""
    try:
        return hash(op)
    except TypeError:
        return -2


def _mark(marks: list, seq: int, fp: int) -> None:
    """Keep (seq, fp) for each mark ``seq`` is a multiple of (``seq`` is one of 16)."""
    for i, mask in enumerate(FP_MASKS):
        if seq & mask:
            return
        marks[i] = (seq, fp)


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


def _root(track: GroupTrack, args: tuple, kwargs: dict, pos: int | None, name: str,
          gpos: int | None, gname: str) -> int | None:
    """A rooted collective's root as a global rank (from ``src``/``dst``, or from
    ``group_src``/``group_dst`` through the group's ranks); None when not given."""
    n = len(args)
    root = args[pos] if pos is not None and n > pos else kwargs.get(name)
    if root is None:
        groot = args[gpos] if gpos is not None and n > gpos else kwargs.get(gname)
        if groot is None:
            return None
        root = track.ranks[groot] if 0 <= groot < len(track.ranks) else groot
    root = int(root)
    return root if root >= 0 else None  # the wire's counts are not negative


def _default_pg():
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.default_pg
