"""The `stall` and `hang` of point-to-point ops (``send``/``recv``/``isend``/``irecv``, as
pipelines use them): ranks waiting for peers that never posted the matching op, followed along
the pipeline to the stage that stopped, or found waiting for each other (a deadlock).

Its own room because a pipeline has no collective everybody waits in: the finding is built
from each rank's oldest point-to-point op rather than from a group-wide sequence number, and
both the hang and the stall rule fall back to it (rules.hangs, rules.stalls).
"""

from __future__ import annotations

from typing import Any

from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.rules.waits import (P2P, Frame, chain_text, follow_waits, is_running,
                                             p2p_label, p2p_peer_behind, p2p_posted_by_peer,
                                             rows_at, stop_evidence, stopped_text)
from dashboard.diagnosis.text import agree, group_label, have, ranks_label, stack_commands, them
from dashboard.state import JobState


def in_p2p(row: dict[str, Any]) -> bool:
    """Whether a progress row is inside a point-to-point op."""
    return bool(P2P.busy(row) and row.get("p2p_op"))


def _p2p_waits(state: JobState, group: str, frame: Frame, rows: dict[int, dict[str, Any]],
               longer_than: float) -> dict[int, int]:
    """Ranks of ``group`` waiting in a point-to-point op longer than ``longer_than`` for a
    peer that has not posted its side: rank -> that peer."""
    out = {}
    for rank, row in rows.items():
        if (in_p2p(row) and frame.now - row["p2p_since"] >= longer_than
                and is_running(state, rank, frame)):
            peer = p2p_peer_behind(rank, row, rows)
            if peer is not None:
                out[rank] = peer
    return out


def p2p_finding(state: JobState, group: str, frame: Frame, s: Settings, after: float,
                kind: str) -> Finding | None:
    """A `stall` or `hang` of point-to-point ops in ``group``: ranks waiting longer than
    ``after`` for peers that never posted their side, followed along the pipeline."""
    rows = rows_at(state, group, frame)
    waits = _p2p_waits(state, group, frame, rows, after)
    if kind == "stall":  # the hang speaks for waits past hang_after
        waits = {r: p for r, p in waits.items()
                 if frame.now - rows[r]["p2p_since"] < s.hang_after}
    if not waits:
        return None
    chain, roots = follow_waits(state, group, [], frame, P2P, starts=sorted(waits))
    cycle = not roots  # they wait for each other: a deadlock of point-to-point ops
    unused = _unused_channels(rows, waits) if cycle else []
    if unused:  # the others only wait for the ranks that wait on a channel never used
        cycle, roots = False, unused
    elif cycle:
        roots = sorted(waits)
    waiting = sorted(set(waits) - set(roots))
    since = min(rows[r]["p2p_since"] for r in waits)
    direct = sorted({r for r, p in waits.items() if p in roots})
    lead = direct[0] if direct else (waiting or roots)[0]
    lead_wait = (f"rank {lead} has waited {frame.now - rows[lead]['p2p_since']:.0f} s in "
                 f"{p2p_label(rows[lead])}")
    if cycle:
        summary = (f"{ranks_label(roots).capitalize()} wait for each other on "
                   f"{group_label(state, group)}, each in a point-to-point op whose peer "
                   f"never posted the matching one: {lead_wait}"
                   f"{chain_text(state, [c for c in chain if c['rank'] != lead])}")
        hint = ("A deadlock of point-to-point ops: each rank waits for a peer that waits for "
                "it (both receive first, or blocking sends larger than the transport buffers "
                "in a ring). Order them so that one side sends first (even ranks send, odd "
                "ranks receive, then the reverse), or post both with `dist.batch_isend_irecv`.")
    elif unused:
        summary = (f"{ranks_label(roots).capitalize()} {agree(roots, 'waits', 'wait')} on "
                   f"{group_label(state, group)} in a point-to-point op its peer has never "
                   f"used: {'; '.join(_unused_text(rows, r) for r in roots)}, while "
                   f"{ranks_label(sorted(set(waits) - set(roots)))} only "
                   f"{agree(set(waits) - set(roots), 'waits', 'wait')} along the channels "
                   f"that carried every step so far"
                   f"{chain_text(state, [c for c in chain if c['rank'] not in roots])}")
        hint = (f"{ranks_label(roots).capitalize()} named a peer or tag that never sends to "
                f"{them(roots)} (or receives from {them(roots)}): a wrong `src`/`dst` (a "
                "copy-pasted stage index, a global rank where a group rank was meant) or a "
                f"wrong `tag`. See the line with {stack_commands(state, roots)}; its "
                "neighbours are blocked only because it does not take or send their "
                "tensors.")
    else:
        summary = (f"{ranks_label(roots).capitalize()} {have(roots)} not sent or received "
                   f"what {ranks_label(waiting or sorted(waits))} "
                   f"{agree(waiting or waits, 'waits', 'wait')} for on "
                   f"{group_label(state, group)}: {lead_wait}"
                   f"{chain_text(state, [c for c in chain if c['rank'] != lead])}")
        hint = (f"{ranks_label(roots).capitalize()} never posted the matching send or "
                f"receive: see where {agree(roots, 'it is', 'they are')} with "
                f"{stack_commands(state, roots)}. In a pipeline "
                f"{agree(roots, 'this is the stage', 'these are the stages')} that stopped "
                "(compute that never ends, data loading, a stage that skipped a micro-batch "
                f"or ran a different schedule); {agree(roots, 'its', 'their')} neighbours only "
                f"wait for {them(roots)}.")
    if kind == "stall":
        summary += (", far longer than this group's operations take (stall after "
                    f"{after:.0f} s)")
    if kind == "stall":
        hint += (f" If {agree(roots, 'it does', 'they do')} not move, this becomes a hang "
                 f"after {s.hang_after:g} s.")
    return finding(
        kind, Severity.CRITICAL if kind == "hang" else Severity.WARNING, roots, group,
        summary + "." + stopped_text(state, frame), hint,
        {"seq": rows[lead].get("p2p_n"), "op": rows[lead].get("p2p_op"), "source": "p2p",
         "waiting": sorted(waits), "since": since, "threshold_s": round(after, 3),
         "waits": {str(r): {"op": rows[r].get("p2p_op"), "peer": rows[r].get("p2p_peer"),
                            "tag": rows[r].get("p2p_tag"), "n": rows[r].get("p2p_n"),
                            "since": rows[r].get("p2p_since")} for r in sorted(waits)},
         "chain": chain, **stop_evidence(frame)},
        since + after, key="p2p")


def _unused_channels(rows: dict[int, dict[str, Any]], waits: dict[int, int]) -> list[int]:
    """In a cycle of point-to-point waits, the ranks waiting on a channel (peer, direction,
    tag) their peer has never used, where another rank of the cycle waits on one that has
    carried ops before: the others are a pipeline's ordinary waits, blocked behind the rank
    that asked the wrong peer (or tag). Empty when every wait is new (a first exchange that
    deadlocks: both sides receive first) or every one is established."""
    unused, used = [], []
    for rank in waits:
        (used if p2p_posted_by_peer(rank, rows[rank], rows) else unused).append(rank)
    return sorted(unused) if unused and used else []


def _unused_text(rows: dict[int, dict[str, Any]], rank: int) -> str:
    row = rows[rank]
    peer = row["p2p_peer"]
    did = "sent to" if row.get("p2p_op") in ("recv", "irecv") else "received from"
    return (f"rank {rank} is in {p2p_label(row)}, and rank {peer} has never {did} it "
            f"with tag {row.get('p2p_tag') or 0}")
