"""How far behind the agents the server's ingest is, so that its own lag is never blamed on a rank.

An overloaded server folds each rank's heartbeat late. Judged on arrival, the ranks would
look silent (``rank_lost``) or stuck in a collective they left long ago (``hang``). So ingest
measures its lag and diagnosis judges at ``now - lag``: overload delays verdicts, it never
invents them.

The lag of one folded batch is how much later than usual, for that agent, its newest event
was folded: ``(fold time - event time) - (the smallest such delay seen for that session)``.
Subtracting each session's own floor removes its clock offset and network delay, so agents'
clocks need not agree with the server's. The server's lag is a high percentile of the
batches folded in the last ``window_s`` seconds (one agent resending old events after a
reconnect does not count as overload), or the age of the oldest write still queued, or a
recent pause of the server itself, or how far any rank's events received lead those folded,
whichever is larger (a stalled server folds nothing to measure: right after it resumes, the
silence it has not read yet would look like the ranks').

The last of those is what keeps a rank the server reads late from being called silent: for
each session, the newest event time it has received (queued for the writer, or refused with a
full queue: the agent sends it again) against the newest it has folded, both on the agent's
clock. A rank is then judged silent only when nothing came from it, folded or not, for the
silence a rule asks; one that sent nothing (frozen, cut off) leads by nothing.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

log = logging.getLogger("pgdash.server")

LAG_WINDOW_S = 5.0  # batches folded this recently make up the current lag
LAG_QUANTILE = 0.9
LAG_WARN_S = 5.0  # above this, the server says it is behind (log, /metrics, page)
PAUSE_NOTICED_S = 1.0  # the watchdog overslept by this much: the server itself was paused
WATCHDOG_S = 0.1  # how often the watchdog wakes
MAX_SAMPLES = 8192  # bound of the window, whatever the rate
MAX_SESSIONS = 1_000_000  # floors kept (one per agent process)
UNREAD_KEEP_S = 120.0  # received, never folded since (the agent gave up, or died): forgotten
# judged_at() reuses a lag measured this recently. It is asked before each batch is folded
# while the server is behind, and measuring reads every sample of the window and every
# unread session: at 1,024 ranks, 39% of the server's time, which kept it behind.
LAG_REFRESH_S = 0.1


class IngestLag:
    """Lag samples of folded batches; ``current()`` is the server's lag in seconds.

    Args:
        clock: wall clock (``time.time``), injected for tests.
        backlog_s: returns the age in seconds of the oldest write still queued (0 if none).
    """

    def __init__(self, clock: Callable[[], float], backlog_s: Callable[[], float] = lambda: 0.0,
                 window_s: float = LAG_WINDOW_S):
        self.clock = clock
        self.backlog_s = backlog_s
        self.window_s = window_s
        self._floor: dict[str, float] = {}
        self._read: dict[str, float] = {}  # session -> newest event time folded
        # session -> (newest event time received past what is folded, wall time received)
        self._unread: dict[str, tuple[float, float]] = {}
        self._samples: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=MAX_SAMPLES)
        self._pauses: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)
        self._beat: float | None = None  # monotonic time the watchdog last ran
        self._behind = False  # whether the server last said it is behind
        self._measured: tuple[float, float] | None = None  # judged_at's last (now, lag)

    def start(self) -> "IngestLag":
        """Run the pause watchdog: a thread that only sleeps, so that oversleeping means the
        process stood still (SIGSTOP, swapped out, starved of the GIL)."""
        self._beat = time.monotonic()
        threading.Thread(target=self._watch, name="pgdash-pause-watchdog", daemon=True).start()
        return self

    def _watch(self) -> None:
        while True:
            time.sleep(WATCHDOG_S)
            self.check_pause()

    def check_pause(self) -> None:
        """Record a pause if the watchdog has not run for PAUSE_NOTICED_S. Also called by
        the writer before it judges anything and by :meth:`current`: after SIGCONT either may
        run before the watchdog, and the moments of the pause must not be judged on what was
        read before it, nor reported as a lag of a second or two."""
        if self._beat is None:
            return
        now = time.monotonic()
        gap, self._beat = now - self._beat, now
        if gap > WATCHDOG_S + PAUSE_NOTICED_S:
            self.paused(gap - WATCHDOG_S)

    def folded(self, session: str, newest_event_t: float, folded_at: float) -> None:
        """Record a batch of ``session`` whose newest event (agent time) was folded now."""
        delay = folded_at - newest_event_t
        floor = self._floor.get(session)
        if floor is None or delay < floor:
            if floor is None and len(self._floor) >= MAX_SESSIONS:
                self._floor.clear()  # a server up for months: start the floors afresh
                self._read.clear()
            self._floor[session] = floor = delay
        self._samples.append((folded_at, delay - floor))
        self.read_through(session, newest_event_t)

    def received(self, session: str, newest_event_t: float) -> None:
        """Any thread: a batch of ``session`` whose newest event (agent time) is
        ``newest_event_t`` came in, to be folded or refused (the agent sends it again)."""
        read = self._read.get(session)
        if read is None or newest_event_t <= read:
            return  # a session not folded yet leads by nothing known; the backlog says it
        unread = self._unread.get(session)
        if unread is None or newest_event_t > unread[0]:
            self._unread[session] = (newest_event_t, self.clock())

    def read_through(self, session: str, newest_event_t: float) -> None:
        """Writer thread: ``session``'s events up to ``newest_event_t`` are folded (or were
        already: a batch sent again)."""
        if newest_event_t > self._read.get(session, float("-inf")):
            self._read[session] = newest_event_t
        unread = self._unread.get(session)
        if unread is not None and newest_event_t >= unread[0]:
            self._unread.pop(session, None)

    def unread_s(self) -> float:
        """How far the events received from the most-behind session lead those folded."""
        now, lead = self.clock(), 0.0
        for session, (newest, at) in tuple(self._unread.items()):
            if now - at > UNREAD_KEEP_S:
                self._unread.pop(session, None)
            else:
                lead = max(lead, newest - self._read.get(session, newest))
        return lead

    def lateness(self, session: str, newest_event_t: float, folded_at: float) -> float:
        """How much later than usual a batch of ``session`` is folded now (0 for a session
        not seen before): a batch read after the server itself stood still is as late as
        the pause, before any sample or the push loop has said so."""
        floor = self._floor.get(session)
        return 0.0 if floor is None else max(0.0, folded_at - newest_event_t - floor)

    def paused(self, seconds: float) -> None:
        """The server itself was not running for ``seconds`` (stopped, swapped out, starved
        of the GIL): for a window after it, what agents sent meanwhile is still being read,
        so the lag is at least that long."""
        self._pauses.append((self.clock(), seconds))
        self._measured = None  # the next judgement holds back by the pause at once

    def forget(self, session: str) -> None:
        self._floor.pop(session, None)
        self._read.pop(session, None)
        self._unread.pop(session, None)

    def current(self) -> float:
        """The server's lag now, in seconds (0.0 when it keeps up)."""
        # A pause the watchdog has not woken to notice yet (the first request served after
        # SIGCONT may run before it: /metrics said 2 s after a 20 s stop on a loaded machine).
        self.check_pause()
        now = self.clock()
        # tuple(): one C-level copy under the GIL, while the writer thread appends
        recent = sorted(lag for at, lag in tuple(self._samples) if now - at <= self.window_s)
        measured = recent[min(len(recent) - 1, int(LAG_QUANTILE * len(recent)))] \
            if recent else 0.0
        paused = max((gap for at, gap in tuple(self._pauses) if now - at <= self.window_s + gap),
                     default=0.0)
        return max(0.0, measured, paused, self.backlog_s(), self.unread_s())

    def judged_at(self, now: float) -> float:
        """The moment live verdicts are judged up to: ``now``, or, while the server is
        behind (its lag over LAG_WARN_S), ``now`` less that lag.

        An overloaded server folds heartbeats late; judged at arrival time the ranks would
        look silent or stuck. Held back by the lag they look as they were when what the
        server has folded so far was current. A lag under LAG_WARN_S is not held back: the
        grid's moments are then judged with exactly the events received by each, as replay
        judges them (dashboard.diagnosis.book).

        The lag is measured at most every LAG_REFRESH_S (a pause noticed is heeded at once).
        """
        measured = self._measured
        if measured is not None and 0.0 <= now - measured[0] < LAG_REFRESH_S:
            lag = measured[1]
        else:
            lag = self.current()
            self._measured = (now, lag)
        if (lag > LAG_WARN_S) != self._behind:
            self._behind = not self._behind
            if self._behind:
                log.warning("pgdash: ingest is %.1f s behind the agents; verdicts that this "
                            "lag could explain are held until it catches up", lag)
            else:
                log.warning("pgdash: ingest caught up with the agents")
        return now - (lag if self._behind else 0.0)
