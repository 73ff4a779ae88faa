"""Answers to the server's questions: a snapshot of what this rank is doing.

When pgdash names a rank, the next question is what that rank is doing. The server asks on the
connection the agent already holds (``pgdash_agent.wire.ASK_EVENT``); the client's reader thread
only queues the question (bounded, counted when full) and wakes the agent's background thread,
which reads every thread's Python frames (``sys._current_frames``: the training thread need not
cooperate, and a thread blocked in C with the GIL released is read as it stands), where each
group is and the newest collectives that ended (with their times), and sends them as a ``snapshot`` event in the usual stream: stored, acknowledged and
resent like any other. The agent executes nothing it is sent: a question it does not know is
counted and ignored. Training never waits for any of it. One question reads another process:
"peer", for a rank of this launch on this host whose own agent is silent, answered with
py-spy's dump of it (pgdash_agent.native.peer_dump checks the process first).
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Callable, Iterable

from pgdash_agent import frames as pyframes
from pgdash_agent import native as native_frames
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.outbox import Outbox
from pgdash_agent.wire import ASKS, MAX_ASK_ID, MAX_NAME, MAX_RANKS, MAX_SNAPSHOT_THREADS

MAX_PENDING = 4  # questions waiting for the background thread; the oldest goes first
MAX_PID = 2**22  # Linux's pid_max at most


Question = tuple  # (ask, at, reason, native, peer: (pid, rank) of a "peer" question, or None)


def question(message: Any) -> Question | None:
    """A question of the server's (ASK_EVENT) as :data:`Question`; None when it is malformed
    or one this agent does not answer. Never raises."""
    if not isinstance(message, dict):
        return None
    ask, at, what = message.get("ask"), message.get("at"), message.get("what")
    if not (isinstance(ask, str) and 0 < len(ask) <= MAX_ASK_ID and what in ASKS):
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        at = None
    reason = message.get("reason")
    reason = reason[:MAX_NAME] if isinstance(reason, str) else None
    peer = None
    if what == "peer":  # another rank of this host: {"pid", "rank"}
        pid, rank = message.get("pid"), message.get("rank")
        if not (type(pid) is int and 0 < pid <= MAX_PID and type(rank) is int
                and 0 <= rank <= MAX_RANKS):
            return None
        peer = (pid, rank)
    return ask, at, reason, message.get("native") is True, peer


def peer_reading(py_spy: str | None, pid: int) -> dict[str, Any]:
    """A "peer" answer's reading of process ``pid``: py-spy's dump, or why there is none."""
    dump, why = native_frames.peer_dump(py_spy, pid)
    return {"peer_dump": dump} if why is None else {"native_error": why}


def answered(body: dict[str, Any], at: Any, reason: str | None,
             started: float) -> dict[str, Any]:
    """``body`` with the question's time and reason echoed and how long answering took
    (since ``started``, a perf_counter reading)."""
    if at is not None:
        body["asked_at"] = float(at)
    if reason is not None:
        body["reason"] = reason
    body["took_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    return body


class Snapshots:
    """Queues the server's questions and answers them on the agent's background thread.

    Args:
        tracker: the collective tracker (where each group is).
        outbox: where the answers go.
        wall: converts a ``perf_counter()`` reading to Unix time (the groups' times).
        flight: the last Flight Recorder reading per group (C++-issued collectives' counters).
        wake: wakes the background thread when a question arrives.
        py_spy: py-spy's path, for questions that ask for native frames (None: none here;
            see pgdash_agent.native).
        cpp_recent: the newest collectives issued from C++ that the Flight Recorder timed,
            (group, op, bytes, start, end, seq) in Unix seconds (FlightStats.recent).
    """

    def __init__(self, tracker: CollectiveTracker, outbox: Outbox,
                 wall: Callable[[float], float], flight: Callable[[], dict[str, Any]],
                 wake: Callable[[], None], py_spy: str | None = None,
                 cpp_recent: Callable[[], Iterable[tuple]] = tuple):
        self.tracker = tracker
        self.outbox = outbox
        self._wall = wall
        self._flight = flight
        self._wake = wake
        self.py_spy = py_spy
        self._cpp_recent = cpp_recent
        self._pending: collections.deque[
            tuple[str, float | None, str | None, bool, tuple[int, int] | None]] = \
            collections.deque()
        self._lock = threading.Lock()
        self.dropped = 0  # questions dropped because MAX_PENDING were waiting
        self.ignored = 0  # questions this agent does not answer (malformed, unknown)

    def ask(self, message: Any) -> None:
        """A question from the server (the client's reader thread). Never raises."""
        try:
            asked = question(message)
            if asked is None:
                self.ignored += 1
                return
            with self._lock:
                if len(self._pending) >= MAX_PENDING:
                    self._pending.popleft()
                    self.dropped += 1
                self._pending.append(asked)
            self._wake()
        except Exception:
            self.ignored += 1

    def answer(self) -> None:
        """Answer the questions waiting (the agent's background thread)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                ask, at, reason, native, peer = self._pending.popleft()
            started = time.perf_counter()
            if peer is not None:
                body: dict[str, Any] = {"ask": ask, "threads": [], "for_rank": peer[1]}
                body.update(peer_reading(self.py_spy, peer[0]))
            else:
                self.tracker.summarise()  # the collectives that ended since the last pass
                body = {"ask": ask, "threads": threads_now(with_ids=native),
                        "groups": self.tracker.progress(self._wall, self._flight()),
                        "recent": self.recent()}
                if native:
                    self._add_native(body)
            self.outbox.put(time.time(), "snapshot", answered(body, at, reason, started))

    def _add_native(self, body: dict[str, Any]) -> None:
        """Each thread's native frames from py-spy, or why there are none."""
        ids = [thread.pop("ids", ()) for thread in body["threads"]]
        if self.py_spy is None:
            body["native_error"] = native_frames.NO_PY_SPY
            return
        stacks, why = native_frames.native_stacks(self.py_spy)
        if why is not None:
            body["native_error"] = why
        for thread, tids in zip(body["threads"], ids):
            found = next((stacks[i] for i in tids if i in stacks), None)
            if found is not None:
                thread["native"] = found

    def recent(self) -> list[list[Any]]:
        """The newest collectives that ended, by end time: ``[group, op, bytes, start, end,
        seq]`` with Unix times for those Python issued (through the agent's wrappers; seq:
        the Flight Recorder's sequence number where it runs), ``[..., seq,
        "flight_recorder"]`` for those issued from C++ (DDP's) that the Flight Recorder
        timed (pgdash_agent.flight_stats)."""
        wall = self._wall
        rows = [[group, op, nbytes, round(wall(t0), 6), round(wall(t1), 6), seq]
                for group, op, nbytes, t0, t1, seq in list(self.tracker.recent)]
        rows += [[group, op, nbytes, round(t0, 6), round(t1, 6), seq, "flight_recorder"]
                 for group, op, nbytes, t0, t1, seq in list(self._cpp_recent())]
        rows.sort(key=lambda row: row[4])
        return rows


def threads_now(with_ids: bool = False) -> list[dict[str, Any]]:
    """Every thread's frames but pgdash's own, the training (main) thread first (``with_ids``:
    each with ``ids``, the ids native frames are matched by; not sent)."""
    main = threading.main_thread().ident
    running = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        thread = running.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        if name.startswith("pgdash-"):
            continue  # the agent's own threads (this one included)
        frames, omitted = pyframes.stack_frames(frame)
        entry: dict[str, Any] = {"name": name[:200], "frames": frames}
        if ident == main:
            entry["training"] = True
        if omitted:
            entry["omitted"] = omitted
        if with_ids:  # how py-spy may name it: its OS thread id, or its pthread id
            entry["ids"] = (getattr(thread, "native_id", None), ident)
        out.append(entry)
    out.sort(key=lambda t: not t.get("training", False))
    return out[:MAX_SNAPSHOT_THREADS]
