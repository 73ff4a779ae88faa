"""Rule for ranks that called different collectives at the same sequence number."""

from __future__ import annotations

import collections
from typing import Any

from pgdash_agent.wire import SIZED

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import agree, group_label, ranks_label
from dashboard.state import JobState


CPP = "a C++ collective"  # DDP's or FSDP's, seen only by the Flight Recorder


def desync(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = _made_apart(state) or _numbered_apart(state)
    seen = {f["group"] for f in out}
    out += [f for f in _inside(state, now, s) if f["group"] not in seen]
    seen = {f["group"] for f in out}
    out += [f for f in _failed_together(state) if f["group"] not in seen]
    seen = {f["group"] for f in out}
    return out + [f for f in _fingerprints(state) if f["group"] not in seen]


def _made_apart(state: JobState) -> list[Finding]:
    """Ranks whose new_group calls part from the others' (``JobState.groups_made``): every
    rank of the job must make the same calls, in the same order, members or not. Each agent
    counts a call before it is made, and sends a fingerprint of all its calls after each of
    its newest; at the first number where the ranks that reached it disagree, the ranks
    outside the fingerprint more than half of the job's ranks share are named (a rank that
    skipped a call, or passed other ranks), as the call fingerprints are (``_vote``). Where
    none has that many, nobody is named (a warning) once every rank reached it. Seen even when
    the odd call then hangs, before torch registers any group of it (``_numbered_apart``
    reads the groups registered)."""
    at: dict[int, dict[int, int]] = collections.defaultdict(dict)  # number -> rank -> mark
    since: dict[int, float] = {}
    for rank, (count, marks, t) in state.groups_made.items():
        for n, mark in enumerate(marks, start=count - len(marks) + 1):
            at[n][rank] = mark
        since[rank] = t
    world = max(state.world_size or 0, len(state.groups_made))
    for n in sorted(at):
        vote = _vote(at[n], world)
        if vote is None:
            continue
        odd = vote[0]
        by_mark: dict[int, list[int]] = collections.defaultdict(list)
        for rank, mark in sorted(at[n].items()):
            by_mark[mark].append(rank)
        views = sorted(by_mark.values(), key=lambda who: (-len(who), who))
        first = max(since[r] for who in views[1:] for r in who)
        if odd:
            text = (f"The new_group call #{n} of {ranks_label(odd)} is not the one "
                    f"{ranks_label(sorted(views[0]))} made at that number: "
                    f"{ranks_label(odd)} skipped a new_group call before it, or passed other "
                    "ranks")
        else:
            text = (f"The ranks made new_group call #{n} apart: " + ", ".join(
                f"{ranks_label(sorted(who))} {'one sequence' if i == 0 else 'another'}"
                for i, who in enumerate(views)) + " of calls up to it")
        return [finding(
            "desync", Severity.CRITICAL if odd else Severity.WARNING, odd, None,
            f"{text}. Every rank of the job must make the same new_group calls in the same "
            "order, members or not, so the groups made since do not meet: their new_group "
            "or collectives hang or mix.",
            "Call `dist.new_group(ranks)` on every rank of the job, in the same order and "
            "with the same `ranks`, also on ranks that are not in `ranks` (not under `if rank "
            "in ranks:`), or pass `use_local_synchronization=True` so that only its members "
            "call it. Groups made by `init_device_mesh` or `new_subgroups` need the same "
            "mesh shape and group size on every rank (read from one config, not a node's).",
            {"source": "new_group_calls", "call": n,
             "views": [sorted(who) for who in views]},
            first, key="new_group_calls")]
    return []


def _vote(seen: dict[int, Any], members: int) -> tuple[list[int], list[int]] | None:
    """Ranks that reported different values at one place where every one of ``members``
    ranks must report the same: (the ranks outside the value more than half of the members
    share, the rest); ([], all heard) where no value has that many and every member was
    heard (nobody named); None where all agree, or the ranks not heard yet decide."""
    counts = collections.Counter(seen.values())
    if len(counts) < 2:
        return None
    top, n = counts.most_common(1)[0]
    if n * 2 > members:
        odd = sorted(r for r, v in seen.items() if v != top)
        return odd, sorted(r for r in seen if r not in odd)
    if len(seen) >= members:
        return [], sorted(seen)
    return None


def _numbered_apart(state: JobState) -> list[Finding]:
    """Ranks that gave one group name to another group than most ranks did
    (``JobState.group_views``): torch names a group (new_group without hashed names) by how
    many groups its process made before, so a rank that skipped a new_group call, which
    every rank of the job must make, members or not, names its next groups apart from the
    others', and their rendezvous never meet. Where no list has most reporters, nobody is
    named (a warning)."""
    out: list[Finding] = []
    for name, views in sorted(state.group_views.items(), key=lambda kv: str(kv[0])):
        counts = sorted(((ranks, who) for ranks, who in views.items() if who),
                        key=lambda kv: (-len(kv[1]), kv[0]))
        if len(counts) < 2:
            continue
        majority = len(counts[0][1]) > len(counts[1][1])
        odd = sorted(r for _, who in counts[1:] for r in who) if majority else []
        shown = "; ".join(f"{ranks_label(sorted(who))} {agree(sorted(who), 'says', 'say')} "
                          f"it holds {ranks_label(list(ranks))}" for ranks, who in counts)
        at = max(t for _, who in counts[1:] for t in who.values())
        lead = (f"{ranks_label(odd).capitalize()} numbered {agree(odd, 'its', 'their')} "
                "process groups apart from the others'" if odd else
                "The ranks numbered their process groups apart")
        out.append(finding(
            "desync", Severity.CRITICAL if odd else Severity.WARNING, odd, name,
            f"{lead}: group {name} is not the same group on every rank ({shown}). torch "
            "names a group by how many groups its process made before it, so "
            f"{ranks_label(odd) if odd else 'a rank'} skipped a new_group call or made "
            "its groups in another order, and the groups made since do not meet: "
            "their collectives hang or mix.",
            "Call `dist.new_group(ranks)` on every rank of the job, in the same order, "
            "also on ranks that are not in `ranks` (not under `if rank in ranks:`), or "
            "pass `use_local_synchronization=True` so that only its members call it; "
            "`DeviceMesh` and `new_subgroups` make their groups this way for you.",
            {"source": "group_names",
             "views": {",".join(map(str, ranks)): sorted(who) for ranks, who in counts}},
            at, key="group_names"))
    return out


# How far from the failures compared a rank that failed or vanished counts as their consequence.
ABORT_SLACK_S = 2.0


def _failed_together(state: JobState) -> list[Finding]:
    """Ranks that failed after calling a collective with another size (or op, or dtype) than
    their peers at the same number. Each failure reports what it knows: a collective that
    raised, its own call and the one before it; an exception that ended the program, the
    last collective completed on each group; and the ranks whose newest heartbeat has them
    inside one of those collectives say what they called there. A size mismatch often ends a peer, not the odd
    rank: gloo aborts the rank that receives more than it expects (SIGABRT, before its agent
    says anything); a broadcast_object_list of another length hands its receivers garbage
    sizes, and they fail unpickling it. So the ranks are compared at each collective number
    the failures reported: the minority is named, or, without a majority, the ranks whose
    call changed from their own call before while the others' did not. The ranks that failed
    or vanished within ABORT_SLACK_S are its consequences (``evidence.consequences``), not
    findings of their own (rules.diagnose)."""
    calls: dict[tuple[str, int], dict[int, tuple]] = collections.defaultdict(dict)
    changed: dict[tuple[str, int], dict[int, bool]] = collections.defaultdict(dict)
    times: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for e in state.errors:
        r = e.get("rank")
        if r is None or e.get("attempt", 0) != state.attempt:
            continue
        reported = []
        if e.get("where") == "collective" and e.get("bytes") is not None:
            sig = (e["op"], e.get("dtype"), e["bytes"])
            reported.append((e["group"], e["seq"], sig))
            if e.get("before"):
                before = tuple(e["before"])
                reported.append((e["group"], e["seq"] - 1, before))
                if before[0] == sig[0]:
                    changed[(e["group"], e["seq"])][r] = before != sig
        for group, seq, op, dtype, nbytes in e.get("last") or ():
            reported.append((group, seq, (op, dtype, nbytes)))
        for group, seq, sig in reported:
            calls[(group, seq)].setdefault(r, sig)
            times[(group, seq)].append(e["t"])
    # The ranks still inside a collective a failure reported (their newest heartbeat) vote
    # too: the odd rank is often one that never fails by itself (oom_retry_repeats_allreduce:
    # rank 1 repeated its gradients' all_reduce where the others all-reduced the loss; rank 0
    # aborted, rank 2 failed on its closed connection, and rank 1 waited until the launcher
    # killed it: one failure reported the call, the heartbeats of ranks 0 and 1 the others).
    # So do the ranks past it whose board (pgdash_agent.board) says what they called there.
    for group, seq in list(calls):
        for rank, row in state.progress_of(group).items():
            if row.get("inflight_op") and row.get("entered") == seq:
                calls[(group, seq)].setdefault(rank, _signature(
                    row["inflight_op"], row.get("inflight_dtype"), row.get("inflight_bytes")))
            elif row.get("done_op") and row.get("completed") == seq:
                calls[(group, seq)].setdefault(rank, _signature(
                    row["done_op"], row.get("done_dtype"), row.get("done_bytes")))
    out = []
    named: set[str] = set()
    for (group, seq), sigs in sorted(calls.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if group in named or len(set(sigs.values())) < 2:
            continue
        members = (state.groups.get(group) or {}).get("ranks") or sorted(sigs)
        counts = collections.Counter(sigs.values())
        top, n = counts.most_common(1)[0]
        if n * 2 > len(members):
            odd = sorted(r for r, sig in sigs.items() if sig != top)
        else:  # no majority: the ranks whose call changed while the others' did not
            moved = changed.get((group, seq), {})
            odd = sorted(r for r in sigs if moved.get(r))
            steady = [r for r in sigs if moved.get(r) is False]
            if not odd or not steady or len({sigs[r] for r in steady}) > 1 or \
                    any(sigs[r] == sigs[steady[0]] for r in odd) or \
                    len(odd) + len(steady) < len(sigs):
                continue
            top = sigs[steady[0]]
        when = times[(group, seq)]
        consequences = _consequences(state, odd, members, min(when), max(when))
        op, dtype, nbytes = sigs[odd[0]]
        others = sorted(r for r in sigs if r not in odd)
        summary = (f"{ranks_label(odd).capitalize()} called {op} #{seq} on "
                   f"{group_label(state, group)} with {nbytes} bytes ({dtype}), where "
                   f"{ranks_label(others)} called {top[0]} with {top[2]} bytes ({top[1]})")
        if consequences:
            summary += (f"; {ranks_label(consequences)} then failed or vanished (a size "
                        "mismatch ends the ranks that receive what they do not expect)")
        out.append(finding(
            "desync", Severity.CRITICAL, odd, group, summary + ".",
            f"{ranks_label(odd).capitalize()} called collective #{seq} with other arguments "
            "than its peers: look for a shape or a count computed per rank there (padding, "
            "a layer built or skipped on one rank, a list of objects of another length, a "
            "step repeated after an error). A size mismatch kills or corrupts the ranks that "
            "receive the odd message, so the rank that died is often not the one to fix.",
            {"seq": seq, "source": "errors", "consequences": consequences,
             "signatures": {str(r): {"op": v[0], "dtype": v[1], "bytes": v[2]}
                            for r, v in sorted(sigs.items())}},
            max(when), key="failed"))
        named.add(group)
    return out


def _signature(op: str, dtype: str | None, nbytes: int | None) -> tuple:
    """What ranks must agree on at one collective: its op, dtype and, where every rank's must
    match (SIZED: not all_gather's or all_to_all's, uneven by rank in healthy jobs), its bytes;
    as a failure reports it (pgdash_agent.collectives.call_signature)."""
    return (op, dtype, nbytes if op in SIZED else 0)


def _consequences(state: JobState, odd: list[int], members: Any, first: float,
                  last: float) -> list[int]:
    """The other members that failed or vanished within ABORT_SLACK_S of ``first`` .. ``last``
    (the mismatch's moments): what a size mismatch did to them (gloo aborts the rank that
    receives the odd message; its peers then fail on its closed connection)."""
    return sorted(
        r.rank for r in state.ranks() if r.rank not in odd and r.rank in members
        and r.status in (RankStatus.LOST, RankStatus.FAILED) and r.exit_at is not None
        and first - ABORT_SLACK_S <= r.exit_at <= last + ABORT_SLACK_S)


def _inside(state: JobState, now: float, s: Settings) -> list[Finding]:
    """Ranks inside the same collective with different signatures (op, dtype, bytes) or
    roots, or some in a Python-issued one and others in a C++-issued one: a mismatch that
    hangs."""
    out = _mixed(state, now, s)
    mixed = {f["group"] for f in out}
    for group in sorted(state.groups, key=str):
        if group in mixed:
            continue
        by_seq: dict[int, dict[int, tuple]] = collections.defaultdict(dict)
        since: dict[int, float] = {}
        rows = state.progress_of(group)
        for rank, row in rows.items():
            if row.get("inflight_op"):
                by_seq[row["entered"]][rank] = _signature(
                    row["inflight_op"], row.get("inflight_dtype"), row.get("inflight_bytes"))
                since[row["entered"]] = max(since.get(row["entered"], 0),
                                            row.get("inflight_since") or 0)
        for seq, sigs in by_seq.items():
            if len(set(sigs.values())) < 2:
                roots = _roots(state, group, seq, sigs, rows, since[seq])
                if roots is not None:
                    out.append(roots)
                continue
            counts = collections.Counter(sigs.values())
            top = max(counts.values())
            members = (state.groups.get(group) or {}).get("ranks") or ()
            if list(counts.values()).count(top) > 1 and len(sigs) < len(members):
                continue  # a tie among the ranks seen so far: the others' heartbeats decide
            majority = min((sig for sig, n in counts.items() if n == top),
                           key=lambda sig: min(r for r, v in sigs.items() if v == sig))
            odd = sorted(r for r, sig in sigs.items() if sig != majority)
            described = {str(r): {"op": sig[0], "dtype": sig[1], "bytes": sig[2]}
                         for r, sig in sorted(sigs.items())}
            odd_sig = sigs[odd[0]]
            # Ranks that died of it (their boards, read by their host's reader after they
            # were gone, say where they were: pgdash_agent.board) are its consequences.
            consequences = _consequences(state, odd, members, since[seq], since[seq])
            summary = (f"{ranks_label(odd).capitalize()} called {odd_sig[0]} ({odd_sig[1]}, "
                       f"{odd_sig[2]} bytes) as collective #{seq} on "
                       f"{group_label(state, group)}, where the others called {majority[0]} "
                       f"({majority[1]}, {majority[2]} bytes)")
            if consequences:
                summary += (f"; {ranks_label(consequences)} then failed or vanished (a size "
                            "mismatch ends the ranks that receive what they do not expect)")
            out.append(finding(
                "desync", Severity.CRITICAL, odd, group, summary + ".",
                "Ranks must issue the same collectives in the same order with the same shapes. "
                f"Look for a rank-dependent branch before collective #{seq} on "
                f"{ranks_label(odd)} (an `if rank == ...`, uneven data, a skipped step). "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective (slowly).",
                {"seq": seq, "signatures": described, "consequences": consequences,
                 "expected": {"op": majority[0], "dtype": majority[1],
                              "bytes": majority[2]}},
                since[seq], key=f"{seq}"))
    return out


def _roots(state: JobState, group: str, seq: int, sigs: dict[int, tuple],
           rows: dict[int, dict], since: float) -> Finding | None:
    """Ranks inside the same rooted collective (a broadcast, scatter, reduce or gather) that
    name different roots: each waits for a root that is not sending, or for ranks that are
    not receiving. Two ranks inside one disagree as often as not (the root and the odd one
    are stuck, the others finished), so the ranks past it (``done_root``, the root of the
    collective they completed last) vote too; a tie short of every member waits for them."""
    votes = {rank: rows[rank].get("inflight_root") for rank in sigs}
    if None in votes.values() or len(set(votes.values())) < 2:
        return None
    for rank, row in rows.items():
        if rank not in votes and row.get("completed") == seq and \
                row.get("done_root") is not None:
            votes[rank] = row["done_root"]
    counts = collections.Counter(votes.values())
    top = max(counts.values())
    members = (state.groups.get(group) or {}).get("ranks") or ()
    if list(counts.values()).count(top) > 1 and len(votes) < len(members):
        return None
    root = min(r for r, n in counts.items() if n == top)
    odd = sorted(r for r, v in votes.items() if v != root)
    op = next(iter(sigs.values()))[0]  # the ranks inside agree on all but the root
    named = sorted({votes[r] for r in odd})
    which = "src" if op in ("broadcast", "scatter") else "dst"
    return finding(
        "desync", Severity.CRITICAL, odd, group,
        f"{ranks_label(odd).capitalize()} called {op} #{seq} on {group_label(state, group)} "
        f"with {which}={', '.join(map(str, named))}, where the others used {which}={root}.",
        f"Every rank must pass the same {which} (a global rank) to a {op}: look for a root "
        f"computed per rank on {ranks_label(odd)} (`LOCAL_RANK` where a global rank is meant, "
        "a per-node setting). TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective (slowly).",
        {"seq": seq, "op": op, "roots": {str(r): v for r, v in sorted(votes.items())},
         "expected": {which: root}},
        since, key=f"{seq}root")


def _mixed(state: JobState, now: float, s: Settings) -> list[Finding]:
    """Ranks of one group at the same place in the Flight Recorder's order (which counts
    Python- and C++-issued collectives alike), some inside a collective Python issued and the
    others inside one C++ issued (DDP's bucket all-reduce, FSDP's all-gather): they called
    different collectives. The typical case: one rank left the training loop (its data ran
    out) and waits in the end-of-epoch barrier while the others wait in DDP's all-reduce.
    Held for ``behind_after`` (two heartbeats) before it is said: both views are snapshots."""
    out = []
    ranks = state.rank_index()
    for group in sorted(state.groups, key=str):
        by_seq: dict[int, dict[int, str]] = collections.defaultdict(dict)
        since: dict[int, float] = {}
        for rank, row in state.progress_of(group).items():
            r = ranks.get(rank)
            if row.get("fr_inflight_since") is None or (r is not None and
                                                         r.status != RankStatus.RUNNING):
                continue
            seq = row.get("fr_enqueued", 0)
            if row.get("inflight_op") and row.get("inflight_fr") == seq:
                by_seq[seq][rank] = row["inflight_op"]
            elif (not row.get("inflight_op") and row.get("p2p_op") is None
                  and seq > (row.get("fr_wrapped") or -1)):
                # (an entry the Python calls made, left open by one that raised, is not C++'s)
                by_seq[seq][rank] = CPP
            else:
                continue
            since[seq] = max(since.get(seq, 0.0), row["fr_inflight_since"],
                             row.get("inflight_since") or 0.0)
        for seq, sigs in by_seq.items():
            kinds = set(sigs.values())
            if CPP not in kinds or len(kinds) < 2 or now - since[seq] < s.behind_after:
                continue
            counts = collections.Counter(sigs.values())
            # The fewest ranks called the odd collective; on a tie, the Python-issued one
            # (the training loop's collectives are the C++ ones: a rank that left it is odd).
            odd_sig = min(counts, key=lambda sig: (counts[sig], sig == CPP))
            odd = sorted(r for r, sig in sigs.items() if sig == odd_sig)
            others = sorted(r for r in sigs if r not in odd)
            other_sig = collections.Counter(sigs[r] for r in others).most_common(1)[0][0]
            out.append(finding(
                "desync", Severity.CRITICAL, odd, group,
                f"{ranks_label(odd).capitalize()} called {odd_sig} as collective #{seq} on "
                f"{group_label(state, group)} (the Flight Recorder's count), where "
                f"{ranks_label(others)} are inside {other_sig}: "
                f"{'it' if len(odd) == 1 else 'they'} left the others' sequence of "
                "collectives.",
                f"{ranks_label(odd).capitalize()} issued a different collective than "
                f"{ranks_label(others)} at the same point. With DDP or FSDP this is most often "
                "uneven inputs: one rank's data ran out and it went on (to a barrier, an "
                "evaluation, the next epoch) while the others still run backward. Give every "
                "rank the same number of batches (`DistributedSampler(..., drop_last=True)`), "
                "or wrap the loop in `torch.distributed.algorithms.Join` (`with "
                "Join([model]):`). Otherwise look for a rank-dependent branch before that "
                "point.",
                {"seq": seq, "source": "flight_recorder",
                 "signatures": {str(r): {"op": sig} for r, sig in sorted(sigs.items())},
                 "expected": {"op": other_sig}},
                since[seq] + s.behind_after, key=f"fr{seq}"))
    return out


def _fingerprints(state: JobState) -> list[Finding]:
    """Ranks whose call fingerprints differ from most of their group's at one collective
    number (``JobState.fingerprints``): they called a different op, reduce op, dtype, size
    or root somewhere before it, though every call completed (an all_reduce with MAX where
    the others SUM; sizes NCCL does not check). Where no fingerprint has most of the group
    (two ranks), the ranks are not named."""
    out: list[Finding] = []
    done: set[str] = set()
    for (group, level), by_seq in sorted(state.fingerprints.items(),
                                         key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if group in done:
            continue
        members = (state.groups.get(group) or {}).get("ranks") or ()
        for seq in sorted(by_seq):
            seen = by_seq[seq]
            members = members or sorted(seen)  # (a group not described yet: who reported)
            vote = _vote({r: fp for r, (fp, _) in seen.items()}, len(members))
            if vote is None:
                continue
            odd, others = vote
            at = max(t for _, t in seen.values())
            who = (f"{ranks_label(odd).capitalize()} called" if odd else
                   f"{ranks_label(others).capitalize()} called")
            whom = (f"from what {ranks_label(others)} called" if odd else
                    "from one another (no call sequence has most of the group)")
            out.append(finding(
                "desync", Severity.CRITICAL if odd else Severity.WARNING, odd, group,
                f"{who} different collectives on {group_label(state, group)} "
                f"{whom}, by collective #{seq}: the same number of calls, but not the same "
                "op, reduce op, dtype, size or root in at least one of them. Each call "
                "completed, so nothing hangs, but the results differ between ranks.",
                "Ranks must issue the same collectives with the same arguments. Look for an "
                f"argument computed per rank before collective #{seq}: a reduce op or dtype "
                "from a per-node config, a tensor sized from local data, a root from "
                "`LOCAL_RANK`. NCCL does not check sizes, so such a job may run on and "
                "diverge silently. TORCH_DISTRIBUTED_DEBUG=DETAIL names the first call that "
                "differs (slowly: run it on a short job).",
                {"seq": seq, "source": "fingerprint", "mark_level": level,
                 "fingerprints": {str(r): fp for r, (fp, _) in sorted(seen.items())}},
                at, key="fingerprint"))
            done.add(group)
            break
    return out
