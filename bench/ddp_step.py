"""What the pgdash agent costs a DDP training step (run by ``bench/agent_overhead.py``).

What is measured: the step time (forward, backward with DDP's C++ gradient all-reduces,
optimizer step) of a small MLP under ``DistributedDataParallel``, 2 ranks, gloo, CPU, one
thread per rank, with the agent attached (``agent.attach()`` before ``init_process_group``, as
``python -m pgdash_agent`` does) and without it. Each launch is one mode; launches alternate in the
palindromic order bare, agent, agent, bare, ... so that a drift of the machine cancels out. A
launch warms up, then times ``steps`` steps one by one on rank 0; its median is one sample.
Reported: per mode the median of the launch medians, the ratio agent / bare, and the ratio of
the paired neighbouring launches (the verdict's estimator, like the collective benchmark).

The agent is really working: the ranks report to a pgdash server (started by the caller) and
wait until connected; during the timed steps the agent reads the Flight Recorder, sends
heartbeats and summaries. Each agent launch also reports the CPU its own threads took per
second of timed steps (``/proc/self/task/<tid>/stat``), and how many of DDP's all-reduces
the agent counted from the Flight Recorder.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, free_port

GOAL_RATIO = 1.02
ORDER = ("bare", "agent", "agent", "bare")


def _thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux)."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def worker(result_path: str, mode: str, steps: int, warmup: int) -> int:
    """One rank of one launch: build DDP, warm up, time ``steps`` steps, write the result."""
    import datetime
    import threading

    attached = None
    if mode == "agent":
        import pgdash_agent

        attached = pgdash_agent.attach()
        if attached is None:
            raise RuntimeError("attach() returned None: the agent did not start")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()

    if attached is not None:
        deadline = time.monotonic() + 20.0
        while not attached.sender.connected and time.monotonic() < deadline:
            time.sleep(0.05)
    connected = attached.sender.connected if attached is not None else None
    for _ in range(warmup):
        step()
    dist.barrier()
    threads = {t.name: t.native_id for t in threading.enumerate()
               if t.name.startswith("pgdash") and t.native_id is not None}
    cpu_before = {n: _thread_cpu_s(tid) for n, tid in threads.items()}
    times = []
    pc = time.perf_counter
    started = pc()
    for _ in range(steps):
        t0 = pc()
        step()
        times.append(pc() - t0)
    elapsed = pc() - started
    cpu = {n: (_thread_cpu_s(tid) - cpu_before[n]) / elapsed for n, tid in threads.items()}
    result = {"rank": rank, "mode": mode, "median_ms": statistics.median(times) * 1e3,
              "mean_ms": statistics.fmean(times) * 1e3, "elapsed_s": elapsed,
              "thread_cpu_per_s": cpu}
    if attached is not None:
        attached.detach()
        fr = getattr(attached, "fr_stats", None)  # None: an agent older than the reader
        result["agent"] = {"fr_reads": fr.reads if fr else 0,
                           "fr_read_cpu_s": round(fr.read_seconds, 4) if fr else 0.0,
                           "fr_missed": fr.missed if fr else 0,
                           "connected_before_timing": connected}
    dist.destroy_process_group()
    tmp = result_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh)
    os.replace(tmp, result_path)
    return 0


def _launch(mode: str, server_url: str, tmp: Path, n: int, steps: int,
            warmup: int, port: int) -> dict:
    results = [tmp / f"ddp-{n}-{mode}-rank{r}.json" for r in range(2)]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PGDASH_SERVER=server_url,
                   PGDASH_JOB=f"bench-ddp-{n}")
        log = open(tmp / f"ddp-{n}-{mode}-rank{rank}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.agent_overhead", "--ddp-worker", str(results[rank]),
             mode, "--ddp-steps", str(steps), "--ddp-warmup", str(warmup)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL))
        log.close()
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes != [0, 0] or not results[0].exists():
        text = (tmp / f"ddp-{n}-{mode}-rank0.log").read_text()[-3000:]
        raise RuntimeError(f"DDP launch {n} ({mode}) failed with {codes}:\n{text}")
    return json.loads(results[0].read_text())


def run(server_url: str, tmp: Path, rounds: int, steps: int, warmup: int) -> dict:
    """``rounds`` rounds of ORDER; returns per-launch results and the figures."""
    launches = []
    for r in range(rounds):
        for mode in ORDER:
            launches.append(_launch(mode, server_url, tmp, len(launches), steps, warmup,
                                    free_port()))
    bare = [x["median_ms"] for x in launches if x["mode"] == "bare"]
    agent = [x["median_ms"] for x in launches if x["mode"] == "agent"]
    # Pairs of neighbours: (bare, agent) and (agent, bare) of each round.
    paired = [launches[i + 1]["median_ms"] / launches[i]["median_ms"] if ORDER[i % 4] == "bare"
              else launches[i]["median_ms"] / launches[i + 1]["median_ms"]
              for i in range(0, len(launches), 2)]
    cpu: dict[str, list[float]] = {}
    for x in launches:
        for name, v in x.get("thread_cpu_per_s", {}).items():
            cpu.setdefault(name, []).append(v)
    return {"launches": launches, "bare_ms": statistics.median(bare),
            "agent_ms": statistics.median(agent),
            "ratio": statistics.median(agent) / statistics.median(bare),
            "paired_ratio": statistics.median(paired), "paired": paired,
            "agent_thread_cpu_per_s": {k: statistics.median(v) for k, v in cpu.items()}}


def report(res: dict) -> str:
    ok = res["paired_ratio"] <= GOAL_RATIO
    cpu = ", ".join(f"{k} {v * 100:.2f}%" for k, v in sorted(res["agent_thread_cpu_per_s"].items()))
    fr = [x["agent"] for x in res["launches"] if "agent" in x]
    reads = statistics.median([a["fr_reads"] for a in fr]) if fr else 0
    missed = sum(a["fr_missed"] for a in fr)
    return "\n".join([
        f"DDP step (2 ranks, gloo, MLP 256-512-512-10, batch 64): agent/bare ratio "
        f"{res['paired_ratio']:.3f} (median of paired launches)  goal: ratio <= {GOAL_RATIO:g}"
        f"  -> {'PASS' if ok else 'FAIL'}",
        f"{'':9}medians: bare {res['bare_ms']:.3f} ms, agent {res['agent_ms']:.3f} ms "
        f"(ratio {res['ratio']:.3f}); pairs: "
        + " ".join(f"{p:.3f}" for p in res["paired"]),
        f"{'':9}agent threads' CPU per second of steps (rank 0, median): {cpu or 'n/a'}; "
        f"Flight Recorder full reads per launch: {reads:g}, entries missed: {missed}",
    ])
