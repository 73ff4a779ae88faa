"""Snapshots on the timeline: what a rank was doing when the server asked.

A ``snapshot`` event (pgdash_agent.snapshots) becomes an instant on the rank's lifecycle track
holding its threads' stacks, and its newest collectives become exact slices on a track of
their own beside each group's (whose slices are the heartbeats' sightings, with estimated
ends): consecutive snapshots overlap, so each collective is drawn once.
"""

from __future__ import annotations

from typing import Any

from dashboard.diagnosis.text import stack_text
from dashboard.history.trace_file import TraceFile, cut_text

COMPLETED = "completed:"  # the track of a group's collectives read from snapshots


def snapshot_args(body: dict[str, Any]) -> dict[str, Any]:
    """The instant's arguments: the request, the time the agent took, each thread's stack
    (as the page shows it)."""
    stacks = {thread["name"]: cut_text(stack_text(thread.get("frames") or []), keep_end=True)
              for thread in body.get("threads") or []}
    return {"ask": body["ask"], "took_ms": body.get("took_ms"), "stacks": stacks}


def draw_completed(file: TraceFile, pid: int, body: dict[str, Any], until: float) -> float:
    """Draw the snapshot's collectives that ended after ``until`` (those before were drawn
    from an earlier snapshot); returns the newest end drawn."""
    for row in body.get("recent") or []:
        group, op, nbytes, start, end = row[:5]
        if end > until:
            seq, source = (list(row[5:7]) + [None, None])[:2]
            file.complete("collectives", pid, file.tid(pid, COMPLETED + group), start, end, op,
                          {"group": group, "op": op, "bytes": nbytes, "seq": seq,
                           "source": "snapshot" + (f" ({source})" if source else "")},
                          cat="collective")
    return max([until] + [row[4] for row in body.get("recent") or []])
