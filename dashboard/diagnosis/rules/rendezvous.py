"""Rules for the start of a job: rendezvous never completing, init_process_group failing,
ranks disagreeing on settings that must match."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

from dashboard.diagnosis.errors import classify_error
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.rules.idle import work_text, works
from dashboard.diagnosis.rules.waits import WORKING_HANG_FACTOR
from dashboard.diagnosis.text import (agree, backend_of, have, process_label, ranks_label,
                                      stack_commands, them)
from dashboard.state import TERMINAL_RANK, JobState, RankState


def _world_of(state: JobState, arrivals: list[tuple[str, dict[str, Any]]]) -> int | None:
    sizes = collections.Counter(e.get("world_size") for _, e in arrivals
                                if e.get("world_size") not in (None, -1))
    return state.world_size or (sizes.most_common(1)[0][0] if sizes else None)


class GaveUp(NamedTuple):
    """Ranks whose init_process_group gave up waiting for peers that had not arrived."""

    at: float  # when the first of them gave up
    missing: list[int]  # the ranks not arrived by then
    waiters: dict[str, str]  # session -> its error's title (a peer's absence: not its fault)
    late: dict[str, float]  # session of a missing rank that arrived after -> seconds after


def gave_up(state: JobState) -> GaveUp | None:
    """The rendezvous that timed out waiting (``init_process_group(timeout=...)`` shorter
    than a slow rank's start): ranks failed with errors that say a peer did not come (the
    store's "2/3 clients joined", a key never set) while ranks had not arrived. The ranks
    not arrived are at fault, not the ranks that waited for them, nor those ranks' own
    failures when they arrive to a rendezvous already gone."""
    def build() -> GaveUp | None:
        arrivals = list(state.current_init().items())
        world = _world_of(state, arrivals)
        backend = backend_of(state)
        failed = {sess: (e["arrived_at"] + (e["error"].get("duration_s") or 0.0),
                         classify_error(e["error"], backend))
                  for sess, e in arrivals if e.get("error")}
        waiters = {sess: at for sess, (at, cause) in failed.items() if cause.victim}
        if not world or not waiters:
            return None
        at = min(waiters.values())
        claims = {sess: _claimed(state.sessions[sess], e) for sess, e in arrivals}
        there = {claims[sess] for sess, e in arrivals if e["arrived_at"] <= at}
        missing = sorted(set(range(world)) - there)
        if not missing:
            return None
        late = {sess: e["arrived_at"] - at for sess, e in arrivals
                if e["arrived_at"] > at and claims[sess] in missing}
        return GaveUp(at, missing, {sess: failed[sess][1].title for sess in waiters
                                    if state.init[sess]["arrived_at"] <= at}, late)
    return state.memo(("init_gave_up",), build)


def init_incomplete(state: JobState, now: float, s: Settings) -> list[Finding]:
    arrivals = [(sess, entry) for sess, entry in state.current_init().items()]
    if not arrivals:
        return []
    world = _world_of(state, arrivals)
    if not world:
        return []
    stopped = gave_up(state)
    if stopped is not None:
        return [_gave_up_finding(state, stopped, world)]
    # The rank each process asked init_process_group for: its rendezvous's word, where a
    # script (or a launcher's copied environment) changed RANK after the agent attached.
    claims = {sess: _claimed(state.sessions[sess], e) for sess, e in arrivals}
    arrived = {rank for rank in claims.values() if rank is not None}
    waiting = [e for _, e in arrivals if not e.get("done_at") and not e.get("error")]
    missing = sorted(set(range(world)) - arrived)
    if not waiting or not missing:
        return []
    last_arrival = max(e["arrived_at"] for _, e in arrivals)
    addr = next((e.get("master_addr") for _, e in arrivals if e.get("master_addr")), None)
    port = next((e.get("master_port") for _, e in arrivals if e.get("master_port")), None)
    target = f"{addr}:{port}" if addr and port else "MASTER_ADDR:MASTER_PORT"
    twice = _claimed_twice(state, claims)
    # Waited for as long as a collective is before it is a hang: a rank that never comes.
    # Until then a warning: a rank only slow to start (its imports on a cold file system,
    # its container still pulling) arrives late and the finding ends. Two live processes
    # claiming one rank never finish, however long they wait: critical at once. Missing
    # ranks whose processes are here and work before init_process_group (rank 0 preparing
    # the data first) are given what a collective gives a rank at work (rules.waits).
    here = _here_before_init(state, missing, claims)
    working = {rank: works(state, rank) for rank in here}
    after = s.hang_after * (WORKING_HANG_FACTOR if here and len(here) == len(missing)
                            and all(working.values()) else 1.0)
    never = bool(twice) or now - last_arrival >= after
    evidence = {"world_size": world, "arrived": sorted(arrived), "missing": missing,
                "waiting_since": min(e["arrived_at"] for e in waiting), "master": target}
    if here:
        evidence["here"] = {str(rank): None if use is None else round(use[0], 3)
                            for rank, use in working.items()}
    if twice:
        evidence["claimed_twice"] = {str(rank): [{"pid": r.pid, "host": r.host,
                                                  "started_as": r.rank} for r in rs]
                                     for rank, rs in twice.items()}
        # The ranks the duplicates were started as are the ones nobody will be; another rank
        # not here yet is only late so far (rank 0 spawning its host reader on a busy host
        # arrived a second after the duplicate was seen, and was named with rank 2).
        missing = sorted({r.rank for rs in twice.values() for r in rs
                          if r.rank in missing}) or missing
        return [finding(
            "init_incomplete", Severity.CRITICAL, missing, None,
            f"{ranks_label(missing).capitalize()} never arrived at rendezvous: "
            + "; ".join(f"{len(rs)} processes claim rank {rank} "
                        f"({', '.join(_started_as(r, rank) for r in rs)})"
                        for rank, rs in twice.items())
            + f", so nobody is {ranks_label(missing)} and init_process_group waits for "
            f"{them(missing)} forever.",
            "Give every process its own rank: check the RANK (or SLURM_PROCID, or the rank= "
            "argument of init_process_group) each process of the launcher gets; a launcher "
            "that copies one process's environment for the next, or a script that sets RANK "
            "from LOCAL_RANK on a multi-node job, starts two processes with one rank.",
            evidence, last_arrival)]
    hint = (f"Check that {ranks_label(missing)} {agree(missing, 'was', 'were')} launched at "
            "all (the launcher's log, "
            f"`squeue`/`kubectl get pods`), that {agree(missing, 'it uses', 'they use')} "
            f"WORLD_SIZE={world} and {agree(missing, 'reaches', 'reach')} {target} "
            f"(`nc -zv {addr or '<MASTER_ADDR>'} {port or '<MASTER_PORT>'}` from "
            f"{agree(missing, 'its host', 'their hosts')}).")
    if here:
        hint = (f"{ranks_label(sorted(here)).capitalize()} {agree(here, 'runs', 'run')} "
                f"(its agent reports) but {agree(here, 'has', 'have')} not called "
                "init_process_group yet: "
                + ("working (" + ", ".join(f"rank {rank}: {work_text([use])}"
                                          for rank, use in working.items() if use)
                   + "), as a script that prepares its data on one rank before "
                   "init_process_group does. " if any(working.values()) else
                   "using no CPU and moving no data, blocked before it. ")
                + f"{stack_commands(state, sorted(here)).capitalize()} "
                f"{agree(here, 'shows', 'show')} where. "
                + ("" if len(here) == len(missing) else hint))
    return [finding(
        "init_incomplete", Severity.CRITICAL if never else Severity.WARNING, missing, None,
        f"{ranks_label(missing).capitalize()} "
        f"{'never arrived' if never else agree(missing, 'has', 'have') + ' not arrived'} "
        f"at rendezvous: {len(arrived)} of {world} ranks did, and init_process_group waits "
        f"for {them(missing)}"
        + ("." if never else f" (critical once it has waited {after:g} s)."),
        hint, evidence, last_arrival + s.init_grace)]


def _here_before_init(state: JobState, missing: list[int],
                      claims: dict[str, int | None]) -> dict[int, RankState]:
    """The missing ranks whose processes run and report (an agent attached before
    init_process_group, as the launcher wrapper does) without having called it."""
    index = state.rank_index()
    return {rank: index[rank] for rank in missing
            if rank in index and index[rank].status not in TERMINAL_RANK
            and index[rank].session not in claims}


def _gave_up_finding(state: JobState, stopped: GaveUp, world: int) -> Finding:
    missing, waiters = stopped.missing, stopped.waiters
    by_rank = {state.sessions[sess].rank: title for sess, title in waiters.items()}
    timeouts = sorted({e.get("timeout_s") for sess, e in state.current_init().items()
                       if sess in waiters and e.get("timeout_s")})
    waited = f" (`init_process_group(timeout={timeouts[0]:g} s)`)" if len(timeouts) == 1 else ""
    late = sorted((state.sessions[sess].rank, after) for sess, after in stopped.late.items())
    came = "; ".join(f"rank {rank} arrived {after:.0f} s after" for rank, after in late)
    waiting = sorted(r for r in by_rank if r is not None)
    return finding(
        "init_incomplete", Severity.CRITICAL, missing, None,
        f"{ranks_label(missing).capitalize()} did not arrive at rendezvous in time: "
        f"{ranks_label(waiting)} gave up waiting for {them(missing)}{waited}"
        + (f"; {came}." if came else "."),
        f"Find what delays {ranks_label(missing)} before init_process_group (imports or "
        "data on a cold file system, a download, a container still pulling, a slow node; "
        f"while {agree(missing, 'it starts', 'they start')}: {stack_commands(state, missing)}), "
        "or give the rendezvous more time (`init_process_group(timeout=...)`, default 30 "
        "min; torchrun's `--rdzv-conf join_timeout=`).",
        {"world_size": world, "missing": missing,
         "gave_up": {str(r): title for r, title in sorted(by_rank.items(), key=str)},
         "late_s": {str(r): round(after, 1) for r, after in late},
         "timeout_s": timeouts[0] if len(timeouts) == 1 else None},
        stopped.at)


def _claimed(r: RankState, entry: dict[str, Any]) -> int | None:
    """The rank a process's init_process_group was asked for, else the one it started as."""
    rank = entry.get("rank")
    return rank if rank not in (None, -1) else r.rank


def _claimed_twice(state: JobState, claims: dict[str, int | None]) -> dict[int, list[RankState]]:
    """Rank -> the live processes (still in their rendezvous) that claim it, where two or
    more do; a process that ended (a launcher restarting one in place) claims nothing."""
    by_rank: dict[int, list[RankState]] = collections.defaultdict(list)
    for sess, rank in claims.items():
        r = state.sessions[sess]
        entry = state.init[sess]
        if rank is not None and r.status not in TERMINAL_RANK and not entry.get("done_at") \
                and not entry.get("error"):
            by_rank[rank].append(r)
    return {rank: sorted(rs, key=lambda r: (r.rank != rank, r.pid or 0))
            for rank, rs in sorted(by_rank.items()) if len(rs) > 1}


def _started_as(r: RankState, claimed: int) -> str:
    where = f"pid {r.pid} on {r.host}" if r.pid else f"session {r.session[:8]}"
    if r.rank is not None and r.rank != claimed:
        return f"{where}, started as rank {r.rank}"
    return where


def init_failed(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    stopped = gave_up(state)
    explained = set(stopped.waiters) | set(stopped.late) if stopped else set()
    for sess, entry in state.current_init().items():
        err = entry.get("error")
        if not err or sess in explained:  # (init_incomplete names the ranks that were late)
            continue
        r = state.sessions[sess]
        cause = classify_error(err, backend_of(state))
        rank = r.rank if r.rank is not None else entry.get("rank")
        out.append(finding(
            "init_failed", Severity.CRITICAL, [rank] if rank is not None and rank >= 0 else [], None,
            f"Rank {rank}'s init_process_group raised{process_label(r)}: {cause.title}.",
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
RENDEZVOUS_KEYS = ("world_size", "MASTER_ADDR", "MASTER_PORT")  # a mismatch: init never ends
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")
# Settings of those families that only say what a rank logs or dumps: one node exporting
# NCCL_DEBUG=INFO to look at its network is debugging, not a mismatch.
_LOGGING_ONLY = frozenset({
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_DEBUG_TIMESTAMP_FORMAT",
    "NCCL_DEBUG_TIMESTAMP_LEVELS", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_TRACE_CPP_STACK", "TORCH_NCCL_DESYNC_DEBUG",
    "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN"})


def _settings_of(r: RankState, init: dict[str, Any]) -> dict[str, Any]:
    """What a rank runs with; for the rendezvous's own settings, what its init_process_group
    was called with (``init``: its entry in ``JobState.init``) before what its process
    started with: a script may set them itself, and a rank stuck in a rendezvous it can never
    complete has no other word for them."""
    size = init.get("world_size")
    values: dict[str, Any] = {"world_size": size if size not in (None, -1) else r.world_size,
                              "backend": r.backend}
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        values[key] = init.get(key.lower()) or r.env.get(key)
    for name in ("torch", "cuda", "nccl"):
        values[f"{name} version"] = r.versions.get(name)
    for key, value in r.env.items():
        if key.startswith(_ENV_PREFIXES) and key not in _LOGGING_ONLY:
            values[key] = value
    return values


def config_mismatch(state: JobState, now: float, s: Settings) -> list[Finding]:
    ranks = [r for r in state.ranks() if r.hello_at is not None]
    if len(ranks) < 2:
        return []
    inits = {state.sessions[sess].rank: e for sess, e in state.current_init().items()}
    per_rank = {r.rank: _settings_of(r, inits.get(r.rank, {})) for r in ranks}
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
        tied = [v for v, n in counts.items() if n == top]
        if len(tied) == 1:
            majority = tied[0]
        elif 0 in values and str(values[0]) in tied:
            majority = str(values[0])  # rank 0 serves the store: its settings break a tie
        else:  # no majority among the ranks that said hello so far (master_port_stale: ranks
            continue  # 1 and 2 before rank 0, whose port then named rank 1, not rank 2)
        odd = sorted(r for r, v in values.items() if str(v) != majority)
        shown = {str(r): v if v is not None else "(unset)" for r, v in sorted(values.items())}
        odd_values = ", ".join(f"{shown[str(r)]} on rank {r}" for r in odd[:4])
        severity = Severity.CRITICAL if key in _CRITICAL_KEYS else Severity.WARNING
        by = {r.rank: r for r in ranks}
        out.append(finding(
            "config_mismatch", severity, odd, None,
            f"{ranks_label(odd).capitalize()} {have(odd)} another "
            f"{key} than the others: {odd_values}; the others have "
            f"{majority if majority != 'None' else '(unset)'}.",
            f"Set {key} the same on every rank (the launcher's environment, the job script); "
            f"compare `env | grep -E 'NCCL|GLOO|MASTER|WORLD'` on "
            f"{', '.join(sorted({by[r].host for r in odd if by[r].host}))[:200] or 'their hosts'}.",
            {"key": key, "values": shown, "majority": majority},
            max(by[r].hello_at for r in values), key=key))
    return out
