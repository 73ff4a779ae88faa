"""Progress of collectives Python never sees, from PyTorch's Flight Recorder.

DDP's gradient all-reduce and functional collectives are issued from C++, so no Python wrapper
sees them. The Flight Recorder (on by default for gloo and NCCL in torch 2.13) keeps, per
process group, the last enqueued and last completed collective sequence number. Reading just
that status (``includeCollectives=False``) costs about 0.2 ms, so the agent's background thread
reads it once per interval. A rank whose ``enqueued`` stays ahead of ``completed`` sits in a
collective; a rank whose ``enqueued`` is lower than its peers' never reached it.

The status is keyed by the backend's process-group id; the group's name comes from the
entries of one full dump, taken only when an id without a name shows up. CUDA builds keep
NCCL groups in a recorder of their own (``_dump_nccl_trace_json``; seen on torch 2.11 + NCCL
2.28 on an H200, where ``_dump_fr_trace_json`` listed no NCCL group), so both are read.
"""

from __future__ import annotations

import json
from typing import Any, Callable


LEARN_EVERY_S = 10.0


def default_dumps() -> list[Callable[[bool], bytes]]:
    """The Flight Recorder dumps this torch has: gloo (and others), and NCCL's own."""
    from torch._C import _distributed_c10d

    dumps = []
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        fn = getattr(_distributed_c10d, name, None)
        if fn is not None:
            dumps.append(lambda include, fn=fn: fn(includeCollectives=include))
    return dumps


class FlightRecorderProbe:
    """Per group: FR's enqueued/completed counters and since when one is in flight.

    Args:
        clock: wall clock (Unix seconds).
        dumps: functions returning Flight Recorder JSON (argument: include the entries);
            default: every recorder this torch has. Injected for tests.
    """

    def __init__(self, clock: Callable[[], float],
                 dumps: list[Callable[[bool], bytes | str]] | None = None):
        self.clock = clock
        self.dumps = dumps
        self.names: dict[str, str] = {}  # "<recorder>:<pg id>" -> process group name
        self.errors = 0
        self.disabled = False
        self._since: dict[str, tuple[int, int, float]] = {}  # pg id -> (enq, done, since)
        self._learned_at = float("-inf")
        self._busy: dict[str, list[int]] = {}  # pg id -> [samples in flight, samples]
        # Called with (now, status) after every status read (pgdash_agent.flight_stats times
        # completions with it).
        self.on_status: Callable[[float, dict[str, dict[str, Any]]], None] | None = None
        self.last_status: dict[str, dict[str, Any]] | None = None  # of the last read or sample

    def sample(self) -> None:
        """Count, per group, whether a collective is in flight now (the agent calls this every PGDASH_FR_POLL_S
        on average while a group's collectives are C++-only, as DDP's: the share of samples
        that find a rank inside one says how long it waits there)."""
        status = self._status(self.clock())
        if status is not None:
            self._count(status)

    def _count(self, status: dict[str, dict[str, Any]]) -> None:
        for key, entry in status.items():
            tally = self._busy.setdefault(key, [0, 0])
            tally[0] += int(entry.get("last_enqueued_collective", -1)) > int(
                entry.get("last_completed_collective", -1))
            tally[1] += 1

    def read(self) -> dict[str, dict[str, Any]]:
        """Group name -> {"fr_enqueued", "fr_completed", "fr_inflight_since", "fr_busy",
        "fr_samples"}; {} if off. ``fr_busy`` of ``fr_samples`` samples since the last read
        found a collective in flight (a read is no sample: heartbeats come at a fixed period)."""
        now = self.clock()
        status = self._status(now)
        if status is None:
            return {}
        busy, self._busy = self._busy, {}
        out = {}
        for key, entry in status.items():
            name = self.names.get(key)
            if name is None:
                continue
            enqueued = int(entry.get("last_enqueued_collective", -1))
            completed = int(entry.get("last_completed_collective", -1))
            since = None
            if enqueued > completed:
                previous = self._since.get(key)
                if previous and previous[:2] == (enqueued, completed):
                    since = previous[2]
                else:
                    since = now
                    self._since[key] = (enqueued, completed, now)
            in_flight, samples = busy.get(key, (0, 0))
            out[name] = {"fr_enqueued": max(enqueued, 0), "fr_completed": max(completed, 0),
                         "fr_inflight_since": since, "fr_busy": in_flight,
                         "fr_samples": samples}
        return out

    def _status(self, now: float) -> dict[str, dict[str, Any]] | None:
        """The recorders' per-group status by "<recorder>:<pg id>"; None if off or broken."""
        if self.disabled:
            return None
        status: dict[str, dict[str, Any]] = {}
        try:
            if self.dumps is None:
                self.dumps = default_dumps()
            for index, dump in enumerate(self.dumps):
                for pg_id, entry in (json.loads(dump(False)).get("pg_status") or {}).items():
                    status[f"{index}:{pg_id}"] = entry
            unnamed = [key for key, entry in status.items() if key not in self.names
                       and int(entry.get("last_enqueued_collective", -1)) >= 0]
            # A full dump costs up to tens of ms (2000 entries): only for a new active group,
            # and at most every LEARN_EVERY_S.
            if unnamed and now - self._learned_at >= LEARN_EVERY_S:
                self._learned_at = now
                self._learn_names({key.split(":")[0] for key in unnamed})
            self.last_status = status
            if self.on_status is not None:
                self.on_status(now, status)
        except Exception:
            self.errors += 1
            if self.errors >= 3:  # this torch has no usable Flight Recorder: stop trying
                self.disabled = True
            return None
        return status

    def _learn_names(self, recorders: set[str]) -> None:
        for index in sorted(recorders):
            dump = self.dumps[int(index)]
            for entry in json.loads(dump(True)).get("entries") or []:
                group = entry.get("process_group") or ()
                if group and group[0] != "":
                    self.names[f"{index}:{entry.get('pg_id')}"] = str(group[0])
