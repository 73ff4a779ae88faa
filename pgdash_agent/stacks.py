"""The Python stack of a thread stuck in a collective, sent once per stuck collective.

A hang's most useful evidence is where the user's code waits. :class:`StuckStacks` finds the
groups whose collective has been in flight for longer than PGDASH_STACK_AFTER_S (the tracker's,
and the Flight Recorder's for collectives issued from C++), walks the waiting thread's frames
and sends them as a ``stack`` event. Its own room because it is the one place that reads
other threads' frames; it runs on the agent's background thread, never on the training one.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from pgdash_agent import frames as pyframes
from pgdash_agent.collective_wrappers import CollectiveWrappers
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.outbox import Outbox


class StuckStacks:
    """Sends the stack of each thread sitting in one collective for long.

    Args:
        stack_after_s: how long a collective is in flight before its stack is sent.
        tracker: the collective tracker (which groups are stuck, since when).
        wrappers: the collective wrappers (their code object marks a waiting thread's frame).
        outbox: where the stacks go.
        wall: converts a ``perf_counter()`` reading to Unix time.
    """

    def __init__(self, stack_after_s: float, tracker: CollectiveTracker,
                 wrappers: CollectiveWrappers, outbox: Outbox,
                 wall: Callable[[float], float]):
        self.stack_after_s = stack_after_s
        self.tracker = tracker
        self.wrappers = wrappers
        self.outbox = outbox
        self._wall = wall
        # (group, op) -> the last sequence number whose stack was sent: one entry per group,
        # however long the job runs.
        self._stacks_sent: dict[tuple[str, str], int] = {}

    def capture(self, flight: dict[str, dict[str, Any]]) -> None:
        """Send the Python stack of each thread sitting in one collective for long (once each).

        ``flight`` is the last Flight Recorder reading (per group name). A blocking collective
        releases the GIL, so this thread can read the stuck thread's frames; the stuck thread
        is the one with a pgdash wrapper frame on its stack.
        """
        stuck = self.tracker.stuck(self.stack_after_s)
        now = time.time()
        python = {t.name for t in stuck}  # the recorder numbers those too: one stack each
        stuck_fr = [(name, fr) for name, fr in flight.items()
                    if fr.get("fr_inflight_since") is not None and name not in python
                    and now - fr["fr_inflight_since"] > self.stack_after_s]
        if not stuck and not stuck_fr:
            return  # the usual case: no frames to walk
        code = self.wrappers.wrapper_code
        frames: dict[int, Any] = {}  # id(track) -> the wrapper frame waiting on it
        threads = sys._current_frames()
        for frame in threads.values():
            while frame is not None and frame.f_code is not code:
                frame = frame.f_back
            if frame is not None:
                frames[id(frame.f_locals.get("track"))] = frame
        # Collectives issued from C++ (DDP) show only in the Flight Recorder, and an async
        # one (DDP's through the agent's comm hook) left its wrapper at once: the training
        # thread is then blocked in C++ under its last Python frame, on the main thread.
        main = threads.get(threading.main_thread().ident)
        for track in stuck:
            frame = frames.get(id(track))
            frame = frame.f_back if frame is not None else main
            inflight = track.inflight
            if frame is not None and inflight is not None:
                self._send_stack(track.name, track.entered, inflight[0],
                                 self._wall(track.inflight_since), frame)
        if main is not None:
            for name, fr in stuck_fr:
                self._send_stack(name, fr["fr_enqueued"], "c++ collective",
                                 fr["fr_inflight_since"], main)

    def _send_stack(self, group: str, seq: int, op: str, since: float, frame: Any) -> None:
        if self._stacks_sent.get((group, op)) == seq:
            return
        self._stacks_sent[(group, op)] = seq
        text = pyframes.format_stack(frame)  # the user's frames, not the agent's wrappers
        self.outbox.put(time.time(), "stack", {"group": group, "seq": seq, "op": op,
                                               "since": since, "stack": text[-60_000:]})
