"""Diagnosis core: the Finding type, severities, and the settings every rule reads.

A finding names what is wrong, the rank(s) at fault, a next step, and its evidence. Rules
(``dashboard.diagnosis.rules``) make findings from a JobState and an event time; the book
(``dashboard.diagnosis.book``) keeps their lifecycle. No Flask, no SQL, no clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from dashboard.statuses import TextEnum


class Severity(TextEnum):
    """How bad a finding is (str-valued: JSON holds the same strings as before)."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class Settings:
    # Findings are judged on the moments k * diagnose_every (Unix seconds), live and in
    # replay alike (dashboard.diagnosis.book): the same moments give the same times. Half a
    # second, as agents summarise latencies (PGDASH_STATS_INTERVAL_S): a summary that makes
    # a straggler conclusive is judged at most this long after it arrives (bench/detect.py).
    diagnose_every: float = 0.5
    # ... but a job of more ranks than this is judged on every second only, and one of more
    # than huge_job_ranks every two seconds: a judgement's cost grows with the ranks (0.22 s
    # of a core at 1,024, bench.fold's mesh), and judged every second it kept a quarter of
    # the one core a job's events are folded on (bench/capacity.py); the stall and hang
    # thresholds (10 s and more) hardly notice a second more. A function of the state, so
    # replay skips the same moments.
    large_job_ranks: int = 256
    large_job_every: float = 1.0
    huge_job_ranks: int = 512
    huge_job_every: float = 2.0
    hang_after: float = 60.0  # --hang-after: a collective waiting this long is a hang
    # Ranks of a moving job are routinely a few collectives apart (heartbeats are snapshots
    # taken at different moments): the page shows a rank "behind" only once the others have
    # waited in a collective this long (dashboard.web.display.group_states).
    behind_after: float = 2.0
    # A collective some ranks wait in while a peer has not entered it is a `stall` once the
    # wait reaches the largest of these (measured on real gloo jobs: see README, "Stall"):
    stall_after: float = 10.0  # --stall-after: the floor, well above a checkpoint's pause
    stall_p99_factor: float = 10.0  # ... this many times the group's own p99 collective time
    stall_max_factor: float = 1.5  # ... this many times the longest one the group completed
    stall_min_calls: int = 20  # collectives per rank before the group's history counts...
    stall_warmup_after: float = 30.0  # ... before that (warm-up, compilation), this floor
    # A barrier is where ranks wait for one rank's own work (rank 0 saves a checkpoint,
    # evaluates, downloads the data set): a wait there is a stall only after this long.
    stall_barrier_after: float = 30.0
    lost_after: float = 15.0  # a running rank silent this long (no heartbeat) is lost
    # A rank whose connection closed is lost unless it is back this soon (an agent that
    # reconnects after a network blip, or after acks came late from a busy server).
    reconnect_grace: float = 1.5
    # ... but one that closed while the server had owed its agent an acknowledgement this long
    # (the agent gave up on a server behind its agents: protocol v1 after its ack timeout,
    # v2 when pings go unanswered too) is lost only after lost_after, as a silent rank is:
    # reconnecting into a crowded server takes longer than the grace (bench/capacity.py
    # --wire v1, 512 and 1,024 ranks: a healthy job got rank_lost criticals in 5 of 7 runs)
    owed_close_after: float = 2.0
    # After the latest arrival at rendezvous, missing ranks are named. 3 s named ranks that
    # were only slow to start on a crowded host (bench/detect.py: a false init_incomplete in
    # 2 of ~40 runs); a launcher starts ranks within seconds, a rank that never comes stays
    # missing, and torch itself waits 30 minutes.
    init_grace: float = 10.0
    # Stragglers (measured with bench/detect.py; see the rule's docstring and README):
    straggler_min_intervals: int = 1  # latency summaries (PGDASH_STATS_INTERVAL_S) a window spans
    straggler_min_calls: int = 16  # ... holding at least this many collectives on every rank
    straggler_late_share: float = 0.9  # ... the others clearly waited longer (ratio and floor
    # below) than the straggler's median at this share of their collectives: a single pause
    # (a checkpoint, a CPU stall of a crowded host) is one long wait, random jitter makes each
    # rank wait at about half of them; a straggler makes them wait at nearly every one
    # ... when the others' waits are steady: their wait at the late share's low end at least
    # this share of the one at its high end (a rank slower by about the same time at every
    # step; jitter, or a crowded host's scheduler, spreads them); else on twice the calls
    straggler_steady: float = 0.5
    straggler_persist: int = 1  # ... judged so on this many consecutive windows
    # ... and a window of fewer summaries than this (a busy group's, whose collectives fill
    # one summary) only when the window before named the same rank: CI once warned on a
    # healthy 2-rank FSDP job whose rank 1 was kept off its core for one half-second summary
    straggler_min_span: int = 2
    # ... and a rank named whose newest summary ends more than this before another's is
    # judged again over the time all of them have reported (rules.windows.aligned): the
    # agents' summaries (PGDASH_STATS_INTERVAL_S, 0.5 s) end at different phases of the
    # interval, and one that ends at most half of it later covers mostly the same time
    straggler_align_s: float = 0.25
    # ... or, for groups that run several collectives a step (FSDP, DDP's buckets: the others
    # wait at the step's first one only), on a window of this many collectives per rank, the
    # others waited long at this share of theirs and the straggler at a quarter of it at most
    # (see rules.straggler_verdict._sparse_straggler)
    straggler_sparse_calls: int = 48
    straggler_sparse_share: float = 0.08
    # ... and only when so few long waits of the straggler against so many of the others is
    # unlikely by chance (a sign test: with no straggler, a long wait is the candidate's or a
    # typical other's alike). Where it is not, the window doubles, twice. On a crowded host
    # the scheduler makes one rank of a pair late a few more times than the other: 5 long
    # waits against 1 in 48 collectives warned on a healthy job (p 0.11).
    straggler_sparse_p: float = 0.01
    # Ranks late together (a slow node's ranks, two older GPUs): a rank whose median wait is
    # within this share of the way from the straggler's to the others' typical wait is a
    # straggler too (half the group's ranks at most; a victim waits about the typical)
    straggler_together: float = 0.25
    straggler_ratio: float = 3.0  # the others wait this many times longer than the straggler
    straggler_min_wait_us: float = 2000.0  # ... and at least this much longer per collective
    # ... and the others' waiting for it (beyond its own waits) at least this share of the
    # window's time: less costs the job next to nothing, and a crowded host's scheduler
    # makes that much (corpus healthy_async_allreduce_overlap: 3 ranks computing 0.3 s per
    # step on 2 cores, one waited for 2 ms at a fifth of the steps, 2.5% of the time, and was
    # named; the corpus's stragglers cost the others 20-55% when they are named)
    straggler_min_cost: float = 0.05
    slow_history: int = 10  # intervals of history before slow_collective can judge
    slow_persist: int = 3  # consecutive slow intervals before it is a finding
    slow_min_calls: int = 3  # intervals with fewer collectives on the fastest rank don't count
    slow_ratio: float = 10.0  # a collective this many times slower than its own history
    slow_min_us: float = 5000.0  # ... and at least this much slower per call
    throttle_after: float = 5.0  # thermal/power slowdown active this long is a finding
    # A straggler's own waits inside C++-only collectives (DDP's), from the Flight Recorder's
    # samples (5 a second): judged on at least this many samples per rank...
    hidden_min_samples: int = 25
    hidden_wait_gap: float = 0.05  # ... it waits if found in flight this much more often
    hidden_min_busy: int = 3  # ... (at least this many times, and two standard errors)
    hidden_horizon: float = 10.0  # ... over at most this many seconds of heartbeats (older
    # ones describe the job before it slowed down)
    # The live server's word on each agent's connection (dashboard.ingest.heard.Heard.heard):
    # (session, moment) -> the newest time by then that it heard from the agent or owed it an
    # acknowledgement, or None when it cannot say. None (replay, tests): the fold alone says.
    heard: Callable[[str, float], float | None] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a checkpoint's timeline holds its settings) without ``heard``: the
        connections are the live server's, not the job's."""
        return {k: v for k, v in self.__dict__.items() if k != "heard"}


Finding = dict[str, Any]
SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


def finding(kind: str, severity: str, ranks: Iterable[int], group: str | None, summary: str,
            hint: str, evidence: dict[str, Any], first_seen: float, key: str = "") -> Finding:
    """One finding as stored and served; its id is stable across moments (kind, group, key)."""
    return {"id": f"{kind}:{group or '-'}:{key}", "kind": kind,
            "severity": Severity(severity).value,
            "ranks": sorted(set(ranks)), "group": group, "summary": summary, "hint": hint,
            "evidence": evidence, "first_seen": first_seen, "last_seen": first_seen,
            "active": True}
