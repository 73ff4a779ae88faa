"""Count, bytes and latency of the collectives only the Flight Recorder saw (DDP's, functional).

The Python wrappers (``pgdash_agent.collective_wrappers``) time what Python issues. DDP's
reducer, FSDP1 and functional collectives are issued from C++; PyTorch's Flight Recorder (FR)
keeps an entry for each of them in a ring buffer (2000 entries by default,
``TORCH_FR_BUFFER_SIZE``). This module
reads those entries on the agent's background thread and folds the ones no wrapper saw into
the same per-(group, op) summaries as the wrappers' rows, marked ``"source":
"flight_recorder"``.

Never twice: a wrapped call notes the group's backend sequence number before and after the
call (``ProcessGroup._get_sequence_number_for_group``, the counter FR stamps on its entries as
``collective_seq_id``), so every FR entry whose number lies inside such an interval was the
wrapper's and is skipped. An entry of a group whose wrapped call is still open (its interval
not known yet) waits for the next read. Point-to-point entries are left to the wrappers (on
NCCL they share the collective counter).

Once: each recorder's ``record_id`` is global and increasing; the reader remembers the next id
it has not processed. Entries the ring overwrote before a read are counted (``missed``).

Latency: on NCCL with ``TORCH_NCCL_ENABLE_TIMING=1`` an entry carries ``duration_ms`` measured
on the device (``"timing": "device"``). Otherwise (gloo always) FR records no completion time,
so completion is noticed by the agent's own polls of the recorder's per-group
``last_completed_collective`` counter: the latency is from the entry's creation to the middle
of the poll gap in which it completed, exact to that gap (``"timing": "host_poll"`` with
``resolution_us``, the widest gap in the interval's rows).

Cost: a full dump serialises the whole ring (about 30 ms plus parsing for 2000 entries here),
so it is taken only when the status shows entries that no wrapper accounts for, at most once
per ``read_every_s``, and never more often than keeps its own measured cost under ``budget``
(a fraction of one core); only the entries after the last one processed are parsed.
"""

from __future__ import annotations

import bisect
import collections
import time
from dataclasses import dataclass
from typing import Any, Callable

from pgdash_agent.flight_dump import dump_tail, entry_bytes, op_name
from pgdash_agent.wire import LatencySummary

SOURCE = "flight_recorder"
MAX_INTERVALS = 50_000  # wrapped intervals kept per group between reads
MAX_WAITING = 10_000  # entries kept while waiting for completion or for a wrapper's interval
MAX_POLLS = 10_000  # completion observations kept per group between reads
RECENT_ENTRIES = 256  # the newest timed entries a snapshot shows (pgdash_agent.snapshots)


@dataclass
class _Summary(LatencySummary):
    """The wrappers' summary, plus how exact its latencies are."""

    timing: str = "device"
    resolution_us: float = 0.0


class WrappedIntervals:
    """Per group, the backend sequence numbers the wrappers issued: merged ``(lo, hi]``.

    Filled and read on the agent's background thread only (the wrappers hand their numbers
    over in their records), so it needs no lock.
    """

    def __init__(self, limit: int = MAX_INTERVALS):
        self.limit = limit
        self.by_group: dict[str, list[list[int]]] = {}
        self.lost_upto: dict[str, int] = {}  # overflowed: everything up to here counts as wrapped
        self.overflows = 0

    def add(self, group: str, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        spans = self.by_group.get(group)
        if spans is None:
            spans = self.by_group[group] = []
        if spans and lo <= spans[-1][1] and lo >= spans[-1][0]:
            spans[-1][1] = max(spans[-1][1], hi)
            return
        if spans and lo < spans[-1][0]:  # out of order (an async work completed late)
            bisect.insort(spans, [lo, hi])
        else:
            spans.append([lo, hi])
        if len(spans) > self.limit:
            dropped = spans.pop(0)
            self.overflows += 1
            self.lost_upto[group] = max(self.lost_upto.get(group, 0), dropped[1])

    def covers(self, group: str, seq: int, extra: list[tuple[int, int]] = ()) -> bool:
        if seq <= self.lost_upto.get(group, -1):
            return True
        for lo, hi in extra:
            if lo < seq <= hi:
                return True
        spans = self.by_group.get(group)
        if not spans:
            return False
        i = bisect.bisect_left(spans, [seq, seq]) - 1
        for span in spans[max(0, i):i + 2]:
            if span[0] < seq <= span[1]:
                return True
        return False

    def highest(self, group: str) -> int:
        spans = self.by_group.get(group)
        return max(spans[-1][1] if spans else -1, self.lost_upto.get(group, -1))

    def prune(self, group: str, upto: int) -> None:
        """Forget intervals wholly at or below ``upto`` (entries classified already)."""
        spans = self.by_group.get(group)
        while spans and spans[0][1] <= upto:
            spans.pop(0)


class FlightStats:
    """Reads FR entries at a bounded rate and summarises those no wrapper saw.

    Args:
        probe: the :class:`pgdash_agent.flight.FlightRecorderProbe` (its dumps, names and status).
        wrapped: the wrappers' intervals (:class:`WrappedIntervals`).
        open_calls: returns, per group name, the sequence number before a wrapped call that
            is still running (its interval is not known yet), and the intervals of async works
            not completed yet.
        clock: wall clock (Unix seconds).
        read_every_s: least time between two full reads (PGDASH_FR_READ_S).
        budget: most share of one core the full reads may take (PGDASH_FR_BUDGET).
    """

    def __init__(self, probe: Any, wrapped: WrappedIntervals,
                 open_calls: Callable[[], tuple[dict[str, int], dict[str, list]]],
                 clock: Callable[[], float] = time.time, read_every_s: float = 1.0,
                 budget: float = 0.005):
        self.probe = probe
        self.wrapped = wrapped
        self.open_calls = open_calls
        self.clock = clock
        self.read_every_s = read_every_s
        self.budget = budget
        self.next_id: dict[int, int] = {}  # recorder index -> first record id not processed
        self.missed = 0  # entries the ring overwrote before they were read
        self.reads = 0
        self.errors = 0
        self.seen_cpp = False  # the last read found collectives only the recorder saw
        # The newest entries timed here, (group, op, bytes, start, end, seq) in Unix seconds:
        # the collectives issued from C++ on a snapshot's timeline
        self.recent: collections.deque = collections.deque(maxlen=RECENT_ENTRIES)
        self.read_seconds = 0.0  # CPU time of the full reads (thread time)
        self._last_read = float("-inf")
        self._min_gap = 0.0
        self._classified: dict[str, int] = {}  # group -> highest sequence number classified
        # Entries seen before they completed or before their wrapper's interval was known:
        # (recorder, record id) -> (entry, wrapped or None while unknown, first seen at)
        self._waiting: dict[tuple[int, int], list] = {}
        # status key -> (first seen, last seen, last completed collective): one item per
        # value the polls found, since the last read
        self._polls: dict[str, tuple[list[float], list[float], list[int]]] = {}
        self._summary: dict[tuple[str, str], _Summary] = {}

    # -- status polls (cheap; the probe calls this with every status it reads) ----------------

    def note_status(self, now: float, status: dict[str, dict[str, Any]]) -> None:
        for key, entry in status.items():
            done = int(entry.get("last_completed_collective", -1))
            first, last, values = self._polls.setdefault(key, ([], [], []))
            if values and values[-1] == done:
                last[-1] = now  # still there: the gap of the next advance starts here
                continue
            if values and done < values[-1]:  # the recorder was reset: start over
                del first[:], last[:], values[:]
            if len(values) >= MAX_POLLS:
                del first[:MAX_POLLS // 2], last[:MAX_POLLS // 2], values[:MAX_POLLS // 2]
            first.append(now)
            last.append(now)
            values.append(done)

    def _completed_at(self, key: str, seq: int, created: float,
                      fallback: float) -> tuple[float, float]:
        """(latency s, resolution s) of sequence number ``seq``: completed after the last poll
        that found it running (or its creation) and by the first poll that found it done."""
        first, last, values = self._polls.get(key, ((), (), ()))
        i = bisect.bisect_left(values, seq) if values else 0
        if values and 0 < i < len(values):
            seen, before = first[i], last[i - 1]
        elif values and i == 0:  # done by the first poll kept: since its creation
            seen, before = first[0], created
        else:  # no poll saw it done: the read did
            seen, before = fallback, (last[-1] if last else created)
        start = max(before, created)
        seen = max(seen, start)
        return (start + seen) / 2 - created, seen - start

    # -- full reads (bounded rate) -------------------------------------------------------------

    def due(self, now: float, status: dict[str, dict[str, Any]] | None) -> bool:
        """Whether a full read is allowed now and could find something new."""
        if now - self._last_read < max(self.read_every_s, self._min_gap):
            return False
        if status is None:
            return False
        if self._waiting:
            return True
        for key, entry in status.items():
            enqueued = int(entry.get("last_enqueued_collective", -1))
            if enqueued < 0:
                continue
            name = self.probe.names.get(key)
            if name is None:
                return True  # a group not named yet: its entries tell
            if enqueued > max(self._classified.get(name, -1), self.wrapped.highest(name)):
                return True
        return False

    def read(self, now: float | None = None) -> None:
        """One full read of every recorder: classify and summarise the new entries."""
        now = self.clock() if now is None else now
        started = time.thread_time()
        self._last_read = now
        self.seen_cpp = False
        try:
            if self.probe.disabled:
                return
            if self.probe.dumps is None:  # the probe never read yet (a job shorter than a tick)
                from pgdash_agent.flight import default_dumps

                self.probe.dumps = default_dumps()
            dumps = self.probe.dumps
            for index, dump in enumerate(dumps):
                entries, status = self._new_entries(index, dump(True))
                if status:
                    self.note_status(now, {f"{index}:{k}": v for k, v in status.items()})
                self._process(index, entries, now)
        finally:
            cost = time.thread_time() - started
            self.reads += 1
            self.read_seconds += cost
            self._min_gap = cost / self.budget if self.budget > 0 else 0.0

    def _new_entries(self, index: int, raw: bytes | str) -> tuple[list[dict], dict]:
        """Entries of recorder ``index`` from the first one not processed yet (or still
        waiting), and the dump's pg_status (see :func:`dump_tail`)."""
        nxt = self.next_id.get(index)
        waiting = [rid for (i, rid) in self._waiting if i == index]
        if waiting and nxt is not None:  # re-read those too: completion shows on them later
            nxt = min(nxt, min(waiting))
        return dump_tail(raw, nxt)

    def _process(self, index: int, entries: list[dict], now: float) -> None:
        nxt = self.next_id.get(index)
        if entries:
            first = int(entries[0].get("record_id", 0))
            if nxt is not None and first > nxt:
                self.missed += first - nxt  # the ring overwrote them before this read
            elif nxt is None and first > 0:
                self.missed += first  # attached late: older entries are gone
        opened, async_spans = self.open_calls()
        # Entries still waiting from earlier reads come first (they are older).
        waiting = [w for k, w in sorted(self._waiting.items()) if k[0] == index]
        self._waiting = {k: w for k, w in self._waiting.items() if k[0] != index}
        fresh = []
        refreshed = {}
        for entry in entries:
            rid = int(entry.get("record_id", -1))
            if nxt is not None and rid < nxt:
                refreshed[rid] = entry  # a waiting entry, as it is now
                continue
            fresh.append([entry, None, now])
            self.next_id[index] = rid + 1
            group = (entry.get("process_group") or [""])[0]
            if group:  # names the group for the probe too (no full dump of its own needed)
                self.probe.names[f"{index}:{entry.get('pg_id')}"] = str(group)
        for item in waiting:
            item[0] = refreshed.get(int(item[0].get("record_id", -1)), item[0])
        for item in waiting + fresh:
            entry = item[0]
            if entry.get("is_p2p"):
                continue  # left to the wrappers (on NCCL p2p shares the collective counter)
            group = (entry.get("process_group") or [""])[0]
            if not group:
                continue
            seq = int(entry.get("collective_seq_id", -1))
            if item[1] is None:
                lo = opened.get(group)
                if lo is not None and seq > lo:
                    self._wait(index, item)  # a wrapped call is open: its interval comes later
                    continue
                item[1] = self.wrapped.covers(group, seq, async_spans.get(group, ()))
                if seq > self._classified.get(group, -1):
                    self._classified[group] = seq
            if item[1]:
                continue
            self._complete(index, item, now)
        for group, seq in self._classified.items():
            self.wrapped.prune(group, seq)
        self._prune_polls()

    def _wait(self, index: int, item: list) -> None:
        if len(self._waiting) < MAX_WAITING:
            self._waiting[(index, int(item[0].get("record_id", -1)))] = item
        else:
            self.missed += 1

    def _complete(self, index: int, item: list, now: float) -> None:
        entry = item[0]
        key = f"{index}:{entry.get('pg_id')}"
        seq = int(entry.get("collective_seq_id", -1))
        created = int(entry.get("time_created_ns", 0)) / 1e9
        duration = entry.get("duration_ms")
        if duration is not None:
            latency, resolution, timing = float(duration) / 1e3, 0.0, "device"
        else:
            done = entry.get("retired") or entry.get("state") == "completed"
            if not done:
                values = self._polls.get(key, ((), (), ()))[2]
                done = bool(values) and values[-1] >= seq
            if not done:
                self._wait(index, item)
                return
            noticed = int(entry.get("time_discovered_completed_ns") or 0) / 1e9
            latency, resolution = self._completed_at(key, seq, created, noticed or now)
            timing = "host_poll"
        self.seen_cpp = True
        group = entry["process_group"][0]
        s_op = op_name(str(entry.get("profiling_name", "")))
        s = self._summary.get((group, s_op))
        if s is None:
            s = self._summary[(group, s_op)] = _Summary()
        nbytes = entry_bytes(entry)
        s.add(max(latency * 1e6, 0.0), nbytes)
        self.recent.append((group, s_op, nbytes, created, created + max(latency, 0.0), seq))
        if timing == "host_poll":
            s.timing = "host_poll"
            s.resolution_us = max(s.resolution_us, resolution * 1e6)

    def _prune_polls(self) -> None:
        """Keep only the polls later entries may still need (the last two per group)."""
        waiting_keys = {f"{i}:{w[0].get('pg_id')}" for (i, _), w in self._waiting.items()}
        for key, (first, last, values) in self._polls.items():
            if key not in waiting_keys and len(values) > 2:
                del first[:-2], last[:-2], values[:-2]

    def take_summary(self) -> list[dict[str, Any]]:
        """Rows (the wrappers' shape plus source, timing, resolution) since the last call."""
        rows = [{**s.row(g, op), "source": SOURCE, "timing": s.timing,
                 "resolution_us": round(s.resolution_us, 3)}
                for (g, op), s in self._summary.items()]
        self._summary = {}
        return rows
