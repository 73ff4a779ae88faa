"""Two moments of a job side by side: what changed from A to B (``GET .../compare``).

"Before and after the slowdown": read from two ``state?at=`` answers (dashboard.web.live's
``state_at``), never from a fold of its own, so it says exactly what the page shows at each:

* ``ranks``: ranks whose state on the page changed (running -> hung, a rank that exited);
* ``groups``: process groups whose progress diverged: their state on the page changed
  (moving -> overdue) or other ranks are behind (``[rank, collectives behind]``), with how
  far the group's front advanced from A to B;
* ``latencies``: ops whose median latency over the LATENCY_WINDOW_S seconds before each
  moment moved by a factor of MOVED or more;
* ``findings``: those that became active, and those that resolved.

A may be later than B: the changes then read backwards, as asked.
"""

from __future__ import annotations

import statistics
from typing import Any

LATENCY_WINDOW_S = 10  # seconds before each moment whose per-second p50s are compared
MOVED = 1.5  # a latency that changed by this factor (either way) is listed


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What changed between ``a`` and ``b``, two ``state_at`` answers of one job."""
    return {"a": a["at"], "b": b["at"], "ranks": _ranks(a, b), "groups": _groups(a, b),
            "latencies": _latencies(a, b), "findings": _findings(a, b)}


def _ranks(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    before = {row["rank"]: row for row in a["sections"].get("rank_states") or []}
    out = []
    for row in b["sections"].get("rank_states") or []:
        was = before.get(row["rank"])
        if was is None or was["state"] != row["state"]:
            out.append({"rank": row["rank"], "a": was["state"] if was else None,
                        "b": row["state"], "reason": row.get("reason")})
    return out


def _groups(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    before = {row["group"]: row for row in a["sections"].get("group_states") or []}
    out = []
    for row in b["sections"].get("group_states") or []:
        was = before.get(row["group"])
        if was is not None and (was["state"], was["behind"]) == (row["state"], row["behind"]):
            continue
        out.append({"group": row["group"], "family": row["family"],
                    "a": was["state"] if was else None, "b": row["state"],
                    "a_behind": was["behind"] if was else [], "b_behind": row["behind"],
                    "advanced": row["max_seq"] - was["max_seq"] if was and
                    row["max_seq"] is not None and was["max_seq"] is not None else None})
    return out


def _latencies(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    before = _medians(a)
    out = []
    for key, now in _medians(b).items():
        was = before.get(key)
        if was and now and (now / was >= MOVED or was / now >= MOVED):
            family, op, source = key
            out.append({"family": family, "op": op, "source": source, "a_p50_us": was,
                        "b_p50_us": now, "factor": round(now / was, 2)})
    return sorted(out, key=lambda row: -max(row["factor"], 1 / row["factor"]))


def _medians(answer: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    """Per (family, op, source): the median of the per-second p50s over the window."""
    out = {}
    for row in (answer["sections"].get("timeline_grid") or {}).get("ops") or []:
        values = [v for v in row["p50_us"][-LATENCY_WINDOW_S:] if v is not None]
        if values:
            out[(row["family"], row["op"], row["source"])] = statistics.median(values)
    return out


def _findings(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    active_a = {f["id"]: f for f in a["findings"] if f["active"]}
    active_b = {f["id"]: f for f in b["findings"] if f["active"]}

    def rows(found: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
        return [{key: f[key] for key in ("id", "kind", "severity", "ranks", "summary")}
                for fid, f in found.items() if fid not in other]

    return {"appeared": rows(active_b, active_a), "resolved": rows(active_a, active_b)}
