"""Per-connection rate limits on agent traffic: events per second and bytes per second.

Pure (no Flask, no sockets, an injected clock), so any ingest path can use it: the Socket.IO
``/agent`` handler asks :meth:`ConnectionLimits.admit` before it validates a batch, and a
refusal goes back to the agent as ``{"ok": false, "retry": true, "retry_after": s}`` with a
reason that names the setting. The agent keeps the batch and sends it again later, so a
flooding agent is slowed, not robbed, and other connections never notice.

Each limit is a token bucket that may go into debt: a batch is admitted while the bucket is not
in debt, then its whole cost is taken. So a single batch bigger than the burst still passes
(nothing is ever refused forever), and the connection then waits until the debt is repaid.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

#: Server settings (``PGDASH_<NAME>``), their defaults, and what they bound.
EVENTS_PER_S = "MAX_EVENTS_PER_S"
BYTES_PER_S = "MAX_BYTES_PER_S"
BURST_S = "RATE_BURST_S"
DEFAULTS = {
    # An agent sends ~5-50 events/s in steady state; a burst after a reconnect resends its
    # buffer (PGDASH_MAX_BUFFERED_EVENTS, 20,000 by default) within a few seconds.
    EVENTS_PER_S: 5_000.0,
    BYTES_PER_S: 8_000_000.0,
    BURST_S: 4.0,  # seconds of full-rate traffic a quiet connection may send at once
}


class TokenBucket:
    """``rate`` units per second, at most ``rate * burst_s`` saved up; may go into debt."""

    def __init__(self, rate: float, burst_s: float, clock: Callable[[], float]):
        self.rate = rate
        self.capacity = rate * burst_s
        self.level = self.capacity
        self._clock = clock
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until the bucket is out of debt (0: a take may happen now)."""
        self._refill()
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount


@dataclasses.dataclass
class Refusal:
    """Why a batch was not admitted, and when to try again."""

    reason: str
    retry_after: float


class ConnectionLimits:
    """The limits of one agent connection.

    Args:
        events_per_s: ``PGDASH_MAX_EVENTS_PER_S``; 0 or less turns the limit off.
        bytes_per_s: ``PGDASH_MAX_BYTES_PER_S``; 0 or less turns the limit off.
        burst_s: ``PGDASH_RATE_BURST_S``: how many seconds of traffic may come at once.
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, events_per_s: float, bytes_per_s: float, burst_s: float = 4.0,
                 clock: Callable[[], float] = time.monotonic):
        self._buckets: list[tuple[TokenBucket, str, str]] = []
        if events_per_s > 0:
            self._events = TokenBucket(events_per_s, burst_s, clock)
            self._buckets.append((self._events, EVENTS_PER_S, f"{events_per_s:g} events/s"))
        else:
            self._events = None
        if bytes_per_s > 0:
            self._bytes = TokenBucket(bytes_per_s, burst_s, clock)
            self._buckets.append((self._bytes, BYTES_PER_S, f"{bytes_per_s:g} bytes/s"))
        else:
            self._bytes = None

    @property
    def counts_bytes(self) -> bool:
        """Whether :meth:`admit` needs a batch's size (measuring it costs time)."""
        return self._bytes is not None

    def admit(self, events: int, nbytes: int = 0) -> Refusal | None:
        """Admit a batch of ``events`` events and ``nbytes`` bytes (None), or say why not."""
        for bucket, name, rate in self._buckets:
            wait = bucket.wait()
            if wait > 0:
                return Refusal(f"this connection sends more than {rate} (PGDASH_{name} on the "
                               f"server); send again in {wait:.2f} s", round(wait, 3))
        if self._events is not None:
            self._events.take(events)
        if self._bytes is not None:
            self._bytes.take(nbytes)
        return None


def settings_error(name: str, value: object) -> str | None:
    """A message if a limit setting is not a number (None when it is fine)."""
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"PGDASH_{name} must be a number, got {value!r:.40}"
    return None
