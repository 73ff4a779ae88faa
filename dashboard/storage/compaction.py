"""Compaction: bounded storage, by thinning routine events once they are old and quiet.

A job's log keeps every event at full resolution for its most recent ``keep_full_s``
seconds (of arrival time, counted back from the job's newest event), each session's own
last ``keep_full_s`` seconds (a rank that exited early keeps its final minutes), and
within ``around_findings_s`` of every finding. Beyond that, the log is cut into cells of
``cell_s`` seconds, and within a cell each agent session keeps:

- ``heartbeat``: its last one (progress and drop counts are "latest wins" in the fold);
- ``coll_stats``: one summary, the sum of the cell's (counts, bytes, time, histograms
  added; maximum and poll resolution the largest), stored in place of the cell's last one;
- ``gpu``: its last reading, plus every reading with a fault (XID, lost, ECC, remapping)
  and every one where throttling started or stopped, so fault and throttle times stay exact.

Everything else (hello, rendezvous, groups, stacks, errors, exits, connects and
disconnects) is never touched, and a cell holding any such event of any session is kept
whole: a restart or a rank leaving changes how the fold reads what is around it.

What the fold gives up beyond the window (JobState at a moment inside a thinned cell):
the per-second latency series (``op_seconds``) and the straggler windows (``recent``) have
one point per cell instead of one per second; the Flight Recorder tallies and GPU history
have one entry per cell; cumulative latency statistics (``collectives``), progress, groups,
GPU faults and throttling, errors and every rank's status are the same. At the job's newest
moment (and at any moment inside the window or near a finding) nothing is lost, since the
fold's windows (60 intervals, 120 readings) are shorter than ``keep_full_s`` must be.

Packs: every cell older than ``pack_after_s`` (behind the job's newest arrival; every cell,
once the job has been quiet that long and a cell more) becomes a row of ``event_packs``
holding all the job's events of that cell (dashboard.storage.packformat; every session
together, which is where the bytes go: ranks send near-identical bodies), or several rows
of PACK_EVENTS events each for a big job's cell. A cell inside
the window is packed whole; once it leaves the window it is packed again, thinned as above
(once). Each session's newest event, and its newest with a seq, stay rows
(dashboard.storage.store). Stored checkpoints beyond the window and away from findings are thinned
to one per ``checkpoint_keep_s``, keyframes (dashboard.history.keyframes) to those at multiples of
``keyframe_keep_s``.

The :class:`Compactor` runs on its own thread, at most ``duty`` of a core: it streams each
cell from the store's pooled connections (it never holds a cell: a 1,024-rank one is
~370,000 events), encodes packs there, and writes them as tasks on the store's writer thread
(``Store.writer.submit``; a pack and the deletion of what it replaces in one transaction: a
task a pack where rows become packs, a task a few cells where a cell is thinned), never on
the ingest path. Compacting or packing a cell twice changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, ContextManager, Iterator

from dashboard import allocator
from dashboard.storage.thinning import Plan, gpu_throttled

if TYPE_CHECKING:  # the command line reads Policy's defaults without loading SQLAlchemy
    from dashboard.storage.store import Store

log = logging.getLogger("pgdash.compaction")

# A writer task of the compactor holds up to ``cells_per_task`` cells, fewer once their
# events pass this many (what its packs and deletions replace, in one transaction).
TASK_EVENTS = 50_000
# The most events a pack holds: a cell of more is several packs (a 1,024-rank cell holds
# ~370,000). Making one holds its events and its encoding's buffers at once (the encoding
# alone peaks at 7.7 MB for 8,192 events, 29 MB for 32,768), and the live server makes one
# every few seconds at 1,024 ranks: packs of 32,768 raised its RSS by up to ~70 MB a time,
# and the heaps kept part of it (bench.memory --ranks 1024 --minutes 4: mean 257 -> 240 MB,
# highest 343 -> 270). Smaller packs compress less, and only while a cell is whole (a
# 512-rank job stored by bench.storage: 46.7 B an event in packs of 32,768, 48.9 of 16,384,
# 52.0 of 8,192); thinned, a cell is a few events per session. Opening one decodes less.
PACK_EVENTS = 8_192
# The compactor's share of a core while it reads a big job's cells (see Compactor._paced).
DUTY = 0.25
PACE_EVENTS = 4096


@dataclasses.dataclass(frozen=True)
class Policy:
    """How much of the log stays at full resolution (each a named setting)."""

    keep_full_s: float = 900.0  # --keep-full / PGDASH_KEEP_FULL_S; 0 turns compaction off
    around_findings_s: float = 300.0  # --keep-around-findings / PGDASH_KEEP_AROUND_FINDINGS_S
    cell_s: float = 60.0  # PGDASH_COMPACT_CELL_S: one summary per session, kind and cell
    every_s: float = 30.0  # PGDASH_COMPACT_EVERY_S: how often the compactor looks
    pack_after_s: float = 60.0  # PGDASH_PACK_AFTER_S: a cell this old becomes a pack; 0: never
    checkpoint_keep_s: float = 1800.0  # PGDASH_CHECKPOINT_KEEP_S: old checkpoints, one per
    # PGDASH_KEYFRAME_KEEP_S: old keyframes, those at multiples of this; 0: all. At most the
    # 30 s before a moment the page takes a keyframe from (static/js/job/replay.js).
    keyframe_keep_s: float = 30.0

    def __post_init__(self) -> None:
        if self.cell_s <= 0 or self.every_s <= 0:
            raise ValueError("PGDASH_COMPACT_CELL_S and PGDASH_COMPACT_EVERY_S must be above 0")
        if self.pack_after_s and self.pack_after_s < self.cell_s:
            # A pack holds a whole cell: one that may still get events is not packed yet.
            raise ValueError(f"PGDASH_PACK_AFTER_S is {self.pack_after_s:g} s: it must be 0 "
                             f"(never pack) or at least PGDASH_COMPACT_CELL_S "
                             f"({self.cell_s:g} s)")
        if self.checkpoint_keep_s < 0:
            raise ValueError(f"PGDASH_CHECKPOINT_KEEP_S is {self.checkpoint_keep_s:g} s: it "
                             "must be 0 (keep every stored checkpoint) or more seconds")
        if not 0 <= self.keyframe_keep_s <= 30:
            raise ValueError(f"PGDASH_KEYFRAME_KEEP_S is {self.keyframe_keep_s:g} s: it must "
                             "be 0 (keep every keyframe) or up to 30 seconds (the page shows "
                             "a keyframe at most 30 s before the moment it asks for)")
        if self.keep_full_s and self.keep_full_s < max(180.0, 2 * self.cell_s):
            # The fold's windows (60 latency intervals, two minutes of GPU readings) must lie
            # inside the window, or the newest state would differ from a full log's.
            raise ValueError(f"--keep-full / PGDASH_KEEP_FULL_S is {self.keep_full_s:g} s: "
                             f"it must be 0 (keep everything) or at least "
                             f"{max(180.0, 2 * self.cell_s):g} s")
        if self.around_findings_s < 0:
            raise ValueError("--keep-around-findings / PGDASH_KEEP_AROUND_FINDINGS_S must "
                             "be 0 or more seconds")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: float | None) -> "Policy":
        """The policy from ``PGDASH_*`` variables, then explicit overrides (CLI flags)."""
        env = os.environ if env is None else env
        values: dict[str, float] = {}
        for field, name in (("keep_full_s", "PGDASH_KEEP_FULL_S"),
                            ("around_findings_s", "PGDASH_KEEP_AROUND_FINDINGS_S"),
                            ("cell_s", "PGDASH_COMPACT_CELL_S"),
                            ("every_s", "PGDASH_COMPACT_EVERY_S"),
                            ("pack_after_s", "PGDASH_PACK_AFTER_S"),
                            ("checkpoint_keep_s", "PGDASH_CHECKPOINT_KEEP_S"),
                            ("keyframe_keep_s", "PGDASH_KEYFRAME_KEEP_S")):
            if env.get(name):
                try:
                    values[field] = float(env[name])
                except ValueError:
                    raise ValueError(f"{name}={env[name]!r} is not a number of seconds") \
                        from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class Compactor:
    """Compacts every job's log in the background, a few cells per writer task.

    Args:
        store: the database (reads here, writes through ``store.writer.submit``).
        policy: the window and cell settings.
        guard: ``guard(job_id, start, end)``, a context held while cells in [start, end) of
            arrival time are rewritten, so that whoever folds states from the log neither
            reads them half rewritten nor keeps states it folded from them
            (``Rewind.compacting``).
        owns: whether this process should compact a job (several server processes).
        clock: the time arrivals are stamped with (the server's), for quiet jobs.
        duty: the share of a core a pass takes while it reads (see _paced); 1: unpaced
            (a caller that stops ingest while it compacts, such as bench/storage.py).
    """

    def __init__(self, store: Store, policy: Policy,
                 guard: Callable[[int, float, float], ContextManager] | None = None,
                 owns: Callable[[int], bool] | None = None, cells_per_task: int = 5,
                 clock: Callable[[], float] = time.time, duty: float = DUTY):
        self.store, self.policy = store, policy
        self.guard, self.owns, self.clock = guard, owns, clock
        self.cells_per_task = cells_per_task
        self.pause = 1 / duty - 1  # seconds of pause per second of work
        self._done_upto: dict[int, float] = {}  # job -> cells below this are compacted
        self._done_id: dict[int, int] = {}  # job -> the last event id in those cells
        self._packed_upto: dict[int, float] = {}  # job -> cells below this are packed
        self._thinned_before: dict[int, tuple[float, list]] = {}  # job -> (horizon, keep)
        self._packed_id: dict[int, int] = {}  # job -> the last event id in those cells
        self._throttled: dict[int, dict[str, bool]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.deleted = 0  # events removed so far
        self.rewritten = 0  # summaries rewritten so far
        self.packed = 0  # packs written so far
        self.checkpoints_deleted = 0
        self.keyframes_deleted = 0
        self._keyframes_upto: dict[int, float] = {}  # job -> keyframes below this are thinned
        # Rows packed within minutes need not be compressed one by one (their pack is).
        store.log.compress = not policy.pack_after_s
        if policy.checkpoint_keep_s > 0:
            store.checkpoints.span = self.checkpoint_span
        if policy.keyframe_keep_s > 0:
            store.keyframes.kept = self.keyframe_kept
        self.errors = 0

    def start(self) -> "Compactor":
        if self.policy.keep_full_s > 0 or self.policy.pack_after_s > 0:
            self._thread = threading.Thread(target=self._loop, name="pgdash-compactor",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.policy.every_s):
            try:
                self.run_once()
            except _Stopping:  # the server stops: the cell in hand was left as it was
                return
            except Exception:  # keep trying: a failed pass loses nothing
                self.errors += 1
                log.exception("pgdash: compaction pass failed; retrying in %.0f s",
                              self.policy.every_s)

    def run_once(self) -> int:
        """One pass over every job; returns the number of events removed."""
        removed = 0
        before = (self.packed, self.checkpoints_deleted, self.keyframes_deleted)
        for job_id, first, last in self.store.log.spans():
            if self._stop.is_set():
                break
            if self.owns is not None and not self.owns(job_id):
                continue
            removed += self.compact_job(job_id, first, last)
        if removed or (self.packed, self.checkpoints_deleted, self.keyframes_deleted) != before:
            self.store.reclaim()
            allocator.trim()  # what the pass built and freed goes back (dashboard.allocator)
        return removed

    def compact_job(self, job_id: int, first_at: float, last_at: float) -> int:
        """Compact the job's cells that lie wholly before its window, pack those older than
        ``pack_after_s`` at full resolution, and thin its old checkpoints."""
        policy, cell = self.policy, self.policy.cell_s
        thin_h = math.floor((last_at - policy.keep_full_s) / cell) * cell \
            if policy.keep_full_s > 0 else -math.inf
        pack_h = math.floor((last_at - policy.pack_after_s) / cell) * cell \
            if policy.pack_after_s > 0 else -math.inf
        if policy.pack_after_s > 0 and self.clock() - last_at >= policy.pack_after_s + cell:
            # A quiet job (ended, or its agents gone): its newest cells get nothing more
            # either (what arrives now lies a cell past them), so they are packed too.
            pack_h = math.floor(last_at / cell) * cell + cell
        if job_id not in self._done_upto and job_id not in self._packed_upto:
            self._resume(job_id)
        start = self._done_upto.get(job_id, math.floor(first_at / cell) * cell)
        if start >= max(thin_h, pack_h):
            return 0
        keep = [(f["first_seen"] - policy.around_findings_s,
                 f["last_seen"] + policy.around_findings_s)
                for f in self.store.findings.of_job(job_id)]
        removed = 0
        if start < thin_h:  # final: thinned as plan() decides, then packed
            removed += self._walk(job_id, start, thin_h, keep, final=True)
        begin = max(self._done_upto.get(job_id, start), self._packed_upto.get(job_id, start))
        if begin < pack_h:  # newer: packed at full resolution, thinned once it is old
            removed += self._walk(job_id, begin, pack_h, keep, final=False)
        if thin_h > -math.inf:
            self._thinned_before[job_id] = (thin_h, keep)
            if policy.checkpoint_keep_s > 0:
                self._thin_checkpoints(job_id)
            if policy.keyframe_keep_s > 0:
                self._thin_keyframes(job_id, thin_h)
        return removed

    def _resume(self, job_id: int) -> None:
        """Where an earlier pass (of this process or one before a restart) left the job:
        after its newest final cell and its newest pack. Cells are walked in order and
        packed as they are walked, so every cell before a pack has been walked the same way;
        without this, the first pass after a restart decoded every pack of every stored job
        again to find nothing to do (a minute for a quarter-hour of 256 ranks). The sessions'
        throttle states, which thinning carries from cell to cell, are read back from the
        newest final cell's packs (they keep each session's last GPU reading of the cell)."""
        cell, final, final_from = self.policy.cell_s, None, 0
        for pack in self.store.packs.of_job(job_id):
            cell_end = math.floor(pack["first_at"] / cell) * cell + cell
            if pack["thinned"]:
                if self._done_upto.get(job_id) != cell_end:
                    final_from = pack["first_id"]  # the cell's first pack (of PACK_EVENTS)
                final = pack
                self._done_upto[job_id], self._done_id[job_id] = cell_end, pack["last_id"]
            self._packed_upto[job_id], self._packed_id[job_id] = cell_end, pack["last_id"]
        if final is not None:
            throttled = self._throttled.setdefault(job_id, {})
            for ev in self.store.log.events(job_id, after=final_from - 1,
                                            upto=final["last_id"]):
                if ev["kind"] == "gpu":
                    throttled[ev["session"]] = gpu_throttled(ev["body"])

    def checkpoint_span(self, job_id: int, at: float) -> tuple[float, float] | None:
        """Where old checkpoints are thinned: the stretch of arrival time that keeps one
        checkpoint around moment ``at`` (None: every checkpoint there is kept). The store
        asks before it saves one, so that a scrub does not store again what was removed."""
        if self._kept_whole(job_id, at):
            return None
        every = self.policy.checkpoint_keep_s
        bucket = math.floor(at / every)
        return bucket * every, (bucket + 1) * every

    def keyframe_kept(self, job_id: int, at: float) -> bool:
        """Whether a keyframe at ``at`` is kept where old keyframes are thinned: inside the
        window, near a finding, or at a multiple of ``keyframe_keep_s``. Asked before one is
        stored, so that a scrub does not store again what was removed."""
        every = self.policy.keyframe_keep_s
        return self._kept_whole(job_id, at) or \
            math.isclose(at / every, round(at / every), rel_tol=0, abs_tol=1e-9)

    def _kept_whole(self, job_id: int, at: float) -> bool:
        """Whether moment ``at`` of the job lies where nothing is thinned: inside the window
        (not compacted yet) or near one of its findings."""
        horizon, keep = self._thinned_before.get(job_id, (-math.inf, ()))
        return at >= horizon or any(a <= at <= b for a, b in keep)

    def _thin_keyframes(self, job_id: int, horizon: float) -> None:
        """Beyond the window and away from findings, keep the keyframes at multiples of
        ``keyframe_keep_s`` (the page shows the newest at most 30 s before a moment)."""
        start = self._keyframes_upto.get(job_id, -math.inf)
        drop = [at for at in self.store.keyframes.between(job_id, start, horizon)
                if not self.keyframe_kept(job_id, at)]
        if drop:
            delete = self.store.keyframes.delete
            self.store.writer.submit(lambda conn: delete(conn, job_id, drop), timeout=120.0)
            self.keyframes_deleted += len(drop)
        self._keyframes_upto[job_id] = horizon

    def _walk(self, job_id: int, start: float, horizon: float,
              keep: list[tuple[float, float]], final: bool) -> int:
        """Cells [start, horizon) of the job, a few per writer task; returns events removed.

        ``final``: the cells are thinned (thinning.Plan) and their packs marked final, and
        the walk starts from the job's last final cell; else packed whole, from the last
        packed one.

        A cell is streamed, never held: a first read plans what thinning removes (a few
        numbers per event), a second packs what stays, PACK_EVENTS events a pack. What
        memory holds of a 1,024-rank cell (~370,000 events, ~0.4 GB as dicts) is then one
        pack's worth of its events and the packs made (bench/memory.py).
        """
        cell, packing = self.policy.cell_s, self.policy.pack_after_s > 0
        throttled = self._throttled.setdefault(job_id, {})
        floors = {session: last - self.policy.keep_full_s
                  for session, last in self.store.sessions.last_arrivals(job_id).items()}
        newest = self.store.sessions.newest_ids(job_id) if packing else set()
        packs = {p["first_id"]: p for p in self.store.packs.of_job(job_id)} if packing else {}
        done_id = self._done_id if final else self._packed_id
        removed = 0
        while start < horizon and not self._stop.is_set():
            task_start, read, last = start, 0, 0
            after = max(self._done_id.get(job_id, 0), done_id.get(job_id, 0))
            writes, thinning, gone = [], False, 0
            while (start < horizon and not self._stop.is_set() and read < TASK_EVENTS
                   and start < task_start + cell * self.cells_per_task):
                end = start + cell
                plans: list[tuple[dict[int, dict], list[int]]] = []
                if final:
                    for run in self._runs(job_id, after, end):
                        planned = Plan(cell, keep, throttled, floors)
                        for ev in run:
                            planned.add(ev)
                            read += 1
                            last = ev["id"]
                        plans.append(planned.result())
                    for updates, deletes in plans:
                        thinning = thinning or bool(updates or deletes)
                        gone += len(deletes)
                        if not packing and (updates or deletes):
                            writes.append(lambda conn, u=updates, d=deletes:
                                          self.store.log.compact(conn, u, list(d)))
                if packing:
                    for i, run in enumerate(self._runs(job_id, after, end)):
                        updates, deletes = plans[i] if final else ({}, ())
                        packer = _Packer(self.store, job_id, updates, deletes, newest,
                                         packs, final)
                        for ev in run:
                            packer.add(ev)
                            read += not final
                            last = ev["id"]
                        self.rewritten += len(updates)
                        for write in packer.done():
                            if write.alone:  # its own writer task (see _Packer.done)
                                self.store.writer.submit(write, timeout=120.0)
                            else:
                                writes.append(write)
                        self.packed += len(packer.made)
                if read:
                    after = last
                start = min(horizon, end)
            if writes:
                guard = self.guard(job_id, task_start, start) if self.guard and thinning \
                    else contextlib.nullcontext()
                with guard:
                    self.store.writer.submit(lambda conn: [w(conn) for w in writes], timeout=120.0)
            removed += gone
            self.deleted += gone
            if read:
                done_id[job_id] = after
            (self._done_upto if final else self._packed_upto)[job_id] = start
        return removed

    def _runs(self, job_id: int, after: int, end: float) -> Iterator[Iterator[dict[str, Any]]]:
        """The job's events after id ``after`` that arrived before ``end``, in runs by cell
        of arrival time, each an iterator to read to its end before the next: a run ends
        where an event's cell is later than the run's first's, so that a cell's packs hold a
        contiguous range of the job's ids even where arrival times are out of order."""
        events = self._paced(self.store.log.events_until(job_id, after, end, raw=True))
        cell_s = self.policy.cell_s
        pending: list[dict[str, Any]] = []  # the first event of the next run, once met

        def run(first: dict[str, Any]) -> Iterator[dict[str, Any]]:
            current = math.floor(first["received_at"] / cell_s)
            yield first
            for ev in events:
                if math.floor(ev["received_at"] / cell_s) > current:
                    pending.append(ev)
                    return
                yield ev

        first = next(events, None)
        while first is not None:
            yield run(first)
            first = pending.pop() if pending else None

    def _paced(self, events: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``events``, with a pause after every PACE_EVENTS of them that keeps this thread's
        share of a core at ``duty``: a pass over a 1,024-rank cell takes seconds of CPU, and
        taken in one go it held ingest back (the batches queued meanwhile are memory too).
        Raises _Stopping there once the compactor is closed: a stopping server does not
        wait for the rest of a big cell, and nothing of a cell read in part is written."""
        started = time.thread_time()
        for i, ev in enumerate(events, start=1):
            yield ev
            if i % PACE_EVENTS == 0:
                if self.pause:
                    self._stop.wait((time.thread_time() - started) * self.pause)
                    started = time.thread_time()
                if self._stop.is_set():
                    raise _Stopping()

    def _thin_checkpoints(self, job_id: int) -> None:
        """Beyond the window and away from findings, keep the first stored checkpoint of
        every ``checkpoint_keep_s`` (a state at any moment starts from the one before it)."""
        seen, drop = set(), []
        for last_id, at in sorted(self.store.checkpoints.of_job(job_id), key=lambda c: c[1]):
            span = self.checkpoint_span(job_id, at)
            if span is None:
                continue
            if span in seen:
                drop.append(last_id)
            seen.add(span)
        if drop:
            delete = self.store.checkpoints.delete
            self.store.writer.submit(lambda conn: delete(conn, job_id, drop), timeout=120.0)
            self.checkpoints_deleted += len(drop)


class _Stopping(Exception):
    """The compactor was closed while it read a cell."""


class _Packer:
    """One run of a cell's events (:meth:`Compactor._runs`) into packs of at most
    PACK_EVENTS events, made as the run is read; then the writer tasks that store them in
    place of what they hold (:meth:`done`). Each session's newest event (and newest with a
    seq) stays a row; a summary the plan rewrote is packed rewritten, and the events it
    deleted go."""

    def __init__(self, store: "Store", job_id: int, updates: dict[int, dict],
                 deletes: Collection[int], newest: set[int], stored: dict[int, dict],
                 final: bool):
        self.store, self.job_id, self.final = store, job_id, final
        self.updates, self.deletes, self.newest, self.stored = updates, deletes, newest, stored
        self.made: list[dict[str, Any]] = []  # pack rows (compressed)
        self._spans: list[tuple[int, int]] = []  # per pack made: the ids it took the place of
        self._chunk: list[dict[str, Any]] = []
        self._span_from: int | None = None  # the first id read since the last pack made
        self.first_id: int | None = None
        self.last_id = 0
        self.old: list[int] = []  # first ids of the stored packs it replaces
        self.kept = 0

    def add(self, ev: dict[str, Any]) -> None:
        i = self.last_id = ev["id"]
        if self.first_id is None:
            self.first_id = i
        if self._span_from is None:
            self._span_from = i
        if i in self.stored:
            self.old.append(i)
        if i in self.newest or i in self.deletes:
            return
        if i in self.updates:
            ev = dict(ev, body=self.updates[i])
        self._chunk.append(ev)
        self.kept += 1
        if len(self._chunk) >= PACK_EVENTS:
            self._pack()

    def _pack(self) -> None:
        if self._chunk:
            self.made.append(self.store.packs.row(self.job_id, self._chunk, self.final))
            self._spans.append((self._span_from, self.last_id))
            self._chunk, self._span_from = [], None

    def done(self) -> list["_Write"]:
        """The writer tasks storing the packs ([]: nothing to change). Rows becoming packs
        (what the live server does every minute) are a task a pack, each pack and the rows
        it holds in one transaction: a 1,024-rank cell's deletion of ~370,000 rows in one
        held every batch of ingest back for seconds, and the batches queued meanwhile were
        the server's memory. A cell rewritten (thinned, or packed again) is one task: its
        old packs and rows go in the transaction that stores the new ones. Rows go by id
        range (Packs.write): every event of the job between a pack's first and last id is
        in it, deleted, or a session's newest (kept a row)."""
        old, stored = self.old, self.stored
        if (not self.updates and not self.deletes and old
                and len(old) == math.ceil(self.kept / PACK_EVENTS)
                and sum(stored[i]["n"] for i in old) == self.kept
                and all(stored[i]["thinned"] == self.final for i in old)):
            self.made, self._chunk = [], []
            return []  # packed as it should be: packing twice changes nothing
        if not self.kept and not old and not self.deletes:
            return []  # only rows that must stay rows
        self._pack()
        packs, job_id, store, newest = self.store.packs, self.job_id, self.store, self.newest
        if not old and not self.updates and not self.deletes:
            return [_Write(lambda conn, pack=pack, span=span:
                           packs.write(conn, job_id, [pack], [], span, newest), alone=True)
                    for pack, span in zip(self.made, self._spans)]
        made, span = self.made, (self.first_id, self.last_id)
        row_updates = {i: b for i, b in self.updates.items() if i in newest}

        def write(conn) -> None:
            packs.write(conn, job_id, made, old, span, newest)
            if row_updates:
                store.log.compact(conn, row_updates, [])
        return [_Write(write)]


@dataclasses.dataclass
class _Write:
    """A writer task of the compactor; ``alone``: submitted by itself, not with the rest of
    its cells'."""

    call: Callable[[Any], None]
    alone: bool = False

    def __call__(self, conn: Any) -> None:
        self.call(conn)
