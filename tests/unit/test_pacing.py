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
    wanted = [True]
    pace = Pace(lambda: False, stop, wanted=lambda: wanted[0])
    pace.start()
    pace()  # less than a slice of work: nothing
    wanted[0] = False
    pace._from = time.monotonic() - 10.0  # ten seconds of work with nothing to give way to
    pace()  # ... go unpaused, and that slice ends there
    wanted[0] = True
    pace()  # a job starts: the work before it is not paused for now
    _busy(pace)
    with pytest.raises(Stopped):  # a slice of work done while it is wanted: a pause
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
    # lengthens the pause. What it gave away is counted (a fold's deadline leaves it out).
    assert time.monotonic() - start >= 0.3 * 0.9
    assert pace.paused_s >= 0.3 * 0.9


def test_a_pace_that_must_finish_goes_on_flat_out_once_the_server_stops():
    stop = threading.Event()
    stop.set()
    # Behind for ever, with no limit, and stopped: both return (without finish they raise;
    # without the stop they would wait on).
    pace = Pace(lambda: True, stop, finish=True)
    _busy(pace)
    pace()
    pace.wait_while_behind()
