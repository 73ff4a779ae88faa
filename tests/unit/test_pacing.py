"""dashboard.pacing: a background fold's pace (what it does between events, not how fast)."""

import threading
import time

import pytest

from dashboard import pacing
from dashboard.pacing import GaveUp, Pace, Stopped


def _busy(pace: Pace) -> None:
    """A slice of work just done: the next call acts."""
    pace._from = time.monotonic() - pacing.SLICE_S


def test_a_pace_pauses_only_after_a_slice_of_work_and_only_when_wanted():
    stop = threading.Event()
    stop.set()  # any pause would raise Stopped at once
    wanted = [False]
    pace = Pace(lambda: False, stop, wanted=lambda: wanted[0])
    pace.start()
    pace()  # less than a slice of work: nothing
    _busy(pace)
    pace()  # a slice, but nothing to give way to
    wanted[0] = True
    with pytest.raises(Stopped):  # now it gives way
        pace()


def test_a_pace_waits_while_the_server_is_behind_and_gives_up_or_stops():
    behind = [True]
    stop = threading.Event()
    pace = Pace(lambda: behind[0], stop, give_up_s=0.5)
    with pytest.raises(GaveUp):
        pace.wait_while_behind()
    pace = Pace(lambda: behind[0], stop)  # no limit: stops with the server
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Stopped):
        pace.wait_while_behind()
    behind[0] = False
    Pace(lambda: behind[0], threading.Event(), give_up_s=0.0).wait_while_behind()  # at once


def test_a_paced_slice_is_followed_by_a_pause_so_the_fold_works_its_duty():
    stop = threading.Event()
    pace = Pace(lambda: False, stop)
    pace._from = time.monotonic() - 0.1  # a slice of 0.1 s
    start = time.monotonic()
    pace()
    # At a duty of a quarter it pauses three times the slice (0.3 s); a loaded machine only
    # lengthens the pause.
    assert time.monotonic() - start >= 0.3 * 0.9
