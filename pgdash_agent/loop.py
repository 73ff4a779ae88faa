"""The agent's background thread, ``pgdash-agent``, and its schedule.

:class:`AgentLoop` decides when each job of the background thread runs: async works are
polled every pass (every PGDASH_ASYNC_POLL_S while one is pending, else every 0.1 s); every
PGDASH_INTERVAL_S the groups are scanned and the Flight Recorder read, a latency summary, a
GPU reading and the heartbeat are sent and stuck stacks captured; between two heartbeats a
summary every PGDASH_STATS_INTERVAL_S, and Flight Recorder samples at random moments. What
each report contains is ``pgdash_agent.reports``'s business; this file is only the clock.
Nothing in the loop raises: an error is counted in the tracker's ``internal_errors`` and the
loop goes on. The training thread never waits on it (it only sets the wake event).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.config import AgentConfig
from pgdash_agent.process_groups import ProcessGroupWatch
from pgdash_agent.reports import Reporter
from pgdash_agent.snapshots import Snapshots
from pgdash_agent.stacks import StuckStacks

log = logging.getLogger("pgdash.agent")


class AgentLoop:
    """Runs the agent's periodic work on its own daemon thread.

    Args:
        config: the agent's settings (the periods).
        tracker: the collective tracker (async works to poll, records to summarise).
        groups: announces new process groups.
        reporter: builds and queues the reports.
        stacks: sends the stacks of threads stuck in a collective.
        announce: rank 0's console line, said once the server took the job.
        snapshots: answers the server's questions (pgdash_agent.snapshots).
    """

    def __init__(self, config: AgentConfig, tracker: CollectiveTracker,
                 groups: ProcessGroupWatch, reporter: Reporter, stacks: StuckStacks,
                 announce: Callable[[], None], snapshots: Snapshots):
        self.config = config
        self.tracker = tracker
        self.groups = groups
        self.reporter = reporter
        self.stacks = stacks
        self._announce = announce
        self.snapshots = snapshots
        self._stop = threading.Event()
        self.wake = threading.Event()  # set on stop, and when an async work starts
        self._thread = threading.Thread(target=self._loop, name="pgdash-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to finish its last pass, and wait up to ``timeout`` seconds."""
        self._stop.set()
        self.wake.set()
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        reporter = self.reporter
        next_tick = time.monotonic() + self.config.interval_s
        next_stats = time.monotonic() + self.config.stats_interval_s
        while not self._stop.is_set():
            try:
                self.tracker.poll_async()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self.config.interval_s
                    next_stats = now + self.config.stats_interval_s
                    self.groups.scan()
                    if self.config.flight_stats:
                        reporter.read_flight()
                    reporter.flush_stats()
                    reporter.sample_gpu()
                    reporter.heartbeat()  # last: the readings waiting leave with it (outbox)
                    self.stacks.capture(reporter.last_flight)
                elif now >= next_stats:
                    next_stats = now + self.config.stats_interval_s
                    # A summary between heartbeats; not one just before the next heartbeat's.
                    if next_tick - now > 0.5 * self.config.stats_interval_s:
                        reporter.flush_stats()
                else:
                    self.tracker.summarise()
                    reporter.sample_flight(now)
                self.snapshots.answer()
                self._announce()
            except Exception as exc:
                self.tracker.internal_errors += 1
                log.debug("pgdash: agent loop: %s", exc)
            wait = self.config.async_poll_s if self.tracker.pending else 0.1
            if reporter.last_flight:  # wake for the next sample, not on a fixed 0.1 s grid
                wait = min(wait, max(0.01, reporter.flight_sample_at - time.monotonic()))
            self.wake.wait(min(wait, max(0.0, min(next_tick, next_stats) - time.monotonic())))
            self.wake.clear()
        try:
            self.tracker.poll_async()
            self.groups.scan()
        except Exception:
            pass
