"""Rule for ranks that called different collectives at the same sequence number."""

from __future__ import annotations

import collections

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import agree, group_label, ranks_label
from dashboard.state import JobState


CPP = "a C++ collective"  # DDP's or FSDP's, seen only by the Flight Recorder


def desync(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = _inside(state, now, s)
    seen = {f["group"] for f in out}
    out += [f for f in _failed_sizes(state) if f["group"] not in seen]
    seen = {f["group"] for f in out}
    return out + [f for f in _fingerprints(state) if f["group"] not in seen]


# How far from the failed calls a rank that vanished counts as aborted by the mismatch.
ABORT_SLACK_S = 2.0


def _failed_sizes(state: JobState) -> list[Finding]:
    """Ranks whose collective raised at the same number as their peers' with another size,
    where theirs changed from their own call before it (the same op) and the peers' did not.
    gloo aborts the rank that receives more than it expects (SIGABRT, before its agent can
    say anything): the receiver of the odd rank's chunk, not always the odd rank, vanishes,
    and the others' calls fail on its closed connection. The ranks that vanished then are in
    ``evidence.aborted``: consequences, not findings of their own (rules.diagnose)."""
    by_call: dict[tuple[str, int], dict[int, dict]] = collections.defaultdict(dict)
    for e in state.errors:
        if (e.get("where") == "collective" and e.get("bytes") is not None
                and e.get("rank") is not None and e.get("attempt", 0) == state.attempt):
            by_call[(e["group"], e["seq"])].setdefault(e["rank"], e)
    out = []
    for (group, seq), errors in sorted(by_call.items(), key=lambda kv: (str(kv[0][0]),
                                                                       kv[0][1])):
        sig = {r: (e["op"], e.get("dtype"), e["bytes"]) for r, e in errors.items()}
        before = {r: tuple(e["before"]) if e.get("before") else None
                  for r, e in errors.items()}
        if len(set(sig.values())) < 2 or any(
                b is None or b[0] != sig[r][0] for r, b in before.items()):
            continue  # one size, or a call before it of another op: nothing to compare
        changed = sorted(r for r in errors if before[r] != sig[r])
        steady = sorted(r for r in errors if r not in changed)
        if not changed or not steady or len({sig[r] for r in steady}) > 1 or \
                any(sig[r] == sig[steady[0]] for r in changed):
            continue
        times = [e["t"] for e in errors.values()]
        aborted = sorted(r.rank for r in state.ranks() if r.rank not in errors
                         and r.status in (RankStatus.LOST, RankStatus.FAILED)
                         and r.exit_at is not None
                         and min(times) - ABORT_SLACK_S <= r.exit_at <= max(times) + ABORT_SLACK_S)
        op, dtype, nbytes = sig[changed[0]]
        usual = sig[steady[0]]
        summary = (f"{ranks_label(changed).capitalize()} called {op} #{seq} on "
                   f"{group_label(state, group)} with {nbytes} bytes ({dtype}), where "
                   f"{ranks_label(steady)} and {agree(changed, 'its', 'their')} own call "
                   f"before used {usual[2]} bytes ({usual[1]})")
        if aborted:
            summary += (f"; {ranks_label(aborted)} then vanished (gloo aborts a rank that "
                        "receives more than it expects) and the others' calls failed")
        out.append(finding(
            "desync", Severity.CRITICAL, changed, group, summary + ".",
            f"{ranks_label(changed).capitalize()} changed the size of its {op} input at "
            f"collective #{seq}: look for a shape computed per rank there (padding, a layer "
            "built or skipped on one rank, a flattened buffer of another length). A size "
            "mismatch kills the rank that receives the larger message, so the rank that "
            "died is often not the one to fix.",
            {"seq": seq, "source": "errors", "aborted": aborted,
             "signatures": {str(r): {"op": v[0], "dtype": v[1], "bytes": v[2],
                                     "before": list(before[r])}
                            for r, v in sorted(sig.items())}},
            max(times), key=f"{seq}size"))
    return out


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
                sig = (row["inflight_op"], row.get("inflight_dtype"), row.get("inflight_bytes"))
                by_seq[row["entered"]][rank] = sig
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
            out.append(finding(
                "desync", Severity.CRITICAL, odd, group,
                f"{ranks_label(odd).capitalize()} called {odd_sig[0]} ({odd_sig[1]}, "
                f"{odd_sig[2]} bytes) as collective #{seq} on {group_label(state, group)}, "
                f"where the others called {majority[0]} ({majority[1]}, {majority[2]} bytes).",
                "Ranks must issue the same collectives in the same order with the same shapes. "
                f"Look for a rank-dependent branch before collective #{seq} on "
                f"{ranks_label(odd)} (an `if rank == ...`, uneven data, a skipped step). "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective (slowly).",
                {"seq": seq, "signatures": described, "expected": {
                    "op": majority[0], "dtype": majority[1], "bytes": majority[2]}},
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
            counts = collections.Counter(fp for fp, _ in seen.values())
            if len(counts) < 2:
                continue
            top, n = counts.most_common(1)[0]
            if n * 2 > len(members):
                odd = sorted(r for r, (fp, _) in seen.items() if fp != top)
                others = sorted(r for r in seen if r not in odd)
            elif len(seen) == len(members):  # no majority, every rank heard: name none
                odd, others = [], sorted(seen)
            else:
                continue  # the ranks not heard yet decide
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
