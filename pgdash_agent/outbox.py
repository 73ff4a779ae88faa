"""The agent's bounded, thread-safe outbox of events waiting to be sent and acknowledged."""

from __future__ import annotations

import collections
import threading
from typing import Any

from pgdash_agent.wire import Event, event

# Summaries and heartbeats can be dropped under pressure (the next one supersedes much of what
# was lost, and the drop is reported); identity, groups, init, errors and exits are what a
# diagnosis is built on, so they are dropped only if nothing else is left to drop.
DROPPABLE_KINDS = frozenset({"coll_stats", "heartbeat"})


class Outbox:
    """Events in sequence order; ``put`` assigns the sequence number.

    Bounded by ``capacity`` events: past it the oldest droppable event goes, and the drop is
    counted by kind in ``dropped`` (reported to the server with the next heartbeat).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.dropped: collections.Counter[str] = collections.Counter()
        self._events: collections.deque[Event] = collections.deque()
        self._seq = 0
        self._lock = threading.Lock()
        self.ready = threading.Condition(self._lock)

    def put(self, t: float, kind: str, body: dict[str, Any]) -> bool:
        """Append an event; returns False if something had to be dropped to make room."""
        with self._lock:
            self._seq += 1
            self._events.append(event(self._seq, t, kind, body))
            room = self._make_room()
            self.ready.notify_all()
            return room

    def take(self, limit: int) -> list[Event]:
        with self._lock:
            n = min(limit, len(self._events))
            return [self._events.popleft() for _ in range(n)]

    def requeue(self, events: list[Event]) -> None:
        """Put unacknowledged events back in front, keeping sequence order."""
        if not events:
            return
        with self._lock:
            self._events.extendleft(reversed(events))
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
            self.dropped[self._events[index]["kind"]] += 1
            del self._events[index]
        return ok
