"""The pace of the server's background folds: work a share of the time, live ingest first.

Some folds have nobody waiting on them live: an ended job opened on the page
(dashboard.ingest.pipeline's ``Ingest.ready``), the moments around an ended job's incidents
(dashboard.history.incident_frames). They are CPU-bound Python sharing the interpreter with
ingest: flat out, one took half of it from a live 1,024-rank job, whose ingest fell a minute
behind and whose agents' resends then kept it there (bench/capacity.py --stored). Such a fold
calls its :class:`Pace` between events: after a slice of SLICE_S of work it pauses so that it
works DUTY of the time, and while the server is behind its agents it waits.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

DUTY = 0.25  # the share of the time a paced fold works ...
SLICE_S = 0.05  # ... in slices about this long
BEHIND_STEP_S = 0.2  # how often a fold waiting for ingest to catch up looks again
PACE_EVENTS = 500  # a fold calls its pace every this many events (~10 ms at 1,024 ranks)


class Stopped(Exception):
    """The server stops: the fold under way is given up."""


class GaveUp(Exception):
    """The server stayed behind its agents longer than the pace's ``give_up_s``."""


class Pace:
    """Called between a fold's events (often: it reads the clock, and acts once a slice of
    work is done).

    Args:
        behind: whether the server is behind its agents now (the fold then waits).
        stop: set when the server stops: the fold then raises :class:`Stopped`, or with
            ``finish``, goes on flat out (someone waits for its result).
        wanted: whether pausing is needed now (an opening with no job running goes flat out).
        give_up_s: after waiting this long for ingest, :class:`GaveUp` (None: wait on).
    """

    def __init__(self, behind: Callable[[], bool], stop: threading.Event, *,
                 wanted: Callable[[], bool] = lambda: True, give_up_s: float | None = None,
                 finish: bool = False):
        self.behind, self.stop, self.wanted, self.give_up_s = behind, stop, wanted, give_up_s
        self.finish = finish
        self.duty = DUTY  # (tests lift it)
        self.paused_s = 0.0  # time given away so far (a fold's deadlines leave it out)
        self._from = time.monotonic()

    def start(self) -> None:
        """A slice of work starts now (the fold begins)."""
        self._from = time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        busy = now - self._from
        if busy < SLICE_S:
            return
        if not self.wanted():  # nothing to give way to: this slice ends unpaused
            self._from = now
            return
        if self.stop.wait(busy * (1 - self.duty) / self.duty):
            self._stopped()
        self._account(now)
        self.wait_while_behind()

    def wait_while_behind(self) -> None:
        """Return once the server keeps up with its agents (or it stops, with ``finish``)."""
        start = time.monotonic()
        give_up = None if self.give_up_s is None else start + self.give_up_s
        while not self.stop.is_set() and self.behind():
            if self.stop.wait(BEHIND_STEP_S):
                break
            if give_up is not None and time.monotonic() >= give_up:
                self._account(start)
                raise GaveUp
        self._account(start)
        if self.stop.is_set():
            self._stopped()

    def _account(self, since: float) -> None:
        now = time.monotonic()
        self.paused_s += now - since
        self._from = now

    def _stopped(self) -> None:
        if not self.finish:
            raise Stopped
