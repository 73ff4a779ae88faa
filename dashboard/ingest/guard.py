"""Failed token attempts per client address: a bounded number per window, then 429.

Without it a client could guess the token at whatever rate the server answers (``POST /login``,
or ``Authorization: Bearer`` on any API route). :class:`LoginGuard` remembers, per address, the
times of its last ``max_failures`` failed attempts; while that many fall inside ``window_s``,
every further attempt from the address is refused *before* its credential is checked, so a
guess that happens to be right is refused too and tells the guesser nothing. A successful
attempt neither counts nor clears the record: otherwise anyone holding the token on the same
address (a Prometheus scraper behind the same NAT) would reset a guesser's count for it.

Memory is bounded: at most ``max_addresses`` addresses (least recently failing evicted first,
counted), each with at most ``max_failures`` timestamps. Pure (no Flask, an injected clock);
``dashboard.web.access`` applies it to the HTTP routes and the ``/ui`` namespace.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Callable

#: Server settings (``PGDASH_<NAME>``) and their defaults.
MAX_FAILURES = "LOGIN_MAX_FAILURES"
WINDOW_S = "LOGIN_WINDOW_S"
MAX_ADDRESSES = "LOGIN_MAX_ADDRESSES"
PROXIES = "LOGIN_PROXIES"
DEFAULTS = {
    # 30 guesses per 5 minutes is ~8,600 a day: nothing against a random token of 16+
    # characters, and room for a person or a misconfigured scraper to get it wrong a while.
    MAX_FAILURES: 30,
    WINDOW_S: 300.0,
    MAX_ADDRESSES: 10_000,  # ~30 timestamps each: a few MB at most
    # Reverse proxies in front of the server that append the client's address to
    # X-Forwarded-For. 0 (direct): the header is ignored, since any client can write it.
    PROXIES: 0,
}


def client_address(remote_addr: str | None, forwarded_for: str | None, proxies: int) -> str:
    """The address a guess is counted against.

    With ``proxies`` trusted proxies in front, the address the outermost one saw is the
    ``proxies``-th entry of X-Forwarded-For from the right (entries further left are what the
    client itself wrote, and could be anything); without the header, or with fewer entries
    than proxies, the connection's own address.
    """
    if proxies > 0 and forwarded_for:
        hops = [part.strip() for part in forwarded_for.split(",")]
        if len(hops) >= proxies and hops[-proxies]:
            return hops[-proxies][:64]
    return remote_addr or "?"


class LoginGuard:
    """Counts failed token attempts per client address and says when to refuse one.

    Args:
        max_failures: ``PGDASH_LOGIN_MAX_FAILURES``: failures allowed per window; 0 turns the
            guard off.
        window_s: ``PGDASH_LOGIN_WINDOW_S``: the sliding window, in seconds.
        max_addresses: ``PGDASH_LOGIN_MAX_ADDRESSES``: how many addresses are remembered.
        clock: monotonic seconds (injected for tests).
        proxies: ``PGDASH_LOGIN_PROXIES``: trusted reverse proxies (see :func:`client_address`).
    """

    def __init__(self, max_failures: int, window_s: float, max_addresses: int,
                 clock: Callable[[], float] = time.monotonic, proxies: int = 0):
        self.proxies = proxies
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self.counters: collections.Counter[str] = collections.Counter()
        self._clock = clock
        self._failures: collections.OrderedDict[str, collections.deque[float]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: it may try now). A refusal is counted."""
        if self.max_failures <= 0:
            return 0.0
        with self._lock:
            times = self._failures.get(address)
            if times is None or len(times) < self.max_failures:
                return 0.0
            wait = times[0] + self.window_s - self._clock()
            if wait <= 0:
                return 0.0
            self.counters["refused"] += 1
            return wait

    def failed(self, address: str) -> None:
        """Record a failed attempt from ``address``."""
        if self.max_failures <= 0:
            return
        with self._lock:
            self.counters["failures"] += 1
            times = self._failures.pop(address, None)
            if times is None:
                times = collections.deque(maxlen=self.max_failures)
            times.append(self._clock())
            self._failures[address] = times  # now the most recent
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)
                self.counters["evicted"] += 1

    def address(self, remote_addr: str | None, headers) -> str:
        """The client address of a request (its connection's, or per PGDASH_LOGIN_PROXIES)."""
        return client_address(remote_addr, headers.get("X-Forwarded-For"), self.proxies)

    def message(self, address: str, wait: float) -> str:
        """What a refused client is told: what happened, which settings, when to retry."""
        return (f"too many failed token attempts from {address}: at most {self.max_failures} "
                f"per {self.window_s:g} s (PGDASH_LOGIN_MAX_FAILURES, PGDASH_LOGIN_WINDOW_S on "
                f"the server); try again in {math.ceil(wait)} s")


def from_config(config) -> LoginGuard:
    """The guard of a server, from its ``PGDASH_LOGIN_*`` settings.

    Raises:
        ValueError: a setting is not a number of the right kind; the message names it.
    """
    values = {}
    for name, kind in ((MAX_FAILURES, int), (WINDOW_S, float), (MAX_ADDRESSES, int),
                       (PROXIES, int)):
        raw = config.get(name, DEFAULTS[name])
        try:
            value = kind(raw)
            if isinstance(raw, float) and kind is int and raw != value:
                raise ValueError(raw)
        except (TypeError, ValueError):
            raise ValueError(f"PGDASH_{name} must be a{'n integer' if kind is int else ' number'}"
                             f", got {raw!r:.40}") from None
        if value < 0 or (value == 0 and name not in (MAX_FAILURES, PROXIES)):
            raise ValueError(f"PGDASH_{name} must be positive, got {raw!r:.40}")
        values[name] = value
    return LoginGuard(values[MAX_FAILURES], values[WINDOW_S], values[MAX_ADDRESSES],
                      proxies=values[PROXIES])
