"""Diagnosis: findings that name the rank at fault, as a pure function of JobState and time.

``diagnose(state, now)`` returns the findings active at event time ``now``. Each rule is one
function; each finding's ``first_seen`` is derived from the state (when the evidence became
conclusive), so replaying a stored log up to ``t`` gives the findings live mode showed at ``t``.
No Flask, no SQL, no clock: ``now`` is passed in.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Iterable

from agent.wire import hist_bucket, hist_bucket_value
from dashboard.errors import classify
from dashboard.state import JobState, RankState


@dataclasses.dataclass(frozen=True)
class Settings:
    hang_after: float = 60.0  # --hang-after: a collective waiting this long is a hang
    # A collective some ranks wait in while a peer has not entered it is a `stall` once the
    # wait reaches the largest of these (measured on real gloo jobs: see README, "Stall"):
    stall_after: float = 10.0  # --stall-after: the floor, well above a checkpoint's pause
    stall_p99_factor: float = 10.0  # ... this many times the group's own p99 collective time
    stall_max_factor: float = 1.5  # ... this many times the longest one the group completed
    stall_min_calls: int = 20  # collectives per rank before the group's history counts...
    stall_warmup_after: float = 30.0  # ... before that (warm-up, compilation), this floor
    lost_after: float = 15.0  # a running rank silent this long (no heartbeat) is lost
    # A rank whose connection closed is lost unless it is back this soon (an agent that
    # reconnects after a network blip, or after acks came late from a busy server).
    reconnect_grace: float = 1.5
    init_grace: float = 3.0  # after the latest arrival, missing ranks are named
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
    straggler_ratio: float = 3.0  # the others wait this many times longer than the straggler
    straggler_min_wait_us: float = 2000.0  # ... and at least this much longer per collective
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


Finding = dict[str, Any]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def finding(kind: str, severity: str, ranks: Iterable[int], group: str | None, summary: str,
            hint: str, evidence: dict[str, Any], first_seen: float, key: str = "") -> Finding:
    return {"id": f"{kind}:{group or '-'}:{key}", "kind": kind, "severity": severity,
            "ranks": sorted(set(ranks)), "group": group, "summary": summary, "hint": hint,
            "evidence": evidence, "first_seen": first_seen, "last_seen": first_seen,
            "active": True}


def diagnose(state: JobState, now: float, settings: Settings = Settings()) -> list[Finding]:
    """Findings active at ``now``, most severe first."""
    found: list[Finding] = []
    for rule in RULES:
        found.extend(f for f in rule(state, now, settings) if f["first_seen"] <= now)
    desyncs = {(f["group"], f["evidence"]["seq"]) for f in found if f["kind"] == "desync"}
    # A mismatched collective usually hangs every rank on gloo: say desync, not hang.
    found = [f for f in found if not (f["kind"] in ("hang", "stall") and
                                      (f["group"], f["evidence"]["seq"]) in desyncs)]
    for f in found:
        f["last_seen"] = now
        # Each attempt of a restarted job has its own findings: attempt 0's keep their ids.
        f["attempt"] = state.attempt
        if state.attempt:
            f["id"] += f"@{state.attempt}"
    return sorted(found, key=lambda f: (SEVERITY_ORDER[f["severity"]], -f["first_seen"]))


# -- helpers ----------------------------------------------------------------------------------

def _ranks_label(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _have(ranks: Iterable[int]) -> str:
    return "has" if len(set(ranks)) == 1 else "have"


def _group_label(state: JobState, name: str) -> str:
    desc = (state.groups.get(name) or {}).get("desc")
    # torch names groups made without a description "undefined"
    return f"group {name} ({desc})" if desc and desc != "undefined" else f"group {name}"


def _where(r: RankState | None) -> str:
    if r is None:
        return ""
    return f" (pid {r.pid} on {r.host})" if r.pid else ""


def _last_error(state: JobState, rank: int) -> dict[str, Any] | None:
    """The latest error of that rank in the current attempt."""
    return next((e for e in reversed(state.errors) if e.get("rank") == rank
                 and e.get("attempt", 0) == state.attempt), None)


def _is_init_failure(state: JobState, r: RankState) -> bool:
    return bool((state.init.get(r.session) or {}).get("error"))


# -- rules ------------------------------------------------------------------------------------

def rank_lost(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for r in state.ranks():
        if r.status == "lost":
            since, how = r.exit_at or r.last_seen, "its connection closed without a clean exit"
            if now - since < s.reconnect_grace:
                continue
        elif r.status in ("running", "initializing") and now - r.last_seen > s.lost_after:
            since = r.last_seen + s.lost_after
            how = f"nothing heard from it for {now - r.last_seen:.0f} s (heartbeats stopped)"
        else:
            continue
        victims = {v.rank: _last_error(state, v.rank) for v in state.ranks()
                   if v.status == "failed" and v.rank != r.rank}
        out.append(finding(
            "rank_lost", "critical", [r.rank], None,
            f"Rank {r.rank} vanished{_where(r)}: {how}.",
            f"Look for why process {r.pid} on {r.host} died: `dmesg -T | grep -iE "
            f"'killed process|out of memory'` on {r.host} (OOM killer), the launcher's exit "
            f"code for rank {r.rank} (-9 is SIGKILL), and the end of that rank's own log. "
            "Errors on other ranks after this moment are consequences.",
            {"last_seen": r.last_seen, "host": r.host, "pid": r.pid,
             "victims": {str(k): v for k, v in victims.items()}},
            since, key=f"r{r.rank}"))
    return out


def rank_failed(state: JobState, now: float, s: Settings) -> list[Finding]:
    failed = [r for r in state.ranks() if r.status == "failed" and not _is_init_failure(state, r)]
    if not failed:
        return []
    causes = {}
    for r in failed:
        err = _last_error(state, r.rank)
        cause = classify(err["error"], err.get("error_type")) if err else None
        causes[r.rank] = (err, cause)
    lost = [r.rank for r in state.ranks() if r.status == "lost"]
    culprits = [r for r in failed if causes[r.rank][1] is None or not causes[r.rank][1].victim]
    victims = [r for r in failed if r not in culprits]
    if not culprits and not lost:
        # Everyone who failed was waiting on a peer: blame the first to fail, say so.
        culprits = [min(victims, key=lambda r: (causes[r.rank][0] or {}).get("t", r.exit_at or 0))]
        victims = [r for r in victims if r is not culprits[0]]
    out = []
    for r in culprits:
        err, cause = causes[r.rank]
        text = err["error"] if err else "the process exited unsuccessfully"
        if cause is None:
            title = "exited with an error"
        elif cause.cause == "unknown":  # the error's own words say more than "unrecognised"
            first = text.strip().splitlines()[0] if text.strip() else ""
            title = f"{err.get('error_type') or 'error'}: {first[:160]}"
        else:
            title = cause.title
        out.append(finding(
            "rank_failed", "critical", [r.rank], err.get("group") if err else None,
            f"Rank {r.rank} failed{_where(r)}: {title}.",
            (cause.hint if cause else "Read the end of this rank's log.") +
            (" The other failures are consequences of this one." if victims else ""),
            {"error": text, "error_type": err.get("error_type") if err else None,
             "where": err.get("where") if err else None, "op": err.get("op") if err else None,
             "seq": err.get("seq") if err else None,
             "cause": cause.cause if cause else None, "details": cause.details if cause else {},
             "victims": {str(v.rank): (causes[v.rank][0] or {}).get("error") for v in victims}},
            (err or {}).get("t") or r.exit_at or r.last_seen, key=f"r{r.rank}"))
    return out


@dataclasses.dataclass(frozen=True)
class _View:
    """One way of reading progress rows: the agent's wrappers, or the Flight Recorder."""

    seq: str  # the row's sequence-number field
    since: str  # its in-flight-since field
    source: str

    def busy(self, row: dict[str, Any]) -> bool:
        return row.get(self.since) is not None and (
            self.source != "python" or bool(row.get("inflight_op")))

    def op(self, row: dict[str, Any]) -> str:
        return row.get("inflight_op") if self.source == "python" else "a C++ collective (DDP)"


PYTHON = _View("entered", "inflight_since", "python")
FLIGHT = _View("fr_enqueued", "fr_inflight_since", "flight_recorder")


def _behind(state: JobState, group: str, seq: int, waiting: set[int],
            view: _View = PYTHON) -> list[int]:
    rows = state.progress_of(group)
    members = (state.groups.get(group) or {}).get("ranks") or sorted(rows)
    return [m for m in members
            if m not in waiting and (rows.get(m) or {}).get(view.seq, 0) < seq]


def _stuck(state: JobState, group: str, now: float, s: Settings, view: _View):
    """(seq, waiting ranks, rows) of the collective stuck past hang_after, or None."""
    ranks = state.rank_index()
    rows = state.progress_of(group)
    stuck = {rank: row for rank, row in rows.items()
             if view.busy(row) and now - row[view.since] >= s.hang_after
             and (ranks.get(rank) is None or ranks[rank].status == "running")}
    if not stuck:
        return None
    seq = max(row[view.seq] for row in stuck.values())
    return seq, {rank for rank, row in stuck.items() if row[view.seq] == seq}, rows


def hang(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    for group in sorted(state.groups, key=str):
        # The wrappers' view names the op; the Flight Recorder's also sees C++ collectives.
        view, found = PYTHON, _stuck(state, group, now, s, PYTHON)
        if found is None:
            view, found = FLIGHT, _stuck(state, group, now, s, FLIGHT)
        if found is None:
            continue
        seq, waiting, rows = found
        op = view.op(rows[min(waiting)])
        since = min(rows[r][view.since] for r in waiting)
        behind = _behind(state, group, seq, waiting, view)
        chain, roots = _follow(state, group, behind, view)
        if not roots:  # every member is inside the collective: nobody to wait for
            roots = sorted(waiting)
            summary = (f"{_ranks_label(waiting).capitalize()} {_have(waiting)} been inside "
                       f"{op} #{seq} on "
                       f"{_group_label(state, group)} for {now - since:.0f} s, and no rank is "
                       "missing from it.")
            hint = ("All ranks entered the same collective and none completes: suspect the "
                    "transport (network, NCCL/gloo), a mismatched collective, or a GIL "
                    "deadlock. Rerun with NCCL_DEBUG=INFO (or TORCH_DISTRIBUTED_DEBUG=DETAIL "
                    "on gloo) and compare the stacks in the evidence.")
        else:
            first = ranks.get(roots[0])
            summary = (f"{_ranks_label(waiting).capitalize()} {_have(waiting)} waited "
                       f"{now - since:.0f} s in {op} #{seq} on {_group_label(state, group)} "
                       f"for {_ranks_label(roots)}.")
            hint = (f"{_ranks_label(roots).capitalize()} never reached that collective. See "
                    f"where it is: `py-spy dump --pid {first.pid if first else '<pid>'}` on "
                    f"{first.host if first else 'its host'} (its last collectives and stack are "
                    "in the evidence): data loading, a rank-dependent branch that skips a "
                    "collective, or compute that never ends. Without pgdash the NCCL watchdog "
                    "would report this only after its timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                    "keeps a Flight Recorder dump).")
        involved = set(waiting) | set(roots) | {c["rank"] for c in chain}
        stacks = {str(rank): state.stacks[(g, rank)]["stack"]
                  for (g, rank) in state.stacks if rank in involved
                  and (g != group or state.stacks[(g, rank)]["seq"] == seq
                       or view is FLIGHT)}
        out.append(finding(
            "hang", "critical", roots, group, summary, hint,
            {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
             "since": since,
             "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                 (view.seq, "completed", "inflight_op")} for b in behind},
             "chain": chain, "stacks": stacks},
            since + s.hang_after, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
    return out


def _group_history(state: JobState) -> dict[str, tuple[float | None, float, int]]:
    """Per group: (p99 us, longest us, collectives per member) of every collective seen
    complete with a real latency (the wrappers', or NCCL's device timing), all ops and ranks
    together. Built once per state version."""
    def build() -> dict[str, tuple[float | None, float, int]]:
        merged: dict[str, Any] = {}
        for (group, _op, _rank, _source), stats in state.collectives.items():
            if stats.resolution_us is not None:
                continue  # timed to the agent's poll gap (gloo's Flight Recorder): too coarse
            m = merged.get(group)
            if m is None:
                m = merged[group] = type(stats)()
            m.merge(stats)
        out = {}
        for group, m in merged.items():
            members = len((state.groups.get(group) or {}).get("ranks") or ()) or 1
            out[group] = (m.percentile(0.99), m.max_us, m.count // members)
        return out
    return state.memo(("group_history",), build)


def _stall_threshold(state: JobState, group: str, view: _View, rows: dict[int, dict],
                     s: Settings) -> tuple[float, dict[str, Any]]:
    """Seconds a wait in ``group`` must last to be a stall, and what that was derived from."""
    if view is FLIGHT:  # C++ collectives: no latency history, only how many ran
        calls = min((row.get("fr_completed") or 0) for row in rows.values())
        p99_us = longest_us = None
    else:
        p99_us, longest_us, calls = _group_history(state).get(group, (None, 0.0, 0))
    if calls < s.stall_min_calls:
        return s.stall_warmup_after, {"history_calls": calls, "warmup": True}
    threshold = max(s.stall_after, s.stall_p99_factor * (p99_us or 0) / 1e6,
                    s.stall_max_factor * (longest_us or 0) / 1e6)
    return threshold, {"history_calls": calls, "p99_us": p99_us, "longest_us": longest_us}


def stall(state: JobState, now: float, s: Settings) -> list[Finding]:
    """A collective some ranks have waited in, for a peer that has not entered it, far longer
    than the group's own history: named long before --hang-after. Becomes the `hang` at
    --hang-after (this rule then stays quiet), or resolves by itself when the peer arrives.

    Unlike `hang`, a collective every member entered is not a stall: nobody to name yet.
    """
    out = []
    ranks = state.rank_index()
    for group in sorted(state.groups, key=str):
        if any(_stuck(state, group, now, s, v) is not None for v in (PYTHON, FLIGHT)):
            continue  # the hang rule speaks for this group now
        rows = state.progress_of(group)
        for view in (PYTHON, FLIGHT):
            busy = {rank: row for rank, row in rows.items()
                    if view.busy(row) and now - row[view.since] < s.hang_after
                    and (ranks.get(rank) is None or ranks[rank].status == "running")}
            if not busy:
                continue
            seq = max(row[view.seq] for row in busy.values())
            waiting = {rank for rank, row in busy.items() if row[view.seq] == seq}
            behind = _behind(state, group, seq, waiting, view)
            if not behind:
                continue
            since = min(rows[r][view.since] for r in waiting)
            threshold, basis = _stall_threshold(state, group, view, rows, s)
            if now - since < threshold:
                continue
            chain, roots = _follow(state, group, behind, view)
            op = view.op(rows[min(waiting)])
            first = ranks.get(roots[0])
            out.append(finding(
                "stall", "warning", roots, group,
                f"{_ranks_label(waiting).capitalize()} {_have(waiting)} waited "
                f"{now - since:.0f} s in {op} #{seq} on {_group_label(state, group)} for "
                f"{_ranks_label(roots)}, far longer than this group's collectives take "
                f"(stall after {threshold:.0f} s).",
                f"{_ranks_label(roots).capitalize()} {_have(roots)} not reached that "
                f"collective yet. See what it does: `py-spy dump --pid "
                f"{first.pid if first and first.pid else '<pid>'}` on "
                f"{first.host if first and first.host else 'its host'}. A checkpoint or an "
                "evaluation that runs on one rank only looks like this too; if it is not one, "
                f"this becomes a hang after {s.hang_after:g} s (--hang-after).",
                {"seq": seq, "op": op, "source": view.source, "waiting": sorted(waiting),
                 "since": since, "threshold_s": round(threshold, 3), **basis,
                 "behind": {str(b): {k: (rows.get(b) or {}).get(k) for k in
                                     (view.seq, "completed", "inflight_op")} for b in behind},
                 "chain": chain},
                since + threshold, key=f"{seq}" if view is PYTHON else f"fr{seq}"))
            break
    return out


def _follow(state: JobState, group: str, behind: list[int],
            view: _View = PYTHON) -> tuple[list[dict], list[int]]:
    """Follow ranks that are behind to where they wait themselves, across groups."""
    chain: list[dict[str, Any]] = []
    roots: list[int] = []
    seen: set[tuple[str, int]] = set()
    todo = [(group, b) for b in behind]
    while todo:
        g, rank = todo.pop(0)
        if (g, rank) in seen:
            continue
        seen.add((g, rank))
        # Where it waits itself: a collective Python saw, else one only the Flight
        # Recorder saw (a rank stuck in DDP's C++ all-reduce).
        elsewhere = [(og, row, v) for v in (PYTHON, FLIGHT)
                     for (og, r), row in sorted(state.progress.items())
                     if r == rank and og != g and v.busy(row)]
        if not elsewhere:
            roots.append(rank)
            continue
        og, row, v = elsewhere[0]
        next_behind = _behind(state, og, row[v.seq], {rank}, v)
        chain.append({"rank": rank, "waits_in": og, "seq": row[v.seq],
                      "op": v.op(row), "for": next_behind})
        if not next_behind:
            roots.append(rank)
        todo.extend((og, b) for b in next_behind)
    return chain, sorted(set(roots))


def desync(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for group in sorted(state.groups, key=str):
        by_seq: dict[int, dict[int, tuple]] = collections.defaultdict(dict)
        since: dict[int, float] = {}
        for rank, row in state.progress_of(group).items():
            if row.get("inflight_op"):
                sig = (row["inflight_op"], row.get("inflight_dtype"), row.get("inflight_bytes"))
                by_seq[row["entered"]][rank] = sig
                since[row["entered"]] = max(since.get(row["entered"], 0),
                                            row.get("inflight_since") or 0)
        for seq, sigs in by_seq.items():
            if len(set(sigs.values())) < 2:
                continue
            counts = collections.Counter(sigs.values())
            top = max(counts.values())
            majority = min((sig for sig, n in counts.items() if n == top),
                           key=lambda sig: min(r for r, v in sigs.items() if v == sig))
            odd = sorted(r for r, sig in sigs.items() if sig != majority)
            described = {str(r): {"op": sig[0], "dtype": sig[1], "bytes": sig[2]}
                         for r, sig in sorted(sigs.items())}
            odd_sig = sigs[odd[0]]
            out.append(finding(
                "desync", "critical", odd, group,
                f"{_ranks_label(odd).capitalize()} called {odd_sig[0]} ({odd_sig[1]}, "
                f"{odd_sig[2]} bytes) as collective #{seq} on {_group_label(state, group)}, "
                f"where the others called {majority[0]} ({majority[1]}, {majority[2]} bytes).",
                "Ranks must issue the same collectives in the same order with the same shapes. "
                f"Look for a rank-dependent branch before collective #{seq} on "
                f"{_ranks_label(odd)} (an `if rank == ...`, uneven data, a skipped step). "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective (slowly).",
                {"seq": seq, "signatures": described, "expected": {
                    "op": majority[0], "dtype": majority[1], "bytes": majority[2]}},
                since[seq], key=f"{seq}"))
    return out


def init_incomplete(state: JobState, now: float, s: Settings) -> list[Finding]:
    arrivals = [(sess, entry) for sess, entry in state.current_init().items()]
    if not arrivals:
        return []
    sizes = collections.Counter(e.get("world_size") for _, e in arrivals
                                if e.get("world_size") not in (None, -1))
    world = state.world_size or (sizes.most_common(1)[0][0] if sizes else None)
    if not world:
        return []
    arrived = {state.sessions[sess].rank for sess, _ in arrivals
               if state.sessions[sess].rank is not None}
    waiting = [e for _, e in arrivals if not e.get("done_at") and not e.get("error")]
    missing = sorted(set(range(world)) - arrived)
    if not waiting or not missing:
        return []
    last_arrival = max(e["arrived_at"] for _, e in arrivals)
    addr = next((e.get("master_addr") for _, e in arrivals if e.get("master_addr")), None)
    port = next((e.get("master_port") for _, e in arrivals if e.get("master_port")), None)
    target = f"{addr}:{port}" if addr and port else "MASTER_ADDR:MASTER_PORT"
    return [finding(
        "init_incomplete", "critical", missing, None,
        f"Rendezvous is waiting: {len(arrived)} of {world} ranks arrived; "
        f"{_ranks_label(missing)} never did.",
        f"Check that {_ranks_label(missing)} were launched at all (the launcher's log, "
        f"`squeue`/`kubectl get pods`), that they use WORLD_SIZE={world} and reach {target} "
        f"(`nc -zv {addr or '<MASTER_ADDR>'} {port or '<MASTER_PORT>'}` from their hosts).",
        {"world_size": world, "arrived": sorted(arrived), "missing": missing,
         "waiting_since": min(e["arrived_at"] for e in waiting), "master": target},
        last_arrival + s.init_grace)]


def init_failed(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for sess, entry in state.current_init().items():
        err = entry.get("error")
        if not err:
            continue
        r = state.sessions[sess]
        cause = classify(err["error"], err.get("error_type"))
        rank = r.rank if r.rank is not None else entry.get("rank")
        out.append(finding(
            "init_failed", "critical", [rank] if rank is not None and rank >= 0 else [], None,
            f"init_process_group raised on rank {rank}{_where(r)}: {cause.title}.",
            cause.hint,
            {"error": err["error"], "error_type": err.get("error_type"), "cause": cause.cause,
             "details": cause.details, "init_method": entry.get("init_method"),
             "master_addr": entry.get("master_addr"), "master_port": entry.get("master_port"),
             "after_s": err.get("duration_s")},
            entry["arrived_at"] + (err.get("duration_s") or 0), key=sess[:12]))
    return out


# Settings every rank of a job must agree on. Per-rank ones (RANK, LOCAL_RANK,
# CUDA_VISIBLE_DEVICES, TORCHELASTIC_ERROR_FILE, ...) are deliberately absent.
_CRITICAL_KEYS = ("world_size", "backend", "MASTER_ADDR", "MASTER_PORT")
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")


def _settings_of(r: RankState) -> dict[str, Any]:
    values: dict[str, Any] = {"world_size": r.world_size, "backend": r.backend}
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        values[key] = r.env.get(key)
    for name in ("torch", "cuda", "nccl"):
        values[f"{name} version"] = r.versions.get(name)
    for key, value in r.env.items():
        if key.startswith(_ENV_PREFIXES):
            values[key] = value
    return values


def config_mismatch(state: JobState, now: float, s: Settings) -> list[Finding]:
    ranks = [r for r in state.ranks() if r.hello_at is not None]
    if len(ranks) < 2:
        return []
    per_rank = {r.rank: _settings_of(r) for r in ranks}
    keys = sorted({k for v in per_rank.values() for k in v})
    out = []
    for key in keys:
        values = {rank: v.get(key) for rank, v in per_rank.items()}
        if key in ("world_size", "backend") and None in values.values():
            values = {rank: v for rank, v in values.items() if v is not None}
        if len(set(map(str, values.values()))) < 2:
            continue
        counts = collections.Counter(map(str, values.values()))
        top = max(counts.values())
        majority = min((v for v, n in counts.items() if n == top),
                       key=lambda v: min(r for r, x in values.items() if str(x) == v))
        odd = sorted(r for r, v in values.items() if str(v) != majority)
        shown = {str(r): v if v is not None else "(unset)" for r, v in sorted(values.items())}
        odd_values = ", ".join(f"{shown[str(r)]} on rank {r}" for r in odd[:4])
        severity = "critical" if key in _CRITICAL_KEYS else "warning"
        by = {r.rank: r for r in ranks}
        out.append(finding(
            "config_mismatch", severity, odd, None,
            f"Ranks disagree on {key}: {odd_values}; the others have "
            f"{majority if majority != 'None' else '(unset)'}.",
            f"Set {key} the same on every rank (the launcher's environment, the job script); "
            f"compare `env | grep -E 'NCCL|GLOO|MASTER|WORLD'` on "
            f"{', '.join(sorted({by[r].host for r in odd if by[r].host}))[:200] or 'their hosts'}.",
            {"key": key, "values": shown, "majority": majority},
            max(by[r].hello_at for r in values), key=key))
    return out


def _windows(state: JobState, group: str, now: float) -> dict[int, list[tuple]]:
    """Recent (end, count, sum_us) summaries with calls, per running rank of a group, up to
    ``now``. Straggler and slow_collective both ask, per group: built once per state version
    and time for all groups."""
    return state.memo(("windows", now), lambda: _all_windows(state, now)).get(group, {})


def _all_windows(state: JobState, now: float) -> dict[str, dict[int, list[tuple]]]:
    running = {r.rank for r in state.ranks() if r.status == "running"}
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
    verdicts: dict[str, tuple] = {}
    for group in sorted(state.groups, key=str):
        windows = _windows(state, group, now)
        if len(windows) < 2:
            continue
        found = [_straggler_in(windows, back, s) for back in range(s.straggler_persist)]
        if any(v is None for v in found) or len({v[0] for v in found}) != 1:
            continue
        # The window just before, if it names another rank, makes this noise: a straggler
        # that changes from one interval to the next is a crowded host's scheduler, not a
        # slow rank (one whose slowness has just begun names nobody there, or itself).
        before = _straggler_in(windows, s.straggler_persist, s)
        if before is not None and before[0] != found[0][0]:
            continue
        verdicts[group] = found[0]
    out = []
    for group, (slow, means, typical, n, recent) in verdicts.items():
        # A rank late here only because it waited for another rank in a different group is
        # a victim: follow such waits, as hangs do, to the rank that made it late.
        chain = _late_chain(state, group, slow, verdicts)
        last = chain[-1]["rank"] if chain else slow
        checked: list[dict[str, Any]] = []
        hidden = _hidden_chain(state, last, group, now, s, checked)
        if hidden is None:
            continue  # whether it waits inside DDP's collectives is not known yet
        chain += hidden
        root = chain[-1]["rank"] if chain else slow
        r = state.rank_index().get(root)
        summary = (f"The other ranks of {_group_label(state, group)} keep waiting for rank "
                   f"{slow}: {typical / 1000:.1f} ms or more at {s.straggler_late_share:.0%} of "
                   f"their collectives, "
                   f"against {means[slow] / 1000:.1f} ms (median) for rank {slow} itself")
        for hop in chain:
            where = ("'s C++ collectives (DDP)" if hop.get("source") != "python" else "")
            summary += (f"; rank {hop['waits']} waits for rank {hop['rank']} inside "
                        f"{_group_label(state, hop['group'])}{where}")
        evidence = {"median_wait_us": {str(k): round(v, 1) for k, v in sorted(means.items())},
                    "others_wait_us": round(typical, 1),
                    "late_share": s.straggler_late_share,
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
            "straggler", "warning", [root], group, summary + ".",
            f"Rank {root} arrives last{' at every collective' if not chain else ''}. Look at "
            f"what it does between collectives{_where(r)}: data loading (DataLoader "
            "num_workers, slow storage), uneven batch or sequence lengths, extra work on that "
            "rank (logging, checkpointing), or a slower device (GPU clocks throttled: see GPU "
            "health).",
            evidence, max(pts[-1][0] for pts in recent.values()), key=f"r{root}"))
    return out


def _late_chain(state: JobState, group: str, slow: int,
                verdicts: dict[str, tuple]) -> list[dict[str, Any]]:
    """Hops from ``slow``, the straggler of ``group``, through groups where it is itself one
    of the ranks kept waiting by another straggler (``[{"waits", "rank", "group",
    "source"}]``; empty when it waits for nobody)."""
    chain: list[dict[str, Any]] = []
    seen = {group}
    rank = slow
    while len(chain) < 4:
        hop = None
        for other, verdict in sorted(verdicts.items(), key=lambda kv: str(kv[0])):
            members = (state.groups.get(other) or {}).get("ranks") or ()
            if other in seen or rank not in members or verdict[0] == rank:
                continue
            means, typical = verdict[1], verdict[2]
            if rank in means and means[rank] >= typical * 0.5:  # it is one who waits there
                hop = {"waits": rank, "rank": verdict[0], "group": other, "source": "python",
                       "wait_us": round(means[rank], 1)}
                break
        if hop is None:
            return chain
        chain.append(hop)
        seen.add(hop["group"])
        rank = hop["rank"]
    return chain


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
    chain: list[dict[str, Any]] = []
    seen = {group}
    while len(chain) < 4:
        hop = None
        for other in sorted(state.groups, key=str):
            if other in seen or rank not in state.groups[other]["ranks"] or \
                    not state.flight_only(other):
                continue
            # Agents that sample send the tally even when it is 0; older ones never do.
            sampled = any("fr_samples" in row for row in state.progress_of(other).values())
            verdict = _waits_for(state.fr_tallies_of(other), rank, now, s, sampled)
            if verdict is None:
                return None
            peer, shares = verdict
            if peer is not None:
                hop = {"waits": rank, "rank": peer, "group": other, "busy_share": shares}
                break
            if shares:
                checked.append({"rank": rank, "group": other, "busy_share": shares})
        if hop is None:
            return chain
        chain.append(hop)
        seen.add(hop["group"])
        rank = hop["rank"]
    return chain


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


def _straggler_in(windows: dict[int, list[tuple]], back: int, s: Settings):
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
        n = s.straggler_min_intervals
        while n <= depth and any(sum(p[1] for p in pts[-n:]) < calls
                                 for pts in windows.values()):
            n += 1
        if n > depth:
            return None
        recent = {rank: pts[-n:] for rank, pts in windows.items()}
        pooled = {rank: _pooled(pts) for rank, pts in recent.items()}
        medians = {rank: _pooled_quantile(h, 0.5) for rank, h in pooled.items()}
        slow = min(medians, key=medians.get)
        lows = {rank: _pooled_quantile(h, 1.0 - s.straggler_late_share)
                for rank, h in pooled.items() if rank != slow}
        typical = _typical(lows, slow)
        if typical < s.straggler_ratio * medians[slow] or \
                typical - medians[slow] < s.straggler_min_wait_us:
            continue
        if steady:
            highs = {rank: _pooled_quantile(h, s.straggler_late_share)
                     for rank, h in pooled.items() if rank != slow}
            if typical < s.straggler_steady * _typical(highs, slow):
                continue
        return slow, medians, typical, n, recent
    return None


def _pooled(points: list[tuple]) -> dict[int, int]:
    """The latency histogram of all the collectives of some intervals together."""
    out: dict[int, int] = collections.defaultdict(int)
    for p in points:
        if len(p) > 5:
            for bucket, n in p[5]:
                out[bucket] += n
        else:  # folded before histograms were kept: all its collectives at its quartile
            out[hist_bucket(p[4] if len(p) > 4 else p[2] / p[1])] += p[1]
    return out


def _pooled_quantile(hist: dict[int, int], q: float) -> float:
    """Quantile ``q`` of a pooled histogram: at least ``q`` of the collectives took at most
    this long (the bucket's middle)."""
    total = sum(hist.values())
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= q * total:
            return hist_bucket_value(bucket)
    return 0.0


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
            "slow_collective", "warning", members, group,
            f"Collectives on {_group_label(state, group)} take {latest / 1000:.1f} ms, "
            f"{latest / baseline:.0f}x their usual {baseline / 1000:.2f} ms in this job.",
            "The transfer itself slowed down on every rank (not one late rank): check the "
            "links between these ranks' hosts (NCCL_DEBUG=INFO shows the transport; "
            "`ibstat`, NVLink/PCIe errors in GPU health), other jobs sharing the network, "
            "and a sudden growth in message size.",
            {"current_us": round(latest, 1), "baseline_us": round(baseline, 1),
             "ranks": members, "intervals": s.slow_persist},
            max(pts[-1][0] for pts in windows.values()), key="latest"))
    return out


# XIDs that mean the hardware (not the program) failed; others are usually the program's
# own fault (13, 31, 43: an illegal access or a crashed kernel) and are reported as warnings.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping recorded",
    64: "ECC row remapping failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}
APP_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault",
            43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error"}
_GPU_FAULTS = {"lost": "the GPU fell off the bus (NVML: GPU is lost)",
               "ecc": "uncorrectable ECC errors since the driver loaded",
               "remap_failure": "a memory row remapping failed",
               "remap_pending": "a memory row remapping is pending (needs a GPU reset)"}


def _fault_text(key: str) -> tuple[str, bool]:
    """(description, is hardware) of a GPU fault key."""
    if key.startswith("xid:"):
        xid = int(key[4:])
        if xid in HARDWARE_XIDS:
            return f"XID {xid} ({HARDWARE_XIDS[xid]})", True
        return f"XID {xid} ({APP_XIDS.get(xid, 'see the NVIDIA XID catalogue')})", False
    return _GPU_FAULTS[key], key != "remap_pending"


def gpu_fault(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    ranks = state.rank_index()
    for rank, faults in sorted(state.gpu_faults.items()):
        if not faults:
            continue
        described = {key: _fault_text(key) for key in faults}
        hardware = any(hw for _, hw in described.values())
        gpu = state.gpus.get(rank, {})
        host = (ranks.get(rank).host if ranks.get(rank) else None) or "its host"
        text = "; ".join(d for d, _ in described.values())
        out.append(finding(
            "gpu_fault", "critical" if hardware else "warning", [rank], None,
            f"GPU of rank {rank} ({gpu.get('name') or 'GPU'} {gpu.get('uuid', '')}) on {host}: "
            f"{text}.",
            (f"Take {host} out of the pool and check it: `nvidia-smi -q -d ECC,ROW_REMAPPER` "
             f"and `dmesg -T | grep -i xid` on {host}; XID 79, 95 or a remap failure need a GPU "
             "reset or an RMA. Restart the job without that GPU."
             if hardware else
             "These XIDs usually come from the program itself (an illegal memory access, a "
             "kernel that crashed): rerun that rank with CUDA_LAUNCH_BLOCKING=1 or under "
             "compute-sanitizer to find the kernel."),
            {"faults": {k: {"first_seen": t, "meaning": described[k][0]}
                        for k, t in sorted(faults.items())},
             "uuid": gpu.get("uuid"), "host": host},
            min(faults.values()), key=f"r{rank}"))
    return out


def gpu_throttle(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for rank, since in sorted(state.throttled_since.items()):
        gpu = state.gpus.get(rank, {})
        reasons = [r for r in gpu.get("reasons", []) if r != "gpu_idle"]
        out.append(finding(
            "gpu_throttle", "warning", [rank], None,
            f"GPU of rank {rank} is slowed down ({', '.join(reasons)}): SM clock "
            f"{gpu.get('sm_clock_mhz') or '?'} of {gpu.get('sm_clock_max_mhz') or '?'} MHz, "
            f"{gpu.get('temp_c') or '?'} °C, {gpu.get('power_w') or '?'} W.",
            "A throttled GPU makes its rank a straggler for the whole job. Check cooling and "
            "power on that host (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`), fans, "
            "airflow and the power supply; a hardware slowdown that persists needs the host "
            "looked at.",
            {"reasons": reasons, "since": since, "temp_c": gpu.get("temp_c"),
             "power_w": gpu.get("power_w"), "sm_clock_mhz": gpu.get("sm_clock_mhz")},
            since + s.throttle_after, key=f"r{rank}"))
    return out


RULES: list[Callable[[JobState, float, Settings], list[Finding]]] = [
    init_incomplete, init_failed, config_mismatch, rank_lost, rank_failed, hang, stall, desync,
    straggler, slow_collective, gpu_fault, gpu_throttle,
]
