"""What the agent's background thread sends: heartbeats, latency summaries, GPU readings.

:class:`Reporter` assembles each periodic report from the collective tracker, the Flight
Recorder and the GPU sampler, and puts it in the outbox: the heartbeat (each group's progress,
what was dropped, what is buffered), the interval's latency summaries (merged while the
server is unreachable: one row per group and op, however long it lasts), the GPU readings and
their XIDs. It also decides when the Flight Recorder is read and sampled. When each of
these runs is the loop's business (``pgdash_agent.loop``); what they contain is this file's.
Only the agent's background thread (and detach, once it stopped) calls it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any, Callable

from pgdash_agent.board import proc_stat
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.config import AgentConfig
from pgdash_agent.flight import FlightRecorderProbe
from pgdash_agent.flight_stats import FlightStats
from pgdash_agent.gpu import GpuSampler
from pgdash_agent.outbox import Outbox
from pgdash_agent.sender import Sender

log = logging.getLogger("pgdash.agent")


class Reporter:
    """Builds and queues the periodic reports of one agent.

    Args:
        config: the agent's settings.
        outbox: where the reports go.
        sender: asked whether the server is connected (a stale report is not queued).
        tracker: the collective tracker (progress, summaries, drop counts).
        flight: the Flight Recorder probe.
        fr_stats: the Flight Recorder reader (its summaries and missed entries).
        nvml: the ``pynvml`` module or a stand-in (tests: there is no GPU here).
        gpu_locator: returns this rank's GPU UUID, None while CUDA is not up yet, or False
            without CUDA.
    """

    def __init__(self, config: AgentConfig, outbox: Outbox, sender: Sender,
                 tracker: CollectiveTracker, flight: FlightRecorderProbe, fr_stats: FlightStats,
                 nvml: Any, gpu_locator: Callable[[], str | None | bool]):
        self.config = config
        self.outbox = outbox
        self.sender = sender
        self.tracker = tracker
        self.flight = flight
        self.fr_stats = fr_stats
        self._wall_offset = time.time() - time.perf_counter()
        self.last_flight: dict[str, dict[str, Any]] = {}  # the last Flight Recorder reading
        self.flight_sample_at = 0.0  # monotonic time of the next sample
        self._nvml = nvml
        self._gpu_locator = gpu_locator
        self.gpu: GpuSampler | None = None
        self._gpu_checked = not config.gpu  # True once we know whether there is a GPU
        self._xids: list[int] = []  # XIDs not sent yet (kept across disconnects)
        self._pending_stats: list[dict[str, Any]] = []
        self._stats_start = time.time()

    def dropped(self) -> dict[str, int]:
        dropped = dict(self.outbox.dropped)
        if self.tracker.dropped_records:
            dropped["collectives"] = self.tracker.dropped_records
        if self.fr_stats.missed:  # Flight Recorder entries overwritten before they were read
            dropped["flight_recorder"] = self.fr_stats.missed
        return dropped

    def wall(self, perf: float) -> float:
        return perf + self._wall_offset

    def flush_stats(self, force: bool = False) -> None:
        """Close the current latency interval; while offline, keep growing it instead."""
        rows = self.tracker.take_summary() + self.fr_stats.take_summary()
        if rows:
            self._pending_stats = _merge_rows(self._pending_stats, rows)
        if self._pending_stats and (self.sender.connected or force):
            now = time.time()
            self.outbox.put(now, "coll_stats", {"start": self._stats_start, "end": now,
                                                "rows": self._pending_stats})
            self._pending_stats = []
            self._stats_start = now
        elif not self._pending_stats:
            self._stats_start = time.time()

    def read_flight(self, force: bool = False) -> None:
        """Read the Flight Recorder's entries when due (see agent.flight_stats)."""
        try:
            now = time.time()
            if force or self.fr_stats.due(now, self.flight.last_status):
                self.fr_stats.read(now)
        except Exception as exc:
            self.fr_stats.errors += 1
            log.debug("pgdash: flight recorder read: %s", exc)

    def heartbeat(self, force: bool = False) -> None:
        if not (self.sender.connected or force):
            return  # a stale heartbeat is worth nothing; the next live one says it all
        self.last_flight = self.flight.read()
        body = {"groups": self.tracker.progress(self.wall, self.last_flight),
                "dropped": self.dropped(), "buffered": len(self.outbox),
                "cpu_s": round(cpu_seconds(), 3)}
        io = io_bytes()
        if io is not None:
            body["io_b"] = io
        made, marks = self.tracker.groups_made
        if made:
            body["groups_made"], body["groups_made_fp"] = made, list(marks)
        holding = threads_holding_exit()
        if holding is not None:
            body["main_done"], body["holding"] = True, holding
        self.outbox.put(time.time(), "heartbeat", body)

    def sample_flight(self, now: float) -> None:
        """Between heartbeats, while a group runs collectives Python never sees (DDP's), count
        how often the Flight Recorder finds one in flight: how long this rank waits there.

        Sampled at random moments (PGDASH_FR_POLL_S apart on average): at a fixed period a
        training step of a commensurate length would be seen at the same phase every time.
        """
        if now < self.flight_sample_at:
            return
        self.flight_sample_at = now + random.uniform(0.5, 1.5) * self.config.fr_poll_s
        tracks = self.tracker.by_name
        if self.fr_stats.seen_cpp or any(
                fr["fr_enqueued"] and (name not in tracks or not tracks[name].entered)
                for name, fr in self.last_flight.items()):
            self.flight.sample()

    def sample_gpu(self) -> None:
        """Find this rank's GPU once CUDA is up, then send one reading per interval."""
        if not self._gpu_checked:
            uuid = self._gpu_locator()
            if uuid is False:
                self._gpu_checked = True  # no CUDA in this process: nothing to sample
            elif uuid is not None:
                self._gpu_checked = True
                sampler = GpuSampler(uuid, self._nvml)
                if sampler.start():
                    self.gpu = sampler
                else:
                    log.info("pgdash: no GPU health: %s", sampler.error)
        if self.gpu is None:
            return
        reading = self.gpu.sample()
        if reading is None:
            return
        self._xids.extend(reading["xids"])
        if not self.sender.connected and not self._xids:
            return  # like heartbeats, plain readings are worth sending only live
        reading["xids"], self._xids = self._xids[:64], self._xids[64:]
        self.outbox.put(time.time(), "gpu", reading)


def _merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge two interval summaries (used while the server is unreachable)."""
    if not old:
        return new
    merged = {_row_key(r): dict(r, hist=dict(map(tuple, r["hist"]))) for r in old}
    for r in new:
        key = _row_key(r)
        m = merged.get(key)
        if m is None:
            merged[key] = dict(r, hist=dict(map(tuple, r["hist"])))
            continue
        m["count"] += r["count"]
        m["bytes"] += r["bytes"]
        m["sum_us"] = round(m["sum_us"] + r["sum_us"], 3)
        m["max_us"] = max(m["max_us"], r["max_us"])
        for b, c in r["hist"]:
            m["hist"][b] = m["hist"].get(b, 0) + c
        if "resolution_us" in r:
            m["resolution_us"] = max(m.get("resolution_us", 0.0), r["resolution_us"])
            if r.get("timing") == "host_poll":
                m["timing"] = "host_poll"
    return [dict(m, hist=sorted([b, c] for b, c in m["hist"].items())) for m in merged.values()]


def _row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["group"], row["op"], row.get("source", "wrapper")


def cpu_seconds(proc: str = "/proc") -> float:
    """CPU seconds so far of this process (every thread) and of its descendants, live or
    ended: a loop whose work is done by DataLoader's workers (decoding, augmenting), or by
    processes those start (a decoder's own pool), while its main thread waits for their
    batches uses little CPU of its own, and is working, not blocked (rules.idle on the
    server). Children that ended count once their parent reaped them (``os.times``:
    DataLoader joins its workers; a live child's reaped ones are in its ``cutime``), live
    ones from ``/proc/<pid>/stat`` (a few reads a heartbeat: at most MAX_CHILDREN
    processes, nearest first)."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    waiting = _children("self", proc)
    read = 0
    while waiting and read < MAX_CHILDREN:
        pid = waiting.pop(0)
        read += 1
        fields = proc_stat(pid, proc)
        try:  # its own time and its reaped children's (utime, stime, cutime, cstime)
            total += sum(int(f) for f in fields[STAT_UTIME:STAT_UTIME + 4]) / _TICKS
        except (TypeError, ValueError):
            continue  # (ended since, or not readable)
        waiting += _children(pid, proc)
    return total


def _children(pid: str, proc: str) -> list[str]:
    """The live child processes of ``pid`` (any of its threads' children)."""
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return []
    children: list[str] = []
    for task in tasks:
        try:
            with open(f"{proc}/{pid}/task/{task}/children", "rb") as f:
                children += f.read().decode().split()
        except OSError:
            continue
    return children


MAX_CHILDREN = 64
# utime, the 14th field of /proc/<pid>/stat (stime, cutime and cstime follow), counted from
# the state (the 3rd)
STAT_UTIME = 14 - 3
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def io_bytes(path: str = "/proc/self/io") -> int | None:
    """Bytes this process read and wrote through system calls so far (Linux's ``rchar`` +
    ``wchar``: files, pipes, sockets): whether a rank that issues no collectives moves data
    (a checkpoint written to slow storage) or is blocked. None where there is no such file."""
    try:
        with open(path, "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"rchar"]) + int(fields[b"wchar"])
    except (OSError, KeyError, ValueError):
        return None


MAX_HOLDING = 8  # thread names a heartbeat lists


def threads_holding_exit() -> list[str] | None:
    """None while the main thread runs; once it has ended (the script returned, and the
    interpreter waits for its non-daemon threads before it exits), the names of the threads
    it waits for: a process that lives on after its script ended (rules.idle)."""
    main = threading.main_thread()
    if main.is_alive():
        return None
    return sorted(t.name[:64] for t in threading.enumerate()
                  if t is not main and not t.daemon and t.is_alive())[:MAX_HOLDING]
