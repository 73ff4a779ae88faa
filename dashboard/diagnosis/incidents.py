"""Incidents: findings that share one root cause, grouped, as a pure function of findings.

One frozen rank makes a finding in every group that waits for it; a crash makes errors on its
peers; a faulty GPU makes its rank a straggler. A person wants one line for each of these: an
*incident*, with the findings as its evidence and the links between them.

``incidents(findings)`` groups findings whose blamed ranks overlap and whose kinds are
causally linked (:data:`CAUSES`, :data:`SYMPTOMS`). Active findings are grouped among
themselves, resolved ones among themselves (a resolved finding never glues two live causes
together); a resolved group with the id of an active incident is its history. The id is the
root cause (its class and blamed ranks), never a counter, so live mode and replay (the
findings active at a moment, from ``state?at=``) give the same incidents, and a stall that
becomes a hang stays one incident. No Flask, no SQL, no clock.
"""

from __future__ import annotations

from typing import Any, Iterable

from dashboard.diagnosis.core import SEVERITY_ORDER, Finding
from dashboard.diagnosis.text import agree, ranks_label, them

Incident = dict[str, Any]

# Kinds that are a root cause themselves, and the class of incident each one opens.
CAUSES = {"rank_failed": "crash", "rank_lost": "crash", "gpu_fault": "gpu",
          "gpu_throttle": "gpu", "desync": "desync", "init_failed": "init",
          "init_incomplete": "init", "config_mismatch": "config",
          "rank_exited_early": "exit"}
# Kinds that are what a cause looks like from the other ranks: they join a cause on the same
# ranks (a hang on a rank that crashed, a straggler on a throttled GPU) or each other.
SYMPTOMS = {"hang": "hang", "stall": "hang", "straggler": "straggler",
            "slow_collective": "slow"}
# slow_collective blames every rank of a group: overlapping ranks say nothing about a common
# cause, so it joins only its own kind on the same ranks.
LONERS = {"slow_collective"}


def _linked(a: Finding, b: Finding) -> bool:
    if not set(a["ranks"]) & set(b["ranks"]):
        return False
    ka, kb = a["kind"], b["kind"]
    if ka in LONERS or kb in LONERS:
        return ka == kb and a["ranks"] == b["ranks"]
    ca, cb = CAUSES.get(ka), CAUSES.get(kb)
    if ca and cb:  # two causes: one incident only if of one class (a crash and its loss)
        return ca == cb
    return True  # a symptom with its cause, or two symptoms of the same ranks


def _components(findings: list[Finding]) -> list[list[Finding]]:
    parent = list(range(len(findings)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Index by rank so that a 1,024-rank job with many findings stays cheap.
    by_rank: dict[int, list[int]] = {}
    for i, f in enumerate(findings):
        for r in f["ranks"]:
            by_rank.setdefault(r, []).append(i)
    for members in by_rank.values():
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                i, j = members[x], members[y]
                if root(i) != root(j) and _linked(findings[i], findings[j]):
                    parent[root(i)] = root(j)
    groups: dict[int, list[Finding]] = {}
    for i, f in enumerate(findings):
        groups.setdefault(root(i), []).append(f)
    return list(groups.values())


def _rank(f: Finding) -> tuple:
    """Primary finding first: an active one (a resolved stall does not name a live hang),
    a cause before a symptom, then severity, then the one that names the rank most directly
    (fewest hops of its chain: the group where the others wait for the culprit itself reads
    better than one where they wait for its victim), then the earliest."""
    return (not f["active"], f["kind"] not in CAUSES, SEVERITY_ORDER[f["severity"]],
            len((f.get("evidence") or {}).get("chain") or ()), f["first_seen"], f["id"])


def _link(f: Finding, primary: Finding) -> dict[str, Any]:
    """How one finding belongs to its incident (one row of the incident's chain)."""
    ev = f.get("evidence") or {}
    where = f"group {f['group']}" if f.get("group") is not None else "the job"
    if f["kind"] in ("hang", "stall"):
        waiting = ev.get("waiting") or []
        text = (f"{ranks_label(waiting)} {agree(waiting, 'waits', 'wait')} in {where} for "
                f"{ranks_label(f['ranks'])}" if waiting else
                f"{ranks_label(f['ranks'])} {agree(f['ranks'], 'hangs', 'hang')} in {where}")
        for hop in ev.get("chain") or []:
            text += (f"; rank {hop.get('rank')} waits in group {hop.get('waits_in')}"
                     + (f" for {ranks_label(hop['for'])}" if hop.get("for") else ""))
    elif f["kind"] == "straggler":
        text = f"the ranks of {where} keep waiting for {ranks_label(f['ranks'])}"
    else:
        text = f"{f['kind']} on {where}, blaming {ranks_label(f['ranks'])}"
    if f is primary:
        text = "root cause: " + text
    return {"finding": f["id"], "kind": f["kind"], "group": f.get("group"),
            "ranks": f["ranks"], "active": f["active"], "link": text}


def _summary(cls: str, primary: Finding, members: list[Finding], ranks: list[int]) -> str:
    others = [f for f in members if f is not primary]
    if cls == "hang" and len(members) > 1:
        stuck = [f for f in members if f["kind"] in ("hang", "stall")]
        waiting = sorted({r for f in stuck for r in (f.get("evidence") or {}).get("waiting", [])}
                         | {hop.get("rank") for f in stuck
                            for hop in (f.get("evidence") or {}).get("chain", [])} - set(ranks))
        groups = sorted({str(f["group"]) for f in stuck if f.get("group") is not None})
        since = min((f.get("evidence") or {}).get("since", f["first_seen"]) for f in stuck)
        last = max(f["last_seen"] for f in stuck)
        state = (agree(ranks, "hangs", "hang") if primary["kind"] == "hang"
                 else agree(ranks, "holds up", "hold up"))
        who = (f"{ranks_label(waiting)} {agree(waiting, 'waits', 'wait')} for {them(ranks)}"
               if waiting else f"the others wait for {them(ranks)}")
        return (f"{ranks_label(ranks).capitalize()} {state} the job: {who} in "
                f"{len(groups)} group{'s' if len(groups) != 1 else ''} "
                f"({', '.join(groups)}), the longest for {last - since:.0f} s.")
    text = primary["summary"]
    if others:
        kinds = sorted({f["kind"] for f in others})
        text += (f" {len(others)} related finding{'s' if len(others) != 1 else ''} "
                 f"({', '.join(kinds)}) follow{'s' if len(others) == 1 else ''} from it.")
    return text


def _incident(members: list[Finding]) -> Incident:
    members = sorted(members, key=_rank)
    primary = members[0]
    cls = CAUSES.get(primary["kind"]) or SYMPTOMS.get(primary["kind"]) or primary["kind"]
    # The blamed ranks are those of the root cause's own findings, not of every symptom.
    same = [f for f in members if (CAUSES.get(f["kind"]) or SYMPTOMS.get(f["kind"])) == cls]
    ranks = sorted({r for f in same for r in f["ranks"]})
    active = [f for f in members if f["active"]]
    worst = min((active or members), key=lambda f: SEVERITY_ORDER[f["severity"]])
    return {
        "id": f"{cls}:r{'-'.join(map(str, ranks))}" if ranks else f"{cls}:{primary['id']}",
        "kind": primary["kind"],
        "severity": worst["severity"],
        "ranks": ranks,
        "summary": _summary(cls, primary, members, ranks),
        "hint": primary["hint"],
        "findings": [f["id"] for f in sorted(members, key=lambda f: (f["first_seen"], f["id"]))],
        "chain": [_link(f, primary) for f in members],
        "first_seen": min(f["first_seen"] for f in members),
        "last_seen": max(f["last_seen"] for f in members),
        "active": bool(active),
    }


def incidents(findings: Iterable[Finding]) -> list[Incident]:
    """Incidents of a job's findings (active and resolved), newest first.

    Args:
        findings: every finding kept for the job (``Ingest.findings``), or the findings
            active at one moment (``diagnose(state, at)``): then only active incidents.
    """
    findings = list(findings)
    live = {i["id"]: (i, group) for group in _components([f for f in findings if f["active"]])
            for i in [_incident(group)]}
    past: dict[str, list[Finding]] = {}
    for group in _components([f for f in findings if not f["active"]]):
        past.setdefault(_incident(group)["id"], []).extend(group)
    out = []
    for iid, (inc, group) in live.items():
        history = past.pop(iid, [])
        out.append(_incident(group + history) if history else inc)
    out += [_incident(group) for group in past.values()]
    return sorted(out, key=lambda i: (-i["first_seen"], i["id"]))


def marks(found: Iterable[Incident]) -> list[float]:
    """The moments where a job's incidents began, and ended where resolved, oldest first:
    where the page's Shift+arrows stop (static/js/job/replay.js, ``learnMarks``), and around
    which keyframes are stored second by second (dashboard.history.keyframes)."""
    out: set[float] = set()
    for inc in found:
        out.add(inc["first_seen"])
        if not inc["active"]:
            out.add(inc["last_seen"])
    return sorted(out)


def active_count(found: list[Incident]) -> int:
    return sum(1 for i in found if i["active"])
