"""Rules for slowness: a straggler rank the others keep waiting for, and a group whose
collectives became far slower than their own history.

The rule entry points live here, with how their findings read. Who the straggler of a window
is lives in rules.straggler_verdict, whom it waits for itself in rules.straggler_chains, and
the windows both rules read in rules.windows; those never import this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.rules.straggler_chains import hidden_chain, late_chain
from dashboard.diagnosis.rules.straggler_verdict import StragglerVerdict, cost_share, stragglers_in
from dashboard.diagnosis.rules.windows import stacked_windows
from dashboard.diagnosis.text import backend_of, group_label, process_label, ranks_label
from dashboard.state import JobState


def straggler(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A rank the others keep waiting for: it spends the least time inside collectives.

    Needs no synchronised clocks: each rank's own in-collective time is compared. The rank
    that arrives last waits least; when the others waited clearly longer than it at nearly
    every collective of the window, it is the straggler. The window grows until every rank
    has seen ``straggler_min_calls`` collectives, so a group that runs one collective a
    second is judged on as many samples as a busy one; short, scattered waits of a healthy
    job fail the ratio, the floor or the late share (see ``straggler_in``).

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
    found: dict[str, StragglerVerdict] = {}
    costs: dict[str, float] = {}  # each verdict's cost_share, for its evidence
    for groups, windows in stacked_windows(state, now):
        if windows.size < 2:
            continue
        persist = [stragglers_in(windows, back, s) for back in range(s.straggler_persist)]
        # The window just before, if it names another rank, makes this noise: a straggler
        # that changes from one interval to the next is a crowded host's scheduler, not a
        # slow rank (one whose slowness has just begun names nobody there, or itself).
        before = stragglers_in(windows, s.straggler_persist, s)
        for g, group in enumerate(groups):
            seen = [verdicts[g] for verdicts in persist]
            if any(v is None for v in seen):
                continue
            # Ranks late together take turns at arriving last: the verdicts name the same
            # stragglers while they share one (those they all name are named).
            late = frozenset.intersection(*(v.ranks for v in seen))
            if not late or (before[g] is not None and not before[g].ranks & late):
                continue
            # A verdict whose whole window is one summary is half a second of evidence: a
            # crowded host's scheduler can keep one rank of a pair off its core that long.
            # The window before must say so too (one summary later, for a straggler that
            # persists).
            if seen[-1].intervals < s.straggler_min_span and before[g] is None:
                continue
            slow = seen[0].rank if seen[0].rank in late else min(late)
            verdict = seen[0]._replace(rank=slow, ranks=late)
            cost = cost_share(verdict)
            if cost < s.straggler_min_cost:
                continue
            found[group], costs[group] = verdict, cost
    verdicts = {group: found[group] for group in sorted(found, key=str)}
    out = []
    for group, (slow, means, typical, n, recent, share, late) in verdicts.items():
        # A rank late here only because it waited for another rank in a different group is
        # a victim: follow such waits, as hangs do, to the rank that made it late.
        chain = late_chain(state, group, slow, verdicts, now, s)
        if chain is None:
            continue  # whom it waits for elsewhere is not known yet
        last = chain[-1]["rank"] if chain else slow
        checked: list[dict[str, Any]] = []
        hidden = hidden_chain(state, last, group, now, s, checked)
        if hidden is None:
            continue  # whether it waits inside DDP's collectives is not known yet
        chain += hidden
        root = chain[-1]["rank"] if chain else slow
        named = sorted(late) if not chain else [root]  # (late elsewhere: its chain's root)
        r = state.rank_index().get(root)
        waits_for = "it" if not chain else f"rank {slow}"
        if len(named) > 1:
            summary = (f"{ranks_label(named).capitalize()} are stragglers: the other ranks of "
                       f"{group_label(state, group)} wait {typical / 1000:.1f} ms or more for "
                       f"them at {share:.0%} of their collectives, against at most "
                       f"{max(means[k] for k in named) / 1000:.1f} ms (median) for these "
                       f"ranks themselves")
        else:
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
                    "mean_wait_us": {str(k): round(v, 1)
                                     for k, v in sorted(zip(recent.ranks, recent.means()))},
                    "intervals": n, "collectives": recent.calls(slow),
                    "cost_share": round(min(costs[group], 1.0), 3)}
        if hidden:
            evidence["waits_in_cpp"] = hidden
        if chain:
            evidence["chain"] = chain
        if checked:
            evidence["cpp_groups_checked"] = checked
        if len(named) > 1:
            hosts = sorted({h.host for k in named if (h := state.rank_index().get(k)) and h.host})
            where = (f" (all on {hosts[0]}: look at that host first)" if len(hosts) == 1
                     else f" (on {', '.join(hosts)})" if hosts else "")
            hint = (f"{ranks_label(named).capitalize()} arrive last at every collective, "
                    f"together{where}. Look at what they share and do between collectives: "
                    "their host (CPU contention, a slower NIC or storage), data loading "
                    "(DataLoader num_workers, slow storage), uneven batch or sequence lengths, "
                    "or slower devices (GPU clocks throttled: see GPU health).")
        else:
            hint = (f"Rank {root} arrives last{' at every collective' if not chain else ''}. "
                    f"Look at what it does between collectives{process_label(r)}: data loading "
                    "(DataLoader num_workers, slow storage), uneven batch or sequence lengths, "
                    "extra work on that rank (logging, checkpointing), or a slower device (GPU "
                    "clocks throttled: see GPU health).")
        out.append(finding(
            "straggler", Severity.WARNING, named, group, summary + ".", hint,
            evidence, float(recent.newest_ends().max()), key=f"r{min(named)}"))
    return out


def slow_collective(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A group's collectives far slower than their own history in this job.

    Per interval, the fastest rank's time inside collectives is the transfer itself (nobody
    waits for a straggler there), so that is what is compared with its own past; it must
    stay slow for ``slow_persist`` intervals (a one-second stall of a busy machine is not a
    finding), and only while the ranks run.
    """
    out: dict[str, list[Finding]] = {}
    for groups, windows in stacked_windows(state, now):
        if not windows.size:
            continue
        # Per interval (the newest ``depth`` of each rank) and group, the fastest rank's
        # mean time and calls (the fewest calls of those as fast).
        c = windows.cols
        shape = (windows.groups, windows.size, c.width)
        counts, sums = c.counts.reshape(shape), c.sums.reshape(shape)
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.inf)
        fastest_us = means.min(axis=1)
        calls = np.where(means == fastest_us[:, None, :], counts,
                         np.iinfo(np.int64).max).min(axis=1)
        newest = windows.per_group(c.ends[:, -1]).max(axis=1).tolist()
        for g, (group, depth) in enumerate(zip(groups, windows.depths().tolist())):
            if depth:
                out[group] = _slow_in(state, group, fastest_us[g, c.width - depth:].tolist(),
                                calls[g, c.width - depth:].tolist(),
                                sorted(windows.ranks[g * windows.size:(g + 1) * windows.size]),
                                newest[g], s)
    return [f for group in sorted(out, key=str) for f in out[group]]


def _slow_in(state: JobState, group: str, fastest_us: list[float], calls: list[int],
             members: list[int], newest: float, s: Settings) -> list[Finding]:
    """slow_collective of one group, from its fastest rank's mean time and calls per
    interval, oldest first."""
    fastest = [mean if n >= s.slow_min_calls else None for mean, n in zip(fastest_us, calls)]
    history = sorted(v for v in fastest[:-s.slow_persist] if v is not None)
    current = fastest[-s.slow_persist:]
    if len(history) < s.slow_history or len(current) < s.slow_persist or None in current:
        return []
    baseline = history[len(history) // 2]
    if any(v < s.slow_ratio * baseline or v - baseline < s.slow_min_us for v in current):
        return []
    latest = current[-1]
    return [finding(
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
        newest, key="latest")]
