"""What does the agent cost training when its server is away?

A loop of 1-float ``all_reduce`` calls (gloo, CPU) on 2 ranks, timed on the training thread, in
three modes, each in fresh processes (started as torchrun would):

* ``none``: no agent;
* ``away``: ``attach()`` with ``PGDASH_SERVER`` pointing at a port where nothing listens (the
  agent keeps trying to connect, with its backoff, and buffers what it would send);
* ``up``: ``attach()`` with a pgdash server running (started here, on 127.0.0.1).

Each rank runs ``--warmup`` calls, then ``--calls`` timed ones; the loop's time is rank 0's.
The modes alternate in palindromic rounds (none, away, up, up, away, none, ...) so that a drift
of the machine cancels out; reported: the median loop time per mode and the ratios to
``none`` (the issue's goal: ``away`` within 2% of ``none``).

On a 2-core machine the loop's own spread between runs (a 1-float all_reduce over loopback
TCP, ~400 us) is several percent, more than the goal. So the agent's part is also measured
directly, with the server away (``direct``): on rank 0 the installed wrapper around a
collective that does nothing, and the one around ``Work.wait`` on a work already done,
against the same calls unwrapped (what the training thread pays per call); and the agent
thread's work per record (summarising it), timed while that thread is stopped. Their sum,
against the ``none`` loop's time per call, is the agent's share of this loop. A measurement,
not a test: exit status 0 whatever the figures. From the repository root::

    python -m bench.agent_away                  # 3 rounds of 6 runs, 20,000 calls each
    python -m bench.agent_away --rounds 1 --calls 5000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, free_port, rank_env, stop_by_pid

MODES = ("none", "away", "up")
RANKS = 2


def worker(result: str, mode: str, warmup: int, calls: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if mode != "none":
        from pgdash_agent import attach

        attach()
    t = torch.zeros(1)
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    elapsed = time.perf_counter() - start
    Path(result).write_text(json.dumps({"seconds": elapsed}))
    dist.barrier()
    dist.destroy_process_group()


def direct(result: str, calls: int) -> None:
    """The agent's own cost per collective, away from its server: see the module's doc."""
    import torch
    import torch.distributed as dist

    from pgdash_agent import attach

    dist.init_process_group("gloo")
    agent = attach()
    t = torch.zeros(1)
    dist.all_reduce(t)  # the group is known to the agent
    work = dist.all_reduce(t, async_op=True)  # one done: what waiting it costs besides
    work.wait()
    dist.barrier()
    if dist.get_rank() == 0:
        def nothing(tensor, op=None, group=None, async_op=False):
            return None

        wrapped = agent.wrappers._wrap(nothing, "all_reduce")  # the wrapper all_reduce has
        group = dist.distributed_c10d._get_default_group()
        agent.loop.stop()  # its thread's work is timed below, on its own

        def per_call(fn, *args, **kwargs) -> float:  # us
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args, **kwargs)
            return (time.perf_counter() - start) / calls * 1e6

        waits = type(work).wait, type(work).wait.__wrapped__  # the agent's, the original
        bare, wrapper, record = [], [], []
        for _ in range(9):
            bare.append(per_call(nothing, t, group=group) + per_call(waits[1], work))
            wrapper.append(per_call(wrapped, t, group=group) + per_call(waits[0], work))
            n = len(agent.tracker.records)
            start = time.perf_counter()
            agent.tracker.summarise()
            record.append((time.perf_counter() - start) / max(1, n) * 1e6)
        Path(result).write_text(json.dumps({
            "wrapper_us": statistics.median(wrapper) - statistics.median(bare),
            "record_us": statistics.median(record)}))
    dist.barrier()
    dist.destroy_process_group()


def run(mode: str, server_url: str, tmp: Path, args: argparse.Namespace) -> Any:
    """One run of ``mode`` on RANKS fresh processes: rank 0's loop time in seconds, or for
    ``direct`` its figures (``wrapper_us``, ``record_us``)."""
    port = str(free_port())
    result = tmp / f"{mode}-{time.monotonic_ns()}.json"
    procs = []
    try:
        for rank in range(RANKS):
            env = rank_env(rank, RANKS, port, PGDASH_SERVER=server_url,
                           PGDASH_JOB=f"bench-agent-away-{mode}")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "bench.agent_away", "--worker",
                 str(result) if rank == 0 else os.devnull, mode,
                 "--warmup", str(args.warmup), "--calls", str(args.calls)],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL))
        for p in procs:
            p.wait(timeout=600)
    finally:
        stop_by_pid(procs)
    if any(p.returncode != 0 for p in procs) or not result.exists():
        raise RuntimeError(f"{mode}: the ranks failed (exit codes {[p.returncode for p in procs]})")
    found = json.loads(result.read_text())
    return found if mode == "direct" else found["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="palindromic rounds of 2 runs per mode")
    p.add_argument("--calls", type=int, default=20_000, help="timed all_reduce calls per run")
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--worker", nargs=2, metavar=("RESULT", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        if args.worker[1] == "direct":
            direct(args.worker[0], args.calls)
        else:
            worker(args.worker[0], args.worker[1], args.warmup, args.calls)
        return
    import logging

    from dashboard.server import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="pgdash-away-") as tmp:
        server = make_server(f"sqlite:///{Path(tmp) / 'bench.db'}", "127.0.0.1", 0).start()
        nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        try:
            order = list(MODES) + list(reversed(MODES))
            for _ in range(args.rounds):
                for mode in order:
                    url = server.url if mode == "up" else nobody
                    times[mode].append(run(mode, url, Path(tmp), args))
                    print(f"{mode:5} {times[mode][-1]:.3f} s", flush=True)
            own = run("direct", nobody, Path(tmp), args)
        finally:
            server.stop()
    base = statistics.median(times["none"])
    print(f"\n{RANKS} ranks, {args.calls} all_reduce calls of 1 float per run, "
          f"{len(times['none'])} runs per mode, {os.cpu_count()} CPUs")
    print("| mode | median loop | per call | ratio to none |")
    print("|---|---|---|---|")
    for mode in MODES:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med:.3f} s | {1e6 * med / args.calls:.1f} us | {med / base:.3f} |")
    per_call = 1e6 * base / args.calls
    cost = own["wrapper_us"] + own["record_us"]
    print(f"\nthe agent's own work per collective, server away (direct): the wrappers "
          f"{own['wrapper_us']:.2f} us on the training thread + summarising its record "
          f"{own['record_us']:.2f} us on the agent's thread = {cost:.2f} us, "
          f"{100 * cost / per_call:.2f}% of the none loop's {per_call:.1f} us per call")


if __name__ == "__main__":
    main()
