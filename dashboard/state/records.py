"""The records a job's fold is made of: an event as the log holds it, a rank's session, and
the small pure helpers that read them (a job's status from its ranks, a rank as the API shows
it, group families and their order). Nothing here folds: see dashboard.state.fold."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, TypedDict

TERMINAL_RANK = ("exited", "failed", "lost")
FLIGHT_OP = "C++ collective"  # what progress_rows calls a collective only the Flight Recorder saw


class StoredEvent(TypedDict):
    """An event as the log holds it: what the agent sent plus where and when it arrived."""

    id: int
    session: str
    seq: int | None  # None for events the server recorded itself (connect, disconnect)
    t: float
    received_at: float
    kind: str
    body: dict[str, Any]


@dataclasses.dataclass
class RankState:
    rank: int | None
    session: str
    attempt: int = 0  # which restart of the job this session belongs to (0 = first launch)
    first_seen: float | None = None
    host: str = ""
    local_rank: int | None = None
    pid: int | None = None
    device: str | None = None
    backend: str | None = None
    world_size: int | None = None
    status: str = "initializing"
    last_seen: float = 0.0
    hello_at: float | None = None
    exit_at: float | None = None
    # What its exit said (``exit`` event's reason, e.g. "SIGTERM from torchrun"), for the page
    exit_reason: str | None = None
    # When the rank destroyed its default process group (``left`` event): it left
    # distributed training, though its process may go on.
    left_at: float | None = None
    # How long the server had owed its agent an acknowledgement when its connection last
    # closed (the ``disconnect`` event's ``owed_s``; 0.0: nothing owed, or stored before).
    closed_owed_s: float = 0.0
    # Whether its agent closed that connection itself (``goodbye``): its process was alive.
    closed_goodbye: bool = False
    # How its process ended, where its host's reader saw it end (its board's ``ended``:
    # ``{"signal": "SIGTERM"}`` or ``{"code": 1}``; pgdash_agent.board.how_ended).
    ended: dict[str, Any] | None = None
    # How the process was started, as its hello said (pgdash_agent.identity.Launch); None from
    # older agents (and in checkpoints stored before: the class default stands in).
    command: str | None = None
    launcher: str | None = None
    launcher_id: str | None = None
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    # Once its heartbeats say the script's main thread ended while the process lives on:
    # [t, CPU s, I/O bytes] at the first such heartbeat, then the same at the newest; and the
    # non-daemon threads the interpreter waits for (rules.idle.exit_held)
    main_done: list[float] | None = None
    holding: tuple[str, ...] = ()


def status_of(by_rank: dict[int, RankState], world_size: int | None,
               last_event_at: float | None) -> tuple[str, float | None]:
    """(status, ended_at) of a job, or of one attempt, from its ranks."""
    statuses = collections.Counter(r.status for r in by_rank.values())
    if not by_rank:
        status = "initializing"
    elif sum(statuses[k] for k in TERMINAL_RANK) == len(by_rank):
        complete = world_size is None or len(by_rank) >= world_size
        status = "finished" if statuses["exited"] == len(by_rank) and complete else "failed"
    elif statuses["running"] or statuses["exited"]:
        status = "running"
    else:
        status = "initializing"
    ended_at = None
    if status in ("finished", "failed"):
        ends = [r.exit_at for r in by_rank.values() if r.exit_at is not None]
        ended_at = max(ends) if ends else last_event_at
    return status, ended_at


def rank_row(r: RankState) -> dict[str, Any]:
    """One rank as the API shows it."""
    return {"rank": r.rank, "attempt": r.attempt, "host": r.host,
            "local_rank": r.local_rank, "pid": r.pid, "device": r.device,
            "status": r.status, "last_seen": r.last_seen, "dropped": r.dropped}


def family_of(group: dict[str, Any]) -> str:
    """The family a group belongs to: its description unless torch left it generic."""
    desc = group.get("desc")
    return desc if desc and desc != "undefined" else group["name"]


def group_order(name: str) -> tuple[int, Any]:
    """Groups in the order people count them: numbered ones by number, then by name."""
    return (0, int(name)) if name.isdigit() else (1, name)
