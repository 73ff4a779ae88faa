"""The agent's bounded, thread-safe outbox of events waiting to be sent and acknowledged."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from pgdash_agent.wire import Event, event

# Summaries and heartbeats can be dropped under pressure (the next one supersedes much of what
# was lost, and the drop is reported); identity, groups, init, errors and exits are what a
# diagnosis is built on, so they are dropped only if nothing else is left to drop.
DROPPABLE_KINDS = frozenset({"coll_stats", "heartbeat"})
# Readings that may wait for the next heartbeat to leave with it (at most one heartbeat
# period): one batch per second instead of one per reading halves the batches, and with
# them the acknowledgements and writes, a server handles per rank. Anything else (the
# heartbeat itself, errors, stacks, exits) sends what is waiting at once.
LINGERING_KINDS = frozenset({"coll_stats", "gpu"})


class Outbox:
    """Events in sequence order; ``put`` assigns the sequence number.

    Bounded by ``capacity`` events: past it the oldest droppable event goes, and the drop is
    counted by kind in ``dropped`` (reported to the server with the next heartbeat).
    ``due()`` says whether what is waiting should be sent now (see LINGERING_KINDS).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.dropped: collections.Counter[str] = collections.Counter()
        self._events: collections.deque[Event] = collections.deque()
        self._seq = 0
        self._pressing = 0  # events queued that are not LINGERING_KINDS
        self._lock = threading.Lock()
        self.ready = threading.Condition(self._lock)

    def put(self, t: float, kind: str, body: dict[str, Any]) -> bool:
        """Append an event; returns False if something had to be dropped to make room."""
        with self._lock:
            self._seq += 1
            self._events.append(event(self._seq, t, kind, body))
            self._pressing += kind not in LINGERING_KINDS
            room = self._make_room()
            self.ready.notify_all()
            return room

    def due(self, linger_s: float, now: float | None = None) -> bool:
        """Whether to send now: something queued is not a lingering reading, or the oldest
        has waited ``linger_s`` (wall clock, the events' own time)."""
        with self._lock:
            return self._due(linger_s, now)

    def wait(self, timeout: float, linger_s: float, hold: bool = False) -> None:
        """Wait up to ``timeout`` for something to send (``hold``: for anything at all)."""
        with self.ready:
            if hold or not self._due(linger_s):
                self.ready.wait(timeout)

    def _due(self, linger_s: float, now: float | None = None) -> bool:
        if not self._events:
            return False
        if self._pressing:
            return True
        return (time.time() if now is None else now) - self._events[0]["t"] >= linger_s

    def take(self, limit: int) -> list[Event]:
        with self._lock:
            n = min(limit, len(self._events))
            out = [self._events.popleft() for _ in range(n)]
            self._pressing -= sum(ev["kind"] not in LINGERING_KINDS for ev in out)
            return out

    def requeue(self, events: list[Event]) -> None:
        """Put unacknowledged events back in front, keeping sequence order."""
        if not events:
            return
        with self._lock:
            self._events.extendleft(reversed(events))
            self._pressing += sum(ev["kind"] not in LINGERING_KINDS for ev in events)
            # Batches acknowledged out of order (a refused one, then a later one) come back
            # newest first: the events must still leave in sequence order, or the server, which
            # ignores any seq at or below its highest stored, would drop the older ones.
            n = len(events)
            if len(self._events) > n and self._events[n - 1]["seq"] > self._events[n]["seq"]:
                self._events = collections.deque(sorted(self._events, key=lambda e: e["seq"]))
            self._make_room()
            self.ready.notify_all()

    def __len__(self) -> int:
        return len(self._events)

    def _make_room(self) -> bool:
        ok = True
        while len(self._events) > self.capacity:
            ok = False
            index = next(
                (i for i, ev in enumerate(self._events) if ev["kind"] in DROPPABLE_KINDS), 0
            )
            kind = self._events[index]["kind"]
            self.dropped[kind] += 1
            self._pressing -= kind not in LINGERING_KINDS
            del self._events[index]
        return ok
