"""How the program fails and ends, as the agent reports it: errors, the excepthook, atexit.

:class:`FailureReports` sends an ``error`` for a collective that raised, for an exception that
ends the program (``sys.excepthook``, or a launcher that caught it) and for a non-zero
``sys.exit`` status, and remembers that the program failed: the ``exit`` event says whether
the end was clean, and rank 0's console line stays quiet after a traceback. A non-zero
``sys.exit`` on the main thread is seen by the agent whatever started the program (it wraps
``sys.exit`` while attached): torch.multiprocessing.spawn's workers, and scripts that catch
their error, log it and exit 1, end that way; the exception being handled then is the
failure, reported as uncaught. At exit
(``atexit``) it has the agent flush and stop. Its own room because these are the hooks that
run while the program is going down, where nothing may raise and the reason must not be lost.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

from pgdash_agent import frames as pyframes
from pgdash_agent import wire
from pgdash_agent.collectives import GroupTrack, call_signature
from pgdash_agent.outbox import Outbox


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT held back while the agent reports how the program ends (main thread): Ctrl-C
    in a terminal reaches torchrun and every rank, and torchrun sends the ranks a second
    SIGINT, which landed inside the report of the first and cut it short (the rank then
    read as cleanly exited). Meanwhile a SIGINT is only counted (the program is ending
    already); the handler is given back after, so a later one interrupts as before."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # (None: a handler not set from Python: left alone)
                signal.signal(signal.SIGINT, _count_sigint)
        except (OSError, ValueError):
            previous = None
    try:
        yield
    finally:
        if previous is not None:
            try:
                signal.signal(signal.SIGINT, previous)
            except (OSError, ValueError):
                pass


held_sigints = 0  # SIGINTs that came while a report was being made


def _count_sigint(signum: int, frame: Any) -> None:
    global held_sigints
    held_sigints += 1


# The signals schedulers stop (or warn) a job with, whose handlers the program may set.
# (SIGINT's default raises KeyboardInterrupt, which the agent reports already.)
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")


class SignalWatch:
    """Wraps the program's own handlers of STOP_SIGNALS so that ``report(name)`` runs first.

    ``signal.signal`` and ``signal.getsignal`` are replaced while the agent is attached: a
    handler set for one of those signals is installed wrapped, and both give the program's
    handler back, never the wrapper. Handlers set before the agent attached are wrapped at
    install. Nothing changes for a signal without a Python handler (its default action, or
    SIG_IGN): the agent adds no handler of its own, which could not run while the main thread
    waits inside a collective, and would keep SIGTERM from ending the process."""

    def __init__(self, report: Callable[[str], None]):
        self.report = report
        self._set_original = self._get_original = None

    def install(self) -> None:
        self._set_original, self._get_original = signal.signal, signal.getsignal
        signal.signal, signal.getsignal = self._set, self._get
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                num = getattr(signal, name, None)
                try:
                    handler = self._get_original(num) if num is not None else None
                    if callable(handler) and not hasattr(handler, "__pgdash_signal__"):
                        self._set_original(num, self._wrap(num, handler))
                except (OSError, ValueError):
                    pass

    def uninstall(self) -> None:
        """Give the functions back; the wrappers stay (they only report, then call)."""
        if signal.signal == self._set:
            signal.signal = self._set_original
        if signal.getsignal == self._get:
            signal.getsignal = self._get_original

    def _set(self, signalnum: Any, handler: Any) -> Any:
        if callable(handler) and not hasattr(handler, "__pgdash_signal__") and \
                _signal_name(signalnum) in STOP_SIGNALS:
            handler = self._wrap(signalnum, handler)
        return _unwrapped(self._set_original(signalnum, handler))

    def _get(self, signalnum: Any) -> Any:
        return _unwrapped(self._get_original(signalnum))

    def _wrap(self, signalnum: Any, handler: Callable) -> Callable:
        name, report = _signal_name(signalnum), self.report

        def wrapped(signum, frame):
            report(name)
            return handler(signum, frame)

        wrapped.__pgdash_signal__ = handler
        return wrapped


def _signal_name(signalnum: Any) -> str | None:
    try:
        return signal.Signals(signalnum).name
    except (ValueError, TypeError):
        return None


def _unwrapped(handler: Any) -> Any:
    return getattr(handler, "__pgdash_signal__", handler)


def error_text(exc: BaseException) -> str:
    return str(exc) or repr(exc)


def error_causes(exc: BaseException) -> list[dict[str, str]]:
    """The exceptions ``exc`` was raised from or while handling, nearest first, as Python
    prints them above its traceback (``raise ... from None`` hides them), MAX_CAUSES at most."""
    causes: list[dict[str, str]] = []
    seen = {id(exc)}
    while len(causes) < wire.MAX_CAUSES:
        exc = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)
        if exc is None or id(exc) in seen:
            break
        seen.add(id(exc))
        causes.append({"error_type": type(exc).__name__,
                       "error": error_text(exc)[:wire.MAX_TEXT]})
    return causes


class FailureReports:
    """Reports errors and the program's end; one per agent.

    Args:
        outbox: where the reports go.
        pid: the agent's process (a forked child, e.g. a DataLoader worker, reports nothing).
        detach: the agent's ``detach(reason=...)``, called at exit.
    """

    def __init__(self, outbox: Outbox, pid: int, detach: Callable[..., bool]):
        self.outbox = outbox
        self.pid = pid
        self._detach = detach
        self.failed = False
        self.exitcode: int | None = None  # the program's exit status, when it is known
        self._reported: BaseException | None = None  # the last exception reported uncaught
        # The tracker's last_calls (set once it exists): an uncaught error reports them.
        self.last_calls: Callable[[], list] | None = None
        self._exit = sys.exit
        self.signals = SignalWatch(self.note_signal)
        self._signalled: set[str] = set()

    def install(self) -> None:
        """Chain ``sys.excepthook``, watch ``sys.exit`` and the program's own handlers of the
        signals a job is stopped with, and register the flush at exit."""
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._exit = sys.exit
        sys.exit = self._sys_exit
        self.signals.install()
        atexit.register(self._at_exit)

    def uninstall(self) -> None:
        """Give ``sys.exit`` and ``signal.signal`` back (unless someone replaced them since)."""
        if sys.exit == self._sys_exit:
            sys.exit = self._exit
        self.signals.uninstall()

    def note_signal(self, name: str) -> None:
        """The program's own handler of ``name`` is about to run (main thread): a scheduler
        or a launcher is stopping the job (a preemption handler that saves a checkpoint
        and exits 0), so the ranks that end now are not at fault. Reported once per signal
        as an ``error`` with ``where: signal``. Never raises."""
        try:
            if name not in self._signalled and os.getpid() == self.pid:
                self._signalled.add(name)
                self.outbox.put(time.time(), "error", {
                    "where": "signal", "error_type": name,
                    "error": f"the process received {name}, and its own handler ran"})
        except Exception:
            pass

    def _sys_exit(self, status: Any = None) -> None:
        """``sys.exit`` while the agent is attached: note a failing status (and the exception
        being handled, which it ends the program for), then exit as ``sys.exit`` does."""
        if threading.current_thread() is threading.main_thread():  # elsewhere: a thread ends
            self.note_exit(status, handling=sys.exc_info())
        self._exit(status)

    def collective_error(self, track: GroupTrack, op: str, seq: int,
                         exc: BaseException) -> None:
        """A wrapped collective raised (the tracker's ``on_error``; training thread)."""
        try:
            body = {"where": "collective", "error_type": type(exc).__name__,
                    "error": error_text(exc), "group": track.name, "op": op, "seq": seq}
            inflight, done = track.inflight, track.done
            if inflight is not None and inflight[0] == op and seq == track.entered:
                # what it was called with, and the call before it on the group: in a size
                # mismatch the rank whose size changed is the odd one (rules.desync)
                _, body["dtype"], body["bytes"] = call_signature(inflight)
                if done is not None and track.completed == seq - 1:
                    body["before"] = call_signature(done)
            self.outbox.put(time.time(), "error", body)
        except Exception:
            pass

    def _excepthook(self, exc_type, exc, tb) -> None:
        try:
            with sigint_held():
                self.note_uncaught(exc_type, exc, tb)
        finally:
            self._previous_excepthook(exc_type, exc, tb)

    def note_uncaught(self, exc_type: type, exc: BaseException, tb: Any = None) -> None:
        """Report an exception that ends the program (the excepthook's, or one a launcher
        caught, e.g. torch.multiprocessing's), with its traceback (``tb``, else the
        exception's own) as the user reads it (pgdash_agent.frames). Never raises."""
        try:
            if os.getpid() == self.pid and exc is not self._reported:
                self._reported = exc
                self.failed = True
                body = {"where": "uncaught", "error_type": exc_type.__name__,
                        "error": error_text(exc)}
                frames, omitted = pyframes.traceback_frames(
                    tb if tb is not None else getattr(exc, "__traceback__", None))
                if frames:
                    body["traceback"] = frames
                if omitted:
                    body["traceback_omitted"] = omitted
                causes = error_causes(exc)
                if causes:
                    body["causes"] = causes
                calls = self.last_calls() if self.last_calls is not None else None
                if calls:  # what it called last: ranks that fail together compare them
                    body["last"] = calls
                # A KeyboardInterrupt too: someone stopped the job (Ctrl-C, a launcher's
                # SIGINT), and the server must not take the unclean exit for a failure.
                self.outbox.put(time.time(), "error", body)
        except Exception:
            pass

    def note_exit(self, code: Any, handling: tuple = (None, None, None)) -> None:
        """The program called ``sys.exit(code)`` (seen by ``python -m pgdash_agent``, and by
        the agent's ``sys.exit``): a non-zero status is a failure, as the launcher will see
        it; ``handling`` is ``sys.exc_info()`` where it was called, an exception it ends the
        program for. Reported once. Never raises."""
        try:
            status = 0 if code is None else code if isinstance(code, int) else 1
            if os.getpid() != self.pid or status == 0 or self.exitcode is not None:
                return
            self.failed, self.exitcode = True, status
            if isinstance(handling[1], BaseException) and \
                    not isinstance(handling[1], SystemExit):  # the failure: its error says it
                self.note_uncaught(*handling)
                return
            self.outbox.put(time.time(), "error", {
                "where": "exit", "error_type": "SystemExit",
                "error": f"the program exited with status {status}"
                         + (f": {code}" if not isinstance(code, int) else "")})
        except Exception:
            pass

    def _at_exit(self) -> None:
        if os.getpid() != self.pid:  # a forked child (e.g. a DataLoader worker)
            return
        reason = "exit"
        if self.failed:
            reason = ("uncaught exception" if self.exitcode is None
                      else f"exit status {self.exitcode}")
        try:
            self._detach(reason=reason)
        except KeyboardInterrupt:
            pass  # interrupted again while flushing at exit: the user wants out, now
