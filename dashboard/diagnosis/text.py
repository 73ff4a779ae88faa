"""Diagnosis texts shared by the rules: how ranks, groups and processes are named."""

from __future__ import annotations

from typing import Iterable

from dashboard.state import JobState, RankState


def ranks_label(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def have(ranks: Iterable[int]) -> str:
    return "has" if len(set(ranks)) == 1 else "have"


def group_label(state: JobState, name: str) -> str:
    desc = (state.groups.get(name) or {}).get("desc")
    # torch names groups made without a description "undefined"
    return f"group {name} ({desc})" if desc and desc != "undefined" else f"group {name}"


def process_label(r: RankState | None) -> str:
    if r is None:
        return ""
    return f" (pid {r.pid} on {r.host})" if r.pid else ""
