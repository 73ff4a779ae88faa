"""The fold's speed: events per second folded into a fresh JobState, per event kind.

Replay of a stored job (``GET /api/jobs/<id>/state?at=``, dashboard.history.rewind) and the
live server both fold every event, so the fold's speed bounds both. What is folded: an
in-memory log (StoredEvent dicts, in arrival order) of a ``--ranks`` job (default 256, the
mesh of bench.common.mesh_groups) running ``--seconds`` (default 120), each rank sending
what a real agent sends at its defaults (bench.common.agent_schedule: at each heartbeat a
latency summary, the heartbeat and a GPU reading; half a second later a latency summary,
PGDASH_STATS_INTERVAL_S = 0.5), after its connect, hello, rendezvous and groups. From
``--hang-at`` seconds for ``--hang-for`` one rank stops entering the world group's
collectives (the others wait in an all_reduce; nothing completes, so no summaries), and
``--slow-rank`` waits least in its collectives throughout (its peers wait for it): diagnosis
has a hang and a straggler to find.

Printed: events/s of the whole log (the best of ``--repeat`` folds, each into a fresh
JobState) and each kind's share of the time (a second fold timing every event); at each
moment checked, the time one judgement takes (``diagnose`` alone: the live server judges
each job every half second, every second above 256 ranks) and the whole read.

``--reference PATH`` folds the same log with the pgdash of another checkout (e.g. a
``git worktree add /tmp/fold-ref HEAD``) in a subprocess, the figures side by side, and
checks that both folds read the same: at several moments (prefixes of the log) the page's
sections (dashboard.web.live.sections, judged then, with the findings of
dashboard.diagnosis.diagnose then), the findings themselves, and the state's public tables
(``collectives``, ``op_seconds``, ``recent``, ...) as JSON. Both sides run in subprocesses,
in turn. A measurement: exit status 0 whatever the figures, 1 if the results differ. From
the repository root::

    python -m bench.fold                                  # this checkout only
    git worktree add /tmp/fold-ref HEAD
    python -m bench.fold --reference /tmp/fold-ref        # against HEAD
    python -m bench.fold --ranks 64 --seconds 30 --reference /tmp/fold-ref   # quick look
    python -m bench.fold --profile                        # cProfile of one fold
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_780_000_000.0  # the job's start: the same log every run


# -- the log -----------------------------------------------------------------------------------

def build_log(ranks: int = 256, seconds: int = 120, hang_at: float | None = 40.0,
              hang_for: float = 70.0, slow_rank: int | None = 5, ops: int | None = None,
              seed: int = 1) -> list[dict]:
    """The job's events as the log stores them (StoredEvent dicts), in arrival order."""
    from bench.common import (OPS_PER_SECOND, agent_schedule, members, mesh_groups,
                              second_events, start_events, summary_event)

    ops = OPS_PER_SECOND if ops is None else ops
    rng = random.Random(seed)
    world = ranks
    groups = members(mesh_groups(world), world)
    schedule = agent_schedule()  # [(0.0, True), (0.5, False)] at the agent's defaults
    period = 1.0
    span = schedule[1][0] if len(schedule) > 1 else period  # what a summary covers
    stuck = world // 2  # the rank that stops entering the world group's collectives
    hang_start = T0 + hang_at if hang_at is not None else float("inf")
    hang_end = hang_start + hang_for
    timed: list[tuple[float, int, int, str, dict]] = []  # (t, rank, order, kind, body)
    order = 0

    def put(rank: int, t: float, kind: str, body: dict) -> None:
        nonlocal order
        timed.append((t, rank, order, kind, body))
        order += 1

    for rank in range(world):
        t = T0 + rank / world * 0.2  # launchers start ranks a little apart
        put(rank, t, "connect", {"rank": rank, "host": f"node{rank // 8:04d}"})
        for kind, body, _ in start_events(rank, world, "bench-fold", groups[rank], now=t,
                                          init_start_at=t):
            put(rank, t, kind, body)

    def slowed(body: dict) -> dict:
        # The straggler reaches each collective last: it waits a fifth of what others do.
        for row in body["rows"]:
            row["sum_us"] = round(row["sum_us"] / 5, 3)
            row["max_us"] = round(row["max_us"] / 5, 3)
            row["hist"] = [[max(0, b - 14), n] for b, n in row["hist"]]
        return body

    for s in range(1, seconds + 1):
        for rank in range(world):
            base = T0 + s + rank / world - 0.05  # each rank at its own phase
            for offset, heartbeat in schedule:
                t = base + offset
                hung = hang_start <= t < hang_end
                if heartbeat:
                    hb, coll, gpu = second_events(rank, s, groups[rank], ops, rng, now=t,
                                                  span=span)
                    if hung:
                        step = int(hang_at)
                        for row in hb[1]["groups"]:
                            if row["group"] == "0":
                                row.update(entered=step * 20 + (0 if rank == stuck else 1),
                                           completed=step * 20,
                                           inflight_op=None if rank == stuck else "all_reduce",
                                           inflight_since=None if rank == stuck
                                           else hang_start)
                    events = [coll, hb, gpu]
                else:
                    events = [summary_event(groups[rank], ops, rng, span, now=t)]
                for kind, body, _ in events:
                    if kind == "coll_stats":
                        if hung:
                            continue  # nothing completes while the world group waits
                        if rank == slow_rank:
                            slowed(body)
                    put(rank, t, kind, body)
    for rank in range(world):
        put(rank, T0 + seconds + 1 + rank / world, "exit", {"clean": True})
    timed.sort(key=lambda e: (e[0], e[2]))
    seqs: dict[int, int] = collections.Counter()
    log = []
    for i, (t, rank, _, kind, body) in enumerate(timed, start=1):
        seq = None
        if kind not in ("connect", "disconnect"):
            seqs[rank] += 1
            seq = seqs[rank]
        log.append({"id": i, "session": f"session-{rank:05d}", "seq": seq, "t": t,
                    "received_at": t + 0.01, "kind": kind, "body": body})
    return log


def moments(log: list[dict], hang_at: float | None, hang_for: float) -> list[int]:
    """Prefix lengths of the log to check the fold at: early, mid-run, inside the hang once
    it is one (diagnosis' hang_after), after it, and the whole log."""
    ts = [ev["t"] for ev in log]
    wanted = [T0 + 0.25 * (ts[-1] - T0), T0 + 0.5 * (ts[-1] - T0)]
    if hang_at is not None:
        wanted += [T0 + hang_at + min(hang_for - 1, 65.0), T0 + hang_at + hang_for + 3]
    import bisect
    cuts = sorted({min(len(log), bisect.bisect_right(ts, at)) for at in wanted} | {len(log)})
    return [c for c in cuts if c > 0]


# -- a worker: one pgdash's fold of the log ------------------------------------------------

def canonical(value):
    """JSON-able, order-stable form of what the state shows (tuple keys as strings, deques
    as lists, sets sorted, objects as their __dict__)."""
    if type(value).__name__ == "LatencyTable":  # the totals as columns (dashboard.state.totals)
        value = dict(value.items())
    if isinstance(value, dict):
        return {json.dumps(canonical(k), sort_keys=True) if not isinstance(k, str) else k:
                canonical(v) for k, v in value.items()}
    # (GpuHistory: a rank's GPU readings, as its deque of lists was before 8a550be)
    if isinstance(value, (list, tuple, collections.deque)) or \
            type(value).__name__ == "GpuHistory":
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(canonical(v) for v in value)
    if isinstance(value, float):
        return repr(value)  # exact
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses
        out = {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if type(value).__name__ == "LatencyStats":  # a histogram's buckets in no set order
            out["hist"] = dict(sorted(out["hist"].items(), key=lambda kv: int(kv[0])))
        return out
    return value


PUBLIC_TABLES = ("groups", "collectives", "progress", "errors", "init", "stacks", "exit_rows",
                 "recent", "fr_tallies", "snapshots", "gpus", "gpu_history",
                 "gpu_faults", "throttled_since", "attempt", "attempt_started", "started_at",
                 "last_event_at", "last_event_id", "applied")


def latency_series(state, seconds: int = 32) -> dict:
    """The per-second latency series as the chart reads them: per (family, op, source), its
    newest ``seconds`` seconds, each (count, bytes, max_us, histogram). A pgdash before
    714b178 kept them per group for 60 s; this reads both alike. Not the sum of times: added
    in another order (per group, then per family) it differs in its last bits, and the
    chart never reads it."""
    families = state.families()
    merged: dict = {}
    for (group, op, source), series in state.op_seconds.items():
        per = merged.setdefault((families.get(group, group), op, source), {})
        for second, stats in series.items():
            cell = per.setdefault(second, [0, 0, 0.0, collections.Counter()])
            cell[0] += stats.count
            cell[1] += stats.bytes
            cell[2] = max(cell[2], stats.max_us)
            cell[3].update(stats.hist)
    return {key: {second: [c[0], c[1], c[2], sorted(c[3].items())]
                  for second, c in sorted(per.items())[-seconds:]}
            for key, per in sorted(merged.items())}


def observed(state, at: float) -> dict:
    """What is read of a state at event time ``at``: findings, the page's sections, the
    public tables, summary and ranks."""
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.rules import diagnose
    from dashboard.web.live import sections

    settings = Settings()
    findings = diagnose(state, at, settings)
    shown = sections(state, at=at, findings=[dict(f) for f in findings], settings=settings)
    tables = {name: getattr(state, name) for name in PUBLIC_TABLES}
    tables["op_seconds"] = latency_series(state)
    if not isinstance(state.recent, dict):  # columns since dashboard.state.recent: as tuples
        tables["recent"] = state.recent.windows()
    return {"findings": canonical(findings), "sections": canonical(shown),
            "tables": canonical(tables), "summary": canonical(state.summary()),
            "ranks": canonical(state.ranks()), "attempt_rows": canonical(state.attempt_rows()),
            "op_stats": canonical({k: (v[0], v[1], v[2]) for k, v in state.op_stats().items()}),
            "findings_kinds": sorted({f["kind"] for f in findings})}


def worker(args) -> None:
    """Fold the pickled log with whatever ``dashboard`` is first on sys.path; print JSON."""
    import gc

    from dashboard.state import JobState

    with open(args.log, "rb") as fh:
        log, cuts = pickle.load(fh)
    out: dict = {"root": str(Path(sys.modules["dashboard"].__file__).parent.parent)}
    best = float("inf")
    for _ in range(args.repeat):
        gc.collect()
        state = JobState(1, "bench-fold")
        start = time.perf_counter()
        state.apply_all(log)
        best = min(best, time.perf_counter() - start)
    out["fold_s"] = best
    out["events"] = len(log)
    # Per kind: every event timed (perf_counter's own cost is spread evenly over kinds).
    per_kind: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    state = JobState(1, "bench-fold")
    clock = time.perf_counter
    apply = state.apply
    for ev in log:
        start = clock()
        apply(ev)
        per_kind[ev["kind"]] += clock() - start
        count[ev["kind"]] += 1
    out["per_kind"] = {k: [count[k], per_kind[k]] for k in per_kind}
    if args.profile:
        import cProfile
        import pstats
        state = JobState(1, "bench-fold")
        prof = cProfile.Profile()
        prof.runcall(state.apply_all, log)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    if not args.no_check:
        from dashboard.diagnosis import Settings
        from dashboard.diagnosis.rules import diagnose

        checks = []
        state, done = JobState(1, "bench-fold"), 0
        for cut in cuts:
            state.apply_all(log[done:cut])
            done = cut
            at = log[cut - 1]["t"] + 0.5
            start = time.perf_counter()
            diagnose(state, at, Settings())  # a judgement alone: what live judging costs
            judged = time.perf_counter() - start
            start = time.perf_counter()
            seen = observed(state, at)
            took = time.perf_counter() - start
            checks.append({"cut": cut, "at": at, "observed": seen, "read_s": took,
                           "judge_s": judged})
        # A checkpoint of the whole state, loaded, reads the same (the codec's round trip).
        from dashboard.storage.codec import decode_state, encode_state
        loaded = decode_state(encode_state(state))
        checks.append({"cut": len(log), "at": log[-1]["t"] + 0.5, "loaded": True,
                       "observed": observed(loaded, log[-1]["t"] + 0.5), "read_s": 0.0})
        # ... and goes on folding as the original does (re-fold the exits onto it)
        out["checks"] = checks
    with open(args.out, "w") as fh:
        json.dump(out, fh)


def run_worker(root: Path, log_path: str, args, profile: bool = False,
               check: bool = True) -> dict:
    """A worker on the checkout ``root`` (its ``dashboard`` first on sys.path)."""
    from bench.common import checkout_env

    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        out_path = fh.name
    env = checkout_env(root)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--log", log_path,
           "--out", out_path, "--repeat", str(args.repeat)]
    if profile:
        cmd.append("--profile")
    if not check:
        cmd.append("--no-check")
    subprocess.run(cmd, env=env, check=True, cwd=str(root))
    with open(out_path) as fh:
        result = json.load(fh)
    os.unlink(out_path)
    return result


# -- the report ------------------------------------------------------------------------------

def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


# Tables whose order nothing reads: the windows are kept per group since dashboard.state.recent
# (they were per (group, rank), in the order of the first summaries).
UNORDERED = {"/tables/recent"}


def first_difference(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'this' if k in a else 'reference'}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        if list(a) != list(b) and path not in UNORDERED:
            return f"{path}: same keys, other order"
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {str(a)[:80]} != {str(b)[:80]}"


def report(name: str, res: dict, ref: dict | None) -> None:
    rate = res["events"] / res["fold_s"]
    line = f"  {name:10} {res['fold_s']:7.2f} s, {rate:10,.0f} events/s"
    if ref is not None:
        ref_rate = ref["events"] / ref["fold_s"]
        line += f"   (reference {ref_rate:,.0f} events/s, x{rate / ref_rate:.2f})"
    print(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--seconds", type=int, default=120)
    p.add_argument("--hang-at", type=float, default=40.0,
                   help="seconds into the job a rank stops (negative: no hang)")
    p.add_argument("--hang-for", type=float, default=70.0)
    p.add_argument("--slow-rank", type=int, default=5, help="negative: none")
    p.add_argument("--ops", type=int, default=None, help="summary rows per interval")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2, help="folds timed; the best counts")
    p.add_argument("--reference", type=Path, help="another checkout to fold the log with")
    p.add_argument("--profile", action="store_true", help="cProfile one fold (this checkout)")
    p.add_argument("--no-check", action="store_true", help="only the figures")
    # internal: one side's fold in a subprocess
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    hang_at = args.hang_at if args.hang_at >= 0 else None
    slow = args.slow_rank if args.slow_rank >= 0 else None
    start = time.perf_counter()
    log = build_log(args.ranks, args.seconds, hang_at, args.hang_for, slow, args.ops,
                    args.seed)
    cuts = moments(log, hang_at, args.hang_for)
    kinds = collections.Counter(ev["kind"] for ev in log)
    print(f"log: {args.ranks} ranks x {args.seconds} s, {len(log):,} events "
          f"({', '.join(f'{k} {n:,}' for k, n in kinds.most_common())}); "
          f"built in {time.perf_counter() - start:.1f} s", flush=True)
    with tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False) as fh:
        pickle.dump((log, cuts), fh, protocol=pickle.HIGHEST_PROTOCOL)
        log_path = fh.name
    try:
        mine = run_worker(ROOT, log_path, args, profile=args.profile, check=not args.no_check)
        ref = None
        if args.reference is not None:
            ref = run_worker(args.reference.resolve(), log_path, args,
                             check=not args.no_check)
            assert ref["root"] != mine["root"], "the reference imported this checkout"
    finally:
        os.unlink(log_path)
    print(f"fold of the whole log into a fresh JobState (best of {args.repeat}):")
    report("this", mine, ref)
    if ref is not None:
        report("reference", ref, None)
    print("per kind (every event timed; us per event, share of the fold):")
    total = sum(v[1] for v in mine["per_kind"].values())
    ref_kinds = ref["per_kind"] if ref else {}
    for kind, (n, s) in sorted(mine["per_kind"].items(), key=lambda kv: -kv[1][1]):
        line = f"  {kind:12} {n:9,}  {s / n * 1e6:8.2f} us  {s / total:6.1%}"
        if kind in ref_kinds:
            rn, rs = ref_kinds[kind]
            line += f"   (reference {rs / rn * 1e6:8.2f} us, x{(rs / rn) / (s / n):.2f} faster)"
        print(line)
    status = 0
    if not args.no_check:
        print("reads at moments (prefixes of the log):")
        for i, check in enumerate(mine["checks"]):
            seen = check["observed"]
            what = "checkpoint round trip" if check.get("loaded") else f"{check['cut']:,} events"
            line = (f"  {what:22} at +{check['at'] - T0:6.1f} s: findings "
                    f"{seen['findings_kinds'] or '-'}, digest {digest(seen)}, "
                    f"read in {check['read_s']:.2f} s")
            if "judge_s" in check:
                line += f", judged in {check['judge_s']:.3f} s"
                if ref is not None and "judge_s" in ref["checks"][i]:
                    line += f" (reference {ref['checks'][i]['judge_s']:.3f} s)"
            if ref is not None:
                other = ref["checks"][i]["observed"]
                diff = first_difference(seen, other)
                line += ", same as reference" if diff is None else f", DIFFERS: {diff}"
                status |= diff is not None
            print(line)
        if ref is not None:
            print("identical results" if not status else "RESULTS DIFFER from the reference")
    return status


if __name__ == "__main__":
    sys.exit(main())
