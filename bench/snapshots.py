"""Snapshots: how long until every rank of a job has said what it is doing, and what answering
costs a training rank.

For each N, a ``pgdash serve`` process takes N simulated ranks that send what the agent sends
at its defaults (bench.capacity's agents: protocol v2, real websockets) and answer the server's
questions as the agent does (a snapshot the size of a real one: three threads, the training
thread 30 frames deep). Then, ``--rounds`` times: ``POST /api/jobs/<id>/snapshots`` for all
ranks, and for one rank, timed until ``GET`` says every asked rank answered. Goals (issue 26):
all ranks of 1,024 in 5 s (p95), one rank in 1 s.

Last, the real agent's side (``pgdash_agent.snapshots``): the time its background thread holds
the GIL to answer (the training thread's frames 30 deep, three more threads), which is what a
snapshot can delay training by (goal: 50 ms).

    python -m bench.snapshots --ranks 64,1024 --rounds 5
    python -m bench.snapshots --ranks 1024 --hung      # a hung job: when all ranks are asked
    git worktree add /tmp/before HEAD~1
    python -m bench.snapshots --ranks 1024 --compare /tmp/before   # before and after, one run
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.capacity import Bench, get, launch, metric
from bench.common import OPS_PER_SECOND, ROOT, fmt, pct, start_servers, stop_servers
from dashboard.ingest.asks import MIN_INTERVAL_S


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def timed_request(base: str, job_id: int, ranks) -> tuple[float, int, int] | None:
    """(seconds until every asked rank answered, ranks answered, bytes of the answer); None
    when the server refused (503: ingest behind its agents). Runs in a process of its own,
    as a user's browser or ``pgdash snapshot`` does: in the bench's process it would wait for
    the GIL behind 1,024 simulated agents (a poll every 0.05 s came every 0.3-0.5 s)."""
    t0 = time.monotonic()
    try:
        made = post(f"{base}/api/jobs/{job_id}/snapshots", {"ranks": ranks})
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return None
        raise RuntimeError(f"bench: the server refused the snapshot ({exc.code}): "
                           f"{exc.read()[:300]!r}") from None
    while True:
        view = get(base + made["url"], 120)
        answered = sum(1 for r in view["ranks"].values() if r["status"] == "answered")
        if answered == len(made["asked"]) or view["complete"]:
            size = len(json.dumps(view))
            return time.monotonic() - t0, answered, size
        time.sleep(0.05)


async def run_one(world: int, args, workdir: Path, server: str = "this",
                  root: Path = ROOT) -> dict:
    db = f"sqlite:///{workdir / f'snapshots-{world}-{server}.db'}"
    servers = start_servers(1, db, [], workdir, f"snapshots-{world}-{server}", root=root)
    base = servers[0].url
    try:
        bench = Bench([base], world, OPS_PER_SECOND, f"snapshots-{world}")
        stop = asyncio.Event()
        _, tasks = await launch(bench, "v2", stop)
        t0 = time.monotonic()
        while bench.connected < world and time.monotonic() - t0 < 120:
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.settle)
        if args.hung:  # what a hung job sends: heartbeats and GPU readings, no summaries
            bench.hung = True
            await asyncio.sleep(args.settle)
        job = next(j for j in get(base + "/api/jobs")["jobs"] if j["name"] == bench.job)
        loop = asyncio.get_running_loop()
        every, one, answered, sizes, busy = [], [], [], [], 0
        # The user asking (a browser, `pgdash snapshot`) is a process of its own: see
        # timed_request.
        with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")) as user:
            for _ in range(args.rounds):
                timed = await loop.run_in_executor(user, timed_request, base, job["id"], "all")
                if timed is None:
                    busy += 1
                else:
                    every.append(timed[0])
                    answered.append(timed[1])
                    sizes.append(timed[2])
                await asyncio.sleep(MIN_INTERVAL_S)
                one.append((await loop.run_in_executor(user, timed_request, base, job["id"],
                                                       [world - 1]))[0])
                await asyncio.sleep(MIN_INTERVAL_S)
        text = get(base + "/metrics").decode()
        findings = get(f"{base}/api/jobs/{job['id']}/findings")["findings"]
        loud = sorted({f"{f['kind']}:{f['severity']}" for f in findings
                       if f["severity"] in ("warning", "critical")})
        stop.set()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        except asyncio.TimeoutError:
            pass  # agents still closing: the server is stopped below regardless
        return {"ranks": world, "server": server, "connected": bench.connected,
                "all_p50": pct(every, 0.5), "all_p95": pct(every, 0.95),
                "one_p50": pct(one, 0.5), "one_p95": pct(one, 0.95),
                "answered_min": min(answered, default=None),
                "view_kb": max(sizes, default=0) / 1024, "refused_busy": busy,
                "lag_s": metric(text, "pgdash_ingest_lag_seconds"), "findings": loud,
                "reconnects": bench.reconnects}
    finally:
        stop_servers(servers)


def agent_answer_ms(rounds: int = 200) -> tuple[float, float]:
    """(p50, p95) ms the real agent's thread takes to answer, GIL held: the main thread 30
    frames deep (this one, waiting) and three more threads parked."""
    from pgdash_agent.collectives import CollectiveTracker
    from pgdash_agent.outbox import Outbox
    from pgdash_agent.snapshots import Snapshots

    done = threading.Event()
    parked = [threading.Thread(target=done.wait, name=f"worker-{i}", daemon=True)
              for i in range(3)]
    for t in parked:
        t.start()
    outbox = Outbox(rounds + 10)
    snaps = Snapshots(CollectiveTracker(lambda pg: None, lambda *a: None, 100), outbox,
                      lambda perf: perf, lambda: {}, lambda: None)
    took: list[float] = []

    def deep(n: int) -> None:
        if n:
            return deep(n - 1)
        answerer = threading.Thread(target=answer_all, name="answerer")
        answerer.start()
        answerer.join()

    def answer_all() -> None:
        for i in range(rounds):
            snaps.ask({"ask": f"a{i}", "what": "snapshot"})
            t0 = time.perf_counter()
            snaps.answer()
            took.append((time.perf_counter() - t0) * 1e3)

    deep(30)
    done.set()
    return pct(took, 0.5), pct(took, 0.95)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="64,1024", help="comma-separated numbers of ranks")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds after all connected before asking (as bench.capacity)")
    p.add_argument("--hung", action="store_true",
                   help="snapshot a hung job (after --settle s at full traffic, the agents "
                        "send what hung ranks send: heartbeats and GPU readings, no latency "
                        "summaries, for --settle s more): when one snapshots all ranks")
    p.add_argument("--compare", type=Path, metavar="DIR",
                   help="another checkout (e.g. a `git worktree` of the commit before): each "
                        "N runs on its server first, then on this one's")
    args = p.parse_args()
    worlds = [int(x) for x in args.ranks.split(",")]
    print(f"pgdash snapshots: {os.cpu_count()} CPUs, {args.rounds} rounds per N, simulated "
          "agents at the agent's defaults (v2) answering as the agent does"
          + (", the job hung (heartbeats and GPU readings only)" if args.hung else ""),
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pgdash-snapshots-") as tmp:
        sides = [("before", args.compare.resolve()), ("after", ROOT)] if args.compare else \
            [("this", ROOT)]
        for world in worlds:
            for server, root in sides:
                row = asyncio.run(run_one(world, args, Path(tmp), server, root))
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("\n| ranks | all ranks: p50 / p95 | refused (ingest behind) | one rank: p50 / p95 "
          "| answered (worst round) | grouped answer | ingest lag at the end | findings "
          "| reconnects |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']}{'' if r['server'] == 'this' else ' ' + r['server']} "
              f"| {fmt(r['all_p50'])} / {fmt(r['all_p95'])} s "
              f"| {r['refused_busy']} of {args.rounds} "
              f"| {fmt(r['one_p50'])} / {fmt(r['one_p95'])} s | {r['answered_min']} "
              f"| {fmt(r['view_kb'], '.0f')} KB | {fmt(r['lag_s'])} s "
              f"| {', '.join(r['findings']) or 'none'} | {r['reconnects']} |")
    p50, p95 = agent_answer_ms()
    print(f"\nthe agent's thread answering (GIL held; training waits at most this): "
          f"p50 {p50:.2f} ms, p95 {p95:.2f} ms (goal 50 ms)")


if __name__ == "__main__":
    main()
