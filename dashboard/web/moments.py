"""The last few moments of stored jobs shown, kept: stepping back and forth over a few
moments, and comparing two (dashboard.web.compare asks for A again at every B), fold each
moment once.

A moment is kept only once it is final: more than SETTLED_S before the server's clock (every
event received by then is committed: a moment the writer may still stamp events at is not),
and for TTL_S at most (compaction may later rewrite the events it folded into summaries).
The answers are large (a 1,024-rank moment is megabytes of objects): MAX_MOMENTS of them.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

MAX_MOMENTS = 4
TTL_S = 60.0
SETTLED_S = 5.0


class Moments:
    """Args:
        clock: the server's clock (Unix seconds; what moments are measured against).
        monotonic: for the TTL (injected for tests).
    """

    def __init__(self, clock: Callable[[], float], size: int = MAX_MOMENTS,
                 ttl_s: float = TTL_S, monotonic: Callable[[], float] = time.monotonic):
        self.clock, self.size, self.ttl_s, self.monotonic = clock, size, ttl_s, monotonic
        self._kept: collections.OrderedDict[tuple[int, float], tuple[float, Any]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, job_id: int, at: float, make: Callable[[], Any]) -> Any:
        """``make()``'s answer for the job at ``at``, from the moments kept when it is."""
        key = (job_id, at)
        now = self.monotonic()
        with self._lock:
            found = self._kept.get(key)
            if found is not None and now - found[0] <= self.ttl_s:
                self._kept.move_to_end(key)
                self.hits += 1
                return found[1]
        answer = make()
        if answer is not None and at < self.clock() - SETTLED_S:
            with self._lock:
                self._kept[key] = (now, answer)
                self._kept.move_to_end(key)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return answer
