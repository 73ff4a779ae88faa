"""When the server last heard from each agent, by its connection: before anything is stored.

A rank is silent (``rank_lost``) when nothing has come from it for ``lost_after`` seconds. The
fold can only say what it has folded, and an overloaded server folds each rank's batches late
and unevenly: an agent that waits for acknowledgements sends nothing more, and its next batch
(20 or 30 seconds of reports at once) lands after the batches of ranks that were acked
sooner. Judged on the fold alone, such a rank looked silent while the server held its reports
(a healthy 1,024-rank job beside a CPU hog got 925 ``rank_lost`` criticals, bench/capacity.py).

The connection says more: the server heard the agent when a frame of it arrived, and while it
owes the agent an acknowledgement the silence is the server's own. :class:`Heard` keeps that
per session, as spans of the server's clock, for the rules to ask (``Settings.heard``): a rank
is called lost only when its connection is quiet too. A frozen rank (SIGSTOP, the GIL held in
C), a cut-off host or a dead process sends nothing and is owed nothing, so it is named as
before; a rank whose connection closed is back when a frame comes from it again.

Only the process that holds the agent's connection knows; a clustered owner judging a session
connected elsewhere, or a server judging the past of an agent it never heard, is told None and
judges on the fold alone.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

# Heard again within this: one span. Heartbeats come every second, and a server with no room
# asks an agent to wait at most 5 s (dashboard.ingest.pipeline): so an agent that is there
# keeps one span, however far behind the server reads it. Silences shorter than this go
# unseen, and rank_lost asks about silences of lost_after (15 s).
SPAN_GAP_S = 6.0
SPANS_KEPT = 64  # per session: silences longer than SPAN_GAP_S, the newest kept
MAX_SESSIONS = 1_000_000  # a server up for months starts afresh past this


class _Session:
    __slots__ = ("spans", "owed", "owed_since", "open")

    def __init__(self):
        self.spans: collections.deque[list[float]] = collections.deque(maxlen=SPANS_KEPT)
        self.owed = 0  # batches received and not answered yet
        self.owed_since = 0.0
        self.open = True


class Heard:
    """Per session: spans of server time in which a frame came from it or an acknowledgement
    was owed to it. Any thread.

    Args:
        clock: the server's wall clock (``time.time``), injected for tests.
    """

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def connected(self, session: str) -> None:
        """The agent of ``session`` opened a connection (a first one, or again)."""
        with self._lock:
            entry = self._entry(session)
            entry.open, entry.owed = True, 0
            now = self.clock()
            self._cover(entry, now, now)

    def received(self, session: str) -> None:
        """A frame of ``session`` came in."""
        with self._lock:
            now = self.clock()
            self._cover(self._entry(session), now, now)

    def owe(self, session: str) -> None:
        """A batch of ``session`` waits for the writer, and its agent for the acknowledgement
        (:meth:`answered` says it went out): until then its silence is the server's."""
        with self._lock:
            entry = self._entry(session)
            if not entry.owed:
                entry.owed_since = self.clock()
            entry.owed += 1

    def answered(self, session: str) -> None:
        """An acknowledgement owed to ``session`` went out: the agent sends again from now."""
        with self._lock:
            entry = self._sessions.get(session)
            if entry is None or not entry.open:
                return  # its connection closed: nothing went out
            now = self.clock()
            if entry.owed:
                # Owed all along: heard through the wait, also when a moment inside it is
                # judged later (a server behind judges the past).
                self._cover(entry, entry.owed_since, now)
                entry.owed -= 1
                entry.owed_since = now
            else:
                self._cover(entry, now, now)

    def closed(self, session: str) -> float:
        """The connection of ``session`` closed: nothing is owed on it any more. Returns how
        long an acknowledgement had been owed on it (0.0: none)."""
        with self._lock:
            entry = self._sessions.get(session)
            owed = 0.0
            if entry is not None:
                if entry.owed:
                    now = self.clock()
                    self._cover(entry, entry.owed_since, now)  # owed until now
                    owed = max(0.0, now - entry.owed_since)
                entry.open, entry.owed = False, 0
            return owed

    def heard(self, session: str, at: float) -> float | None:
        """The newest moment at or before ``at`` (server time) at which the server heard from
        ``session`` or owed it an acknowledgement; None when it cannot say (a session it
        never heard here, or ``at`` older than the spans it keeps)."""
        with self._lock:
            entry = self._sessions.get(session)
            if entry is None:
                return None
            if entry.owed and entry.owed_since <= at:
                return at
            for start, end in reversed(entry.spans):
                if start <= at:
                    return min(end, at)
            return None  # before its first frame here, or before the spans kept

    def _entry(self, session: str) -> _Session:
        entry = self._sessions.get(session)
        if entry is None:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions.clear()
            entry = self._sessions[session] = _Session()
        return entry

    @staticmethod
    def _cover(entry: _Session, start: float, end: float) -> None:
        """Heard from ``start`` through ``end`` (the newest span grows, or a new one begins)."""
        spans = entry.spans
        if spans and start - spans[-1][1] <= SPAN_GAP_S:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
