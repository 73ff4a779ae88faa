"""Rules for the start of a job: rendezvous never completing, init_process_group failing,
ranks disagreeing on settings that must match."""

from __future__ import annotations

import collections
from typing import Any

from dashboard.diagnosis.errors import classify_error
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import agree, backend_of, have, process_label, ranks_label, them
from dashboard.state import TERMINAL_RANK, JobState, RankState


def init_incomplete(state: JobState, now: float, s: Settings) -> list[Finding]:
    arrivals = [(sess, entry) for sess, entry in state.current_init().items()]
    if not arrivals:
        return []
    sizes = collections.Counter(e.get("world_size") for _, e in arrivals
                                if e.get("world_size") not in (None, -1))
    world = state.world_size or (sizes.most_common(1)[0][0] if sizes else None)
    if not world:
        return []
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
    # claiming one rank never finish, however long they wait: critical at once.
    never = bool(twice) or now - last_arrival >= s.hang_after
    evidence = {"world_size": world, "arrived": sorted(arrived), "missing": missing,
                "waiting_since": min(e["arrived_at"] for e in waiting), "master": target}
    if twice:
        evidence["claimed_twice"] = {str(rank): [{"pid": r.pid, "host": r.host,
                                                  "started_as": r.rank} for r in rs]
                                     for rank, rs in twice.items()}
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
    return [finding(
        "init_incomplete", Severity.CRITICAL if never else Severity.WARNING, missing, None,
        f"{ranks_label(missing).capitalize()} "
        f"{'never arrived' if never else agree(missing, 'has', 'have') + ' not arrived'} "
        f"at rendezvous: {len(arrived)} of {world} ranks did, and init_process_group waits "
        f"for {them(missing)}"
        + ("." if never else f" (critical once it has waited {s.hang_after:g} s)."),
        f"Check that {ranks_label(missing)} {agree(missing, 'was', 'were')} launched at all "
        "(the launcher's log, "
        f"`squeue`/`kubectl get pods`), that {agree(missing, 'it uses', 'they use')} "
        f"WORLD_SIZE={world} and {agree(missing, 'reaches', 'reach')} {target} "
        f"(`nc -zv {addr or '<MASTER_ADDR>'} {port or '<MASTER_PORT>'}` from "
        f"{agree(missing, 'its host', 'their hosts')}).",
        evidence, last_arrival + s.init_grace)]


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
    for sess, entry in state.current_init().items():
        err = entry.get("error")
        if not err:
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
        if key.startswith(_ENV_PREFIXES):
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
        majority = min((v for v, n in counts.items() if n == top),
                       key=lambda v: min(r for r, x in values.items() if str(x) == v))
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
