"""The agent's end-of-program reports (pgdash_agent.failures): ``sys.exit`` while attached."""

import os
import signal
import sys
import threading
import time

import pytest

from pgdash_agent import failures
from pgdash_agent.failures import FailureReports
from pgdash_agent.outbox import Outbox


@pytest.fixture
def reports():
    out = FailureReports(Outbox(16), os.getpid(), lambda **kw: True)
    out.exits = []
    out._exit = out.exits.append  # what sys.exit would have done
    return out


def sent(reports):
    return [(e["kind"], e["body"]["where"], e["body"]["error_type"])
            for e in reports.outbox.take(16)]


def test_an_exit_1_while_handling_an_error_reports_that_error_as_what_ended_the_rank(reports):
    # torch.multiprocessing.spawn's wrapper in each child, and scripts that log and exit 1
    try:
        raise KeyError("loss_ema")
    except Exception:
        reports._sys_exit(1)
    assert reports.exits == [1] and reports.failed and reports.exitcode == 1
    assert sent(reports) == [("error", "uncaught", "KeyError")]
    # python -m pgdash_agent sees the same SystemExit on its way out: reported once
    reports.note_exit(1)
    assert sent(reports) == []


def test_an_exit_status_alone_is_reported_and_an_exit_0_is_not(reports):
    reports._sys_exit(0)
    reports._sys_exit(None)
    assert sent(reports) == [] and not reports.failed
    try:
        raise SystemExit(4)
    except SystemExit:  # an exit turned into another: no error of its own to report
        reports._sys_exit("config missing")
    assert sent(reports) == [("error", "exit", "SystemExit")] and reports.exitcode == 1
    assert reports.exits == [0, None, "config missing"]


def test_an_exception_reported_uncaught_already_is_not_sent_again_at_its_exit(reports):
    exc = RuntimeError("boom")
    reports.note_uncaught(RuntimeError, exc)
    try:
        raise exc
    except RuntimeError:
        reports._sys_exit(1)
    assert sent(reports) == [("error", "uncaught", "RuntimeError")]


def test_sys_exit_on_another_thread_ends_that_thread_only_and_is_no_failure(reports):
    thread = threading.Thread(target=reports._sys_exit, args=(2,))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert reports.exits == [2] and not reports.failed and sent(reports) == []


def test_install_wraps_sys_exit_and_uninstall_gives_it_back(reports):
    real_exit, real_hook = sys.exit, sys.excepthook
    try:
        reports.install()
        assert sys.exit == reports._sys_exit and reports._exit is real_exit
        reports.uninstall()
        assert sys.exit is real_exit
    finally:
        sys.exit, sys.excepthook = real_exit, real_hook


def test_a_second_ctrl_c_does_not_cut_the_report_of_the_first_short(reports):
    # torchrun forwards SIGINT to ranks that the terminal's Ctrl-C already reached: the
    # second lands while the agent reports the first (here: inside the report, for real)
    put = reports.outbox.put

    def slow_put(*args):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # a KeyboardInterrupt would cut this sleep, and the report, short
        put(*args)

    reports.outbox.put = slow_put
    reports._previous_excepthook = lambda *exc: None
    held = failures.held_sigints
    handler = signal.getsignal(signal.SIGINT)
    reports._excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert sent(reports) == [("error", "uncaught", "KeyboardInterrupt")] and reports.failed
    assert failures.held_sigints == held + 1  # counted, not raised
    assert signal.getsignal(signal.SIGINT) is handler  # a later Ctrl-C interrupts as before


def test_the_programs_own_sigterm_handler_is_reported_before_it_runs(reports):
    """A preemption handler (save a checkpoint, exit 0): the server learns the job was
    stopped from outside. The program sees its own handler, never the wrapper; a signal
    without a Python handler is left alone."""
    real_set, real_get = signal.signal, signal.getsignal
    real_exit, real_hook = sys.exit, sys.excepthook
    before = signal.getsignal(signal.SIGTERM)
    ran = []

    def on_sigterm(signum, frame):
        ran.append(signum)

    try:
        reports.install()
        assert signal.signal(signal.SIGTERM, on_sigterm) is before
        assert signal.getsignal(signal.SIGTERM) is on_sigterm
        assert real_get(signal.SIGTERM) is not on_sigterm  # installed wrapped
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # (a Python handler runs between bytecodes)
        assert ran == [signal.SIGTERM] * 2
        assert sent(reports) == [("error", "signal", "SIGTERM")]  # once
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert real_get(signal.SIGUSR2) is signal.SIG_IGN  # nothing to wrap
        reports.uninstall()
        assert signal.signal is real_set and signal.getsignal is real_get
    finally:
        signal.signal, signal.getsignal = real_set, real_get
        real_set(signal.SIGTERM, before)
        real_set(signal.SIGUSR2, signal.SIG_DFL)
        sys.exit, sys.excepthook = real_exit, real_hook
