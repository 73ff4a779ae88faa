"""Plain loop with a hand-written gradient all_reduce, 3 ranks; rank 1 sees a NaN loss once and `continue`s past that step's backward and all_reduce, so from then on it is one collective behind: the ranks pair the wrong steps' gradients silently, and at the end rank 1 finishes one all_reduce early while the others wait in their last one.
EXPECT kind=hang|rank_exited_early culprit=1 ranks=3 launch=torchrun class=uneven
"""
import math
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
nan_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
steps = nan_step + 150

for step in range(steps):
    loss = float("nan") if rank == 1 and step == nan_step else 1.0
    if math.isnan(loss):
        fault("skips a step on a NaN loss (no all_reduce this step)")
        continue
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.001 * grad / world
    time.sleep(0.015)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
