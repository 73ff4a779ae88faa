"""A gloo job with one injected fault (argv[1]); used by tests/test_faults.py and bench/detect.py.

Every rank runs 5 all_reduces, then the fault:
  hang      the last rank sleeps before its 6th all_reduce (the others wait in it)
  gil       the last rank runs a regular expression that backtracks for ever instead, in C
            with the GIL held: its agent's threads cannot run (read from outside only)
  gil-all   every rank does so: no agent of the host can read another (the host reader can)
  chain     groups A=[0..n-1], B=[n-2, n-1]; rank n-1 sleeps; rank n-2 waits for it in B while
            the others wait for rank n-2 in A
  desync    the last rank calls broadcast where the others call all_reduce
  ddp-hang  DDP training; the last rank sleeps before a backward, so the others wait inside
            DDP's C++ all-reduce, which only the Flight Recorder sees
  straggler after the first steps the last rank's step takes 20% longer (argv[3] steps more;
            it prints "STEP <n> <unix time>" as it ends each slow step)
  crash     rank 1 raises an exception
  kill      rank 1 kills itself with SIGKILL
  healthy   no fault
  pause     4 ranks as a 2x2 DP x TP mesh; rank 0 checkpoints once (sleeps argv[3] s, 5)
            while the others wait in a barrier, then argv[4] (60) more steps: healthy
  mixed     the same mesh, healthy but uneven: a warm-up where each rank first sleeps up to
            argv[3] s (4; compilation), data-loader jitter of 0-30 ms per step, and a
            checkpoint pause of argv[4] s (5) on rank 0 every argv[5] (80) steps, argv[6]
            (200) steps in all
Prints "FAULT <unix time>" when the fault is injected, for detection-latency measurements.
"""

import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist

from pgdash_agent import attach

scenario = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
attach()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
last = world - 1
pair = dist.new_group([world - 2, world - 1]) if scenario == "chain" else None
t = torch.ones(4)


def fault(message):
    print(f"FAULT {time.time():.6f} {message}", flush=True)


def busy_step():
    dist.all_reduce(t)
    time.sleep(0.05)


mesh_groups = None
if scenario in ("pause", "mixed"):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    mesh_groups = (mesh.get_group("dp"), mesh.get_group("tp"))


def mesh_step(jitter=0.0):
    dist.all_reduce(t, group=mesh_groups[1])  # tensor parallel: partial sums of a layer
    dist.all_reduce(t, group=mesh_groups[0])  # data parallel: the gradients
    time.sleep(0.05 + jitter)


if scenario == "mixed":
    import random

    rng = random.Random(rank * 7919 + int(time.time()))
    time.sleep(rng.uniform(0, float(sys.argv[3]) if len(sys.argv) > 3 else 4.0))
for _ in range(steps):
    mesh_step() if mesh_groups else busy_step()

if scenario == "hang":
    if rank == last:
        fault("rank sleeps instead of entering all_reduce")
        time.sleep(3600)
    dist.all_reduce(t)
elif scenario in ("gil", "gil-all"):
    if rank == last or scenario == "gil-all":
        fault("rank holds the GIL in C (a regular expression) instead of entering all_reduce")
        re.match(r"(a+)+$", "a" * 64 + "!")  # backtracks for ever; _sre never lets the GIL go
    dist.all_reduce(t)
elif scenario == "chain":
    if rank == last:
        fault("rank sleeps; its pair partner waits in group B, the rest in the world group")
        time.sleep(3600)
    if rank >= world - 2:
        dist.all_reduce(t, group=pair)
    dist.all_reduce(t)
elif scenario == "desync":
    if rank == last:
        fault("rank calls broadcast instead of all_reduce")
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
elif scenario == "crash":
    if rank == 1:
        fault("rank raises")
        raise RuntimeError("injected failure on rank 1")
    dist.all_reduce(t)
elif scenario == "kill":
    if rank == 1:
        fault("rank is killed")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
elif scenario == "straggler":
    more = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    if rank == last:
        fault("rank's steps take 20% longer")
    for i in range(more):
        time.sleep(0.06 if rank == last else 0.05)
        dist.all_reduce(t)
        if rank == last:  # for counting the steps to detection (bench/detect.py)
            print(f"STEP {i + 1} {time.time():.6f}", flush=True)
elif scenario == "ddp-hang":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(8, 8))
    for step in range(1000):
        if step == 3 and rank == last:
            fault("rank sleeps instead of running backward")
            time.sleep(3600)
        model(torch.randn(4, 8)).sum().backward()
elif scenario == "pause":
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    more = int(sys.argv[4]) if len(sys.argv) > 4 else 60
    if rank == 0:
        fault(f"rank checkpoints for {pause:g} s")
        time.sleep(pause)
    dist.barrier()
    for _ in range(more):
        mesh_step()
elif scenario == "mixed":
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 80
    total = int(sys.argv[6]) if len(sys.argv) > 6 else 200
    for step in range(steps, total):
        if step % every == every - 1:
            if rank == 0:
                time.sleep(pause)
            dist.barrier()
        mesh_step(rng.uniform(0, 0.03))
elif scenario == "healthy":
    pass
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
dist.destroy_process_group()
