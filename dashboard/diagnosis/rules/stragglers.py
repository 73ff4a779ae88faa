"""Rules for slowness: a straggler rank the others keep waiting for, and a group whose
collectives became far slower than their own history."""

from __future__ import annotations

import collections
import math
from typing import Any, Callable, NamedTuple

from pgdash_agent.wire import hist_bucket_value

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import backend_of, group_label, process_label
from dashboard.state import JobState, quantile_us


def _windows(state: JobState, group: str, now: float) -> dict[int, list[tuple]]:
    """Recent (end, count, sum_us, histogram) summaries with calls, per running rank of a
    group, up to ``now``. Straggler and slow_collective both ask, per group: built once per
    state version and time for all groups."""
    return state.memo(("windows", now), lambda: _all_windows(state, now)).get(group, {})


def _all_windows(state: JobState, now: float) -> dict[str, dict[int, list[tuple]]]:
    running = {r.rank for r in state.ranks() if r.status == RankStatus.RUNNING}
    out: dict[str, dict[int, list[tuple]]] = {}
    for group in state.groups:
        windows = {}
        for rank, window in state.recent_of(group).items():
            if rank in running:
                windows[rank] = [p for p in window if p[0] <= now and p[1] > 0]
        out[group] = windows
    return out


def _mean_us(points: list[tuple]) -> float:
    return sum(p[2] for p in points) / max(1, sum(p[1] for p in points))


def straggler(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A rank the others keep waiting for: it spends the least time inside collectives.

    Needs no synchronised clocks: each rank's own in-collective time is compared. The rank
    that arrives last waits least; when the others waited clearly longer than it at nearly
    every collective of the window, it is the straggler. The window grows until every rank
    has seen ``straggler_min_calls`` collectives, so a group that runs one collective a
    second is judged on as many samples as a busy one; short, scattered waits of a healthy
    job fail the ratio, the floor or the late share (see ``_straggler_in``).

    Thresholds, measured with bench/detect.py (3 ranks, one 20% slower: 60 ms steps against
    50 ms; healthy 4-rank jobs with a 5 s checkpoint, warm-up and 0-30 ms jitter a step; a
    2-core machine shared with other workers, load average 10-25). Judged on two 1 s
    summaries with three in four late in each, it was named 37-47 steps after it slowed
    down: the summary holding that moment is partly healthy, and two full ones had to
    follow. Now the agents summarise every 0.5 s (PGDASH_STATS_INTERVAL_S) and the window
    is the newest summaries holding 16 collectives per rank, pooled, nine in ten late, the
    others' waits steady (``straggler_steady``): 20-29 steps. With 12 or 16 collectives and
    no steadiness test, each ~170 s jittery healthy run warned once (2.8-3.6 ms waits at
    nine in ten, spread): jitter makes a rank of a pair wait at about 45% of its
    collectives and a crowded host's scheduler makes runs of them, so spread waits need 32
    collectives. The check against the window before (another rank named there: noise)
    stops a straggler that hops between ranks. README, "Stragglers", has the figures.
    """
    verdicts: dict[str, StragglerVerdict] = {}
    for group in sorted(state.groups, key=str):
        windows = _windows(state, group, now)
        if len(windows) < 2:
            continue
        found = [_straggler_in(windows, back, s) for back in range(s.straggler_persist)]
        if any(v is None for v in found) or len({v.rank for v in found}) != 1:
            continue
        # The window just before, if it names another rank, makes this noise: a straggler
        # that changes from one interval to the next is a crowded host's scheduler, not a
        # slow rank (one whose slowness has just begun names nobody there, or itself).
        before = _straggler_in(windows, s.straggler_persist, s)
        if before is not None and before.rank != found[0].rank:
            continue
        verdicts[group] = found[0]
    out = []
    for group, (slow, means, typical, n, recent, share) in verdicts.items():
        # A rank late here only because it waited for another rank in a different group is
        # a victim: follow such waits, as hangs do, to the rank that made it late.
        chain = _late_chain(state, group, slow, verdicts, now, s)
        if chain is None:
            continue  # whom it waits for elsewhere is not known yet
        last = chain[-1]["rank"] if chain else slow
        checked: list[dict[str, Any]] = []
        hidden = _hidden_chain(state, last, group, now, s, checked)
        if hidden is None:
            continue  # whether it waits inside DDP's collectives is not known yet
        chain += hidden
        root = chain[-1]["rank"] if chain else slow
        r = state.rank_index().get(root)
        waits_for = "it" if not chain else f"rank {slow}"
        summary = (f"Rank {root} is a straggler: the other ranks of "
                   f"{group_label(state, group)} wait {typical / 1000:.1f} ms or more for "
                   f"{waits_for} at {share:.0%} of their collectives, against "
                   f"{means[slow] / 1000:.1f} ms (median) for rank {slow} itself")
        for hop in chain:
            where = ("'s C++ collectives (DDP)" if hop.get("source") != "python" else "")
            summary += (f"; rank {hop['waits']} waits for rank {hop['rank']} inside "
                        f"{group_label(state, hop['group'])}{where}")
        evidence = {"median_wait_us": {str(k): round(v, 1) for k, v in sorted(means.items())},
                    "others_wait_us": round(typical, 1),
                    "late_share": share,
                    "mean_wait_us": {str(k): round(_mean_us(pts), 1)
                                     for k, pts in sorted(recent.items())},
                    "intervals": n, "collectives": sum(p[1] for p in recent[slow])}
        if hidden:
            evidence["waits_in_cpp"] = hidden
        if chain:
            evidence["chain"] = chain
        if checked:
            evidence["cpp_groups_checked"] = checked
        out.append(finding(
            "straggler", Severity.WARNING, [root], group, summary + ".",
            f"Rank {root} arrives last{' at every collective' if not chain else ''}. Look at "
            f"what it does between collectives{process_label(r)}: data loading (DataLoader "
            "num_workers, slow storage), uneven batch or sequence lengths, extra work on that "
            "rank (logging, checkpointing), or a slower device (GPU clocks throttled: see GPU "
            "health).",
            evidence, max(pts[-1][0] for pts in recent.values()), key=f"r{root}"))
    return out


MAX_HOPS = 4  # a chain of waits followed this far at most (groups rarely nest deeper)
_UNKNOWN = object()  # a hop that cannot be told yet


def _walk(group: str, rank: int, next_hop: Callable[[int, set[str]], Any]) -> list | None:
    """Follow waits from ``rank`` in ``group``, group to group: ``next_hop(rank, seen
    groups)`` gives the hop (``{"waits", "rank", "group", ...}``) that rank waits on, None
    when it waits for nobody, or _UNKNOWN while that cannot be told (then None here)."""
    chain: list[dict[str, Any]] = []
    seen = {group}
    while len(chain) < MAX_HOPS:
        hop = next_hop(rank, seen)
        if hop is _UNKNOWN:
            return None
        if hop is None:
            break
        chain.append(hop)
        seen.add(hop["group"])
        rank = hop["rank"]
    return chain


def _late_chain(state: JobState, group: str, slow: int, verdicts: dict[str, StragglerVerdict],
                now: float, s: Settings) -> list[dict[str, Any]] | None:
    """Hops from ``slow``, the straggler of ``group``, through groups where it is itself one
    of the ranks kept waiting by another straggler (``[{"waits", "rank", "group",
    "source"}]``; empty when it waits for nobody; None while a group where it waits long
    cannot name whom it waits for yet: DDP's all-reduce, seen by the wrappers through the
    agent's comm hook, is such a group for a rank late in a tensor-parallel group)."""
    def next_hop(rank: int, seen: set[str]) -> Any:
        for other in sorted(state.groups, key=str):
            members = (state.groups.get(other) or {}).get("ranks") or ()
            if other in seen or rank not in members:
                continue
            verdict = verdicts.get(other)
            windows = None
            if verdict is None:  # not conclusive there yet: what its newest window says
                windows = _windows(state, other, now)
                verdict = _straggler_in(windows, 0, s) if len(windows) >= 2 else None
            if verdict is not None and verdict.rank != rank:
                means, typical = verdict.medians, verdict.typical
                if rank in means and means[rank] >= typical * 0.5:  # it is one who waits there
                    return {"waits": rank, "rank": verdict.rank, "group": other,
                            "source": "python", "wait_us": round(means[rank], 1)}
            elif verdict is None and windows and _waits_long(windows, rank, s):
                return _UNKNOWN
        return None

    return _walk(group, slow, next_hop)


def _waits_long(windows: dict[int, list[tuple]], rank: int, s: Settings,
                intervals: int = 4) -> bool:
    """Whether ``rank`` waits clearly longer than a peer in a group's newest summaries."""
    if rank not in windows:
        return False
    medians = {r: quantile_us(_pooled(pts[-intervals:]), 0.5, 0.0)
               for r, pts in windows.items() if pts}
    least = min((v for r, v in medians.items() if r != rank), default=None)
    mine = medians.get(rank)
    return (least is not None and mine is not None and mine >= s.straggler_ratio * least
            and mine - least >= s.straggler_min_wait_us)


def _hidden_chain(state: JobState, rank: int, group: str, now: float, s: Settings,
                  checked: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Who ``rank``, the straggler of ``group``, itself waits for inside C++ collectives.

    A rank that arrives last in one group may only be late because it sat in DDP's gradient
    all-reduce (C++, unseen by the wrappers) waiting for a peer there; the Flight Recorder's
    samples then find it in flight there much more often than that peer. Followed from group
    to group. Returns the hops (``[{"waits", "rank", "group", "busy_share"}]``; empty when
    ``rank`` waits for nobody), or None while the samples cannot tell yet. Appends to
    ``checked`` each group where the last rank of the chain was found not to wait.
    """
    def next_hop(rank: int, seen: set[str]) -> Any:
        for other in sorted(state.groups, key=str):
            if other in seen or rank not in state.groups[other]["ranks"] or \
                    not state.flight_only(other):
                continue
            # Agents that sample send the tally even when it is 0; older ones never do.
            sampled = any("fr_samples" in row for row in state.progress_of(other).values())
            verdict = _waits_for(state.fr_tallies_of(other), rank, now, s, sampled)
            if verdict is None:
                return _UNKNOWN
            peer, shares = verdict
            if peer is not None:
                return {"waits": rank, "rank": peer, "group": other, "busy_share": shares}
            if shares:
                checked.append({"rank": rank, "group": other, "busy_share": shares})
        return None

    return _walk(group, rank, next_hop)


def _waits_for(tallies: dict[int, Any], rank: int, now: float, s: Settings, sampled: bool):
    """Whether ``rank`` waits for a peer inside a group's C++ collectives, from the latest
    heartbeats' Flight Recorder tallies: ``(peer, shares)`` if it is found in flight more
    often than the peer found least, ``(None, shares)`` if not (shares {}: agents that take
    no samples, ``sampled`` False), None while the samples are too few.

    The window grows from the newest heartbeat, back at most ``hidden_horizon`` seconds. Once
    it holds ``hidden_min_samples`` per rank, a difference clear either way (two standard
    errors, counted with one sample more in and out of flight, so that no samples in flight
    is no certainty) decides; at the horizon, the shares as they are decide. Before the
    tallies reach back that far, an unclear difference waits."""
    if rank not in tallies or len(tallies) < 2:
        return None if sampled else (None, {})
    recent = {m: [x for x in reversed(t) if now - s.hidden_horizon <= x[0] <= now]
              for m, t in tallies.items()}
    depth = min(len(t) for t in recent.values())
    # Whether the window can reach the horizon (or all that is kept): else a young group
    # that cannot tell yet must wait, not guess.
    spans = all(len(recent[m]) < len(t) or len(t) == t.maxlen for m, t in tallies.items())
    sums = {m: [0, 0] for m in tallies}
    for k in range(depth):
        for m, t in recent.items():
            sums[m][0] += t[k][1]
            sums[m][1] += t[k][2]
        if min(n for _, n in sums.values()) < s.hidden_min_samples:
            continue
        share = {m: b / n for m, (b, n) in sums.items()}
        peer = min((m for m in share if m != rank), key=share.get)
        shown = {str(m): round(v, 2) for m, v in sorted(share.items())}
        if share[rank] < share[peer]:
            return None, shown  # it waits least here: nobody it waits for
        (b1, n1), (b2, n2) = sums[rank], sums[peer]
        pooled = (b1 + b2 + 1) / (n1 + n2 + 2)
        error = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))  # of the difference
        gap = share[rank] - share[peer]
        waits = gap >= s.hidden_wait_gap and b1 >= s.hidden_min_busy
        if (spans and k == depth - 1) or (waits and gap >= 2 * error) or \
                gap + 2 * error < s.hidden_wait_gap:
            return (peer if waits else None), shown
    return None


class StragglerVerdict(NamedTuple):
    """The straggler of one group's window, and what it was judged on."""

    rank: int
    medians: dict[int, float]  # median wait per rank, us
    typical: float  # the others' typical wait at their straggler_late_share least-waited, us
    intervals: int  # summaries (PGDASH_STATS_INTERVAL_S each) the window spans
    recent: dict[int, list[tuple]]  # those summaries, per rank
    share: float  # at this share of their collectives the others waited ``typical`` or more


def _straggler_in(windows: dict[int, list[tuple]], back: int,
                  s: Settings) -> StragglerVerdict | None:
    """The straggler of the window ending ``back`` intervals ago, or None.

    Returns ``(rank, median wait per rank, the others' typical wait at their
    ``straggler_late_share`` least-waited collectives, intervals, points)``. The window is
    the newest intervals, grown back until every rank has ``straggler_min_calls``
    collectives in it, and judged on the histograms of all its collectives pooled: the
    straggler waits least (median), and the others waited clearly longer (ratio and floor)
    at ``straggler_late_share`` (nine in ten) of their collectives. A straggler is late at
    nearly every collective; one pause (a checkpoint, a CPU stall of a crowded host) is one
    long wait among many short ones, and random jitter makes each rank wait at about half of
    them: neither reaches nine in ten. Pooled rather than interval by interval, the window
    can be as short as one summary interval, so that a straggler is named about one interval
    after its first full interval of late collectives.
    """
    windows = {rank: pts[:len(pts) - back] for rank, pts in windows.items()}
    depth = min(len(p) for p in windows.values())
    # A window of straggler_min_calls where the others' waits are also steady (a rank slower
    # by about the same time at every step); else twice as many collectives (waits spread).
    for calls, steady in ((s.straggler_min_calls, True), (2 * s.straggler_min_calls, False)):
        n = _intervals_holding(windows, depth, calls, s)
        if n is None:
            return None
        recent = {rank: pts[-n:] for rank, pts in windows.items()}
        pooled = {rank: _pooled(pts) for rank, pts in recent.items()}
        medians = {rank: quantile_us(h, 0.5, 0.0) for rank, h in pooled.items()}
        slow = min(medians, key=medians.get)
        lows = {rank: quantile_us(h, 1.0 - s.straggler_late_share, 0.0)
                for rank, h in pooled.items() if rank != slow}
        typical = _typical(lows, slow)
        if typical < s.straggler_ratio * medians[slow] or \
                typical - medians[slow] < s.straggler_min_wait_us:
            continue
        if steady:
            highs = {rank: quantile_us(h, s.straggler_late_share, 0.0)
                     for rank, h in pooled.items() if rank != slow}
            if typical < s.straggler_steady * _typical(highs, slow):
                continue
        return StragglerVerdict(slow, medians, typical, n, recent, s.straggler_late_share)
    return _sparse_straggler(windows, depth, s)


def _sparse_straggler(windows: dict[int, list[tuple]], depth: int,
                      s: Settings) -> StragglerVerdict | None:
    """A straggler of a group that runs several collectives a step (FSDP's all-gathers and
    reduce-scatters per layer, DDP's buckets): the others wait for it once a step, at the
    step's first collective, so at one in k of theirs, never nine in ten.

    On a window of ``straggler_sparse_calls`` collectives per rank (pooled histograms): the
    rank with the least mean wait is the candidate; a wait is long above ``straggler_ratio``
    times its p90 (and ``straggler_min_wait_us`` more); the others must have long waits at
    ``straggler_sparse_share`` or more of their collectives (a pause of one rank, however long,
    is one long wait among those; random jitter makes the candidate's own p90 long too), and
    the candidate at a quarter of that share at most."""
    n = _intervals_holding(windows, depth, s.straggler_sparse_calls, s)
    if n is None:
        return None
    recent = {rank: pts[-n:] for rank, pts in windows.items()}
    pooled = {rank: _pooled(pts) for rank, pts in recent.items()}
    means = {rank: _mean_us(pts) for rank, pts in recent.items()}
    slow = min(means, key=means.get)
    p90 = quantile_us(pooled[slow], 0.9, 0.0)
    long_us = max(s.straggler_ratio * p90, p90 + s.straggler_min_wait_us)
    shares = {rank: _share_above(h, long_us) for rank, h in pooled.items() if rank != slow}
    share = _typical(shares, slow)
    if share < s.straggler_sparse_share or _share_above(pooled[slow], long_us) > share / 4:
        return None
    typical = _typical({rank: quantile_us(h, 1.0 - share, 0.0) for rank, h in pooled.items()
                        if rank != slow}, slow)
    medians = {rank: quantile_us(h, 0.5, 0.0) for rank, h in pooled.items()}
    return StragglerVerdict(slow, medians, typical, n, recent, round(share, 2))


def _intervals_holding(windows: dict[int, list[tuple]], depth: int, calls: int,
                       s: Settings) -> int | None:
    """How many of the newest summaries hold ``calls`` collectives on every rank (at least
    ``straggler_min_intervals``); None if all ``depth`` of them do not."""
    n = s.straggler_min_intervals
    while n <= depth and any(sum(p[1] for p in pts[-n:]) < calls for pts in windows.values()):
        n += 1
    return n if n <= depth else None


def _share_above(hist: dict[int, int], us: float) -> float:
    """The share of a histogram's collectives that took longer than ``us``."""
    total = sum(hist.values())
    above = sum(c for b, c in hist.items() if hist_bucket_value(b) > us)
    return above / total if total else 0.0


def _pooled(points: list[tuple]) -> dict[int, int]:
    """The latency histogram of all the collectives of some intervals together."""
    out: dict[int, int] = collections.defaultdict(int)
    for p in points:
        flat = p[3]  # (bucket, count, bucket, count, ...)
        for i in range(0, len(flat), 2):
            out[flat[i]] += flat[i + 1]
    return out



def _typical(means: dict[int, float], slow: int) -> float:
    others = sorted(v for r, v in means.items() if r != slow)
    return others[len(others) // 2]


def slow_collective(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A group's collectives far slower than their own history in this job.

    Per interval, the fastest rank's time inside collectives is the transfer itself (nobody
    waits for a straggler there), so that is what is compared with its own past; it must
    stay slow for ``slow_persist`` intervals (a one-second stall of a busy machine is not a
    finding), and only while the ranks run.
    """
    out = []
    for group in sorted(state.groups, key=str):
        windows = _windows(state, group, now)
        if not windows:
            continue
        depth = min(len(p) for p in windows.values())
        # Per interval, the fastest rank's (mean time, calls): one column per interval.
        columns = zip(*[[(p[2] / p[1], p[1]) for p in pts[-depth:]]
                        for pts in windows.values()])
        fastest = [mean if calls >= s.slow_min_calls else None
                   for mean, calls in map(min, columns)]
        history = sorted(v for v in fastest[:-s.slow_persist] if v is not None)
        current = fastest[-s.slow_persist:]
        if len(history) < s.slow_history or len(current) < s.slow_persist or None in current:
            continue
        baseline = history[len(history) // 2]
        if any(v < s.slow_ratio * baseline or v - baseline < s.slow_min_us for v in current):
            continue
        latest = current[-1]
        members = sorted(windows)
        out.append(finding(
            "slow_collective", Severity.WARNING, members, group,
            f"Collectives on {group_label(state, group)} take {latest / 1000:.1f} ms, "
            f"{latest / baseline:.0f}x their usual {baseline / 1000:.2f} ms in this job.",
            "The transfer itself slowed down on every rank (not one late rank): check the "
            "links between these ranks' hosts ("
            + ("NCCL_DEBUG=INFO shows the transport; `ibstat`, NVLink/PCIe errors in GPU "
               "health" if backend_of(state, group) == "nccl" else
               "gloo runs over TCP on the interface GLOO_SOCKET_IFNAME names; `ip -s link` "
               "shows its errors and drops")
            + "), other jobs sharing the network, and a sudden growth in message size.",
            {"current_us": round(latest, 1), "baseline_us": round(baseline, 1),
             "ranks": members, "intervals": s.slow_persist},
            max(pts[-1][0] for pts in windows.values()), key="latest"))
    return out


# XIDs that mean the hardware (not the program) failed; others are usually the program's
# own fault (13, 31, 43: an illegal access or a crashed kernel) and are reported as warnings.
